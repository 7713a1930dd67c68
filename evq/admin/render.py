"""How admin answers are shown: aligned tables for people, one JSON document for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs


@attrs.frozen(slots=True)
class Output:
    """One command's answer: ``document`` for ``--json``, ``rows`` under ``columns`` (or
    ``text``) for a terminal."""

    document: Any
    rows: Sequence[Mapping[str, object]] = ()
    columns: Sequence[str] = ()
    text: str | None = None


def table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """Columns left-aligned to their widest cell, numbers right-aligned, like mqadmin's."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), int | float) for row in rows) and bool(rows)
               for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(columns), *(line(r) for r in cells)])


def show(out: Output, *, as_json: bool) -> str:
    if as_json:
        return json.dumps(out.document, sort_keys=True, default=str)
    if out.text is not None:
        return out.text
    return table(out.rows, out.columns)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "-"
    return str(value)
