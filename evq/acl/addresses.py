"""RocketMQ's remote-address patterns (``globalWhiteRemoteAddresses``, ``whiteRemoteAddress``).

A pattern names the client addresses an ACL rule trusts.  The forms are RocketMQ's
(``RemoteAddressStrategyFactory``), with the same meaning:

==========================  ==============================================================
``""`` (blank)              no address
``*``, ``*.*.*.*``,         every address
``*:*:*:*:*:*:*:*``
``192.168.1.7``, ``::1``    that address (IPv6 in any spelling: ``::1`` is ``0:0:…:1``)
``192.168.1.7,10.0.0.1``    any of the listed addresses
``192.168.1.{7,8}``         any of ``192.168.1.7`` and ``192.168.1.8``; also IPv6
                            (``1050::300c:{1,2}``)
``192.168.*.*``             the first octets as given, then one ``*`` or ``lo-hi`` range,
``192.168.1.1-200``         then only ``*``; IPv6 likewise over hex groups
``1050::300c:*``            (``1050::300c:1-ff``, ``1050::1-ff:*``)
==========================  ==============================================================

Anything else is an :class:`AddressPatternError` naming the pattern, raised when the account
file is read, so that a typo never silently trusts or refuses everyone.  Unlike RocketMQ, an
IPv4 client reaching a dual-stack socket as ``::ffff:a.b.c.d`` is matched as ``a.b.c.d``, and
as the IPv6 address it also is.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

import attrs

_EVERY: Final = frozenset({"*", "*.*.*.*", "*:*:*:*:*:*:*:*"})
_DECIMAL: Final = re.compile(r"[0-9]{1,3}")
_HEX: Final = re.compile(r"[0-9a-fA-F]{1,4}")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressPatternError(ValueError):
    """A remote-address pattern none of RocketMQ's forms accepts."""


@attrs.frozen(slots=True)
class _Ranges:
    """One address shape: for each octet (IPv4) or group (IPv6), the inclusive range allowed."""

    version: int
    ranges: tuple[tuple[int, int], ...]

    def matches(self, parts: tuple[int, ...]) -> bool:
        return all(lo <= p <= hi for p, (lo, hi) in zip(parts, self.ranges, strict=True))


@attrs.frozen(slots=True)
class AddressPattern:
    """A parsed pattern: ``matches(ip)`` says whether it trusts a client at ``ip``."""

    text: str
    every: bool = False
    addresses: frozenset[IPAddress] = frozenset()
    ranges: tuple[_Ranges, ...] = ()

    def matches(self, ip: str) -> bool:
        """Whether ``ip`` (as the socket reports it; never a pattern) is one this trusts."""
        if self.every:
            return True
        if not self.addresses and not self.ranges:
            return False
        return any(self._trusts(address) for address in _client_addresses(ip))

    def _trusts(self, address: IPAddress) -> bool:
        if address in self.addresses:
            return True
        parts = _parts(address)
        return any(r.version == address.version and r.matches(parts) for r in self.ranges)


NOBODY: Final = AddressPattern("")


def parse_address_pattern(text: str) -> AddressPattern:
    """``text`` in one of the module's forms; :class:`AddressPatternError` otherwise."""
    pattern = text.strip()
    if not pattern:
        return NOBODY
    if pattern in _EVERY:
        return AddressPattern(pattern, every=True)
    if pattern.endswith("}"):
        return AddressPattern(pattern, addresses=frozenset(_braced(pattern)))
    if "," in pattern:
        return AddressPattern(pattern, addresses=frozenset(
            _address(part.strip(), pattern) for part in pattern.split(",")))
    if "*" in pattern or "-" in pattern:
        shape = _v6_ranges(pattern) if ":" in pattern else _v4_ranges(pattern)
        return AddressPattern(pattern, ranges=(shape,))
    return AddressPattern(pattern, addresses=frozenset({_address(pattern, pattern)}))


def _error(pattern: str, why: str) -> AddressPatternError:
    return AddressPatternError(f"bad remote address pattern {pattern!r}: {why}")


def _address(text: str, pattern: str) -> IPAddress:
    addresses = _client_addresses(text)
    if not addresses or "%" in text or "[" in text:
        raise _error(pattern, f"{text!r} is not an IPv4 or IPv6 address")
    return addresses[0]


