"""The embedded benchmark: :class:`evq.Broker` in-process beside an event store on SQLite.

The design card's third use is a broker embedded in a service.  Such a service could as well
keep its events in a general event store, so this run puts the two side by side, in one
process and one run, on the same bodies:

* **evq**: :meth:`evq.Broker.send_batch` of ``batch`` bodies, then single
  :meth:`evq.Broker.send` calls, on a fresh store of ``backend`` (the store's default flush
  policy, ASYNC_FLUSH), then every queue of the batch topic pulled back with
  :meth:`evq.Broker.pull` (32 a call, raw records) and once more decoding each message;
* **eventsourcing**: the ``eventsourcing`` library's :class:`SQLiteApplicationRecorder` (its
  SQLite event store with a global notification order, the counterpart of a log) inserting
  ``batch`` stored events per :meth:`insert_events` call, then one per call, then reading every
  notification back, 32 per :meth:`select_notifications` call.  Twice: with its defaults
  (WAL journal, ``synchronous=FULL``: every commit syncs the WAL, so a call returns durable),
  and with ``synchronous=NORMAL`` (no sync at commit), the durability evq's default
  ASYNC_FLUSH gives, so the per-call work compares like for like.

``eventsourcing`` is a benchmark extra; without it evq's figures are measured alone and the
report says so.  Timings are wall clock of the calls alone, with the timing thread's CPU time
beside them, after each store has settled (see :func:`evq.bench.store.settle`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from evq.backends import registry
from evq.bench.scaffold import check_backend, fresh_page_us, progress, scratch, store_config
from evq.bench.store import BenchError, Stopwatch, settle
from evq.embedded import Broker

BATCH_TOPIC = "EmbeddedBatch"
SINGLE_TOPIC = "EmbeddedSingle"
QUEUES = 4
GROUP = "embedded-bench"
PULL_MAX_COUNT = 32
EVENT_TOPIC = "evq.bench.embedded:Appended"  # an eventsourcing event's class topic
INSTALL_HINT = "pip install -e '.[bench]'"
PHASES = ("batch", "single", "read")
SQLITE_SYNCHRONOUS = {"OFF": 0, "NORMAL": 1, "FULL": 2}


@attrs.frozen(kw_only=True)
class EmbeddedBenchOptions:
    backend: str = registry.DEFAULT_BACKEND
    messages: int = 100_000
    single_messages: int = 20_000
    size: int = 1024
    batch: int = 32
    segment_size: int | None = None
    data: Path | None = None
    progress: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("messages", "single_messages", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.size < 0:
            raise ValueError("size must not be negative")


@attrs.frozen(kw_only=True)
class Rates:
    """One system's figures: msgs/s of each phase and the timing thread's CPU per message."""

    batch_msgs_per_s: float
    batch_cpu_us_per_msg: float
    single_msgs_per_s: float
    single_cpu_us_per_msg: float
    read_msgs_per_s: float
    read_cpu_us_per_msg: float


@attrs.frozen(kw_only=True)
class EmbeddedBenchResult:
    """One run's figures; ``eventsourcing`` (its defaults), ``eventsourcing_normal``
    (``synchronous=NORMAL``) and the ratios are None when it is not installed."""

    backend: str
    messages: int
    single_messages: int
    size: int
    batch: int
    evq: Rates
    evq_read_decoded_msgs_per_s: float
    eventsourcing: Rates | None
    eventsourcing_normal: Rates | None
    eventsourcing_version: str | None
    fresh_page_us: float
    """What a fresh page-cache page cost this machine at the start of the run (µs a 4 KiB
    page, :func:`~evq.bench.scaffold.fresh_page_us`): evq's batch figure moves with it."""

    def ratio(self, phase: str, *, normal: bool = False) -> float | None:
        """evq's rate over eventsourcing's for ``phase`` (batch, single, read), against its
        defaults or, with ``normal``, against ``synchronous=NORMAL``."""
        other = self.eventsourcing_normal if normal else self.eventsourcing
        if other is None:
            return None
        name = f"{phase}_msgs_per_s"
        return float(getattr(self.evq, name) / getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        for p in PHASES:
            out[f"ratio_{p}"] = self.ratio(p)
            out[f"ratio_{p}_normal"] = self.ratio(p, normal=True)
        return out


def _rates(n_batch: int, batch: Stopwatch, n_single: int, single: Stopwatch, n_read: int,
           read: Stopwatch) -> Rates:
    return Rates(
        batch_msgs_per_s=n_batch / batch.wall, batch_cpu_us_per_msg=batch.cpu / n_batch * 1e6,
        single_msgs_per_s=n_single / single.wall,
        single_cpu_us_per_msg=single.cpu / n_single * 1e6,
        read_msgs_per_s=n_read / read.wall, read_cpu_us_per_msg=read.cpu / n_read * 1e6,
    )


def _batches(messages: int, batch: int) -> list[int]:
    """Sizes of the append calls that make up ``messages``: full batches, then the rest."""
    full, rest = divmod(messages, batch)
    return [batch] * full + ([rest] if rest else [])


# --- evq ---------------------------------------------------------------------------------------


def _evq_phases(opts: EmbeddedBenchOptions, path: Path, body: bytes) -> tuple[Rates, float]:
    config = store_config(opts.segment_size)
    with Broker.open(path, opts.backend, store_config=config) as broker:
        broker.create_topic(BATCH_TOPIC, queues=QUEUES)
        broker.create_topic(SINGLE_TOPIC, queues=QUEUES)
        settle()
        batch_watch, single_watch, read_watch, decoded_watch = (Stopwatch() for _ in range(4))
        calls = _batches(opts.messages, opts.batch)
        bodies = {n: [body] * n for n in set(calls)}
        with progress(opts.progress, "evq send_batch", opts.messages) as bar:
            for n in calls:
                with batch_watch.running():
                    broker.send_batch(BATCH_TOPIC, bodies[n])
                bar.update(n)
        with progress(opts.progress, "evq send", opts.single_messages) as bar:
            for _ in range(opts.single_messages):
                with single_watch.running():
                    broker.send(SINGLE_TOPIC, body)
                bar.update(1)
        read = _evq_pull_all(broker, read_watch, decode=False)
        decoded = _evq_pull_all(broker, decoded_watch, decode=True)
    for got, what in ((read, "pulled"), (decoded, "pulled and decoded")):
        if got != opts.messages:
            raise BenchError(f"evq {what} {got} of {opts.messages} messages")
    rates = _rates(opts.messages, batch_watch, opts.single_messages, single_watch,
                   read, read_watch)
    return rates, decoded / decoded_watch.wall


def _evq_pull_all(broker: Broker, watch: Stopwatch, *, decode: bool) -> int:
    """Every message of the batch topic, queue by queue, ``PULL_MAX_COUNT`` a call."""
    count = 0
    for qid in range(QUEUES):
        offset = 0
        while True:
            with watch.running():
                r = broker.pull(GROUP, BATCH_TOPIC, qid, offset, max_count=PULL_MAX_COUNT)
                got = len(r.messages()) if decode else len(r.records)
            count += got
            if r.next_begin_offset == offset:
                break
            offset = r.next_begin_offset
    return count


# --- eventsourcing --------------------------------------------------------------------------


def eventsourcing_version() -> str | None:
    """The installed ``eventsourcing`` library's version, or None when it is missing."""
    try:
        import eventsourcing  # noqa: F401
    except ImportError:
        return None
    from importlib.metadata import version

    return version("eventsourcing")


def _eventsourcing_phases(opts: EmbeddedBenchOptions, path: Path, body: bytes, *,
                          synchronous: str | None) -> Rates:
    """The three phases on a fresh database; ``synchronous`` overrides SQLite's setting."""
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    path.mkdir(parents=True)
    datastore = SQLiteDatastore(os.fspath(path / "events.sqlite"))
    try:
        recorder = SQLiteApplicationRecorder(datastore)
        recorder.create_table()
        if synchronous is not None:
            _set_synchronous(datastore, synchronous)
        settle()

        def events(stream: uuid.UUID, first: int, n: int) -> list[StoredEvent]:
            return [StoredEvent(originator_id=stream, originator_version=v, topic=EVENT_TOPIC,
                                state=body) for v in range(first, first + n)]

        batch_watch, single_watch, read_watch = Stopwatch(), Stopwatch(), Stopwatch()
        # One aggregate's events per call, as an application saves what one command did.
        batch_stream, version = uuid.uuid4(), 1
        with progress(opts.progress, "eventsourcing insert_events", opts.messages) as bar:
            for n in _batches(opts.messages, opts.batch):
                pending = events(batch_stream, version, n)
                with batch_watch.running():
                    recorder.insert_events(pending)
                version += n
                bar.update(n)
        single_stream = uuid.uuid4()
        with progress(opts.progress, "eventsourcing insert 1", opts.single_messages) as bar:
            for v in range(1, opts.single_messages + 1):
                pending = events(single_stream, v, 1)
                with single_watch.running():
                    recorder.insert_events(pending)
                bar.update(1)
        read = _eventsourcing_read_all(recorder.select_notifications, read_watch)
    finally:
        datastore.close()
    expected = opts.messages + opts.single_messages
    if read != expected:
        raise BenchError(f"eventsourcing read {read} of {expected} notifications")
    # Its notification log holds both phases (one table); count what was read.
    return _rates(opts.messages, batch_watch, opts.single_messages, single_watch, read,
                  read_watch)


def _set_synchronous(datastore: Any, value: str) -> None:
    """Set ``PRAGMA synchronous`` on the datastore's connection.  The setting is per
    connection; the pool hands its one connection back to every call of this one thread."""
    with datastore.get_connection(commit=True) as conn:
        cursor = conn.cursor()
        cursor.execute(f"PRAGMA synchronous={value}")
        cursor.execute("PRAGMA synchronous")
        (got,) = cursor.fetchone()
    if got != SQLITE_SYNCHRONOUS[value]:
        raise BenchError(f"SQLite kept synchronous={got} where {value} was asked for")


def _eventsourcing_read_all(select: Callable[..., Sequence[Any]], watch: Stopwatch) -> int:
    count, start = 0, 1
    while True:
        with watch.running():
            got = select(start, PULL_MAX_COUNT)
        if not got:
            return count
        count += len(got)
        start = got[-1].id + 1


# --- the run and the report ------------------------------------------------------------------


def run_embedded_bench(opts: EmbeddedBenchOptions) -> EmbeddedBenchResult:
    check_backend(opts.backend)
    body = os.urandom(opts.size)
    es_version = eventsourcing_version()
    with scratch(opts.data, prefix="evq-bench-embedded-") as run:
        fresh_page = fresh_page_us(run)
        evq_rates, decoded_rate = _evq_phases(opts, run / "evq", body)
        es_rates = es_normal = None
        if es_version is not None:
            es_rates = _eventsourcing_phases(opts, run / "eventsourcing", body,
                                             synchronous=None)
            es_normal = _eventsourcing_phases(opts, run / "eventsourcing-normal", body,
                                              synchronous="NORMAL")
    return EmbeddedBenchResult(
        backend=opts.backend, messages=opts.messages, single_messages=opts.single_messages,
        size=opts.size, batch=opts.batch, evq=evq_rates, evq_read_decoded_msgs_per_s=decoded_rate,
        eventsourcing=es_rates, eventsourcing_normal=es_normal, eventsourcing_version=es_version,
        fresh_page_us=fresh_page,
    )


def format_report(result: EmbeddedBenchResult) -> str:
    """The human table (the CLI prints it)."""
    r, e, en = result, result.eventsourcing, result.eventsourcing_normal
    notes = {"batch": f"{r.batch} per call", "single": "1 per call",
             "read": f"{PULL_MAX_COUNT} per call"}
    rows = [("msgs/s", "evq", "es", "ratio", "es NORMAL", "ratio", "cpu us/msg evq / es / NORMAL")]
    for phase in PHASES:
        name, cpu = f"{phase}_msgs_per_s", f"{phase}_cpu_us_per_msg"
        cpus = [f"{getattr(x, cpu):,.1f}" for x in (r.evq, e, en) if x is not None]
        rows.append((
            f"{phase} ({notes[phase]})", f"{getattr(r.evq, name):,.0f}",
            *_versus(e, name, r.ratio(phase)), *_versus(en, name, r.ratio(phase, normal=True)),
            " / ".join(cpus)))
    rows.append(("read, decoded", f"{r.evq_read_decoded_msgs_per_s:,.0f}", "", "", "", "",
                 "evq pulls decoded into Messages"))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    es_name = (f"eventsourcing {r.eventsourcing_version} SQLiteApplicationRecorder (es: its "
               "defaults, WAL + synchronous=FULL; es NORMAL: synchronous=NORMAL)"
               if e is not None else f"eventsourcing not installed ({INSTALL_HINT}): evq alone")
    lines = [f"evq embedded benchmark: evq.Broker on {r.backend} beside {es_name}; "
             f"{r.messages:,} batched and {r.single_messages:,} single {r.size}-byte messages",
             ""]
    for row in rows:
        cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:6], widths[1:],
                                                                         strict=True))]
        lines.append("  " + "  ".join(cells) + "  " + row[6])
    lines.append(f"a fresh page-cache page cost {r.fresh_page_us:,.2f} us a 4 KiB page on this "
                 f"machine at the start (evq's appends pay it for every page of log they fill; "
                 f"see evq.bench.scaffold)")
    return "\n".join(lines)


def _versus(other: Rates | None, name: str, ratio: float | None) -> tuple[str, str]:
    if other is None or ratio is None:
        return "-", "-"
    return f"{getattr(other, name):,.0f}", f"{ratio:.2f}x"
