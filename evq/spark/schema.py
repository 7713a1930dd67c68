"""The rows of the ``evq`` format: one per message, the MessageExt fields a pipeline needs."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, Final

from evq.domain.message import Message, Prop
from evq.domain.record import offset_msg_id
from evq.spark.options import BodyAs

BASE_SCHEMA: Final = (
    "topic STRING, brokerName STRING, queueId INT, queueOffset BIGINT, msgId STRING, "
    "uniqKey STRING, tags STRING, keys ARRAY<STRING>, properties MAP<STRING, STRING>, "
    "body BINARY, bornTimestamp TIMESTAMP, storeTimestamp TIMESTAMP, bornHost STRING, "
    "storeHost STRING, reconsumeTimes INT"
)


def schema_ddl(body_as: BodyAs, body_schema: str | None) -> str:
    """``bodyAs=string`` adds ``value STRING``; ``bodyAs=json`` adds ``value STRUCT<...>``
    of the ``bodySchema`` DDL."""
    if body_as is BodyAs.STRING:
        return BASE_SCHEMA + ", value STRING"
    if body_as is BodyAs.JSON:
        return BASE_SCHEMA + f", value STRUCT<{_struct_fields(body_schema or '')}>"
    return BASE_SCHEMA


def _struct_fields(ddl: str) -> str:
    """``a INT, b STRING`` as STRUCT members (``a: INT, b: STRING``)."""
    fields = []
    for part in (p.strip() for p in ddl.split(",")):
        name, _, kind = part.partition(" ")
        fields.append(f"{name}: {kind.strip()}")
    return ", ".join(fields)


def _when(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def to_row(m: Message, broker_name: str, body_as: BodyAs,
           json_fields: Sequence[str] = ()) -> tuple[Any, ...]:
    body = m.payload()
    row: tuple[Any, ...] = (
        m.topic, broker_name, m.queue_id, m.queue_offset,
        offset_msg_id(m.store_host, m.commit_log_offset), m.properties.get(Prop.UNIQ_KEY),
        m.tags, list(m.keys), dict(m.properties), body, _when(m.born_timestamp),
        _when(m.store_timestamp), _host(m.born_host), _host(m.store_host), m.reconsume_times)
    if body_as is BodyAs.STRING:
        return (*row, body.decode("utf-8", errors="replace"))
    if body_as is BodyAs.JSON:
        try:
            doc = json.loads(body)
        except ValueError:
            return (*row, None)  # a body that is not JSON: null, like from_json's PERMISSIVE
        return (*row, tuple(doc.get(f) for f in json_fields) if isinstance(doc, dict) else None)
    return row
