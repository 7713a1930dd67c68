"""JSON bodies as RocketMQ's Java side writes and reads them (fastjson).

Java brokers, name servers and admin tools serialize bodies with fastjson: keys in alphabetical
order, compact, and the keys of maps with integer keys written *without* quotes
(``{"brokerAddrs":{0:"10.0.0.1:10911"}}``, §2.4).  Python's :mod:`json` refuses the latter, so
:func:`loads` quotes bare integer keys first; :func:`dumps` writes standard JSON in fastjson's
order, which the Java side and both stock clients read (§2.3.1).
"""

from __future__ import annotations

import json
import re
from typing import Any

# A string literal (skipped as it is, so text inside strings is never touched), or an integer
# that follows "{" or "," and precedes ":", i.e. an object key.
_STRING_OR_BARE_KEY = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|([{,]\s*)(-?[0-9]+)(?=\s*:)')


def _quote_key(match: re.Match[str]) -> str:
    if match.group(2) is None:
        return match.group(0)
    return f'{match.group(1)}"{match.group(2)}"'


def loads(data: bytes | str) -> Any:
    """Parse fastjson output; bare integer keys come back as strings, like quoted ones.

    Raises :class:`ValueError` (``json.JSONDecodeError`` or ``UnicodeDecodeError``) for text
    that is not JSON even with quoted keys.
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return json.loads(_STRING_OR_BARE_KEY.sub(_quote_key, text))


def dumps(obj: object) -> bytes:
    """Compact JSON with keys sorted, as fastjson orders them; ASCII-escaped, so any reader's
    charset assumptions hold."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("ascii")
