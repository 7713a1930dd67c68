"""The process the store benchmark kills: open a store, append a spool's records, wait.

Protocol on stdout, one line each: ``progress <records appended>`` now and then, then
``end <log end offset>`` once everything is appended.  The child then blocks on stdin until the
parent SIGKILLs it (or exits when the parent goes away and stdin closes), so the store is left
exactly as a crash would leave it: abort marker present, nothing closed.

Run as ``python -m evq.bench.crash_child --backend mmap --store DIR --spool FILE --count N ...``
(one ``--count`` per pickled chunk of the spool).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evq import logs
from evq.backends import registry
from evq.bench.store import PROGRESS_EVERY, Spool, StoreBenchOptions
from evq.domain.log import FlushMode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evq.bench.crash_child")
    p.add_argument("--backend", required=True)
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--spool", type=Path, required=True)
    p.add_argument("--count", type=int, action="append", required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--flush", choices=[m.value for m in FlushMode], default="ASYNC_FLUSH")
    p.add_argument("--segment-size", type=int, default=None)
    args = p.parse_args(argv)
    logs.configure("warning")
    opts = StoreBenchOptions(
        backend=args.backend, flush=FlushMode(args.flush), segment_size=args.segment_size,
        batch=args.batch,
    )
    spool = Spool(args.spool, args.count, 0)
    store = registry.open_log(args.backend, args.store, opts.store_config(), background=False)
    done = reported = 0
    for chunk in spool.chunks():
        for i in range(0, len(chunk), args.batch):
            done += len(store.append(chunk[i : i + args.batch]))
            if done - reported >= PROGRESS_EVERY:
                print(f"progress {done}", flush=True)
                reported = done
    print(f"end {store.max_physical_offset}", flush=True)
    sys.stdin.read()  # until killed, or until the parent is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
