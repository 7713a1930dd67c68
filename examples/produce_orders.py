"""Produce a stream of order events into evq: one JSON object per order.

    python examples/produce_orders.py -n 127.0.0.1:9876 --orders 1000 --rate 50
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from evq.client.blocking import SyncProducer
from evq.domain.message import new_message

CUSTOMERS = ["ada", "grace", "alan", "barbara", "edsger"]
PROGRESS_EVERY = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--namesrv", default="127.0.0.1:9876")
    parser.add_argument("-t", "--topic", default="orders")
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="orders per second")
    parser.add_argument("--backdate-minutes", type=float, default=0.0,
                        help="spread the order times over this many past minutes (to see "
                             "closed windows at once)")
    args = parser.parse_args()
    start_ms = int(time.time() * 1000 - args.backdate_minutes * 60_000)
    step_ms = args.backdate_minutes * 60_000 / max(args.orders, 1)
    print(f"sending {args.orders} orders to {args.topic} at {args.rate:g}/s "
          f"(about {args.orders / args.rate:.0f} s)", file=sys.stderr, flush=True)
    with SyncProducer("example-orders", args.namesrv) as producer:
        for i in range(args.orders):
            if i and i % PROGRESS_EVERY == 0:
                print(f"  {i} sent", file=sys.stderr, flush=True)
            customer = random.choice(CUSTOMERS)
            ts = int(start_ms + i * step_ms) if args.backdate_minutes else int(time.time() * 1000)
            order = {"id": i, "customer": customer, "amount": round(random.uniform(1, 200), 2),
                     "ts": ts}
            # The customer is the sharding key: one customer's orders stay in order.
            producer.send_orderly(new_message(args.topic, json.dumps(order).encode(),
                                              tags="created", keys=[str(i)]), customer)
            time.sleep(1 / args.rate)
    print(f"sent {args.orders} orders to {args.topic}")


if __name__ == "__main__":
    main()
