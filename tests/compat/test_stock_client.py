"""The official RocketMQ C++ client (PyPI ``rocketmq`` 0.4.4) against ``evq serve``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat.conftest import Driver, Served, stock, warm_up
from tests.waiting import wait_for


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


QUEUES = 4  # an auto-created topic's defaultTopicQueueNums
LIFETIME = "120"  # seconds: a consumer's bound; the tests stop theirs once they have their answer


def consumer(served: Served, topic: str, group: str, model: str = "clustering", *,
             orderly: bool = False, fail: bool = False,
             env: dict[str, str] | None = None) -> Driver:
    return Driver("consume", served.namesrv, topic, group, model, "1" if orderly else "0",
                  "1" if fail else "0", LIFETIME, env=env)


def test_clustering_group_splits_queues_and_delivers_each_message_once(served: Served) -> None:
    stock("produce", served.namesrv, "T_cl", "sync", "1")  # creates the topic
    members = [consumer(served, "T_cl", "G_cl") for _ in range(2)]
    warm_up(served.namesrv, "T_cl",
            lambda: all(m.warm_queues() for m in members)
            and len(set().union(*(m.warm_queues() for m in members))) == QUEUES,
            "both members consuming, every queue pulled")
    stock("produce", served.namesrv, "T_cl", "sync", "40")
    wait_for("the 40 messages", lambda: set(range(40)) <= set().union(
        *(m.seqs() for m in members)))
    got = [[m for m in member.stop() if "seq" in m and m["seq"].isdigit()]
           for member in members]
    seqs = sorted(int(m["seq"]) for lines in got for m in lines)
    assert all(lines for lines in got), "both members consumed"
    # Who consumed each queue.  On a loaded machine a member's rebalance can come late: the
    # other then hands some queues over after consuming from them, and what it had not
    # committed is delivered again (at least once).  So a queue may have had two consumers,
    # but only one hand-over's worth: at most half the queues, never all, and a message is
    # never delivered twice to the same member.
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
    members = [consumer(served, "T_bc", "G_bc", "broadcasting", env={"HOME": str(home)})
               for _ in range(2)]
    warm_up(served.namesrv, "T_bc", lambda: all(len(m.warm_queues()) == QUEUES for m in members),
            "both members consuming every queue")
    stock("produce", served.namesrv, "T_bc", "sync", "10")
    for i, member in enumerate(members):
        wait_for(f"member {i} to get the 10 messages", lambda m=member: set(range(10)) <= m.seqs())
    for member in members:
        member.stop()
    assert len(list(home.glob(".rocketmq_offsets/*/G_bc/offsets.Json"))) == 2


def test_orderly_consumer_keeps_queue_order(served: Served) -> None:
    stock("produce", served.namesrv, "T_or", "orderly", "1")
    member = consumer(served, "T_or", "G_or", orderly=True)
    warm_up(served.namesrv, "T_or", lambda: len(member.warm_queues()) == QUEUES,
            "the member consuming (and locking) every queue")
    stock("produce", served.namesrv, "T_or", "orderly", "20")
    wait_for("the 20 messages", lambda: set(range(20)) <= member.seqs())
    per_queue: dict[object, list[int]] = {}
    for m in member.stop():
        if "seq" in m:
            per_queue.setdefault(m["queue"], []).append(int(m["offset"]))
    assert per_queue and all(offs == sorted(offs) for offs in per_queue.values())


def test_a_failed_message_comes_back_through_the_retry_topic(served: Served) -> None:
    stock("produce", served.namesrv, "T_rt", "sync", "1")
    member = consumer(served, "T_rt", "G_rt", fail=True)
    wait_for("message 0 to come back", lambda: any(
        m["seq"] == "0" and m["reconsume"] == 1 for m in member.received()), within=60)
    lines = member.stop()
    assert {"failed": "0"} in lines
    again = [m for m in lines if m.get("seq") == "0"]
    assert again[0]["reconsume"] == 1 and again[0]["topic"] == "T_rt", lines


def test_rebalance_gives_a_leaving_members_queues_to_the_rest(served: Served) -> None:
    stock("produce", served.namesrv, "T_rb", "sync", "1")
    leaving, staying = consumer(served, "T_rb", "G_rb"), consumer(served, "T_rb", "G_rb")
    warm_up(served.namesrv, "T_rb",
            lambda: bool(leaving.warm_queues()) and bool(staying.warm_queues()),
            "both members consuming")
    leaving.stop()  # shut down cleanly: UNREGISTER_CLIENT, then the broker notifies
    since = len(staying.lines)
    warm_up(served.namesrv, "T_rb", lambda: len(staying.warm_queues(since)) == QUEUES,
            "the remaining member consuming every queue")
    stock("produce", served.namesrv, "T_rb", "sync", "20")
    wait_for("the 20 messages", lambda: set(range(20)) <= staying.seqs())
    staying.stop()


def test_delay_level_holds_a_message_back(served: Served) -> None:
    sent = stock("produce", served.namesrv, "T_dl", "delay", "3")  # level 2: 5 s
    assert [s["status"] for s in sent] == ["OK"] * 3
    assert stock("pull", served.namesrv, "T_dl", "G_dl") == []
    got: list[dict[str, object]] = []

    def arrived() -> bool:
        got[:] = stock("pull", served.namesrv, "T_dl", "G_dl")
        return len(got) >= 3

    wait_for("the delayed messages", arrived, within=60, every=0.5)
    assert sorted(int(str(m["seq"])) for m in got) == [0, 1, 2]
