"""The accounts of RocketMQ's ``plain_acl.yml``, read into a frozen model.

The file, as RocketMQ 4.x writes and reads it::

    globalWhiteRemoteAddresses:        # clients at these addresses skip every check
      - 10.10.103.*
    accounts:
      - accessKey: RocketMQ            # more than 6 characters, unique
        secretKey: 12345678            # more than 6 characters
        whiteRemoteAddress: 192.168.0.*   # this account's clients here skip the signature
        admin: false                   # admin: may run admin-only codes, has every resource
        defaultTopicPerm: DENY         # for topics not in topicPerms (absent: DENY)
        defaultGroupPerm: SUB          # for groups not in groupPerms (absent: DENY)
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB]
    dataVersion: [...]                 # written by RocketMQ's admin tools; ignored here

Address patterns are those of :mod:`evq.acl.addresses`.  RocketMQ reads an unknown permission
word as DENY without a word; here it is an error, as is an unknown key, a duplicate access key,
or a wrong type: :class:`AclFileError` names the line and the field, and a file that does not
parse is never half applied.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

import attrs
import yaml

from evq.acl.addresses import NOBODY, AddressPattern, AddressPatternError, parse_address_pattern

KEY_MIN_LENGTH: Final = 7  # RocketMQ refuses keys of 6 characters or fewer


class AclFileError(ValueError):
    """An account file that cannot be used; the message names the line and the field."""


class Perm(enum.IntFlag):
    """RocketMQ's ``Permission`` bits.  DENY in an owned permission refuses whatever else it
    holds; ANY (only ever needed, never owned) is satisfied by PUB or SUB."""

    NONE = 0
    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8

    def grants(self, needed: Perm) -> bool:
        """Whether an account owning ``self`` may do what needs ``needed``."""
        if self & Perm.DENY:
            return False
        if needed & Perm.ANY:
            return bool(self & (Perm.PUB | Perm.SUB))
        return bool(self & needed)


PERM_WORDS: Final[Mapping[str, Perm]] = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
}


@attrs.frozen(slots=True)
class Account:
    """One account: its key pair, where it is trusted, and what it may touch."""

    access_key: str
    secret_key: str = attrs.field(repr=False)
    white_remote_address: AddressPattern = NOBODY
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: Mapping[str, Perm] = attrs.field(factory=dict, hash=False)
    group_perms: Mapping[str, Perm] = attrs.field(factory=dict, hash=False)

    def topic_perm(self, topic: str) -> Perm:
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> Perm:
        return self.group_perms.get(group, self.default_group_perm)


@attrs.frozen(slots=True)
class AclConfig:
    """A whole account file: the global white list and the accounts by access key."""

    global_white_remote_addresses: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = attrs.field(factory=dict, hash=False)

    def account(self, access_key: str) -> Account | None:
        return self.accounts.get(access_key)

    def admin_account(self, access_key: str) -> Account | None:
        """The account of ``access_key`` if it is an admin: what the name server and the HA
        handshake trust for operations only an operator may run."""
        account = self.accounts.get(access_key)
        return account if account is not None and account.admin else None

    def globally_trusted(self, ip: str) -> bool:
        return any(p.matches(ip) for p in self.global_white_remote_addresses)


_TOP_KEYS: Final = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
_ACCOUNT_KEYS: Final = frozenset({"accessKey", "secretKey", "whiteRemoteAddress", "admin",
                                  "defaultTopicPerm", "defaultGroupPerm", "topicPerms",
                                  "groupPerms"})


_PLAIN_TAGS: Final = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})


@attrs.frozen(slots=True)
class _Value:
    """A YAML value with the line it starts on, for error messages."""

    value: Any
    line: int
    text: str = ""  # a scalar as written: YAML reads 0123 as a number, RocketMQ as "0123"


def parse_acl(text: str) -> AclConfig:
    """``plain_acl.yml`` text as an :class:`AclConfig`; :class:`AclFileError` otherwise.
    An empty file is a valid file with no accounts (every request from outside the global
    white list is then refused)."""
    try:
        root = _load(text)
    except yaml.YAMLError as exc:
        raise AclFileError(f"not YAML: {exc}") from None
    if root is None or root.value is None:
        return AclConfig()
    top = _mapping(root, "the file")
    for key, value in top.items():
        if key not in _TOP_KEYS:
            raise _error(value, key, f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})")
    white = _list(top.get("globalWhiteRemoteAddresses"), "globalWhiteRemoteAddresses")
    patterns = tuple(_pattern(v, f"globalWhiteRemoteAddresses[{i}]")
                     for i, v in enumerate(white))
    accounts: dict[str, Account] = {}
    for i, node in enumerate(_list(top.get("accounts"), "accounts")):
        account = _account(node, f"accounts[{i}]")
        if account.access_key in accounts:
            raise _error(node, f"accounts[{i}].accessKey",
                         f"{account.access_key!r} is already used by another account")
        accounts[account.access_key] = account
    return AclConfig(patterns, accounts)


def _load(text: str) -> _Value | None:
    """The document's node tree as plain values with lines; safe constructors only."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _plain(loader, node)
    finally:
        loader.dispose()


