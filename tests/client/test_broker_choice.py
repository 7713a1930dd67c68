"""Which broker of a group a consumer pulls from and commits to (seed 000)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evq.client.broker_choice import BrokerChoice
from evq.domain.clock import ManualClock
from evq.domain.queues import MessageQueue
from evq.net.routes import MASTER_ID

Q = MessageQueue("T", "broker-a", 0)
GROUP = {0: "m:1", 1: "s1:1", 2: "s2:1"}


def test_pulls_follow_the_suggestion_and_go_back_to_the_master() -> None:
    choice = BrokerChoice(ManualClock())
    assert choice.pull_target(Q, GROUP) == (0, "m:1")
    choice.suggest(Q, 2)
    assert choice.pull_target(Q, GROUP) == (2, "s2:1")
    assert choice.pull_target(MessageQueue("T", "broker-a", 1), GROUP) == (0, "m:1")
    choice.suggest(Q, MASTER_ID)
    assert choice.pull_target(Q, GROUP) == (0, "m:1")


def test_a_failed_master_is_avoided_for_a_while() -> None:
    clock = ManualClock()
    choice = BrokerChoice(clock, down_for_s=5)
    choice.failed("m:1")
    assert choice.pull_target(Q, GROUP) == (1, "s1:1")
    assert choice.offset_target(GROUP) == "s1:1"
    clock.advance(5)
    assert choice.pull_target(Q, GROUP) == (0, "m:1")
    assert choice.offset_target(GROUP) == "m:1"


def test_a_suggested_broker_missing_from_the_routes_falls_back() -> None:
    choice = BrokerChoice(ManualClock())
    choice.suggest(Q, 7)
    assert choice.pull_target(Q, GROUP) == (0, "m:1")
    assert choice.pull_target(Q, {}) is None
    assert choice.offset_target({}) is None


@given(st.dictionaries(st.integers(0, 4), st.sampled_from(["a:1", "b:1", "c:1", "d:1"]),
                       min_size=1),
       st.sets(st.sampled_from(["a:1", "b:1", "c:1", "d:1"])), st.integers(0, 4))
def test_targets_are_live_members_of_the_group_whenever_one_is(
    addrs: dict[int, str], down: set[str], suggested: int
) -> None:
    choice = BrokerChoice(ManualClock())
    for addr in down:
        choice.failed(addr)
    choice.suggest(Q, suggested)
    target = choice.pull_target(Q, addrs)
    assert target is not None and addrs[target[0]] == target[1]
    live = {i for i, a in addrs.items() if a not in down}
    if live:
        assert target[0] in live
        if suggested in live:
            assert target[0] == suggested
        assert choice.offset_target(addrs) == addrs[min(live)]
