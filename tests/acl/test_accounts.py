"""``plain_acl.yml`` as RocketMQ writes it reads into accounts; a bad file is refused by line."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from evq.acl.accounts import PERM_WORDS, AclConfig, AclFileError, Perm, parse_acl

# RocketMQ 4.9's distribution/conf/plain_acl.yml, in its shape.
ROCKETMQ_SAMPLE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 0123456789
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
dataVersion:
  - counter: 3
    timestamp: 1600000000000
"""


def test_rocketmqs_sample_file() -> None:
    config = parse_acl(ROCKETMQ_SAMPLE)
    assert config.globally_trusted("10.10.103.9") and not config.globally_trusted("10.10.104.9")
    plain = config.account("RocketMQ")
    assert plain is not None and not plain.admin
    assert plain.secret_key == "12345678"  # a YAML number, read as the text it is
    assert not plain.white_remote_address.matches("127.0.0.1")
    assert plain.topic_perm("topicA") is Perm.DENY
    assert plain.topic_perm("topicB") == Perm.PUB | Perm.SUB
    assert plain.topic_perm("other") is Perm.DENY
    assert plain.group_perm("groupC") is Perm.SUB
    assert plain.group_perm("other") is Perm.SUB
    assert config.admin_account("RocketMQ") is None
    admin = config.admin_account("rocketmq2")
    assert admin is not None and admin.secret_key == "0123456789"
    assert admin.default_topic_perm is Perm.DENY  # absent: DENY, as RocketMQ
    assert config.account("nobody") is None


def test_an_empty_file_has_no_accounts() -> None:
    assert parse_acl("") == AclConfig()
    assert parse_acl("accounts:\n") == AclConfig()


def test_the_secret_stays_out_of_repr() -> None:
    config = parse_acl("accounts:\n  - {accessKey: someuser, secretKey: s3cret-key}\n")
    assert "s3cret-key" not in repr(config)


@pytest.mark.parametrize(("owned", "needed", "granted"), [
    (Perm.PUB, Perm.PUB, True), (Perm.PUB, Perm.SUB, False), (Perm.SUB, Perm.SUB, True),
    (Perm.PUB | Perm.SUB, Perm.SUB, True), (Perm.DENY, Perm.SUB, False),
    (Perm.DENY | Perm.PUB, Perm.PUB, False), (Perm.PUB, Perm.ANY, True),
    (Perm.SUB, Perm.ANY, True), (Perm.DENY, Perm.ANY, False),
])
def test_permission_bits_as_rocketmq(owned: Perm, needed: Perm, granted: bool) -> None:
    assert owned.grants(needed) is granted


names = st.from_regex(r"[A-Za-z0-9_%|-]{1,20}", fullmatch=True)
keys = st.from_regex(r"[A-Za-z0-9]{7,20}", fullmatch=True)
perm_words = st.sampled_from(sorted(PERM_WORDS))


@given(st.lists(st.tuples(keys, keys, st.booleans(), perm_words, perm_words,
                          st.dictionaries(names, perm_words, max_size=4),
                          st.dictionaries(names, perm_words, max_size=4)),
                max_size=4, unique_by=lambda a: a[0]))
def test_any_well_formed_file_reads_back_what_it_says(accounts: list[tuple]) -> None:  # type: ignore[type-arg]
    doc = {"accounts": [
        {"accessKey": ak, "secretKey": sk, "admin": admin, "defaultTopicPerm": dt,
         "defaultGroupPerm": dg, "topicPerms": [f"{k}={v}" for k, v in tp.items()],
         "groupPerms": [f"{k}={v}" for k, v in gp.items()]}
        for ak, sk, admin, dt, dg, tp, gp in accounts]}
    config = parse_acl(yaml.safe_dump(doc))
    assert sorted(config.accounts) == sorted(a[0] for a in accounts)
    for ak, sk, admin, dt, dg, tp, gp in accounts:
        account = config.accounts[ak]
        assert (account.secret_key, account.admin) == (sk, admin)
        assert (account.default_topic_perm, account.default_group_perm) == (
            PERM_WORDS[dt], PERM_WORDS[dg])
        assert account.topic_perms == {k: PERM_WORDS[v] for k, v in tp.items()}
        assert account.group_perms == {k: PERM_WORDS[v] for k, v in gp.items()}


BAD_FILES = [
    ("accounts:\n  - accessKey: someuser\n    secretKey: abcdefgh\n    topicPerms: [a=PUBX]\n",
     r"line 4: accounts\[0\]\.topicPerms\[0\]: 'PUBX' is not one of"),
    ("accounts:\n  - accessKey: abc\n    secretKey: abcdefgh\n",
     r"line 2: accounts\[0\]\.accessKey: must be at least 7"),
    ("accounts:\n  - accessKey: someuser\n    secretKey: short\n",
     r"line 3: accounts\[0\]\.secretKey: must be at least 7"),
    ("acounts: []\n", r"line 1: acounts: unknown key"),
    ("accounts:\n  - accessKey: someuser\n    secretKey: abcdefgh\n    whiteRemote: 1.2.3.4\n",
     r"line 4: accounts\[0\]\.whiteRemote: unknown key"),
    ("accounts:\n  - accessKey: someuser\n    secretKey: abcdefgh\n"
     "    whiteRemoteAddress: 1.2.3\n",
     r"line 4: accounts\[0\]\.whiteRemoteAddress: bad remote address pattern '1.2.3'"),
    ("globalWhiteRemoteAddresses:\n  - 10.*.1.1\n",
     r"line 2: globalWhiteRemoteAddresses\[0\]: bad remote address pattern"),
    ("accounts: [1]\n", r"line 1: accounts\[0\]: expected a mapping"),
    ("accounts: nope\n", r"line 1: accounts: expected a list"),
    ("accounts: [\n", r"not YAML"),
    ("accounts:\n  - {accessKey: someuser, secretKey: abcdefgh}\n"
     "  - {accessKey: someuser, secretKey: abcdefgh}\n",
     r"line 3: accounts\[1\]\.accessKey: 'someuser' is already used"),
    ("accounts:\n  - {accessKey: someuser, secretKey: abcdefgh, admin: yes please}\n",
     r"line 2: accounts\[0\]\.admin: expected true or false"),
    ("accounts:\n  - {secretKey: abcdefgh}\n", r"line 2: accounts\[0\]\.accessKey: required"),
    ("accounts:\n  - {accessKey: someuser, secretKey: abcdefgh, groupPerms: [g]}\n",
     r"line 2: accounts\[0\]\.groupPerms\[0\]: expected name=PERM"),
    ("accounts:\n  - {accessKey: [x], secretKey: abcdefgh}\n",
     r"line 2: accounts\[0\]\.accessKey: expected a word"),
    ("!!python/object/apply:os.system [echo hi]\n", r"line 1: tag .* is not allowed"),
    ("accounts:\n  - accessKey: !!python/name:os.system\n", r"not YAML"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_a_bad_file_is_refused_naming_line_and_field(text: str, message: str) -> None:
    with pytest.raises(AclFileError, match=message):
        parse_acl(text)
