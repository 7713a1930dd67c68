"""The official RocketMQ C++ client (PyPI ``rocketmq`` 0.4.4) against ``evq serve``."""

from __future__ import annotations

import pytest

from tests.compat.conftest import Served, stock


@pytest.mark.parametrize("mode", ["sync", "async", "orderly"])
def test_stock_producer_sends_and_pull_consumer_reads_back(served: Served, mode: str) -> None:
    sent = stock("produce", served.namesrv, f"T_{mode}", mode, "10")
    assert [s["status"] for s in sent] == ["OK"] * 10, sent
    assert len({s["msg_id"] for s in sent}) == 10
    got = stock("pull", served.namesrv, f"T_{mode}", "G_pull")
    assert sorted(int(m["seq"]) for m in got) == list(range(10))
    assert all(m["body_ok"] for m in got)  # compressed and non-ASCII bodies survive
    assert {m["tags"] for m in got} == {"T0", "T1", "T2"}
    if mode == "orderly":
        assert {m["queue"] for m in got if int(m["seq"]) % 2 == 0} == {
            m["queue"] for m in got if int(m["seq"]) == 0}


def test_stock_batch_and_oneway(served: Served) -> None:
    (batch,) = stock("produce", served.namesrv, "T_batch", "batch", "5")
    assert batch["status"] == "OK"
    stock("produce", served.namesrv, "T_batch", "oneway", "3")
    got = stock("pull", served.namesrv, "T_batch", "G_b")
    assert sorted(int(m["seq"]) for m in got) == [0, 0, 1, 1, 2, 2, 3, 4]
