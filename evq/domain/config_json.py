"""RocketMQ's JSON shape for config records (``topicName``, ``readQueueNums``, ...).

Topic and subscription-group configs travel as JSON in metadata events and, later, in admin
answers that Java tools parse; the JSON names are the camelCase of the attrs field names, so
one codec serves every config class.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

T = TypeVar("T")


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def to_json(obj: Any) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in attrs.fields(type(obj)):
        value = getattr(obj, f.name)
        out[camel(f.name)] = value.value if isinstance(value, enum.Enum) else value
    return out


def from_json(cls: type[T], data: Mapping[str, object]) -> T:
    """Build ``cls`` from JSON, coercing the loose types Java tools send ("8", "true");
    absent keys keep their defaults."""
    attrs.resolve_types(cls)  # type: ignore[arg-type]
    kwargs: dict[str, object] = {}
    for f in attrs.fields(cls):  # type: ignore[arg-type]
        key = camel(f.name)
        if key not in data:
            continue
        kwargs[f.name] = _coerce(f.type, data[key], key)
    return cls(**kwargs)


def _coerce(typ: object, value: object, key: str) -> object:
    try:
        if typ is bool:
            return value if isinstance(value, bool) else str(value).lower() == "true"
        if typ is int:
            return int(value)  # type: ignore[call-overload]
        if typ is str:
            return str(value)
        if isinstance(typ, type) and issubclass(typ, enum.Enum):
            return typ(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config field {key}: {value!r} is not a valid value ({exc})") from None
    return value
