"""A broker started with ``--acl`` checks every request it serves: each request code is tried
unsigned, with a wrong signature, by an account without the permission and by one with it,
against a real broker process; a replayed request and an edited account file too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from evq.acl.signature import ACCESS_KEY, SIGNATURE, Credentials, signed_fields
from evq.domain.codes import ResponseCode
from evq.domain.message import encode_properties
from evq.net.codes import RequestCode as C
from evq.net.headers.admin import CreateTopicRequest
from evq.net.protocol import RemotingCommand
from evq.net.security import ClientSecurity
from evq.net.transport import RemotingClient, run, split_address
from tests.processes import Running, run_evq, running_evq
from tests.waiting import wait_for

TIMEOUT = 10.0
ADMIN = Credentials("operator1", "operator-secret")
USER = Credentials("appuser1", "appuser-secret")
GHOST = Credentials("ghostuser", "ghost-secret")
ACCOUNTS = """\
accounts:
  - accessKey: operator1
    secretKey: operator-secret
    admin: true
  - accessKey: appuser1
    secretKey: appuser-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [open=PUB|SUB]
    groupPerms: [G=SUB]
"""


def send(topic: str) -> dict[str, object]:
    return {"producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 0,
            "flag": 0, "properties": encode_properties({}), "reconsumeTimes": 0}


def send_v2(topic: str) -> dict[str, object]:
    return {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0,
            "i": encode_properties({}), "j": 0}


def pull(topic: str, group: str) -> dict[str, object]:
    return {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": 0,
            "maxMsgNums": 1, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0}


def heartbeat(topic: str, group: str) -> bytes:
    return json.dumps({"clientID": "c1", "producerDataSet": [], "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY",
         "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
         "subscriptionDataSet": [{"topic": topic, "subString": "*", "subVersion": 0}]}]}
    ).encode()


def lock(topic: str, group: str) -> bytes:
    return json.dumps({"consumerGroup": group, "clientId": "c1", "mqSet": [
        {"topic": topic, "brokerName": "broker-a", "queueId": 0}]}).encode()


def group_config(name: str) -> bytes:
    return json.dumps({"groupName": name}).encode()


@attrs.frozen
class Case:
    """One request code: the request that is permitted (``by``), and the one that is not,
    sent by ``denied_by``: a resource the user lacks, an admin-only code from the user, or,
    for codes any known account may send, an account the file does not know."""

    code: int
    fields: dict[str, object]
    body: bytes = b""
    by: Credentials = USER
    denied_fields: dict[str, object] | None = None
    denied_body: bytes | None = None
    denied_by: Credentials = USER


OFFSET = {"consumerGroup": "G", "topic": "open", "queueId": 0}
DENIED_OFFSET = {"consumerGroup": "H", "topic": "open", "queueId": 0}
CASES = [
    Case(C.SEND_MESSAGE, send("open"), b"x", denied_fields=send("closed")),
    Case(C.SEND_MESSAGE_V2, send_v2("open"), b"x", denied_fields=send_v2("closed")),
    Case(C.SEND_BATCH_MESSAGE, send_v2("open"), b"x", denied_fields=send_v2("closed")),
    Case(C.PULL_MESSAGE, pull("open", "G"), denied_fields=pull("open", "H")),
    Case(C.QUERY_MESSAGE, {"topic": "open", "key": "k", "maxNum": 1, "beginTimestamp": 0,
                           "endTimestamp": 1}, denied_fields={"topic": "closed", "key": "k"}),
    Case(C.QUERY_CONSUMER_OFFSET, OFFSET, denied_fields=DENIED_OFFSET),
    Case(C.UPDATE_CONSUMER_OFFSET, {**OFFSET, "commitOffset": 0},
         denied_fields={**DENIED_OFFSET, "commitOffset": 0}),
    Case(C.GET_MAX_OFFSET, {"topic": "open", "queueId": 0},
         denied_fields={"topic": "closed", "queueId": 0}),
    Case(C.GET_MIN_OFFSET, {"topic": "open", "queueId": 0},
         denied_fields={"topic": "closed", "queueId": 0}),
    Case(C.GET_EARLIEST_MSG_STORETIME, {"topic": "open", "queueId": 0},
         denied_fields={"topic": "closed", "queueId": 0}),
    Case(C.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "open", "queueId": 0, "timestamp": 0},
         denied_fields={"topic": "closed", "queueId": 0, "timestamp": 0}),
    Case(C.VIEW_MESSAGE_BY_ID, {"offset": 0}, denied_by=GHOST),
    Case(C.HEART_BEAT, {}, heartbeat("open", "G"), denied_body=heartbeat("closed", "G")),
    Case(C.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "G"},
         denied_fields={"clientID": "c1", "consumerGroup": "H"}),
    Case(C.CONSUMER_SEND_MSG_BACK, {"group": "G", "offset": 0, "delayLevel": 0},
         denied_fields={"group": "H", "offset": 0, "delayLevel": 0}),
    Case(C.END_TRANSACTION, {"producerGroup": "PG", "tranStateTableOffset": 0,
                             "commitLogOffset": 0, "commitOrRollback": 8}, denied_by=GHOST),
    Case(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"},
         denied_fields={"consumerGroup": "H"}),
    Case(C.LOCK_BATCH_MQ, {}, lock("open", "G"), denied_body=lock("closed", "G")),
    Case(C.UNLOCK_BATCH_MQ, {}, lock("open", "G"), denied_body=lock("open", "H")),
    Case(C.GET_ALL_TOPIC_CONFIG, {}, denied_by=GHOST),
    Case(C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}, denied_by=GHOST),
    Case(C.GET_ALL_CONSUMER_OFFSET, {}, denied_by=GHOST),
    Case(C.GET_ALL_DELAY_OFFSET, {}, denied_by=GHOST),
    Case(C.GET_BROKER_RUNTIME_INFO, {}, denied_by=GHOST),
    Case(C.GET_CONSUME_STATS, {"consumerGroup": "G", "topic": "open"},
         denied_fields={"consumerGroup": "G", "topic": "closed"}),
    Case(C.GET_TOPIC_STATS_INFO, {"topic": "open"}, denied_fields={"topic": "closed"}),
    Case(C.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "G"},
         denied_fields={"consumerGroup": "H"}),
    Case(C.UPDATE_AND_CREATE_TOPIC, {"topic": "scratch", "readQueueNums": 1,
                                     "writeQueueNums": 1, "perm": 6}, by=ADMIN),
    Case(C.DELETE_TOPIC_IN_BROKER, {"topic": "scratch"}, by=ADMIN),
    Case(C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, group_config("scratch"), by=ADMIN),
    Case(C.DELETE_SUBSCRIPTIONGROUP, {"groupName": "scratch"}, by=ADMIN),
    Case(C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "open", "group": "G", "timestamp": 0,
                                           "isForce": "true"}, by=ADMIN),
]
SERVED = {case.code for case in CASES}


@attrs.frozen
class AclBroker:
    address: str
    acl_file: Path
    log: Path
    process: Running


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    data = tmp_path_factory.mktemp("acl-broker")
    acl_file = data / "accounts.yml"
    acl_file.write_text(ACCOUNTS)
    log = data / "broker.log"
    with log.open("w") as stderr, running_evq(
            "--log-level", "warning", "broker", "--port", "0", "--data", str(data), "--acl",
            "--acl-file", str(acl_file), servers=1, stderr=stderr) as proc:
        broker = AclBroker(proc.addresses["broker"], acl_file, log, proc)
        for topic in ("open", "closed"):
            answer = request(broker, ADMIN, C.UPDATE_AND_CREATE_TOPIC, CreateTopicRequest.write(
                topic=topic, read_queue_nums=1, write_queue_nums=1))
            assert answer.code == ResponseCode.SUCCESS, answer.remark
        yield broker


def request(broker: AclBroker, credentials: Credentials | None, code: int,
            fields: dict[str, object], body: bytes = b"", *,
            tamper: bool = False) -> RemotingCommand:
    """One request on a fresh connection, signed by ``credentials`` (unsigned when None);
    ``tamper`` sends it with its signature spoilt."""
    cmd = RemotingCommand.request(code, fields, body)
    security = None
    if tamper:
        assert credentials is not None
        good = signed_fields(credentials, cmd.ext_fields, body)[SIGNATURE]
        cmd.ext_fields = {**cmd.ext_fields, ACCESS_KEY: credentials.access_key,
                          SIGNATURE: good[:-2] + ("AA" if good[-2:] != "AA" else "BB")}
    elif credentials is not None:
        security = ClientSecurity(credentials=credentials)

    async def main() -> RemotingCommand:
        async with RemotingClient(*split_address(broker.address), security=security) as client:
            return await client.invoke(cmd, TIMEOUT)

    return run(main())


def ids(case: Case) -> str:
    return C(case.code).name


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_without_credentials_every_code_is_refused(acl_broker: AclBroker, case: Case) -> None:
    answer = request(acl_broker, None, case.code, case.fields, case.body)
    assert (answer.code, answer.remark) == (ResponseCode.NO_PERMISSION,
                                            "No accessKey is configured")


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_a_wrong_signature_is_refused(acl_broker: AclBroker, case: Case) -> None:
    answer = request(acl_broker, case.by, case.code, case.fields, case.body, tamper=True)
    assert (answer.code, answer.remark) == (
        ResponseCode.NO_PERMISSION, f"Check signature failed for accessKey={case.by.access_key}")


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_without_the_permission_a_code_is_refused(acl_broker: AclBroker, case: Case) -> None:
    fields = case.fields if case.denied_fields is None else case.denied_fields
    body = case.body if case.denied_body is None else case.denied_body
    if case.by == ADMIN:
        assert case.denied_by == USER
    else:
        assert (fields, body, case.denied_by) != (case.fields, case.body, case.by)
    answer = request(acl_broker, case.denied_by, case.code, fields, body)
    assert answer.code == ResponseCode.NO_PERMISSION, answer.remark
    if case.by == ADMIN:
        expected = f"Need admin permission for request code={case.code}"
    elif case.denied_by == GHOST:
        expected = "No acl config for ghostuser"
    else:
        expected = "No permission for "
    assert answer.remark.startswith(expected), answer.remark


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_with_the_permission_a_code_is_served(acl_broker: AclBroker, case: Case) -> None:
    answer = request(acl_broker, case.by, case.code, case.fields, case.body)
    assert answer.code != ResponseCode.NO_PERMISSION, answer.remark


@pytest.mark.parametrize("code", sorted(set(C) - SERVED), ids=lambda c: C(c).name)
def test_every_code_the_broker_serves_is_in_the_matrix(acl_broker: AclBroker, code: int
                                                       ) -> None:
    # A processor added without a row above would be served here, and this would fail.
    answer = request(acl_broker, ADMIN, code, {})
    assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, (code, answer.remark)


def test_a_request_replayed_with_another_access_key_is_refused(acl_broker: AclBroker) -> None:
    cmd = RemotingCommand.request(C.SEND_MESSAGE, send("open"), b"payload")
    by_admin = signed_fields(ADMIN, cmd.ext_fields, cmd.body)
    replayed = request(acl_broker, None, C.SEND_MESSAGE,
                       {**by_admin, ACCESS_KEY: USER.access_key}, b"payload")
    assert (replayed.code, replayed.remark) == (
        ResponseCode.NO_PERMISSION, f"Check signature failed for accessKey={USER.access_key}")
    original = request(acl_broker, None, C.SEND_MESSAGE, by_admin, b"payload")
    assert original.code == ResponseCode.SUCCESS, original.remark


def test_an_edited_account_file_applies_and_a_bad_one_keeps_the_accounts(
        acl_broker: AclBroker) -> None:
    def may_pull_closed() -> bool:
        return request(acl_broker, USER, C.GET_MAX_OFFSET,
                       {"topic": "closed", "queueId": 0}).code == ResponseCode.SUCCESS

    assert not may_pull_closed()
    original = acl_broker.acl_file.read_text()
    try:
        acl_broker.acl_file.write_text(original.replace("[open=PUB|SUB]",
                                                        "[open=PUB|SUB, closed=SUB]"))
        wait_for("the broker to apply the edited account file", may_pull_closed, within=15)
        acl_broker.acl_file.write_text(original.replace("secretKey: appuser-secret",
                                                        "secretKey: short"))
        wait_for("the broker to log the bad account file",
                 lambda: "acl_file_invalid_keeping_accounts" in acl_broker.log.read_text(),
                 within=15)
        assert may_pull_closed(), "a bad file must leave the accounts in force"
        # The next good edit applies.
        acl_broker.acl_file.write_text(original)
        wait_for("the broker to apply the restored file", lambda: not may_pull_closed(), within=15)
    finally:
        acl_broker.acl_file.write_text(original)


def test_acl_on_with_a_missing_or_bad_file_refuses_to_start(tmp_path: Path) -> None:
    missing = run_evq("broker", "--port", "0", "--data", str(tmp_path), "--acl")
    assert missing.returncode != 0
    default = tmp_path / "conf" / "plain_acl.yml"
    assert f"cannot read ACL file {default}" in missing.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text("accounts:\n  - accessKey: someone\n    secretKey: x\n")
    result = run_evq("broker", "--port", "0", "--data", str(tmp_path), "--acl-file", str(bad),
                     env={"EVQ_ACL_ENABLE": "true"})
    assert result.returncode != 0
    assert f"{bad}: line 3: accounts[0].secretKey: must be at least 7" in result.stderr
