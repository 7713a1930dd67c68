"""The ``evq`` command line.

Commands are nested argparse sub-parsers; each leaf sets ``handler`` (a function of the parsed
arguments returning an exit code) and may set ``log_level_default`` (its logging threshold
unless ``--log-level`` says otherwise).  New
commands (``evq broker``, ``evq namesrv``, ``evq admin ...``, ``evq bench backends``) add a
``_add_*`` function next to the existing ones and register it in :func:`build_parser`.

Exit codes: 0 success, 1 a failure while running, 2 bad usage (argparse's own errors, an
unknown backend), 130 interrupted.  A failure, bad usage included, prints one line,
``evq: error: <reason>``, on stderr; ``--log-level debug`` adds the traceback to the log.
Client commands (``produce``, ``consume``, ``admin``) log only errors by default, so the
library's retry warnings do not precede that line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from evq import logs
from evq.admin.commands import add_admin, add_namesrv_flag
from evq.backends.registry import DEFAULT_BACKEND, UnknownBackend
from evq.client.security_flags import SecurityFlagError, add_security_flags, client_security
from evq.domain.log import FlushMode
from evq.net.tls import TlsConfigError

if TYPE_CHECKING:
    from evq.net.broker import BrokerServer
    from evq.settings import Settings

log = logs.get_logger(__name__)

Handler = Callable[[argparse.Namespace], int]

PROG = "evq"
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
LOG_LEVELS = ("debug", "info", "warning", "error")
FLUSH_MODES = {"async": FlushMode.ASYNC_FLUSH, "sync": FlushMode.SYNC_FLUSH}


class UsageError(Exception):
    """Arguments that parse but cannot be used; exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line, like every other failure (``--help`` still
    shows the usage); sub-parsers are of this class too, argparse makes them so."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}\n")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _port(text: str) -> int:
    port = _non_negative_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {port}")
    return port


