"""The ``evq`` format's options, parsed and checked before Spark starts any task.

Spark hands a data source its options as strings; a mistake found in an executor would surface
as a task failure far from its cause, so every option is read here, in the driver, and a bad
one raises :class:`OptionError` naming the option and what it accepts.

Offsets, in options and in streaming checkpoints, are one JSON shape:
``{"TOPIC": {"BROKER": {"QUEUE_ID": offset}}}`` (queue ids as strings, as JSON needs).
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Mapping
from typing import Final

import attrs

from evq.acl.signature import Credentials
from evq.backends.registry import BACKENDS
from evq.domain.filters import FilterError, parse_subscription
from evq.net.security import ClientSecurity
from evq.net.tls import ENV_TLS_KEY_PASSWORD, TlsConfigError, client_tls

DEFAULT_BROKER_NAME: Final = "broker-a"
DEFAULT_PARTITION_SIZE: Final = 100_000
DEFAULT_WRITE_BATCH: Final = 32
DEFAULT_LOCK_WAIT_S: Final = 120.0
"""How long an offline task waits for the store's lock (other tasks of the job hold it)."""

QueueKey = tuple[str, str, int]
"""(topic, broker name, queue id): one message queue of a cluster or a store directory."""
Offsets = dict[QueueKey, int]


class OptionError(ValueError):
    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        super().__init__(f"evq option {option!r}: {problem}")


class Position(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"


@attrs.frozen(slots=True)
class OffsetSpec:
    """Where reading starts or ends: a position, a time (offset-for-time per queue), or
    explicit offsets (queues not named fall back to ``default``)."""

    position: Position
    timestamp_ms: int | None = None
    explicit: Mapping[QueueKey, int] = attrs.field(factory=dict)


@attrs.frozen(slots=True, kw_only=True)
class SecurityOptions:
    """How the connector's connections to a live cluster are secured: ``accessKey`` /
    ``secretKey`` for an ACL-enabled cluster, and the TLS options.

    Options travel to the executors pickled, and an ``ssl.SSLContext`` does not pickle, so
    this holds what the options said (keys, file paths) and :meth:`client_security` builds the
    live value where a connection is opened.
    """

    credentials: Credentials | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_verify: bool = True

    def client_security(self) -> ClientSecurity | None:
        """The live value, built where the connection opens (driver or executor: the TLS
        files must be readable there).  Raises :class:`evq.net.tls.TlsConfigError`."""
        tls = client_tls(enable=self.tls, ca=self.tls_ca, cert=self.tls_cert, key=self.tls_key,
                         key_password=os.environ.get(ENV_TLS_KEY_PASSWORD) or None,
                         verify=self.tls_verify)
        if self.credentials is None and tls is None:
            return None
        return ClientSecurity(credentials=self.credentials, tls=tls)


class BodyAs(enum.Enum):
    BINARY = "binary"
    STRING = "string"
    JSON = "json"


@attrs.frozen(slots=True, kw_only=True)
class SourceOptions:
    namesrv: str | None = None
    path: str | None = None
    """A store directory, absolute: every executor opens the store at this same path."""
    backend: str = "mmap"
    broker_name: str = DEFAULT_BROKER_NAME
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting: OffsetSpec = OffsetSpec(Position.EARLIEST)
    ending: OffsetSpec = OffsetSpec(Position.LATEST)
    expression: str = "*"
    expression_type: str = "TAG"
    body_as: BodyAs = BodyAs.BINARY
    body_schema: str | None = None
    max_per_trigger: int | None = None
    partition_size: int = DEFAULT_PARTITION_SIZE
    lock_wait_s: float = DEFAULT_LOCK_WAIT_S
    security: SecurityOptions = SecurityOptions()

    @property
    def live(self) -> bool:
        return self.namesrv is not None

    def wants(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


@attrs.frozen(slots=True, kw_only=True)
class SinkOptions:
    namesrv: str
    topic: str | None = None
    group: str = "evq-spark-writer"
    batch: int = DEFAULT_WRITE_BATCH
    security: SecurityOptions = SecurityOptions()


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): str(v) for k, v in options.items()}


def parse_security(o: Mapping[str, str]) -> SecurityOptions:
    """``accessKey`` and ``secretKey`` (both or neither), ``tls``, ``tlsCa``, ``tlsCert``,
    ``tlsKey`` and ``tlsVerify`` from lower-cased options (the key's password, when it has
    one, from ``EVQ_TLS_KEY_PASSWORD`` on every machine)."""
    access, secret = o.get("accesskey") or None, o.get("secretkey") or None
    if (access is None) != (secret is None):
        missing = "secretKey" if secret is None else "accessKey"
        raise OptionError(missing, "'accessKey' and 'secretKey' are given together")
    credentials = Credentials(access, secret) if access and secret else None
    security = SecurityOptions(
        credentials=credentials, tls=_bool(o, "tls", False), tls_ca=o.get("tlsca") or None,
        tls_cert=o.get("tlscert") or None, tls_key=o.get("tlskey") or None,
        tls_verify=_bool(o, "tlsVerify", True))
    try:  # a bad file or a key without its certificate fails on the driver, at once
        security.client_security()
    except TlsConfigError as exc:
        raise OptionError("tls", str(exc)) from None
    return security


