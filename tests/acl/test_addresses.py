"""RocketMQ's remote-address patterns: each form trusts exactly the addresses it names."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.acl.addresses import AddressPatternError, parse_address_pattern

octets = st.integers(0, 255)
v4 = st.builds(lambda n: str(ipaddress.IPv4Address(n)), st.integers(0, 2**32 - 1))
v6 = st.builds(lambda n: str(ipaddress.IPv6Address(n)), st.integers(0, 2**128 - 1))


@st.composite
def v4_ranges(draw: st.DrawFn) -> tuple[str, list[int], int, int]:
    """A range pattern with its meaning: exact leading octets, then lo..hi, then stars."""
    fixed = draw(st.lists(octets, min_size=1, max_size=3))
    lo, hi = sorted(draw(st.tuples(octets, octets)))
    star = draw(st.booleans())
    wild = "*" if star else f"{lo}-{hi}"
    lo, hi = (0, 255) if star else (lo, hi)
    text = ".".join([*map(str, fixed), wild, *["*"] * (3 - len(fixed))])
    return text, fixed, lo, hi


@given(v4_ranges(), st.lists(octets, min_size=4, max_size=4))
def test_an_ipv4_range_trusts_its_prefix_and_range(pattern: tuple[str, list[int], int, int],
                                                   ip: list[int]) -> None:
    text, fixed, lo, hi = pattern
    # Half the time, start the address from the pattern so that matches are common too.
    ip[: len(fixed)] = fixed if ip[0] % 2 else ip[: len(fixed)]
    expected = ip[: len(fixed)] == fixed and lo <= ip[len(fixed)] <= hi
    assert parse_address_pattern(text).matches(".".join(map(str, ip))) == expected


@given(st.integers(0, 2**128 - 1), st.integers(1, 7), st.integers(0, 0xFFFF),
       st.integers(0, 0xFFFF))
def test_an_ipv6_range_trusts_its_prefix_and_range(n: int, exact: int, a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    groups = ipaddress.IPv6Address(n).exploded.split(":")
    text = ":".join([*groups[:exact], f"{lo:x}-{hi:x}", *["*"] * (7 - exact)])
    pattern = parse_address_pattern(text)
    assert pattern.matches(str(ipaddress.IPv6Address(n))) == (lo <= int(groups[exact], 16) <= hi)
    inside = [*groups[:exact], f"{lo:x}", *["0"] * (7 - exact)]
    assert pattern.matches(str(ipaddress.IPv6Address(":".join(inside))))


@given(st.one_of(v4, v6), st.one_of(v4, v6))
def test_a_single_address_trusts_only_itself_in_any_spelling(ip: str, other: str) -> None:
    pattern = parse_address_pattern(ip)
    assert pattern.matches(ip)
    assert pattern.matches(ipaddress.ip_address(ip).exploded)
    assert pattern.matches(other) == (ipaddress.ip_address(other) == ipaddress.ip_address(ip))


@given(st.lists(octets, min_size=3, max_size=3), st.sets(octets, min_size=1, max_size=5),
       octets)
def test_braces_and_commas_list_addresses(prefix: list[int], lasts: set[int], last: int
                                          ) -> None:
    head = ".".join(map(str, prefix))
    braced = parse_address_pattern(f"{head}.{{{','.join(map(str, lasts))}}}")
    listed = parse_address_pattern(",".join(f"{head}.{n}" for n in lasts))
    for pattern in (braced, listed):
        assert pattern.matches(f"{head}.{last}") == (last in lasts)


@given(st.one_of(v4, v6))
def test_blank_trusts_nobody_and_star_everybody(ip: str) -> None:
    assert not parse_address_pattern("").matches(ip)
    assert not parse_address_pattern("  ").matches(ip)
    for every in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        assert parse_address_pattern(every).matches(ip)


def test_ipv6_forms() -> None:
    assert parse_address_pattern("1050::300c:{1,2}").matches("1050:0:0:0:0:0:300c:2")
    assert not parse_address_pattern("1050::300c:{1,2}").matches("1050::300c:3")
    assert parse_address_pattern("1050::*").matches("1050::ffff")
    assert parse_address_pattern("1050::1-ff:*").matches("1050::fe:1")
    assert not parse_address_pattern("1050::1-ff:*").matches("1050::100:1")


def test_ipv4_clients_on_a_dual_stack_socket_match_as_ipv4_and_as_ipv6() -> None:
    assert parse_address_pattern("127.0.0.*").matches("::ffff:127.0.0.1")
    assert parse_address_pattern("127.0.0.1").matches("::ffff:127.0.0.1")
    # ... and as the IPv6 address it also is (Hypothesis drew this one)
    assert parse_address_pattern("0:0:0:0:0:ffff-ffff:*:*").matches("::ffff:0:0")
    assert parse_address_pattern("::ffff:*:*").matches("::ffff:127.0.0.1")


def test_a_client_address_that_is_not_an_ip_matches_nothing_but_star() -> None:
    assert not parse_address_pattern("127.0.0.*").matches("?")
    assert parse_address_pattern("*").matches("?")


@pytest.mark.parametrize("text", [
    "1.2.3", "*.1.2.3", "1.2.*.4", "1.2.3.300", "1.2.3.5-4", "1.2.3.4-", "1.2.3.-1",
    "localhost", "1.2.3.{1,x}", "1.2.{3}.4", "::1::2:*", "1:2:3:4:5:6:7:8:*", "1050::*:1",
    "1.2.3.4,nope", "1.2.3.1-256",
])
def test_bad_patterns_are_refused_by_name(text: str) -> None:
    with pytest.raises(AddressPatternError, match="bad remote address pattern"):
        parse_address_pattern(text)
