"""Child process for the metadata crash test: changes config and offsets until killed.

Usage: ``python -m tests.domain.meta_child DATA_DIR ROUND``.  Prints ``READY`` once the broker
is open, then one line per acknowledged change: ``TOPIC <name> <queues>`` after create_topic
returned, ``DELETED <name>`` after delete_topic returned, ``SNAP <group> <topic> <queue>
<offset>`` after snapshot_offsets returned with that offset in it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from evq import logs
from evq.backends.config import StoreConfig
from evq.backends.registry import open_log
from evq.domain.broker import Broker, tags_code_fn
from evq.domain.clock import SYSTEM_CLOCK
from evq.domain.delay import DelayLevels
from evq.domain.log import FlushMode
from evq.domain.topics import TopicConfig
from evq.meta.sql import SqlMetadataStore


def main() -> None:
    logs.configure("warning", json=True)  # to stderr: stdout carries the acknowledgements
    root, round_no = Path(sys.argv[1]), int(sys.argv[2])
    config = StoreConfig(commitlog_segment_size=256 * 1024, flush=FlushMode.ASYNC_FLUSH)
    log = open_log("mmap", root / "store", config, clock=SYSTEM_CLOCK,
                   tags_code_fn=tags_code_fn(DelayLevels.parse()))
    broker = Broker(log, SqlMetadataStore.in_dir(root / "config"), clock=SYSTEM_CLOCK)
    rng = random.Random(round_no)
    print("READY", flush=True)
    n = 0
    while True:
        n += 1
        name = f"R{round_no}_{n}"
        queues = rng.randint(1, 8)
        broker.create_topic(TopicConfig(topic_name=name, read_queue_nums=queues,
                                        write_queue_nums=queues))
        print(f"TOPIC {name} {queues}", flush=True)
        if n % 3 == 0:
            victim = f"R{round_no}_{n - 1}"
            broker.delete_topic(victim)
            print(f"DELETED {victim}", flush=True)
        # Offsets only grow, across rounds too: a snapshot stored but not yet acknowledged
        # when the child is killed (the change in flight) is then never below an
        # acknowledged one.  Offsets that restarted low each round made such a snapshot
        # look like a lost one (1 run in 4).
        offset = round_no * 1_000_000 + n
        broker.commit_offset("G", "FIXED", n % 4, offset)
        broker.snapshot_offsets()
        print(f"SNAP G FIXED {n % 4} {offset}", flush=True)


if __name__ == "__main__":
    main()