def parse_source(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    o = _lower(options)
    namesrv, path = o.get("namesrv"), o.get("path")
    if (namesrv is None) == (path is None):
        raise OptionError("namesrv", "give exactly one of 'namesrv' (a live cluster) or "
                                     "'path' (a store directory read offline)")
    backend = o.get("backend", "mmap")
    if backend not in BACKENDS:
        raise OptionError("backend", f"unknown backend {backend!r}; choose one of "
                                     f"{', '.join(sorted(BACKENDS))}")
    topics = tuple(t.strip() for t in o.get("topic", "").split(",") if t.strip())
    pattern = o.get("topicpattern")
    if bool(topics) == (pattern is not None):
        raise OptionError("topic", "give 'topic' (one name or a comma-separated list) or "
                                   "'topicPattern' (a regular expression), not both or neither")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError("topicPattern", f"not a regular expression: {exc}") from None
    expression, expression_type = "*", "TAG"
    if "filter" in o and "tags" in o:
        raise OptionError("filter", "give 'tags' or 'filter' (SQL92), not both")
    if "tags" in o:
        expression = o["tags"]
    elif "filter" in o:
        expression, expression_type = o["filter"], "SQL92"
    try:
        parse_subscription("T", expression, expression_type)
    except FilterError as exc:
        raise OptionError("filter" if expression_type == "SQL92" else "tags", str(exc)
                          ) from None
    body_as = _enum(BodyAs, "bodyAs", o.get("bodyas", "binary"))
    body_schema = o.get("bodyschema")
    if body_as is BodyAs.JSON and not body_schema:
        raise OptionError("bodySchema", "bodyAs=json needs the DDL schema of the JSON body, "
                                        "e.g. 'id INT, amount DOUBLE'")
    starting = parse_offsets("startingOffsets", o.get(
        "startingoffsets", "latest" if streaming else "earliest"))
    ending = parse_offsets("endingOffsets", o.get("endingoffsets", "latest"))
    if streaming and "endingoffsets" in o:
        raise OptionError("endingOffsets", "a stream has no end; use it with spark.read")
    return SourceOptions(
        # the driver's working directory: an executor's is its own scratch directory
        namesrv=namesrv, path=None if path is None else os.path.abspath(path), backend=backend,
        broker_name=o.get("brokername", DEFAULT_BROKER_NAME), topics=topics,
        topic_pattern=pattern, starting=starting, ending=ending, expression=expression,
        expression_type=expression_type, body_as=body_as, body_schema=body_schema,
        max_per_trigger=_positive(o, "maxMessagesPerTrigger"),
        partition_size=_positive(o, "maxMessagesPerPartition") or DEFAULT_PARTITION_SIZE,
        lock_wait_s=_positive(o, "lockTimeoutSeconds") or DEFAULT_LOCK_WAIT_S,
        security=parse_security(o))


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    o = _lower(options)
    if "namesrv" not in o:
        raise OptionError("namesrv", "writing needs the name servers of a live cluster")
    return SinkOptions(namesrv=o["namesrv"], topic=o.get("topic"),
                       group=o.get("producergroup", "evq-spark-writer"),
                       batch=_positive(o, "batchSize") or DEFAULT_WRITE_BATCH,
                       security=parse_security(o))


def parse_offsets(option: str, text: str) -> OffsetSpec:
    text = text.strip()
    lowered = text.lower()
    if lowered in ("earliest", "latest"):
        return OffsetSpec(Position(lowered))
    if lowered.startswith("timestamp:"):
        value = lowered.removeprefix("timestamp:")
        if not value.isdigit():
            raise OptionError(option, f"'timestamp:' needs epoch milliseconds, got {value!r}")
        return OffsetSpec(Position.LATEST, timestamp_ms=int(value))
    try:
        return OffsetSpec(Position.EARLIEST if option.startswith("starting") else
                          Position.LATEST, explicit=offsets_from_json(json.loads(text)))
    except (ValueError, TypeError, AttributeError) as exc:
        raise OptionError(option, "expected 'earliest', 'latest', 'timestamp:<epoch ms>' or "
                                  'JSON {"TOPIC": {"BROKER": {"QUEUE_ID": offset}}}'
                                  f" ({exc})") from None


def offsets_from_json(doc: Mapping[str, Mapping[str, Mapping[str, int]]]) -> Offsets:
    out: Offsets = {}
    for topic, brokers in doc.items():
        for broker, queues in brokers.items():
            for qid, offset in queues.items():
                if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                    raise ValueError(f"offset of {topic}/{broker}/{qid} is {offset!r}")
                out[(str(topic), str(broker), int(qid))] = offset
    return out


def offsets_to_json(offsets: Offsets) -> dict[str, dict[str, dict[str, int]]]:
    doc: dict[str, dict[str, dict[str, int]]] = {}
    for (topic, broker, qid), offset in sorted(offsets.items()):
        doc.setdefault(topic, {}).setdefault(broker, {})[str(qid)] = offset
    return doc


def _enum(kind: type[BodyAs], option: str, value: str) -> BodyAs:
    try:
        return kind(value.lower())
    except ValueError:
        raise OptionError(option, f"{value!r} is not one of "
                                  f"{', '.join(m.value for m in kind)}") from None


def _bool(o: Mapping[str, str], option: str, default: bool) -> bool:
    raw = o.get(option.lower())
    if raw is None or not raw.strip():
        return default
    if raw.strip().lower() in ("true", "1"):
        return True
    if raw.strip().lower() in ("false", "0"):
        return False
    raise OptionError(option, f"expected true or false, got {raw!r}")


def _positive(o: Mapping[str, str], option: str) -> int | None:
    raw = o.get(option.lower())
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) <= 0:
        raise OptionError(option, f"expected a positive integer, got {raw!r}")
    return int(raw)