def _braced(pattern: str) -> list[IPAddress]:
    """``prefix{a,b}``: the prefix followed by each listed last part."""
    head, brace, tail = pattern.partition("{")
    separator = ":" if ":" in head else "."
    if not brace or not head.endswith(separator) or "{" in tail or "}" in tail[:-1]:
        raise _error(pattern, "braces must hold the last part, as in 192.168.1.{1,2}")
    return [_address(head + item.strip(), pattern) for item in tail[:-1].split(",")]


def _range(text: str, top: int, base: int, pattern: str) -> tuple[int, int]:
    """One wildcard part: ``*`` (all of 0..top) or ``lo-hi``."""
    if text == "*":
        return (0, top)
    lo_text, minus, hi_text = text.partition("-")
    digits = _DECIMAL if base == 10 else _HEX
    if not (minus and digits.fullmatch(lo_text) and digits.fullmatch(hi_text)):
        raise _error(pattern, f"{text!r} is neither *, a number nor a lo-hi range")
    lo, hi = int(lo_text, base), int(hi_text, base)
    if not lo <= hi <= top:
        raise _error(pattern, f"range {text!r} must have lo <= hi <= {top}")
    return (lo, hi)


def _shape(fixed: list[int], wild: list[str], top: int, base: int, pattern: str) -> list[
        tuple[int, int]]:
    """Exact leading parts, then one range, then only ``*`` (RocketMQ's range rule)."""
    if not fixed:
        raise _error(pattern, "the first part must be exact")
    if any(part != "*" for part in wild[1:]):
        raise _error(pattern, "only * may follow a range")
    return [(p, p) for p in fixed] + [_range(part, top, base, pattern) for part in wild]


def _split_wild(parts: list[str]) -> tuple[list[str], list[str]]:
    """``parts`` cut where the first ``*`` or range starts."""
    for i, part in enumerate(parts):
        if "*" in part or "-" in part:
            return parts[:i], parts[i:]
    return parts, []


def _v4_ranges(pattern: str) -> _Ranges:
    parts = [p.strip() for p in pattern.split(".")]
    if len(parts) != 4:
        raise _error(pattern, "an IPv4 pattern has four parts")
    exact, wild = _split_wild(parts)
    fixed = []
    for part in exact:
        if not _DECIMAL.fullmatch(part) or int(part) > 255:
            raise _error(pattern, f"{part!r} is not an octet")
        fixed.append(int(part))
    return _Ranges(4, tuple(_shape(fixed, wild, 255, 10, pattern)))


def _v6_ranges(pattern: str) -> _Ranges:
    parts = pattern.split(":")
    exact, wild = _split_wild(parts)
    if not wild or any(p == "" for p in wild):
        raise _error(pattern, "the wildcard parts come last")
    fixed = _expand_v6(exact, 8 - len(wild), pattern)
    return _Ranges(6, tuple(_shape(fixed, wild, 0xFFFF, 16, pattern)))


def _expand_v6(parts: list[str], count: int, pattern: str) -> list[int]:
    """Hex groups (with at most one ``::``) as exactly ``count`` numbers."""
    text = ":".join(parts)
    if text.endswith(":"):  # "a::*" split as ["a", "", "*"]: the cut took a colon of the "::"
        text += ":"
    if text.count("::") > 1:
        raise _error(pattern, "at most one ::")
    if "::" in text:
        left, _, right = text.partition("::")
        before = left.split(":") if left else []
        after = right.split(":") if right else []
        missing = count - len(before) - len(after)
        if missing < 1:
            raise _error(pattern, "too many groups")
        groups = [*before, *["0"] * missing, *after]
    else:
        groups = text.split(":") if text else []
    if len(groups) != count or not all(_HEX.fullmatch(g) for g in groups):
        raise _error(pattern, f"expected {count} hex groups before the wildcard")
    return [int(g, 16) for g in groups]


def _client_addresses(ip: str) -> tuple[IPAddress, ...]:
    """The socket's peer address, a zone id dropped; an IPv4-mapped IPv6 one both as IPv4
    and as itself (none for text that is no address)."""
    try:
        address = ipaddress.ip_address(ip.partition("%")[0].strip("[]"))
    except ValueError:
        return ()
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped, address
    return (address,)


def _parts(address: IPAddress) -> tuple[int, ...]:
    packed = address.packed
    if address.version == 4:
        return tuple(packed)
    return tuple(int.from_bytes(packed[i:i + 2], "big") for i in range(0, 16, 2))
