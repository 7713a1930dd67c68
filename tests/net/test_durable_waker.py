"""DurableWaker on real stores: many coroutines, one flusher request a round."""

from __future__ import annotations

import asyncio

import pytest

from evq.bench.store import Workload, sync_coroutines
from evq.domain.log import FlushMode, MessageLog
from evq.domain.record import put_record
from evq.net.durable import DurableWaker
from tests.conftest import OpenLog

RECORDS = [put_record(Workload(240, 64).message(i, b"x" * 64, 0)) for i in range(240)]


@pytest.mark.parametrize("flush", [FlushMode.SYNC_FLUSH, FlushMode.ASYNC_FLUSH])
def test_every_waiter_is_settled_true_once_durable(open_log: OpenLog, flush: FlushMode) -> None:
    log = open_log(flush=flush)
    requests: list[int] = []
    on_durable = log.on_durable

    def counting(end: int, callback: object, timeout: float) -> None:
        requests.append(end)
        on_durable(end, callback, timeout)  # type: ignore[arg-type]

    log.on_durable = counting  # type: ignore[method-assign]

    async def main() -> list[tuple[int, bool]]:
        waker = DurableWaker(asyncio.get_running_loop(), log, 5.0)

        async def produce(k: int) -> list[tuple[int, bool]]:
            got = []
            for r in RECORDS[k::8]:
                end = log.append([r])[0].end_offset
                got.append((end, await waker.wait(end)))
            return got

        return [x for part in await asyncio.gather(*(produce(k) for k in range(8))) for x in part]

    outcomes = asyncio.run(main())
    assert len(outcomes) == len(RECORDS) and all(ok for _, ok in outcomes)
    if flush is FlushMode.SYNC_FLUSH:
        assert log.durable_offset >= max(end for end, _ in outcomes)
    # Eight writers wait at once and each round's request is made once all eight appended:
    # one request a round, every round serving all of them.
    assert len(requests) == len(RECORDS) // 8


def test_sync_coroutines_appends_every_record_once(open_log: OpenLog) -> None:
    log: MessageLog = open_log(flush=FlushMode.SYNC_FLUSH)
    seconds, timeouts = sync_coroutines(log, RECORDS, 16)
    assert timeouts == 0 and seconds > 0
    assert sum(log.queues().values()) == len(RECORDS)
    assert log.durable_offset == log.max_physical_offset
