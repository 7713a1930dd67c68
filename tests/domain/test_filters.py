"""Subscriptions and their two filter stages (evq.domain.filters), down to a real store."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.filters import (
    SUB_ALL,
    ExpressionType,
    FilterError,
    Subscription,
    parse_subscription,
)
from evq.domain.hashing import java_hash, tags_code
from evq.domain.log import MessageLog, PutStatus
from evq.domain.message import Message, Prop, new_message
from evq.domain.record import decode, put_record
from tests.strategies import subscription_tag_sets, tag_expressions, tags

OpenLog = Callable[..., MessageLog]


# --- expression types -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_type", "expected"),
    [("TAG", ExpressionType.TAG), ("tag", ExpressionType.TAG), ("Tag", ExpressionType.TAG),
     ("SQL92", ExpressionType.SQL92), ("sql92", ExpressionType.SQL92),
     (None, ExpressionType.TAG), ("", ExpressionType.TAG),
     (ExpressionType.SQL92, ExpressionType.SQL92)],
)
def test_expression_type_parse(given_type: str | None, expected: ExpressionType) -> None:
    assert ExpressionType.parse(given_type) is expected


@pytest.mark.parametrize("bad", ["SQL", "XML", "TAG ", "sql-92", "CLASS"])
def test_unknown_expression_type(bad: str) -> None:
    with pytest.raises(FilterError, match="unknown expression type") as info:
        parse_subscription("T", "a = 1", bad)
    assert repr(bad) in str(info.value)
    assert info.value.position is None


# --- tag subscriptions ------------------------------------------------------------------------


@pytest.mark.parametrize("everything", [None, "", "*"])
def test_star_empty_and_null_subscribe_to_everything(everything: str | None) -> None:
    sub = parse_subscription("T", everything, "TAG", 7)
    assert sub == Subscription("T", SUB_ALL, ExpressionType.TAG, 7)
    assert sub.matches_all
    assert sub.tag_filter is None
    assert not sub.needs_exact_check
    assert sub.matches(None, {})
    assert sub.matches("anything", {"TAGS": "anything"})


def test_tag_list() -> None:
    sub = parse_subscription("T", "TagA || TagB", version=1700000000000)
    assert sub.expression == "TagA || TagB"
    assert sub.version == 1700000000000
    assert sub.tags == {"TagA", "TagB"}
    assert sub.codes == {java_hash("TagA"), java_hash("TagB")}
    assert sub.needs_exact_check
    assert not sub.matches_all
    assert sub.matches("TagA", {})
    assert sub.matches("TagB", {})
    assert not sub.matches("TagC", {})
    assert not sub.matches("taga", {})
    assert not sub.matches(None, {})


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (" * ", {"*"}),  # only exactly "*" means everything
        ("*||a", {"*", "a"}),
        (" || \t|| ", set()),
        ("|||", {"|"}),
        ("a||||b", {"a", "b"}),
        ("a|||b", {"a", "|b"}),  # split is left to right, as Java's
        ("a|b", {"a|b"}),
        ("\x00a\x1f|| b\n", {"a", "b"}),  # String.trim strips every char up to U+0020
        ("\u00a0a\u3000", {"\u00a0a\u3000"}),  # but no Unicode space
        ("a||a", {"a"}),
        ("a || b || a", {"a", "b"}),
    ],
)
def test_tag_expression_parsing_follows_java(expression: str, expected: set[str]) -> None:
    sub = parse_subscription("T", expression)
    assert sub.tags == expected
    assert sub.codes == {tags_code(tag) for tag in expected}
    assert not sub.matches_all


@pytest.mark.parametrize("separators", ["||", "||||", "||" * 10])
def test_a_tag_expression_of_bare_separators_is_an_error(separators: str) -> None:
    # "||".split("\\|\\|") is an empty array in Java, and FilterAPI throws on it.
    with pytest.raises(FilterError, match="nothing between its separators"):
        parse_subscription("T", separators)


def test_a_subscription_of_only_separators_matches_nothing() -> None:
    sub = parse_subscription("T", " || ")
    accepts = sub.tag_filter
    assert accepts is not None
    assert not any(accepts(code) for code in (0, 1, -1, tags_code("a"), 2**31))
    assert not sub.matches(None, {})
    assert not sub.matches("", {})


def test_tag_filter_tests_the_low_32_bits_of_the_stored_code() -> None:
    sub = parse_subscription("T", "polygenelubricants || TagA")  # hashes to Integer.MIN_VALUE
    accepts = sub.tag_filter
    assert accepts is not None
    low = tags_code("polygenelubricants")
    assert low == -(2**31)
    assert accepts(low)
    assert accepts(low & 0xFFFFFFFF)  # as an unsigned 32-bit value
    assert accepts(tags_code("TagA"))
    assert accepts(tags_code("TagA") + (5 << 32))  # RocketMQ compares tagsCode.intValue()
    assert not accepts(tags_code("TagB"))
    assert not accepts(0)


def test_hash_collisions_pass_the_tag_filter_but_not_the_exact_check() -> None:
    assert tags_code("Aa") == tags_code("BB")
    sub = parse_subscription("T", "Aa")
    accepts = sub.tag_filter
    assert accepts is not None
    assert accepts(tags_code("BB"))
    assert not sub.matches("BB", {Prop.TAGS: "BB"})
    assert sub.matches("Aa", {Prop.TAGS: "Aa"})


def test_a_multi_tag_value_is_one_tag() -> None:
    sub = parse_subscription("T", "a||b")
    accepts = sub.tag_filter
    assert accepts is not None
    assert not accepts(tags_code("a||b"))
    assert not sub.matches("a||b", {})
    assert parse_subscription("T", "a").matches("a", {"TAGS": "a"})


def test_subscriptions_compare_by_value() -> None:
    assert parse_subscription("T", "a||b") == parse_subscription("T", "a||b")
    assert parse_subscription("T", "a||b") != parse_subscription("T", "a||c")
    # the expression text counts, as in RocketMQ's SubscriptionData.equals
    assert parse_subscription("T", "a||b") != parse_subscription("T", "b || a")
    assert parse_subscription("T", "a||b").tags == parse_subscription("T", "b || a").tags
    assert parse_subscription("T", "x > 1", "SQL92") == parse_subscription("T", "x > 1", "sql92")


@given(subscription_tag_sets, st.data())
def test_tag_sets_round_trip_through_expressions(
    tag_set: frozenset[str], data: st.DataObject
) -> None:
    expression = data.draw(tag_expressions(tag_set))
    sub = parse_subscription("T", expression)
    assert sub.tags == tag_set
    assert sub.codes == {tags_code(tag) for tag in tag_set}
    accepts = sub.tag_filter
    assert accepts is not None
    for tag in tag_set:
        assert accepts(tags_code(tag))
        assert sub.matches(tag, {})


@given(subscription_tag_sets, tags)
def test_the_exact_check_never_accepts_what_the_hash_test_refused(
    tag_set: frozenset[str], tag: str
) -> None:
    sub = parse_subscription("T", "||".join(sorted(tag_set)))
    accepts = sub.tag_filter
    assert accepts is not None
    assert sub.matches(tag, {}) == (tag in tag_set)
    if sub.matches(tag, {}):
        assert accepts(tags_code(tag))


# --- SQL92 subscriptions ----------------------------------------------------------------------


def test_sql92_subscription() -> None:
    sub = parse_subscription("T", "a > 5 AND TAGS = 'x'", "SQL92", 3)
    assert sub.expression_type is ExpressionType.SQL92
    assert sub.version == 3
    assert sub.sql is not None
    assert sub.tag_filter is None  # no bloom filter: every ConsumeQueue entry is a candidate
    assert sub.needs_exact_check
    assert not sub.matches_all
    assert sub.matches("x", {"a": "6", "TAGS": "x"})
    assert not sub.matches("x", {"a": "4", "TAGS": "x"})
    assert not sub.matches("x", {"a": "6"})  # the selector sees the properties, TAGS included
    assert not sub.matches(None, {"a": "six", "TAGS": "x"})  # Integer.valueOf throws: no match


def test_sql92_star_is_a_selector_not_everything() -> None:
    with pytest.raises(FilterError, match="unexpected character '\\*'") as info:
        parse_subscription("T", "*", "SQL92")
    assert info.value.position == 0


@pytest.mark.parametrize("empty", [None, ""])
def test_sql92_needs_an_expression(empty: str | None) -> None:
    with pytest.raises(FilterError, match="SQL92 expression is empty"):
        parse_subscription("T", empty, ExpressionType.SQL92)


def test_sql92_errors_carry_the_position() -> None:
    with pytest.raises(FilterError) as info:
        parse_subscription("T", "a = 1 AND b >", "SQL92")
    assert info.value.position == 13
    assert str(info.value) == "unexpected end of expression at position 13"


# --- both stages over a real store ------------------------------------------------------------

TAGGED = [
    ("TagA", {"region": "eu", "price": "10"}),
    ("TagB", {"region": "us", "price": "25"}),
    ("Aa", {"region": "eu", "price": "99.5"}),
    ("BB", {"region": "eu", "price": "5"}),  # collides with "Aa"
    (None, {"region": "eu"}),
    ("a||b", {"price": "abc"}),
    ("TagA", {}),
]


def _messages() -> list[Message]:
    return [
        new_message("Filtered", f"m{i}".encode(), tags=tag, properties=props)
        for i, (tag, props) in enumerate(TAGGED)
    ]


def _pull(log: MessageLog, sub: Subscription) -> list[bytes]:
    """What a pull delivers: ConsumeQueue entries past the hash test, then the exact check."""
    result = log.read(sub.topic, 0, 0, max_count=32, tag_filter=sub.tag_filter)
    delivered = []
    for raw in result.records:
        m = decode(raw)
        if not sub.needs_exact_check or sub.matches(m.tags, m.properties):
            delivered.append(m.body)
    return delivered


@pytest.mark.parametrize(
    ("expression", "expression_type", "bodies"),
    [
        ("*", "TAG", [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"m6"]),
        ("TagA", "TAG", [b"m0", b"m6"]),
        ("TagA || Aa", "TAG", [b"m0", b"m2", b"m6"]),
        ("BB", "TAG", [b"m3"]),
        ("a||b", "TAG", []),
        ("region = 'eu'", "SQL92", [b"m0", b"m2", b"m3", b"m4"]),
        ("price > 9", "SQL92", [b"m0", b"m1"]),  # "99.5" is no Integer: not delivered
        ("price > 9.0", "SQL92", [b"m0", b"m1", b"m2"]),
        ("region IS NULL OR TAGS = 'TagB'", "SQL92", [b"m1", b"m5", b"m6"]),
        ("TAGS IN ('Aa', 'BB') AND price < 50", "SQL92", [b"m3"]),
    ],
)
def test_pull_through_both_stages(
    open_log: OpenLog, expression: str, expression_type: str, bodies: list[bytes]
) -> None:
    log = open_log()
    results = log.append([put_record(m) for m in _messages()])
    assert {r.status for r in results} == {PutStatus.PUT_OK}
    assert _pull(log, parse_subscription("Filtered", expression, expression_type)) == bodies


def test_the_hash_test_alone_lets_a_collision_through(open_log: OpenLog) -> None:
    log = open_log()
    log.append([put_record(m) for m in _messages()])
    sub = parse_subscription("Filtered", "Aa")
    candidates = log.read("Filtered", 0, 0, tag_filter=sub.tag_filter).records
    assert [decode(r).tags for r in candidates] == ["Aa", "BB"]
    assert _pull(log, sub) == [b"m2"]