def _cannot_listen(host: str, port: int, exc: OSError) -> Exception:
    """A bind failure as one line naming the address and the plain reason (the loop's own text
    repeats the address as a Python tuple)."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return RuntimeError(f"cannot listen on {host}:{port}: {reason}")


# --- evq namesrv ----------------------------------------------------------------------------


def _add_namesrv(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from evq.net.namesrv import DEFAULT_PORT

    p = commands.add_parser(
        "namesrv",
        help="run a name server",
        description=(
            "Run a RocketMQ name server: brokers register their topics here, clients look "
            "up routes here. Runs until SIGTERM or SIGINT."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT,
                   help=f"port to listen on, 0 for any free one (default: {DEFAULT_PORT})")
    p.add_argument("--acl-file", type=Path, default=None, metavar="FILE",
                   help="a RocketMQ plain_acl.yml: broker registration, KV config and topic "
                        "deletion then need an admin account's signature (lookups stay "
                        "open); the file is re-read when it changes")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="RocketMQ tls.* settings (tls.server.mode=..., as in tls.properties) "
                        "and the tables' bounds (maxBrokerAddresses, maxTopicQueues, "
                        "maxKvEntries, maxKvBytes; or EVQ_MAX_BROKER_ADDRESSES ...)")
    _tls_server_flags(p)
    p.set_defaults(handler=_cmd_namesrv)


def _cmd_namesrv(args: argparse.Namespace) -> int:
    from evq.net.namesrv import NameServer
    from evq.net.transport import run_until_signal
    from evq.settings import SettingsError, load_namesrv

    try:
        settings = load_namesrv(
            config_file=args.config,
            flags={name: getattr(args, name) for name in _TLS_SERVER_FLAGS})
        tls = settings.tls.server()
    except SettingsError as exc:
        raise UsageError(str(exc)) from None

    async def serve(stop: asyncio.Event) -> int:
        server = NameServer(args.host, args.port, acl_file=args.acl_file, tls=tls,
                            limits=settings.limits)
        try:
            await server.start()
        except OSError as exc:
            raise _cannot_listen(args.host, args.port, exc) from exc
        print(f"{PROG} namesrv listening on {server.address}", flush=True)
        await stop.wait()
        await server.shutdown()
        return 0

    return run_until_signal(serve)


# --- evq bench store ------------------------------------------------------------------------


def _add_bench_store(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "store",
        help="append, read, key lookup, recovery and group-commit throughput of one store",
        description=(
            "Measure one store backend: batched and single-record appends, reads by queue, "
            "key lookups, recovery after SIGKILL and SYNC_FLUSH group commit, against the "
            "floor of copying the same records into a pre-faulted mmap."
        ),
    )
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help=f"store backend (default: {DEFAULT_BACKEND})")
    p.add_argument("--messages", type=_positive_int, default=200_000,
                   help="messages per phase (default: 200000)")
    p.add_argument("--size", type=_non_negative_int, default=1024,
                   help="body bytes per message (default: 1024)")
    p.add_argument("--flush", choices=sorted(FLUSH_MODES), default="async",
                   help="flush mode of the append phases; with 'sync' every append call waits "
                        "for durability, so one producer is bound by disk latency "
                        "(default: async). The multi-producer sync figure is always measured.")
    p.add_argument("--producers", type=_positive_int, default=16,
                   help="producer threads of the SYNC_FLUSH group-commit phase (default: 16)")
    p.add_argument("--sync-messages", type=_positive_int, default=50_000,
                   help="messages of the group-commit phase, at most --messages "
                        "(default: 50000)")
    p.add_argument("--batch", type=_positive_int, default=32,
                   help="records per append call in the batched phase (default: 32)")
    p.add_argument("--lookups", type=_positive_int, default=10_000,
                   help="key queries of the lookup phase (default: 10000)")
    p.add_argument("--transient-store-pool", action="store_true",
                   help="also run the batched append phase with RocketMQ's transient store "
                        "pool (mmap: appends into locked buffers a commit service writes to the "
                        "files), reported beside the mapped-write figures and the same floor")
    p.add_argument("--segment-size", type=_positive_int, default=None, metavar="BYTES",
                   help="CommitLog segment size (default: the store's, 1 GiB)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the stores (default: a temporary directory); "
                        "each run works in a fresh sub-directory and removes it")
    p.add_argument("--scale", type=_message_counts, default=None, metavar="N,N,...",
                   help="instead of the phases above: per-message cost of append, read and "
                        "lookups in a store of each of these many messages (e.g. "
                        "100000,1000000,10000000; flat is the goal). Every store is filled "
                        "first, its appends timed, and all stay on disk together; then "
                        "--rounds rounds read and look up every store in turn, and the read "
                        "side reports the median over the rounds and the median of each "
                        "round's ratio to the smallest size, so the machine's drift between "
                        "minutes does not pass for a store's growth")
    p.add_argument("--rounds", type=_positive_int, default=5, metavar="N",
                   help="with --scale: rounds of reads and lookups over every store "
                        "(default: 5)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the table (no progress bars)")
    p.set_defaults(handler=_cmd_bench_store, log_level_default="warning")


def _message_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 100000,1000000"
                                         ) from None
    if min(counts) < 1:
        raise argparse.ArgumentTypeError("message counts must be positive")
    return counts


def _rerun_line(words: list[str], args: argparse.Namespace) -> str:
    """The command line that repeats a benchmark run: its own words, then the options the
    benchmarks share (``--segment-size`` where the benchmark has it)."""
    if getattr(args, "segment_size", None) is not None:
        words += ["--segment-size", str(args.segment_size)]
    if args.data is not None:
        words += ["--data", str(args.data)]
    if args.json:
        words.append("--json")
    return shlex.join(words)


def _print_bench(result: Any, format_report: Callable[[Any], str], rerun: str,
                 args: argparse.Namespace) -> int:
    """A benchmark's figures: one JSON object, or its report, each with the command line
    that repeats the run."""
    if args.json:
        print(json.dumps({**result.as_dict(), "rerun": rerun}))
    else:
        print(format_report(result))
        print(f"rerun: {rerun}")
    return 0


def _bench_store_rerun(args: argparse.Namespace) -> str:
    words = [
        PROG, "bench", "store", "--backend", args.backend, "--messages", str(args.messages),
        "--size", str(args.size), "--flush", args.flush, "--producers", str(args.producers),
        "--sync-messages", str(args.sync_messages), "--batch", str(args.batch),
        "--lookups", str(args.lookups),
        *(["--transient-store-pool"] if args.transient_store_pool else []),
    ]
    return _rerun_line(words, args)


def _cmd_bench_store(args: argparse.Namespace) -> int:
    from evq.bench.store import StoreBenchOptions, format_report, run_store_bench

    if args.scale is not None:
        return _bench_store_scale(args)
    try:
        opts = StoreBenchOptions(
            backend=args.backend, messages=args.messages, size=args.size,
            flush=FLUSH_MODES[args.flush], producers=args.producers, data=args.data,
            segment_size=args.segment_size, batch=args.batch, sync_messages=args.sync_messages,
            lookups=args.lookups, progress=not args.json and sys.stderr.isatty(),
            transient_store_pool=args.transient_store_pool,
        )
        opts.store_config()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = run_store_bench(opts)
    return _print_bench(result, format_report, _bench_store_rerun(args), args)


def _bench_store_scale(args: argparse.Namespace) -> int:
    from evq.bench import scale

    try:
        opts = scale.ScaleOptions(backend=args.backend, sizes=args.scale, size=args.size,
                                  batch=args.batch, lookups=args.lookups,
                                  rounds=args.rounds, segment_size=args.segment_size,
                                  data=args.data, progress=not args.json and sys.stderr.isatty())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = scale.run_scale(opts)
    if args.json:
        print(json.dumps(scale.as_dict(opts, result)))
    else:
        print(scale.format_report(opts, result), end="")
    return 0


# --- evq bench net --------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _add_bench_net(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "net",
        help="produce, consume and send latency against a broker over the network",
        description=(
            "Start a broker in a child process on a free port and drive it with evq's "
            "remoting client: produce one message per request, in batches and pipelined; "
            "consume everything back with pulls; send latency at a fixed rate."
        ),
    )
    p.add_argument("--messages", type=_positive_int, default=100_000,
                   help="messages per produce phase; consume reads all three phases' "
                        "(default: 100000)")
    p.add_argument("--size", type=_non_negative_int, default=1024,
                   help="body bytes per message (default: 1024)")
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help=f"the broker's store backend (default: {DEFAULT_BACKEND})")
    p.add_argument("--batch", type=_positive_int, default=32,
                   help="messages per SEND_BATCH_MESSAGE request (default: 32)")
    p.add_argument("--in-flight", type=_positive_int, default=64,
                   help="requests outstanding in the pipelined phase (default: 64)")
    p.add_argument("--queues", type=_positive_int, default=8,
                   help="queues of the benchmark topic (default: 8)")
    p.add_argument("--rate", type=_positive_int, default=2_000,
                   help="sends per second of the latency phase (default: 2000)")
    p.add_argument("--latency-seconds", type=_positive_float, default=5.0,
                   help="duration of the latency phase (default: 5)")
    p.add_argument("--segment-size", type=_positive_int, default=None, metavar="BYTES",
                   help="the broker's CommitLog segment size (default: the broker's, 1 GiB)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the broker's store (default: a temporary "
                        "directory); each run works in a fresh sub-directory and removes it")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the table (no progress bars)")
    p.set_defaults(handler=_cmd_bench_net, log_level_default="warning")


def _bench_net_rerun(args: argparse.Namespace) -> str:
    words = [
        PROG, "bench", "net", "--backend", args.backend, "--messages", str(args.messages),
        "--size", str(args.size), "--batch", str(args.batch), "--in-flight",
        str(args.in_flight), "--queues", str(args.queues), "--rate", str(args.rate),
        "--latency-seconds", f"{args.latency_seconds:g}",
    ]
    return _rerun_line(words, args)


def _cmd_bench_net(args: argparse.Namespace) -> int:
    from evq.bench.net import NetBenchOptions, format_report, run_net_bench

    try:
        opts = NetBenchOptions(
            backend=args.backend, messages=args.messages, size=args.size, batch=args.batch,
            in_flight=args.in_flight, queues=args.queues, rate=args.rate,
            latency_seconds=args.latency_seconds, segment_size=args.segment_size,
            data=args.data, progress=not args.json and sys.stderr.isatty(),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = run_net_bench(opts)
    return _print_bench(result, format_report, _bench_net_rerun(args), args)


# --- evq bench ha ---------------------------------------------------------------------------


def _add_bench_ha(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "ha",
        help="produce throughput and latency with no slave, ASYNC_MASTER and SYNC_MASTER",
        description=(
            "Start a master (and a slave) in child processes for each of three setups (no "
            "slave, ASYNC_MASTER, SYNC_MASTER) and produce single-message sends with several "
            "in flight: msgs/s, send p50/p99, and the slave's lag behind the master in bytes."
        ),
    )
    p.add_argument("--messages", type=_positive_int, default=20_000,
                   help="sends per setup (default: 20000)")
    p.add_argument("--size", type=_non_negative_int, default=1024,
                   help="body bytes per message (default: 1024)")
    p.add_argument("--in-flight", type=_positive_int, default=32,
                   help="sends outstanding at once (default: 32)")
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help=f"the brokers' store backend (default: {DEFAULT_BACKEND})")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the stores (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_bench_ha, log_level_default="warning")


def _cmd_bench_ha(args: argparse.Namespace) -> int:
    from evq.bench.ha import HABenchOptions, format_report, run_ha_bench

    try:
        opts = HABenchOptions(backend=args.backend, messages=args.messages, size=args.size,
                              in_flight=args.in_flight, data=args.data)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = run_ha_bench(opts)
    words = [PROG, "bench", "ha", "--backend", args.backend, "--messages", str(args.messages),
             "--size", str(args.size), "--in-flight", str(args.in_flight)]
    return _print_bench(result, format_report, _rerun_line(words, args), args)


# --- evq bench compare -----------------------------------------------------------------------


def _add_bench_compare(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "compare",
        help="evq beside Redis Streams: produce and consume, sync and batched, CPU per message",
        description=(
            "One producer process sends 1 KiB messages and exits, then one consumer process "
            "reads and acknowledges them all, against a fresh `evq serve` (mmap, ASYNC_FLUSH, "
            "one queue) and, when redis-server is on the PATH, a fresh Redis (AOF everysec) "
            "driven by redis-py; prints each figure and evq's ratio to Redis."
        ),
    )
    p.add_argument("--messages", type=_positive_int, default=100_000,
                   help="messages of each batch phase (default: 100000)")
    p.add_argument("--sync-messages", type=_positive_int, default=20_000,
                   help="messages of each sync phase, one per request (default: 20000)")
    p.add_argument("--batch", type=_positive_int, default=32,
                   help="messages per request in the batch phases (default: 32)")
    p.add_argument("--runs", type=_positive_int, default=1,
                   help="runs of each phase, medians reported (default: 1)")
    p.add_argument("--max-seconds", type=_positive_float, default=60.0,
                   help="a producer stops after this long (default: 60)")
    p.add_argument("--no-redis", dest="redis", action="store_false",
                   help="measure evq alone")
    p.add_argument("--client", "--loop", choices=["asyncio", "uvloop", "blocking"],
                   default="asyncio",
                   help="evq's client in the worker processes: Producer / PullConsumer on "
                        "asyncio's loop (the default, as asyncio.run gives) or uvloop, or "
                        "blocking: SyncProducer / SyncPullConsumer, the shape of redis-py's")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the servers' data (default: a temporary "
                        "directory), removed after")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the table (no progress bar)")
    p.set_defaults(handler=_cmd_bench_compare, log_level_default="warning")


def _cmd_bench_compare(args: argparse.Namespace) -> int:
    from evq.bench.compare import CompareOptions, format_report, run_compare

    try:
        opts = CompareOptions(messages=args.messages, sync_messages=args.sync_messages,
                              batch=args.batch, runs=args.runs, max_seconds=args.max_seconds,
                              data=args.data, redis=args.redis, client=args.client,
                              progress=not args.json and sys.stderr.isatty())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = run_compare(opts)
    words = [PROG, "bench", "compare", "--messages", str(args.messages), "--sync-messages",
             str(args.sync_messages), "--batch", str(args.batch), "--runs", str(args.runs),
             "--max-seconds", f"{args.max_seconds:g}", "--client", args.client]
    if not args.redis:
        words.append("--no-redis")
    return _print_bench(result, format_report, _rerun_line(words, args), args)


# --- evq bench path -------------------------------------------------------------------------


def _add_bench_path(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "path",
        help="what one send costs the broker's loop: Python calls, bytecodes and CPU",
        description=(
            "A 1 KiB SEND_MESSAGE_V2 handed to a broker connection in one process (mmap, "
            "ASYNC_FLUSH, no sockets), beside the same transport answering with a constant: "
            "the Python calls and bytecodes a request runs (the same on any machine) and its "
            "CPU time in this run."),
    )
    p.add_argument("--messages", type=int, default=20_000,
                   help="requests each path times (default: 20000)")
    p.add_argument("--traced", type=int, default=200,
                   help="requests each path counts under sys.settrace (default: 200)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default: 1024)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the broker's store (default: a temporary "
                        "directory), removed after")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_bench_path, log_level_default="warning")


def _cmd_bench_path(args: argparse.Namespace) -> int:
    from evq.bench.path import PathBenchOptions, format_report, run_path_bench

    try:
        opts = PathBenchOptions(messages=args.messages, traced=args.traced, size=args.size,
                                data=args.data)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = run_path_bench(opts)
    words = [PROG, "bench", "path", "--messages", str(args.messages), "--traced",
             str(args.traced), "--size", str(args.size)]
    return _print_bench(result, format_report, _rerun_line(words, args), args)


# --- evq bench embedded ---------------------------------------------------------------------


def _add_bench_embedded(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "embedded",
        help="evq.Broker in-process beside the eventsourcing library's SQLite event store",
        description=(
            "In one process and one run: evq.Broker.send_batch, single sends and pulls on a "
            "fresh store, then the eventsourcing library's SQLiteApplicationRecorder inserting "
            "batches of as many events of the same size, single events, and reading them back; "
            "prints each rate and evq's ratio (eventsourcing is in the 'bench' extra; without "
            "it evq is measured alone)."
        ),
    )
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help=f"evq's store backend (default: {DEFAULT_BACKEND})")
    p.add_argument("--messages", type=_positive_int, default=100_000,
                   help="messages of the batch phase, read back after (default: 100000)")
    p.add_argument("--single-messages", type=_positive_int, default=20_000,
                   help="messages of the single-send phase (default: 20000)")
    p.add_argument("--size", type=_non_negative_int, default=1024,
                   help="body bytes per message (default: 1024)")
    p.add_argument("--batch", type=_positive_int, default=32,
                   help="messages per call in the batch phase (default: 32)")
    p.add_argument("--segment-size", type=_positive_int, default=None, metavar="BYTES",
                   help="CommitLog segment size (default: the store's, 1 GiB)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for both stores (default: a temporary directory), "
                        "removed after")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the table (no progress bars)")
    p.set_defaults(handler=_cmd_bench_embedded, log_level_default="warning")


def _cmd_bench_embedded(args: argparse.Namespace) -> int:
    from evq.bench.embedded import (
        INSTALL_HINT,
        EmbeddedBenchOptions,
        eventsourcing_version,
        format_report,
        run_embedded_bench,
    )

    try:
        opts = EmbeddedBenchOptions(
            backend=args.backend, messages=args.messages, single_messages=args.single_messages,
            size=args.size, batch=args.batch, segment_size=args.segment_size, data=args.data,
            progress=not args.json and sys.stderr.isatty())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if eventsourcing_version() is None:
        print(f"eventsourcing is not installed ({INSTALL_HINT}): measuring evq alone",
              file=sys.stderr)
    result = run_embedded_bench(opts)
    words = [PROG, "bench", "embedded", "--backend", args.backend, "--messages",
             str(args.messages), "--single-messages", str(args.single_messages), "--size",
             str(args.size), "--batch", str(args.batch)]
    return _print_bench(result, format_report, _rerun_line(words, args), args)


# --- evq bench spark ------------------------------------------------------------------------


def _add_bench_spark(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "spark",
        help="the Spark format's read and write rates against the broker's pull rate",
        description=(
            "Start evq serve in a child process, fill a topic with small JSON messages "
            "(batch sends), measure the rate the broker serves them to a plain pulling "
            "client, then time a Spark count() and a JSON groupBy over the topic and a Spark "
            "write of as many rows (needs the 'spark' extra)."
        ),
    )
    p.add_argument("--messages", type=_positive_int, default=200_000,
                   help="messages of the topic read, rows written (default: 200000)")
    p.add_argument("--batch", type=_positive_int, default=32,
                   help="messages per send_batch while filling (default: 32)")
    p.add_argument("--master", default="local[2]",
                   help="the Spark master (default: local[2])")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the broker's store and Spark's files "
                        "(default: a temporary directory), removed after")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_bench_spark, log_level_default="warning")


def _cmd_bench_spark(args: argparse.Namespace) -> int:
    from evq.bench.spark import SparkBenchOptions, format_report, run_spark_bench

    try:
        opts = SparkBenchOptions(messages=args.messages, batch=args.batch, master=args.master,
                                 data=args.data)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = run_spark_bench(opts)
    words = [PROG, "bench", "spark", "--messages", str(args.messages), "--batch",
             str(args.batch), "--master", args.master]
    return _print_bench(result, format_report, _rerun_line(words, args), args)


# --- evq broker ------------------------------------------------------------------------------


def _add_broker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "broker", help="run a broker",
        description="Run a broker speaking the RocketMQ 4.x remoting protocol. Settings come "
                    "from --config (TOML, or a RocketMQ broker.conf), EVQ_* environment "
                    "variables and these flags, later ones winning.")
    _broker_flags(p)
    p.set_defaults(handler=_cmd_broker)


def _broker_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="TOML file or RocketMQ broker.conf (brokerName=..., listenPort=...)")
    p.add_argument("--backend", dest="backend", default=None,
                   help=f"store backend (default: {DEFAULT_BACKEND})")
    p.add_argument("--data", dest="store_path_root_dir", default=None, metavar="DIR",
                   help="data directory (default: ./evq-data)")
    p.add_argument("--host", default=None, help="address to bind and to advertise "
                                                "(default: 127.0.0.1)")
    p.add_argument("--port", dest="listen_port", type=_non_negative_int, default=None,
                   help="listen port (default: 10911; 0 picks a free one)")
    p.add_argument("--namesrv", dest="namesrv_addr", default=None, metavar="H:P;H:P",
                   help="name servers to register with")
    p.add_argument("--cluster", dest="broker_cluster_name", default=None)
    p.add_argument("--broker-name", dest="broker_name", default=None)
    p.add_argument("--broker-id", dest="broker_id", type=_non_negative_int, default=None)
    p.add_argument("--role", dest="broker_role", default=None,
                   choices=["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"])
    p.add_argument("--flush", dest="flush", default=None, choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    p.add_argument("--transient-store-pool", dest="transient_store_pool_enable",
                   action="store_true", default=None,
                   help="append into locked memory buffers that a commit service writes to the "
                        "CommitLog every 200 ms (RocketMQ's transientStorePoolEnable; ASYNC_FLUSH "
                        "masters only, ignored with a warning otherwise). A crash loses "
                        "acknowledged messages not yet committed")
    p.add_argument("--ha-port", dest="ha_listen_port", type=_non_negative_int, default=None,
                   help="a master's replication port (default: --port + 1; any free port "
                        "with --port 0)")
    p.add_argument("--master-ha", dest="master_ha_addr", default=None, metavar="H:P",
                   help="a slave's master replication address (default: learnt from the "
                        "name servers)")
    p.add_argument("--slave-read-enable", dest="slave_read_enable", action="store_true",
                   default=None, help="a slave serves pulls (RocketMQ's slaveReadEnable; "
                                      "default off: consumers read from the master)")
    p.add_argument("--access-key", dest="access_key", default=None, metavar="KEY",
                   help="the broker's own account, signing its registrations and a slave's "
                        "HA handshake (broker.conf accessKey; default: $EVQ_ACCESS_KEY)")
    p.add_argument("--secret-key", dest="secret_key", default=None, metavar="SECRET",
                   help="its secret (broker.conf secretKey; default: $EVQ_SECRET_KEY, safer "
                        "than a flag, which other users see in ps)")
    p.add_argument("--acl", dest="acl_enable", action="store_true", default=None,
                   help="refuse requests the ACL file's accounts do not allow (RocketMQ's "
                        "aclEnable; default off: anyone who reaches the port may do anything)")
    p.add_argument("--acl-file", dest="acl_file", default=None, metavar="FILE",
                   help="RocketMQ plain_acl.yml accounts, reloaded when it changes "
                        "(default: DATA/conf/plain_acl.yml)")
    _tls_server_flags(p)
    tls = p.add_argument_group("TLS of this broker's own connections (name servers, master)")
    tls.add_argument("--tls-enable", dest="tls_enable", action="store_true", default=None,
                     help="register with name servers and follow the master over TLS "
                          "(tls.enable)")
    tls.add_argument("--tls-client-ca", dest="tls_client_trust_cert_path", default=None,
                     metavar="FILE", help="CA file their certificates must chain to "
                                          "(tls.client.trustCertPath; default: the system's)")
    tls.add_argument("--tls-client-cert", dest="tls_client_cert_path", default=None,
                     metavar="FILE", help="this broker's client certificate "
                                          "(tls.client.certPath)")
    tls.add_argument("--tls-client-key", dest="tls_client_key_path", default=None,
                     metavar="FILE", help="its key (tls.client.keyPath)")


def _tls_server_flags(p: argparse.ArgumentParser) -> None:
    """The listening side's TLS flags, shared by ``namesrv``, ``broker`` and ``serve``; the
    key password only comes from a config file or EVQ_TLS_SERVER_KEY_PASSWORD."""
    tls = p.add_argument_group("TLS of the ports this process listens on")
    tls.add_argument("--tls-mode", dest="tls_server_mode", default=None,
                     choices=["disabled", "permissive", "enforcing"],
                     help="tls.server.mode: clear text only (default), TLS and clear text on "
                          "one port, or TLS only")
    tls.add_argument("--tls-cert", dest="tls_server_cert_path", default=None, metavar="FILE",
                     help="server certificate chain, PEM (tls.server.certPath)")
    tls.add_argument("--tls-key", dest="tls_server_key_path", default=None, metavar="FILE",
                     help="its private key, PEM (tls.server.keyPath)")
    tls.add_argument("--tls-ca", dest="tls_server_trust_cert_path", default=None,
                     metavar="FILE",
                     help="CA file client certificates must chain to (tls.server.trustCertPath)")
    tls.add_argument("--tls-client-auth", dest="tls_server_need_client_auth", default=None,
                     choices=["none", "optional", "require"],
                     help="ask clients for a certificate (tls.server.need.client.auth; "
                          "default none)")
    tls.add_argument("--tls-handshake-timeout-ms", dest="tls_server_handshake_timeout_ms",
                     type=_positive_int, default=None, metavar="MS",
                     help="from accept to a finished handshake (default 10000)")


_TLS_SERVER_FLAGS = ("tls_server_mode", "tls_server_cert_path", "tls_server_key_path",
                     "tls_server_trust_cert_path", "tls_server_need_client_auth",
                     "tls_server_handshake_timeout_ms")
_BROKER_FLAGS = ("backend", "store_path_root_dir", "host", "listen_port", "namesrv_addr",
                 "broker_cluster_name", "broker_name", "broker_id", "broker_role", "flush",
                 "transient_store_pool_enable", "ha_listen_port", "master_ha_addr",
                 "slave_read_enable", "access_key",
                 "secret_key", "acl_enable", "acl_file", *_TLS_SERVER_FLAGS,
                 "tls_enable", "tls_client_trust_cert_path", "tls_client_cert_path",
                 "tls_client_key_path")


def _broker_settings(args: argparse.Namespace) -> Settings:
    from evq.settings import SettingsError, load

    try:
        return load(config_file=args.config,
                    flags={name: getattr(args, name) for name in _BROKER_FLAGS})
    except SettingsError as exc:
        raise UsageError(str(exc)) from None


def _cmd_broker(args: argparse.Namespace) -> int:
    from evq.net.broker import BrokerServer
    from evq.net.transport import run_until_signal

    settings = _broker_settings(args)

    async def serve(stop: asyncio.Event) -> int:
        server = BrokerServer(settings)
        await _start_broker(server, settings)
        await stop.wait()
        await server.shutdown()
        return 0

    return run_until_signal(serve)


async def _start_broker(server: BrokerServer, settings: Settings) -> None:
    from evq.net.broker import ListenError

    try:
        await server.start()
    except ListenError as exc:
        raise _cannot_listen(exc.host, exc.port, exc) from exc
    except OSError as exc:
        raise _cannot_listen(settings.net.host, settings.net.listen_port, exc) from exc
    ha = f", ha {server.ha_address}" if server.ha_address else ""
    print(f"{PROG} broker listening on {server.address} "
          f"(backend {settings.net.backend}, data {settings.net.store_path_root_dir}{ha})",
          flush=True)


# --- evq serve -------------------------------------------------------------------------------


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "serve", help="run a name server and a broker in one process",
        description="A name server and a broker in one process on the embedded default "
                    "(mmap store in ./evq-data, 127.0.0.1): point RocketMQ clients at "
                    "127.0.0.1:9876.")
    _broker_flags(p)
    p.add_argument("--namesrv-port", type=_port, default=9876,
                   help="name server port, 0 for any free one (default: 9876)")
    p.set_defaults(handler=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from evq.net.broker import BrokerServer
    from evq.net.namesrv import NameServer
    from evq.net.transport import run_until_signal

    host = args.host or "127.0.0.1"
    early = _broker_settings(args)  # before the name server listens: no address in it yet
    acl = early.net
    if acl.acl_enable and acl.credentials is None:
        raise UsageError("evq serve --acl: the name server takes registrations only from an "
                         f"admin account of {acl.acl_path}; give the broker one with "
                         "--access-key and --secret-key (or EVQ_ACCESS_KEY/EVQ_SECRET_KEY)")

    namesrv_tls = early.tls.server()  # the broker's tls.server.* for both ports

    async def serve(stop: asyncio.Event) -> int:
        # With ACL on, the name server guards its writes with the broker's own account file.
        namesrv = NameServer(host, args.namesrv_port,
                             acl_file=acl.acl_path if acl.acl_enable else None, tls=namesrv_tls,
                             limits=early.namesrv_limits)
        try:
            await namesrv.start()
        except OSError as exc:
            raise _cannot_listen(host, args.namesrv_port, exc) from exc
        print(f"{PROG} namesrv listening on {namesrv.address}", flush=True)
        args.namesrv_addr = namesrv.address
        settings = _broker_settings(args)
        server = BrokerServer(settings)
        try:
            await _start_broker(server, settings)
            await stop.wait()
            await server.shutdown()
        finally:
            await namesrv.shutdown()
        return 0

    return run_until_signal(serve)
# --- evq bench backends ---------------------------------------------------------------------


def _backend_list(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _add_bench_backends(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from evq.backends.registry import BACKENDS

    p = bench.add_parser(
        "backends",
        help="the same workload on every store backend, compared",
        description=(
            "Run one workload on every backend, one after another: appends (async and sync, "
            "1 and --writers writers), reads by queue (hot and cold), key and offset-for-time "
            "lookups, recovery after SIGKILL, disk bytes per message, and how they change from "
            "N/10 to N messages.  Writes backends.md and PNG charts to --out."
        ),
    )
    p.add_argument("--messages", type=_positive_int, default=100_000,
                   help="messages per backend, N (default: 100000)")
    p.add_argument("--size", type=_non_negative_int, default=1024,
                   help="body bytes per message (default: 1024)")
    p.add_argument("--backends", type=_backend_list, default=tuple(sorted(BACKENDS)),
                   metavar="NAME,...",
                   help=f"backends to compare (default: {','.join(sorted(BACKENDS))})")
    p.add_argument("--writers", type=_positive_int, default=16,
                   help="writer threads of the concurrent append phases (default: 16)")
    p.add_argument("--sync-messages", type=_positive_int, default=5_000,
                   help="messages of the SYNC_FLUSH phases, at most N (default: 5000)")
    p.add_argument("--lookups", type=_positive_int, default=10_000,
                   help="key and offset-for-time queries each (default: 10000)")
    p.add_argument("--segment-size", type=_positive_int, default=64 * 1024 * 1024,
                   metavar="BYTES", help="CommitLog segment size (default: 64 MiB)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the stores (default: a temporary directory)")
    p.add_argument("--out", type=Path, default=Path("evq-bench-backends"), metavar="DIR",
                   help="where backends.md and the PNG charts go (default: evq-bench-backends)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object keyed by backend instead of the table")
    p.set_defaults(handler=_cmd_bench_backends, log_level_default="warning")


def _bench_backends_rerun(args: argparse.Namespace) -> str:
    words = [
        PROG, "bench", "backends", "--messages", str(args.messages), "--size", str(args.size),
        "--backends", ",".join(args.backends), "--writers", str(args.writers),
        "--sync-messages", str(args.sync_messages), "--lookups", str(args.lookups),
        "--segment-size", str(args.segment_size),
    ]
    if args.json:
        words.append("--json")
    return shlex.join(words)


def _cmd_bench_backends(args: argparse.Namespace) -> int:
    from evq.bench.backends import (
        BackendsBenchOptions,
        charts_available,
        memory_step,
        run_backends_bench,
        write_report,
    )

    try:
        opts = BackendsBenchOptions(
            backends=args.backends, messages=args.messages, size=args.size,
            writers=args.writers, sync_messages=args.sync_messages, lookups=args.lookups,
            segment_size=args.segment_size, data=args.data,
            progress=not args.json and sys.stderr.isatty(),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    results = run_backends_bench(opts)
    step = memory_step(opts.messages)
    rerun = _bench_backends_rerun(args)
    files = write_report(results, args.out, rerun, step)
    if args.json:
        print(json.dumps({name: r.as_dict() for name, r in results.items()}))
    else:
        print(files[0].read_text(), end="")
        print(f"written: {', '.join(str(f) for f in files)}")
        if not charts_available():
            print("no charts: they need matplotlib (pip install -e '.[bench]')", file=sys.stderr)
    return 0


# --- evq produce / evq consume --------------------------------------------------------------


def _add_produce(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("produce", help="send each stdin line as a message",
                            description="Send each line of stdin to a topic; print one JSON "
                                        "send result per line.")
    add_namesrv_flag(p)
    add_security_flags(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-p", "--group", default="evq-cli-producer", help="producer group")
    p.add_argument("--tags", default=None)
    p.add_argument("--keys", default=None, help="space-separated keys")
    p.add_argument("--batch", type=_positive_int, default=1, help="lines per send (default 1)")
    p.set_defaults(handler=_cmd_produce, log_level_default="error")


def _cmd_produce(args: argparse.Namespace) -> int:
    from evq.client.scripts import ProduceOptions, produce

    return produce(ProduceOptions(namesrv=args.namesrv, topic=args.topic, group=args.group,
                                  tags=args.tags, keys=args.keys, batch=args.batch,
                                  security=client_security(args)))


def _add_consume(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("consume", help="print what a topic receives",
                            description="Consume a topic as a member of GROUP and print each "
                                        "message's body (or a JSON object with --json). Runs "
                                        "until --count, --idle-timeout, SIGTERM or SIGINT, "
                                        "and commits its offsets however it stops.")
    add_namesrv_flag(p)
    add_security_flags(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-g", "--group", required=True)
    p.add_argument("-s", "--expression", default="*", help="tag expression (default: *)")
    p.add_argument("--from-beginning", action="store_true",
                   help="start a new group at the oldest message, not the newest")
    p.add_argument("--count", type=_positive_int, default=None, help="exit after N messages")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="exit after this long without a message")
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    p.add_argument("--wait-for-topic", action="store_true",
                   help="wait for a topic no name server knows yet (default: fail at once)")
    p.set_defaults(handler=_cmd_consume, log_level_default="error")


def _cmd_consume(args: argparse.Namespace) -> int:
    from evq.client.scripts import ConsumeOptions, consume

    return consume(ConsumeOptions(
        namesrv=args.namesrv, topic=args.topic, group=args.group, expression=args.expression,
        from_beginning=args.from_beginning, count=args.count, idle_timeout=args.idle_timeout,
        json=args.json, wait_for_topic=args.wait_for_topic, security=client_security(args)))


# --- evq bench recovery ---------------------------------------------------------------------


def _byte_size(text: str) -> int:
    """``1GiB`` (or MiB, KiB, plain bytes) as a byte count."""
    units = {"gib": 1024**3, "mib": 1024**2, "kib": 1024, "": 1}
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]ib|)\s*", text, re.I)
    if m is None or int(m[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 1GiB or 512MiB")
    return int(m[1]) * units[m[2].lower()]


def _byte_sizes(text: str) -> tuple[int, ...]:
    """``1GiB,10GiB`` as byte counts."""
    return tuple(_byte_size(part) for part in text.split(","))


def _add_bench_recovery(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "recovery", help="recovery time after SIGKILL by log size (flat is the goal), and the "
                         "reopen after a clean shutdown",
        description="For each size, a child fills a fresh store to it, checkpoints, writes a "
                    "fixed tail and is SIGKILLed; the reopen is timed, then, once that store "
                    "is closed, the reopen after a clean shutdown.")
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help=f"store backend (default: {DEFAULT_BACKEND})")
    p.add_argument("--sizes", type=_byte_sizes, default=(1024**3, 10 * 1024**3),
                   help="log sizes, comma-separated (default: 1GiB,10GiB)")
    p.add_argument("--tail", type=_byte_size, default=64 * 1024**2,
                   help="bytes written after the checkpoint (default: 64MiB)")
    p.add_argument("--size", type=_positive_int, default=1024,
                   help="body bytes per record (default: 1024)")
    p.add_argument("--segment-size", type=_positive_int, default=None, metavar="BYTES",
                   help="CommitLog segment size (default: the store's, 1 GiB)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="scratch directory for the stores (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_bench_recovery, log_level_default="warning")


def _cmd_bench_recovery(args: argparse.Namespace) -> int:
    from evq.bench.recovery import RecoveryOptions, as_dict, format_report, run_recovery_bench

    try:
        opts = RecoveryOptions(backend=args.backend, sizes=args.sizes, tail=args.tail,
                               size=args.size, segment_size=args.segment_size, data=args.data)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"evq bench recovery: {len(opts.sizes)} crashes, the largest log "
          f"{max(opts.sizes) / 1024**3:.2f} GiB (a child writes each; this takes a while)",
          file=sys.stderr, flush=True)
    figures = run_recovery_bench(opts)
    print(json.dumps(as_dict(opts, figures)) if args.json else format_report(opts, figures),
          end="\n" if args.json else "")
    return 0


# --- the parser and the entry point ---------------------------------------------------------


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("bench", help="benchmarks", description="Run a benchmark.")
    benches = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    _add_bench_store(benches)
    _add_bench_backends(benches)
    _add_bench_net(benches)
    _add_bench_ha(benches)
    _add_bench_recovery(benches)
    _add_bench_compare(benches)
    _add_bench_spark(benches)
    _add_bench_embedded(benches)
    _add_bench_path(benches)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG, description="evq: an event-sourced message broker modelled on RocketMQ 4.x."
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help="logging threshold (default: per command)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_namesrv(commands)
    _add_bench(commands)
    _add_broker(commands)
    _add_serve(commands)
    _add_produce(commands)
    _add_consume(commands)
    add_admin(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level or getattr(args, "log_level_default", None) or "info")
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UnknownBackend, UsageError, SecurityFlagError, TlsConfigError) as exc:
        _fail(exc)
        return EXIT_USAGE
    except Exception as exc:
        log.debug("command_failed", exc_info=True)
        _fail(exc)
        return EXIT_FAILURE


def _fail(exc: BaseException) -> None:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    print(f"{PROG}: error: {reason}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
