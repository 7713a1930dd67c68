"""Every request naming a group is checked against RocketMQ's rule before it is processed,
so no name a client sends can make the broker's offset snapshots unstorable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.record import PURE_PYTHON_VARIABLE
from evq.net.broker.names import (
    CHECK,
    COMPILED,
    KNOWN_GROUPS,
    NamesChecked,
    group_fields,
    names_checked,
)
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient, run
from tests.domain.test_record_kernels import c_compiler
from tests.net.harness import broker
from tests.net.test_broker_server import call, send_fields

HUGE = "x" * (400 * 1024)  # a request header holds at most 512 KiB (protocol.MAX_HEADER)
ILLEGAL = ("g" * 256, "g\n", "g h", "组", HUGE)
KEY = {"topic": "T", "queueId": 0}


@pytest.mark.parametrize("group", ILLEGAL, ids=lambda g: repr(g[:8]))
async def test_requests_naming_an_illegal_group_are_refused_and_nothing_is_lost(
        tmp_path: Path, group: str) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        assert (await call(c, RequestCode.SEND_MESSAGE, send_fields("T"), b"m")).code == 0
        await call(c, RequestCode.UPDATE_CONSUMER_OFFSET,
                   {"consumerGroup": "G", **KEY, "commitOffset": 1})
        refused = [
            await call(c, RequestCode.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": group, **KEY, "commitOffset": 7}),
            await call(c, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, **KEY}),
            await call(c, RequestCode.SEND_MESSAGE, {**send_fields("T"), "producerGroup": group},
                       b"m"),
            await call(c, RequestCode.SEND_MESSAGE_V2,
                       dict(zip("abcdefghijk", send_fields("T").values(), strict=True))
                       | {"a": group}, b"m"),
            await call(c, RequestCode.CONSUMER_SEND_MSG_BACK,
                       {"group": group, "offset": 0, "delayLevel": 0}),
            await call(c, RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "c", "consumerDataSet": [{"groupName": group}]}).encode()),
            await call(c, RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "c", "producerDataSet": [{"groupName": group}]}).encode()),
            await call(c, RequestCode.LOCK_BATCH_MQ, body=json.dumps(
                {"clientId": "c", "consumerGroup": group, "mqSet": []}).encode()),
        ]
        for r in refused:
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert "group name" in (r.remark or "") and len(r.remark or "") < 300
        assert b.ctx is not None
        assert b.ctx.core.offsets() == {("G", "T", 0): 1}
        assert b.ctx.core.snapshot_offsets() == 1  # the snapshot stores: nothing poisoned it
    async with broker(tmp_path) as b:
        assert b.ctx is not None
        assert b.ctx.core.offsets() == {("G", "T", 0): 1}


LEGAL = st.text(st.sampled_from("%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789_-"), min_size=1, max_size=255)


@settings(max_examples=20, deadline=None)
@given(LEGAL)
def test_every_legal_group_name_commits_over_the_wire(tmp_path_factory: pytest.TempPathFactory,
                                                       group: str) -> None:
    async def commit_and_read() -> None:
        async with (broker(tmp_path_factory.mktemp("b")) as b,
                    RemotingClient("127.0.0.1", b.server.port) as c):
            r = await call(c, RequestCode.UPDATE_CONSUMER_OFFSET,
                           {"consumerGroup": group, **KEY, "commitOffset": 3})
            assert r.code == ResponseCode.SUCCESS, r.remark
            r = await call(c, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, **KEY})
            assert r.ext_fields["offset"] == "3"

    run(commit_and_read())




CHECKS = [NamesChecked] + ([] if COMPILED is None else [COMPILED])


def test_the_broker_runs_the_compiled_check_where_it_is_built() -> None:
    assert CHECK is (COMPILED or NamesChecked)
    assert isinstance(names_checked(RequestCode.SEND_MESSAGE_V2, lambda conn, cmd: None), CHECK)
    if COMPILED is None:
        assert os.environ.get(PURE_PYTHON_VARIABLE, "0") not in ("", "0") or c_compiler() is None


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__module__)
def test_the_check_remembers_passed_names_up_to_its_bound_and_refuses_every_illegal_one(
    check: type[NamesChecked],
) -> None:
    """Names that passed are remembered, at most KNOWN_GROUPS of them; an illegal name is
    refused each time it comes, before the bound is reached and after."""
    seen: list[str] = []
    checked = check(group_fields(RequestCode.SEND_MESSAGE_V2),
                    lambda conn, cmd: seen.append(cmd.ext_fields["a"]))

    def send(group: str) -> None:
        checked(None, RemotingCommand(code=RequestCode.SEND_MESSAGE_V2,  # type: ignore[arg-type]
                                      ext_fields={"a": group}))

    names = [f"g{i}" for i in range(KNOWN_GROUPS + 10)]
    for name in [*names, *names]:
        send(name)
        for group in ILLEGAL[:4]:
            with pytest.raises(BrokerError, match="group name"):
                send(group)
    assert seen == [*names, *names]
    # What the check holds: the first KNOWN_GROUPS names, no more.
    assert checked.known == set(names[:KNOWN_GROUPS])


class _Fields(dict[str, str]):
    """Header fields in a dict of another class (the compiled check reads those its other
    way)."""


NAMES = st.one_of(st.sampled_from(["", "G", "g-1", "%RETRY%G", *ILLEGAL[:4]]), LEGAL,
                  st.text(max_size=8))


@pytest.mark.skipif(COMPILED is None, reason="the compiled check is not built (or not wanted)")
@settings(max_examples=300, deadline=None)
@given(code=st.sampled_from([RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_MESSAGE,
                             RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.HEART_BEAT]),
       requests=st.lists(st.tuples(
           st.dictionaries(st.sampled_from(["a", "producerGroup", "consumerGroup", "group",
                                            "topic"]), NAMES, max_size=4),
           st.booleans()), max_size=12))
def test_the_compiled_check_answers_as_the_reference(
    code: int, requests: list[tuple[dict[str, str], bool]]
) -> None:
    """The same requests through both: the same handler calls with the same arguments, the
    same refusals, the same names remembered."""

    def played(check: type[NamesChecked]) -> tuple[list[object], set[str]]:
        trace: list[object] = []
        checked = check(group_fields(code), lambda conn, cmd: ("handled", conn, cmd.ext_fields))
        for fields, exact in requests:
            cmd = RemotingCommand(code=code)
            cmd.ext_fields = dict(fields) if exact else _Fields(fields)
            try:
                trace.append(checked("conn", cmd))  # type: ignore[arg-type]
            except BrokerError as exc:
                trace.append(("refused", exc.code, str(exc)))
        return trace, checked.known

    assert played(COMPILED) == played(NamesChecked)  # type: ignore[arg-type]
