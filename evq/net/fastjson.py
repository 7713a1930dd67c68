"""fastjson's output shape for the admin bodies Java tools parse (§2.4 of the wire notes).

Maps keyed by a MessageQueue are written with the key object inline, and integer keys bare:
``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:5}}``.  That is not JSON, but it
is what ``mqadmin`` reads; evq's own client reads it back with :func:`loads`, and the name
server reads Java brokers' registrations with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from evq.domain.queues import MessageQueue


def queue_json(q: MessageQueue) -> dict[str, object]:
    return {"brokerName": q.broker_name, "queueId": q.queue_id, "topic": q.topic}


def dumps(value: Any) -> str:
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda kv: _sort_key(kv[0]))
        return "{" + ",".join(f"{_key(k)}:{dumps(v)}" for k, v in items) + "}"
    if isinstance(value, MessageQueue):
        return dumps(queue_json(value))
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _sort_key(k: object) -> tuple[int, object]:
    if isinstance(k, MessageQueue):
        return (1, (k.broker_name, k.queue_id, k.topic))
    return (0, str(k)) if isinstance(k, str) else (0, f"{k:020d}" if isinstance(k, int) else k)


def _key(k: object) -> str:
    if isinstance(k, MessageQueue):
        return dumps(queue_json(k))
    if isinstance(k, int):
        return str(k)
    return json.dumps(str(k), ensure_ascii=False)


# A string literal (passed over, so text inside strings is never rewritten), or a key that JSON
# cannot spell: an inline object or a bare integer after "{" or "," and before ":".
_STRING_OR_KEY = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|([{,])\s*(\{[^{}]*\}|-?\d+)\s*:')


def loads(text: str) -> Any:
    """Read fastjson output: inline-object keys become ``MessageQueue`` keys, bare integer
    keys ints.  Raises ValueError for text that is none of that."""
    marked: dict[str, MessageQueue] = {}

    def key(m: re.Match[str]) -> str:
        sep, k = m.group(1), m.group(2)
        if sep is None:
            return m.group(0)
        if k[0] != "{":
            return f'{sep}"\ue001{k}":'
        d = json.loads(k)
        token = f"\ue000mq{len(marked)}"
        try:
            marked[token] = MessageQueue(d["topic"], d["brokerName"], int(d["queueId"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"inline key {k!r:.80} is not a MessageQueue: {exc!r}") from None
        return f'{sep}"{token}":'

    text = _STRING_OR_KEY.sub(key, text)

    def hook(pairs: list[tuple[str, Any]]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for k, v in pairs:
            if k in marked:
                out[marked[k]] = v
            elif k.startswith("\ue001"):
                out[int(k[1:])] = v
            else:
                out[k] = v
        return out

    return json.loads(text, object_pairs_hook=hook)
