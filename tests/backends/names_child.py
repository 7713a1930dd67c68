"""The program the names test kills: store a few messages per topic, acknowledge, wait.

    python -m tests.backends.names_child BACKEND PATH NAMES_JSON

Opens the store at PATH with :data:`tests.backends.crash_child.CONFIG` (SYNC_FLUSH), appends
``PER_TOPIC`` messages to queue 0 of each topic in the JSON list, waits until they are durable,
prints ``ACKED`` and then waits to be killed: the store is never closed.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from evq import logs
from evq.backends.registry import open_log
from evq.domain.message import new_message
from evq.domain.record import put_record
from tests.backends import crash_child

PER_TOPIC = 3
DURABLE_TIMEOUT_S = 30.0


def body(topic: str, n: int) -> bytes:
    return f"{n}|{topic}".encode()


def main(backend: str, path: str, names_json: str) -> None:
    logs.configure("warning", json=True)  # to stderr: stdout is the ACKED line
    names = json.loads(names_json)
    log = open_log(backend, Path(path), crash_child.CONFIG)
    results = log.append([put_record(new_message(t, body(t, n), compress_over=None))
                          for n in range(PER_TOPIC) for t in names])
    if not log.wait_durable(results[-1].end_offset, DURABLE_TIMEOUT_S):
        raise SystemExit("the appends did not become durable")
    print("ACKED", flush=True)
    threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main(*sys.argv[1:])
