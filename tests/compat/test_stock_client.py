"""The official RocketMQ C++ client (PyPI ``rocketmq`` 0.4.4) against ``evq serve``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.compat.conftest import Served, collect, start_stock, stock


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


def _consumed(lines: list[dict[str, object]]) -> list[dict[str, object]]:
    return [m for m in lines if "seq" in m]


def test_clustering_group_splits_queues_and_delivers_each_message_once(served: Served) -> None:
    stock("produce", served.namesrv, "T_cl", "sync", "1")  # creates the topic
    members = [start_stock("consume", served.namesrv, "T_cl", "G_cl", "clustering", "0", "0",
                           "25") for _ in range(2)]
    time.sleep(12)  # both joined and rebalanced (C++ rebalances every 10 s and on notify)
    stock("produce", served.namesrv, "T_cl", "sync", "40")
    got = [_consumed(collect(p)) for p in members]
    seqs = sorted(int(m["seq"]) for lines in got for m in lines)  # type: ignore[call-overload]
    assert sorted(set(seqs)) == list(range(40)), seqs
    assert all(lines for lines in got), "both members consumed"
    # Who consumed each queue.  On a loaded machine the second member's rebalance can come
    # late: the first member then hands some queues over after consuming from them, and what
    # it had not committed is delivered again (at least once).  So a queue may have had two
    # consumers, but only one hand-over's worth: at most half the queues, never all, and a
    # message is never delivered twice to the same member.
    owners: dict[object, set[int]] = {}
    for member, lines in enumerate(got):
        for m in lines:
            owners.setdefault(m["queue"], set()).add(member)
    handed_over = {q for q, who in owners.items() if len(who) > 1}
    assert len(handed_over) <= len(owners) // 2, owners
    for lines in got:
        mine = [(m["queue"], m["offset"]) for m in lines]
        assert len(mine) == len(set(mine)), "a member got a message twice"
    # the topic-creating message (seq 0, alone at offset 0) may be taken before the split
    assert len(seqs) - len(set(seqs)) <= 1 + sum(
        1 for lines in got for m in lines if m["queue"] in handed_over), seqs


def test_broadcasting_members_each_get_everything(served: Served, tmp_path: Path) -> None:
    """Two members on one host, started together in a home of their own (as on a fresh
    machine, where neither finds its offsets directory made), each keep their own offsets
    file: sharing one, they raced to create its directory and the loser died of SIGSEGV."""
    stock("produce", served.namesrv, "T_bc", "sync", "1")
    home = tmp_path / "home"
    members = [start_stock("consume", served.namesrv, "T_bc", "G_bc", "broadcasting", "0",
                           "0", "15", env={"HOME": str(home)}) for _ in range(2)]
    time.sleep(6)
    stock("produce", served.namesrv, "T_bc", "sync", "10")
    for proc in members:
        seqs = {int(m["seq"]) for m in _consumed(collect(proc))}  # type: ignore[call-overload]
        assert set(range(10)) <= seqs
    assert len(list(home.glob(".rocketmq_offsets/*/G_bc/offsets.Json"))) == 2


def test_orderly_consumer_keeps_queue_order(served: Served) -> None:
    stock("produce", served.namesrv, "T_or", "orderly", "1")
    proc = start_stock("consume", served.namesrv, "T_or", "G_or", "clustering", "1", "0", "15")
    time.sleep(5)
    stock("produce", served.namesrv, "T_or", "orderly", "20")
    lines = _consumed(collect(proc))
    per_queue: dict[object, list[int]] = {}
    for m in lines:
        per_queue.setdefault(m["queue"], []).append(int(m["offset"]))  # type: ignore[call-overload]
    assert per_queue and all(offs == sorted(offs) for offs in per_queue.values())
    assert {int(m["seq"]) for m in lines} >= set(range(20))  # type: ignore[call-overload]


def test_a_failed_message_comes_back_through_the_retry_topic(served: Served) -> None:
    stock("produce", served.namesrv, "T_rt", "sync", "1")
    proc = start_stock("consume", served.namesrv, "T_rt", "G_rt", "clustering", "0", "1", "30")
    lines = collect(proc)
    assert {"failed": "0"} in lines
    again = [m for m in _consumed(lines) if m["seq"] == "0"]
    assert again and again[0]["reconsume"] == 1 and again[0]["topic"] == "T_rt", lines


def test_rebalance_gives_a_leaving_members_queues_to_the_rest(served: Served) -> None:
    stock("produce", served.namesrv, "T_rb", "sync", "1")
    leaving = start_stock("consume", served.namesrv, "T_rb", "G_rb", "clustering", "0", "0",
                          "12")
    staying = start_stock("consume", served.namesrv, "T_rb", "G_rb", "clustering", "0", "0",
                          "40")
    collect(leaving)  # shut down cleanly: UNREGISTER_CLIENT, then the broker notifies
    time.sleep(12)  # the remaining member rebalances (on notify, at the latest in 10 s)
    stock("produce", served.namesrv, "T_rb", "sync", "20")
    seqs = {int(m["seq"]) for m in _consumed(collect(staying))}  # type: ignore[call-overload]
    assert set(range(20)) <= seqs


def test_delay_level_holds_a_message_back(served: Served) -> None:
    sent = stock("produce", served.namesrv, "T_dl", "delay", "3")
    assert [s["status"] for s in sent] == ["OK"] * 3
    assert stock("pull", served.namesrv, "T_dl", "G_dl") == []
    time.sleep(2.5)
    got = stock("pull", served.namesrv, "T_dl", "G_dl")
    assert sorted(int(m["seq"]) for m in got) == [0, 1, 2]  # type: ignore[call-overload]
