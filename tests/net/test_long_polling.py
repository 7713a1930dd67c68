"""Parked pulls wake on matching arrivals from the store's thread, or time out; the store calls
the holds only while a pull is parked."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from evq.backends.config import StoreConfig
from evq.backends.registry import BACKENDS, open_log
from evq.domain.log import Dispatched
from evq.domain.message import new_message
from evq.domain.record import put_record
from evq.net.long_polling import PullHolds


def arrival(topic: str, queue_id: int, offset: int, tags_code: int = 0) -> Dispatched:
    return Dispatched(topic, queue_id, offset, 0, 100, tags_code, 0, 0)


def test_a_matching_arrival_from_another_thread_wakes_the_pull() -> None:
    async def main() -> None:
        holds = PullHolds()
        waiting = asyncio.ensure_future(holds.wait("T", 1, 5, timeout_s=10))
        await asyncio.sleep(0)
        assert holds.parked == 1
        threading.Thread(target=holds.on_dispatch, args=([arrival("T", 0, 5),
                                                          arrival("T", 1, 4)],)).start()
        await asyncio.sleep(0.05)
        assert not waiting.done()  # other queue, older offset: still parked
        threading.Thread(target=holds.on_dispatch, args=([arrival("T", 1, 5)],)).start()
        assert await asyncio.wait_for(waiting, 5) is True
        assert holds.parked == 0

    asyncio.run(main())


def test_tag_filter_decides_which_arrival_wakes() -> None:
    async def main() -> None:
        holds = PullHolds()
        waiting = asyncio.ensure_future(
            holds.wait("T", 0, 0, timeout_s=10, tag_filter=lambda code: code == 7))
        await asyncio.sleep(0)
        holds.on_dispatch([arrival("T", 0, 0, tags_code=3)])
        await asyncio.sleep(0.02)
        assert not waiting.done()
        holds.on_dispatch([arrival("T", 0, 1, tags_code=7)])
        assert await asyncio.wait_for(waiting, 5) is True

    asyncio.run(main())


def test_timeout_and_recheck_and_release() -> None:
    async def main() -> None:
        holds = PullHolds()
        assert await holds.wait("T", 0, 0, timeout_s=0.01) is False
        assert holds.parked == 0
        assert await holds.wait("T", 0, 0, timeout_s=10, recheck=lambda: True) is True
        waiting = asyncio.ensure_future(holds.wait("T", 0, 0, timeout_s=10))
        await asyncio.sleep(0)
        holds.release_all()
        assert await asyncio.wait_for(waiting, 5) is False

    asyncio.run(main())


class CountingHolds(PullHolds):
    """Holds that count the store's calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def on_dispatch(self, batch: Sequence[Dispatched]) -> None:
        self.calls += 1
        super().on_dispatch(batch)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_store_calls_the_holds_only_while_a_pull_is_parked_and_wakes_it(
    tmp_path: Path, backend: str
) -> None:
    """Listening to a real store: appends with no pull parked cost the holds no call; a pull
    parked past the queue's end is woken by an append from another thread (as an embedded
    program's or an off-loop put's)."""

    async def main() -> None:
        log = open_log(backend, tmp_path, StoreConfig(), background=False)
        holds = CountingHolds()
        unsubscribe = holds.listen(log)

        def put() -> None:
            log.append([put_record(new_message("T", b"x", compress_over=None))])

        try:
            for _ in range(3):
                put()
            assert holds.calls == 0
            waiting = asyncio.ensure_future(holds.wait(
                "T", 0, 3, timeout_s=10, recheck=lambda: log.bounds("T", 0)[1] > 3))
            await asyncio.sleep(0)
            assert holds.parked == 1
            await asyncio.to_thread(put)
            assert await asyncio.wait_for(waiting, 5) is True
            assert holds.calls == 1 and holds.parked == 0
            put()
            assert holds.calls == 1
        finally:
            unsubscribe()
            log.close()

    asyncio.run(main())