def _plain(loader: yaml.SafeLoader, node: yaml.Node) -> _Value:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.CollectionNode) and node.tag not in _PLAIN_TAGS:
        raise AclFileError(f"line {line}: tag {node.tag} is not allowed here")
    if isinstance(node, yaml.MappingNode):
        out: dict[str, _Value] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise AclFileError(f"line {key_node.start_mark.line + 1}: keys are words, "
                                   f"not {key!r}")
            out[key] = _plain(loader, value_node)
        return _Value(out, line)
    if isinstance(node, yaml.SequenceNode):
        return _Value([_plain(loader, item) for item in node.value], line)
    return _Value(loader.construct_object(node, deep=True), line, str(node.value))


def _error(at: _Value, field: str, why: str) -> AclFileError:
    return AclFileError(f"line {at.line}: {field}: {why}")


def _mapping(node: _Value, field: str) -> dict[str, _Value]:
    if not isinstance(node.value, dict):
        raise _error(node, field, "expected a mapping of key: value")
    return node.value


def _list(node: _Value | None, field: str) -> list[_Value]:
    if node is None or node.value is None:
        return []
    if not isinstance(node.value, list):
        raise _error(node, field, "expected a list")
    return node.value


def _text(node: _Value | None, field: str, *, default: str | None = None) -> str:
    if node is None or node.value is None:
        if default is None:
            raise AclFileError(f"{field}: required")
        return default
    if isinstance(node.value, bool) or not isinstance(node.value, str | int | float):
        raise _error(node, field, f"expected a word, not {node.value!r}")
    return node.value if isinstance(node.value, str) else node.text


def _pattern(node: _Value | None, field: str) -> AddressPattern:
    try:
        return parse_address_pattern(_text(node, field, default=""))
    except AddressPatternError as exc:
        assert node is not None  # the empty default always parses
        raise _error(node, field, str(exc)) from None


def _perm(node: _Value | None, field: str, word: str | None = None) -> Perm:
    if node is None or node.value is None:
        return Perm.DENY
    text = (word if word is not None else _text(node, field)).strip()
    perm = PERM_WORDS.get(text)
    if perm is None:
        raise _error(node, field, f"{text!r} is not one of {', '.join(PERM_WORDS)}")
    return perm


def _resource_perms(node: _Value | None, field: str) -> dict[str, Perm]:
    out: dict[str, Perm] = {}
    for i, item in enumerate(_list(node, field)):
        name, eq, word = _text(item, f"{field}[{i}]").partition("=")
        if not eq or not name.strip() or "=" in word:
            raise _error(item, f"{field}[{i}]", "expected name=PERM, as topicA=PUB|SUB")
        out[name.strip()] = _perm(item, f"{field}[{i}]", word)
    return out


def _account(node: _Value, field: str) -> Account:
    fields = _mapping(node, field)
    for key, value in fields.items():
        if key not in _ACCOUNT_KEYS:
            raise _error(value, f"{field}.{key}",
                         f"unknown key (known: {', '.join(sorted(_ACCOUNT_KEYS))})")
    keys = {}
    for key in ("accessKey", "secretKey"):
        value = fields.get(key)
        if value is None:
            raise _error(node, f"{field}.{key}", "required")
        keys[key] = _text(value, f"{field}.{key}")
        if len(keys[key]) < KEY_MIN_LENGTH:
            raise _error(value, f"{field}.{key}",
                         f"must be at least {KEY_MIN_LENGTH} characters, as RocketMQ requires")
    admin = fields.get("admin")
    if admin is not None and not isinstance(admin.value, bool):
        raise _error(admin, f"{field}.admin", f"expected true or false, not {admin.value!r}")
    return Account(
        access_key=keys["accessKey"],
        secret_key=keys["secretKey"],
        white_remote_address=_pattern(fields.get("whiteRemoteAddress"),
                                      f"{field}.whiteRemoteAddress"),
        admin=bool(admin is not None and admin.value),
        default_topic_perm=_perm(fields.get("defaultTopicPerm"), f"{field}.defaultTopicPerm"),
        default_group_perm=_perm(fields.get("defaultGroupPerm"), f"{field}.defaultGroupPerm"),
        topic_perms=_resource_perms(fields.get("topicPerms"), f"{field}.topicPerms"),
        group_perms=_resource_perms(fields.get("groupPerms"), f"{field}.groupPerms"),
    )
