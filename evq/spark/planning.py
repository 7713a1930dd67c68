"""Which offsets each Spark partition reads: pure arithmetic over per-queue ranges.

A batch read is one partition per message queue, a long queue cut into several so that no
task reads more than ``partition_size`` messages; a micro-batch is the same over the offsets
between two checkpoints, after :func:`limit` spread ``maxMessagesPerTrigger`` over the queues.
"""

from __future__ import annotations

import attrs

from evq.spark.options import Offsets, QueueKey


@attrs.frozen(slots=True)
class Slice:
    """Queue offsets ``[start, end)`` of one queue: what one task reads."""

    queue: QueueKey
    start: int
    end: int


def slices(starts: Offsets, ends: Offsets, partition_size: int) -> list[Slice]:
    """Every non-empty range, cut into pieces of at most ``partition_size`` offsets, in queue
    order (``starts`` names every queue of ``ends``)."""
    out: list[Slice] = []
    for queue in sorted(ends):
        start, end = starts[queue], ends[queue]
        for lo in range(start, end, partition_size):
            out.append(Slice(queue, lo, min(lo + partition_size, end)))
    return out


def limit(starts: Offsets, latest: Offsets, budget: int | None) -> Offsets:
    """The end offsets of the next micro-batch: ``latest`` when there is no budget, else at
    most ``budget`` messages spread over the queues in proportion to what each has waiting
    (every queue with messages gets at least one while the budget lasts, so none starves);
    ``starts`` names every queue of ``latest``."""
    waiting = {q: max(latest[q] - starts[q], 0) for q in latest}
    total = sum(waiting.values())
    if budget is None or total <= budget:
        return dict(latest)
    take = {q: budget * n // total for q, n in waiting.items()}
    left = budget - sum(take.values())
    for q in sorted(waiting, key=lambda q: (take[q] > 0, -(waiting[q] - take[q]), q)):
        if left == 0:
            break
        if take[q] < waiting[q]:
            take[q] += 1
            left -= 1
    return {q: starts[q] + take[q] for q in latest}
