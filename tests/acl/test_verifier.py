"""The verifier decides as RocketMQ's PlainPermissionManager: white addresses, account,
signature, admin-only codes, then each resource's permission."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evq.acl.accounts import parse_acl
from evq.acl.resources import Resource, needs
from evq.acl.signature import ACCESS_KEY, SIGNATURE, Credentials, signed_fields
from evq.acl.verifier import Allow, Deny, verify
from evq.net.codes import RequestCode as C

CONFIG = parse_acl("""\
globalWhiteRemoteAddresses: [10.9.8.*]
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [orders=PUB, audit=PUB|SUB, closed=DENY]
  - accessKey: consumer1
    secretKey: consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
    topicPerms: [closed=DENY]
    groupPerms: [banned=DENY]
  - accessKey: trusted1
    secretKey: trusted-secret
    whiteRemoteAddress: 192.168.7.*
  - accessKey: operator
    secretKey: operator-secret
    admin: true
""")
PRODUCER = Credentials("producer1", "producer-secret")
CONSUMER = Credentials("consumer1", "consumer-secret")
ADMIN = Credentials("operator", "operator-secret")
IP = "127.0.0.1"


def signed(credentials: Credentials, fields: dict[str, str], body: bytes = b"") -> dict[str, str]:
    return signed_fields(credentials, fields, body)


def test_the_order_of_checks() -> None:
    send = {"producerGroup": "PG", "topic": "orders"}
    assert verify(CONFIG, "10.9.8.7", C.SEND_MESSAGE, send, b"x") == Allow(None)
    assert verify(CONFIG, IP, C.SEND_MESSAGE, send, b"x") == Deny("No accessKey is configured")
    assert verify(CONFIG, IP, C.SEND_MESSAGE, {**send, ACCESS_KEY: "ghost"}, b"x") == Deny(
        "No acl config for ghost")
    # The account's white address stands in for its signature, as RocketMQ.
    assert verify(CONFIG, "192.168.7.1", C.UPDATE_AND_CREATE_TOPIC,
                  {ACCESS_KEY: "trusted1"}, b"") == Allow("trusted1")
    assert verify(CONFIG, IP, C.SEND_MESSAGE, {**send, ACCESS_KEY: "trusted1"}, b"x") == Deny(
        "Check signature failed for accessKey=trusted1")
    assert verify(CONFIG, IP, C.SEND_MESSAGE, signed(PRODUCER, send, b"x"), b"x") == Allow(
        "producer1")
    assert verify(CONFIG, IP, C.SEND_MESSAGE, signed(PRODUCER, send, b"x"), b"y") == Deny(
        "Check signature failed for accessKey=producer1")


@pytest.mark.parametrize(("code", "fields", "body", "who", "allowed"), [
    (C.SEND_MESSAGE_V2, {"a": "PG", "b": "orders"}, b"", PRODUCER, True),
    # Both names: checked as the send processor reads it (evq.net.send_header.parse): a V2
    # header's topic is "b", as Java decodes SendMessageRequestHeaderV2; "topic" is ignored.
    (C.SEND_MESSAGE_V2, {"a": "PG", "b": "other", "topic": "orders"}, b"", PRODUCER, False),
    (C.SEND_MESSAGE_V2, {"a": "PG", "b": "orders", "topic": "other"}, b"", PRODUCER, True),
    (C.SEND_BATCH_MESSAGE, {"a": "PG", "b": "closed"}, b"", PRODUCER, False),
    (C.SEND_MESSAGE, {"topic": "closed"}, b"", ADMIN, True),
    (C.SEND_MESSAGE, {"topic": "RMQ_SYS_TRACE_TOPIC"}, b"", PRODUCER, True),
    (C.SEND_MESSAGE, {"topic": "%RETRY%G1"}, b"", CONSUMER, True),
    (C.SEND_MESSAGE, {"topic": "%RETRY%banned"}, b"", CONSUMER, False),
    (C.SEND_MESSAGE, {"topic": "orders"}, b"", CONSUMER, False),
    (C.PULL_MESSAGE, {"topic": "orders", "consumerGroup": "G1"}, b"", CONSUMER, True),
    (C.PULL_MESSAGE, {"topic": "closed", "consumerGroup": "G1"}, b"", CONSUMER, False),
    (C.PULL_MESSAGE, {"topic": "orders", "consumerGroup": "banned"}, b"", CONSUMER, False),
    (C.PULL_MESSAGE, {"topic": "audit", "consumerGroup": "G1"}, b"", PRODUCER, False),
    (C.GET_MAX_OFFSET, {"topic": "orders", "queueId": "0"}, b"", PRODUCER, True),
    (C.GET_MAX_OFFSET, {"topic": "closed", "queueId": "0"}, b"", PRODUCER, False),
    (C.HEART_BEAT, {}, json.dumps({"clientID": "c", "consumerDataSet": [
        {"groupName": "G1", "subscriptionDataSet": [{"topic": "orders"}]}]}).encode(),
     CONSUMER, True),
    (C.HEART_BEAT, {}, json.dumps({"clientID": "c", "consumerDataSet": [
        {"groupName": "G1", "subscriptionDataSet": [{"topic": "closed"}]}]}).encode(),
     CONSUMER, False),
    (C.HEART_BEAT, {}, b"{not json", CONSUMER, False),
    (C.LOCK_BATCH_MQ, {}, json.dumps({"consumerGroup": "banned", "mqSet": []}).encode(),
     CONSUMER, False),
    (C.UPDATE_AND_CREATE_TOPIC, {"topic": "orders"}, b"", PRODUCER, False),
    (C.UPDATE_AND_CREATE_TOPIC, {"topic": "orders"}, b"", ADMIN, True),
    (C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "o", "group": "G1"}, b"", CONSUMER, False),
    (C.GET_BROKER_CLUSTER_ACL_CONFIG, {}, b"", CONSUMER, False),
    (C.GET_BROKER_RUNTIME_INFO, {}, b"", PRODUCER, True),
])
def test_permissions(code: int, fields: dict[str, str], body: bytes, who: Credentials,
                     allowed: bool) -> None:
    decision = verify(CONFIG, IP, code, signed(who, fields, body), body)
    assert isinstance(decision, Allow) is allowed, decision


def test_a_retry_topic_is_its_group() -> None:
    assert needs(C.PULL_MESSAGE, {"topic": "%RETRY%G", "consumerGroup": "G"}, b"") == [
        (Resource("G", group=True), needs(C.PULL_MESSAGE, {"topic": "x"}, b"")[0][1])] * 2


field_names = st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1,
                      max_size=12)
headers = st.dictionaries(field_names, st.text(max_size=30), max_size=6)
codes = st.sampled_from(sorted(C))


@settings(max_examples=500)
@given(codes, headers, st.binary(max_size=64), st.one_of(st.none(), st.text(max_size=40)),
       st.sampled_from(["producer1", "consumer1", "operator", "ghost", ""]))
def test_a_forged_signature_never_passes(code: int, fields: dict[str, str], body: bytes,
                                         signature: str | None, access_key: str) -> None:
    forged = {**fields, ACCESS_KEY: access_key}
    if signature is not None:
        forged[SIGNATURE] = signature
    decision = verify(CONFIG, IP, code, forged, body)
    assert isinstance(decision, Deny)


@settings(max_examples=300)
@given(codes, headers, st.binary(max_size=64), st.integers(0, 2), st.integers(0, 2))
def test_a_request_signed_by_one_account_and_replayed_as_another_is_refused(
        code: int, fields: dict[str, str], body: bytes, signer: int, claimed: int) -> None:
    accounts = [PRODUCER, CONSUMER, ADMIN]
    request = signed(accounts[signer], fields, body)
    replayed = {**request, ACCESS_KEY: accounts[claimed].access_key}
    decision = verify(CONFIG, IP, code, replayed, body)
    if signer != claimed:
        assert decision == Deny(
            f"Check signature failed for accessKey={accounts[claimed].access_key}")
    else:
        assert not (isinstance(decision, Deny) and "signature" in decision.reason)
