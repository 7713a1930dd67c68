"""RocketMQ's SQL92 selector: parsing (evq.domain.sql92) and evaluation (evq.domain.selector).

Expected outcomes follow RocketMQ 4.9's filter module; several rows are the cases of its own
``ExpressionTest`` and ``ParserTest``.  An outcome is True, False, None (unknown) or ERROR
(RocketMQ's evaluator throws; the broker does not deliver the message).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from evq.domain import sql92 as sql
from evq.domain.javalang import (
    INT_MAX,
    NumberFormatError,
    compare_doubles,
    parse_boolean,
    parse_double,
    parse_int,
    parse_long,
)
from evq.domain.selector import (
    PARSE_CACHE_SIZE,
    EvaluationError,
    SqlFilter,
    _compile_cached,
    compile_sql,
    compile_tree,
)
from evq.domain.sql92 import MAX_DEPTH, MAX_EXPRESSION_LENGTH, FilterError, parse, render
from tests.strategies import sql_conditions, sql_properties

ERROR = "error"
Outcome = bool | None | str


def outcome(evaluate: Callable[[], bool | None]) -> Outcome:
    try:
        return evaluate()
    except EvaluationError:
        return ERROR


def evaluated(expression: str, properties: Mapping[str, str]) -> Outcome:
    selector = compile_sql(expression)
    result = outcome(lambda: selector.evaluate(properties))
    assert selector.matches(properties) is (result is True)
    return result


# --- evaluation examples ----------------------------------------------------------------------

EXAMPLES: list[tuple[str, dict[str, str], Outcome]] = [
    # = and <> on strings; a missing property is unknown, a missing right side is FALSE
    ("a = 'x'", {"a": "x"}, True),
    ("a = 'x'", {"a": "y"}, False),
    ("a = 'x'", {}, None),
    ("'x' = a", {}, False),
    ("a = b", {}, True),  # null = null is TRUE in RocketMQ
    ("a = b", {"a": "1"}, False),
    ("a = b", {"b": "1"}, None),
    ("a = b", {"a": "3.14", "b": "3.14"}, True),
    ("a <> b", {"a": "3.14", "b": "3.14"}, False),
    ("a <> b", {"a": "3.14", "b": "3.141"}, True),
    ("a <> 'x'", {}, None),
    ("a <> 'x'", {"a": "y"}, True),
    ("TAGS is not null and TAGS='''''tag'''''", {"TAGS": "''tag''"}, True),
    ("a = 'héllo ✓'", {"a": "héllo ✓"}, True),
    # numbers: the property is parsed as the literal's Java type
    ("a = 3", {"a": "3"}, True),
    ("a = 3", {"a": "+3"}, True),
    ("a = 3", {"a": "03"}, True),
    ("a = 3", {"a": "3.0"}, ERROR),  # Integer.valueOf("3.0") throws
    ("a = 3.0", {"a": "3"}, True),
    ("a = 3", {"a": " 3"}, ERROR),
    ("a = 3.0", {"a": " 3 "}, True),  # Double.valueOf trims
    ("a = 3", {"a": "abc"}, ERROR),
    ("a > 5", {"a": "2147483648"}, ERROR),  # out of Integer range beside an int literal
    ("a > 5L", {"a": "2147483648"}, ERROR),  # 5L is still an Integer
    ("a > 2147483648", {"a": "2147483649"}, True),  # a long literal parses with Long.valueOf
    ("a > 2147483648", {"a": "1.5"}, ERROR),
    ("a >= 10", {"a": "10"}, True),
    ("a > 10", {"a": "10"}, False),
    ("a < 10", {"a": "9"}, True),
    ("a <= 10", {"a": "11"}, False),
    ("a > 3.14", {"a": "3.1415"}, True),
    ("a > 3.1E10", {"a": "3.1415E10"}, True),
    ("a > 1.5", {"a": "NaN"}, True),  # Double.compare puts NaN above everything
    ("a = 1.5", {"a": "NaN"}, False),
    ("a < 1.5", {"a": "-Infinity"}, True),
    ("a > 1.5", {"a": "inf"}, ERROR),  # Python's spelling, not Java's
    ("a > 1.5", {"a": "0x1p3"}, True),
    ("a > 1.5", {"a": "2f"}, True),
    ("a > 5", {}, None),
    ("5 < a", {"a": "6"}, True),
    ("-5 < a", {"a": "-4"}, True),
    ("- -5 = a", {"a": "5"}, True),
    ("1 = 1.0", {}, True),  # Integer widens to Double
    ("2147483648 = 2147483648.0", {}, True),
    ("9007199254740993 = 9007199254740992.0", {}, True),  # long to double rounds, as in Java
    # two properties under < > compare as doubles; as strings they only compare with = <>
    ("a > b", {"a": "20", "b": "10"}, True),
    ("a > b", {"a": "10", "b": "20"}, False),
    ("a > b", {"a": "10", "b": "x"}, ERROR),
    ("a > b", {"a": "10"}, None),
    ("a = b", {"a": "10", "b": "10.0"}, False),
    # booleans
    ("a = TRUE", {"a": "true"}, True),
    ("a = TRUE", {"a": "TRUE"}, True),
    ("a = TRUE", {"a": "yes"}, False),
    ("a = FALSE", {"a": "anything"}, True),  # Boolean.valueOf is false for anything but "true"
    ("a=TRUE OR b=FALSE", {"a": "true", "b": "false"}, True),
    ("a=TRUE OR b=FALSE", {"a": "false", "b": "true"}, False),
    ("'true' = TRUE", {}, True),
    ("1 = TRUE", {}, False),  # Boolean beside a number compares as "less"
    ("1 <> TRUE", {}, True),
    ("(a = 'x') = TRUE", {"a": "x"}, True),
    ("(a = 'x') = (b = 'y')", {"a": "x", "b": "z"}, False),
    ("(a = 'x') = b", {"a": "x", "b": "true"}, ERROR),  # Boolean then String: ClassCastException
    ("b = (a = 'x')", {"a": "x", "b": "true"}, True),
    ("(a = 'x') = 5", {"a": "x"}, False),
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, None),
    ("TRUE = TRUE", {}, True),
    ("TRUE <> FALSE", {}, True),
    # a bare property is cast: FALSE when present, unknown when missing
    ("a", {"a": "true"}, False),
    ("a", {}, None),
    ("NOT a", {"a": "x"}, True),
    ("NOT a", {}, None),
    ("NOT a = 'x'", {"a": "x"}, ERROR),  # (NOT a) = 'x': Boolean beside String
    ("NOT (a = 'x')", {"a": "x"}, False),
    ("NOT (a = 'x')", {"a": "y"}, True),
    ("NOT (a = 'x')", {}, None),
    # negation of a non-number is null
    ("-a = 5", {"a": "-5"}, None),
    ("a = -NULL", {}, True),  # null = null
    ("a = -'x'", {"a": "1"}, False),
    ("a > -TRUE", {"a": "1"}, None),
    # IS [NOT] NULL
    ("a is null", {"abc": "2"}, True),
    ("a is null", {"a": "2"}, False),
    ("a is not null", {"a": "2"}, True),
    ("a is not null", {"abc": "2"}, False),
    ("a is null", {"a": ""}, False),
    ("NULL IS NULL", {}, True),
    ("5 IS NULL", {}, False),
    ("(a > 5) IS NULL", {}, True),
    ("(a > 5) IS NULL", {"a": "x"}, ERROR),
    ("-a IS NULL", {"a": "5"}, True),
    # BETWEEN is >= AND <=; NOT BETWEEN is < OR >
    ("a between 2 and 10", {"a": "2"}, True),
    ("a between 2 and 10", {"a": "10"}, True),
    ("a between 2 and 10", {"a": "1"}, False),
    ("a between 2 and 10", {"a": "11"}, False),
    ("a between 2 and 10", {}, None),
    ("a between 0 and 100", {"a": "abc"}, ERROR),
    ("a not between 2 and 10", {"a": "1"}, True),
    ("a not between 2 and 10", {"a": "3"}, False),
    ("a not between 10 and 2", {"a": "5"}, True),  # no order check on NOT BETWEEN
    ("a between b and c", {"a": "3.14"}, None),
    ("a between up and low", {"a": "3.14", "up": "up", "low": "low"}, ERROR),
    ("a between b and c", {"a": "2", "b": "1", "c": "3"}, True),
    ("a between 1 and 2.5", {"a": "2.5"}, ERROR),  # a >= 1 parses "2.5" as an Integer
    ("a between 1.0 and 2.5", {"a": "2.5"}, True),
    ("a between -5 and -1", {"a": "-3"}, True),
    ("a between -1 and -5", {"a": "-3"}, False),  # negations are not constants: not checked
    # IN: exact string match on a present property
    ("a in ('3', '4', '5')", {"a": "3"}, True),
    ("a in ('3', '4', '5')", {"a": "8"}, False),
    ("a in ('3', '4', '5')", {"a": "03"}, False),
    ("a in ('3', '4', '5')", {}, None),
    ("a not in ('3', '4', '5')", {"a": "8"}, True),
    ("a not in ('3', '4', '5')", {"a": "4"}, False),
    ("a not in ('3', '4', '5')", {}, None),
    ("a in ('it''s')", {"a": "it's"}, True),
    ("a in ('a', 'b', 'c', 'd', 'e', 'f')", {"a": "f"}, True),
    # AND / OR: three-valued, left to right, stopping at the first deciding operand
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "3", "b": "5", "c": "6", "d": "1"}, True),
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "4", "b": "5", "c": "6", "d": "1"}, False),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "3"}, True),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "5"}, True),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "10"}, False),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3"}, None),
    ("a = 1 AND b = 1", {"a": "1"}, None),
    ("a = 1 AND b = 1", {"a": "2"}, False),
    ("a = 1 OR b = 1", {"b": "1"}, True),
    ("a = 1 OR b = 1", {"a": "2"}, None),
    ("a is null OR a='hello'", {"a": "hello"}, True),
    ("a is null OR a='hello'", {"a": "abc"}, False),
    ("a is not null and a='hello'", {"a": "hello"}, True),
    ("a > 1 OR b = 'x'", {"a": "x", "b": "x"}, ERROR),  # the error comes first
    ("b = 'x' OR a > 1", {"a": "x", "b": "x"}, True),  # short-circuit: never evaluated
    ("b = 'x' AND a > 1", {"a": "x", "b": "y"}, False),
    ("NOT (a = 1 AND b = 2) OR c IS NULL", {"a": "1", "b": "2", "c": "z"}, False),
    ("(a = 1 OR b = 2) AND (c = 3 OR d = 4)", {"b": "2", "d": "4"}, True),
    ("a AND b", {"a": "1", "b": "1"}, False),
    # keywords in any case, comments, blanks
    ("a BeTwEeN 1 aNd 2 oR nOt (b Is NoT nUlL)", {"a": "5"}, True),
    ("a = 1 -- a comment\n AND b = 2", {"a": "1", "b": "2"}, True),
    ("a = 1 /* a\n comment */ AND b = 2", {"a": "1", "b": "2"}, True),
    ("\ta\n=\r'x'\f", {"a": "x"}, True),
    ("$v = 1 AND _n1 = 2", {"$v": "1", "_n1": "2"}, True),
    ("Region = 'eu'", {"region": "eu"}, None),  # property names are case-sensitive
]


@pytest.mark.parametrize(("expression", "properties", "expected"), EXAMPLES)
def test_evaluation(expression: str, properties: dict[str, str], expected: Outcome) -> None:
    assert evaluated(expression, properties) == expected


@pytest.mark.parametrize(("expression", "properties", "expected"), EXAMPLES)
def test_compiled_agrees_with_reference_on_examples(
    expression: str, properties: dict[str, str], expected: Outcome
) -> None:
    assert reference_outcome(parse(expression), properties) == expected


def test_huge_numeric_property_values() -> None:
    nines = "9" * 10000
    assert evaluated("a > 5", {"a": nines}) == ERROR
    assert evaluated("a > 5.0", {"a": nines}) is True  # Double.valueOf gives Infinity
    assert evaluated("a = 5", {"a": "0" * 10000 + "5"}) is True  # Java skips leading zeros


def test_evaluation_error_names_the_value() -> None:
    with pytest.raises(EvaluationError, match="'abc'"):
        compile_sql("a > 5").evaluate({"a": "abc"})
    with pytest.raises(EvaluationError, match="ClassCastException"):
        compile_sql("(a = 'x') = b").evaluate({"a": "x", "b": "x"})


# --- parse errors -----------------------------------------------------------------------------

BAD: list[tuple[str, int | None, str]] = [
    ("", 0, "unexpected end of expression"),
    ("   ", 3, "unexpected end of expression"),
    ("a and between 2 and 10", 6, "unexpected keyword BETWEEN"),
    (" a between 10 and 0", 3, "BETWEEN bounds out of order"),
    ("a between 2.5 and 1", 2, "BETWEEN bounds out of order"),
    ("a > 100000000000000000000000", 4, "does not fit a Java long"),
    ("a > 9223372036854775808", 4, "does not fit a Java long"),
    ("a > 1e400", 4, "too large for a double"),
    ("a > 0.0", 4, "is zero"),
    ("a > 0e10", 4, "is zero"),
    ("a > 1e-400", 4, "is zero"),
    ("a = NULL", 2, "NULL cannot be compared with ="),
    ("NULL <> a", 5, "NULL cannot be compared with <>"),
    ("a > NULL", 2, "NULL cannot be compared with >"),
    ("a > 'x'", 2, "'x' cannot be compared with >"),
    ("'x' <= a", 4, "'x' cannot be compared with <="),
    ("a > TRUE", 2, "TRUE cannot be compared with >"),
    ("a > (b = 1)", 2, "b = 1 cannot be compared with >"),
    ("a > 1 > 2", 6, "a > 1 cannot be compared with >"),
    ("a between 'x' and 'y'", 2, "cannot be compared with between"),
    ("a between 1 and 2 between 3 and 4", 18, "cannot be compared"),
    ("TRUE = 1", 5, "TRUE cannot be compared with 1"),
    ("FALSE <> 'x'", 6, "FALSE cannot be compared with 'x'"),
    ("-a IN ('x')", 3, "IN needs a property on its left, not -a"),
    ("'a' IN ('x')", 4, "IN needs a property"),
    ("a IN ()", 6, "expected a string literal in the IN list"),
    ("a IN (1)", 6, "expected a string literal in the IN list"),
    ("a IN 'x'", 5, "expected '(' after IN"),
    ("a IN ('x'", 9, "expected ')' closing the IN list"),
    ("a IS 5", 5, "expected NULL or NOT NULL after IS"),
    ("a IS NOT 5", 9, "expected NULL or NOT NULL after IS"),
    ("a BETWEEN 1 OR 2", 12, "expected AND between the bounds of BETWEEN"),
    ("5", 0, "5 is not a condition"),
    ("'x'", 0, "'x' is not a condition"),
    ("-a", 0, "-a is not a condition"),
    ("NOT 5", 4, "5 is not a condition"),
    ("a = 1 AND 5", 10, "5 is not a condition"),
    ("5 OR a = 1", 0, "5 is not a condition"),
    ("a = 1 b = 2", 6, "unexpected 'b' after the expression"),  # RocketMQ ignores the rest
    ("a = 1)", 5, "unexpected ')' after the expression"),
    ("(a = 1", 6, "expected ')', found end of expression"),
    ("a = 'x", 4, "unterminated string literal"),
    ("a = 1 /* x", 6, "unterminated comment"),
    ("a = 1 --no newline", 6, "unexpected '-' after"),  # "--" needs a line end to be a comment
    ("a # 1", 2, "unexpected character '#'"),
    ("a != 1", 2, "unexpected character '!'"),
    ("a = \"x\"", 4, "unexpected character '\"'"),
    ("a.b = 1", 1, "unexpected character '.'"),
    ("a = 0x10", 5, "unexpected 'x10' after the expression"),
    ("a = 0L", 5, "unexpected 'L' after the expression"),
    ("a = 007", 4, "integer literal 007 has a leading zero"),  # JavaCC: three integers
    ("a = 1" + "9" * 5000, 4, "does not fit a Java long"),
    ("a LIKE 'x%'", 2, "unexpected 'LIKE' after the expression"),
    ("a CONTAINS 'x'", 2, "unexpected 'CONTAINS' after the expression"),  # RocketMQ 5 only
    ("a = 1 AND", 9, "unexpected end of expression"),
    ("AND", 0, "unexpected keyword AND"),
]


@pytest.mark.parametrize(("expression", "position", "problem"), BAD)
def test_parse_errors(expression: str, position: int | None, problem: str) -> None:
    with pytest.raises(FilterError) as info:
        compile_sql(expression)
    assert info.value.position == position
    assert problem.lower() in info.value.problem.lower()
    assert str(info.value) == f"{info.value.problem} at position {position}"


def test_error_messages_quote_at_most_a_little_of_the_expression() -> None:
    huge = "(" + " OR ".join(f"a = {i}" for i in range(500)) + ") > 1"
    with pytest.raises(FilterError) as info:
        parse(huge)
    assert len(huge) > 5000
    assert len(str(info.value)) < 200
    assert "..." in str(info.value)


def test_depth_limit() -> None:
    for opener, closer in (("(", ")"), ("NOT ", ""), ("- ", ""), ("+", "")):
        deep = opener * (MAX_DEPTH + 1) + "a = 1" + closer * (MAX_DEPTH + 1)
        with pytest.raises(FilterError, match="nested deeper"):
            parse(deep)
    parse("(" * (MAX_DEPTH - 1) + "a = 1" + ")" * (MAX_DEPTH - 1))
    chain = "a" + " = a" * (MAX_DEPTH + 1)
    with pytest.raises(FilterError, match="nested deeper"):
        parse(chain)


def test_hostile_nesting_never_exhausts_the_stack() -> None:
    depth = sys.getrecursionlimit() * 4
    for text in ("(" * depth, "NOT " * depth + "a", "-" * depth, "a" + " = a" * depth):
        with pytest.raises(FilterError):
            parse(text[:MAX_EXPRESSION_LENGTH])


@pytest.mark.parametrize(
    "hostile",
    [
        "-" * MAX_EXPRESSION_LENGTH,  # no line end: never a comment, each "-" is one token
        "a>--1 OR " * 7000 + "b",
        "0" * MAX_EXPRESSION_LENGTH,
        "/*" + "*a" * 30000,
        "'" + "''" * 30000,
        "a = 1" + "\n--x" * 16000,
        "a = " + "1" * 60000,
        "a = 1" + "e" * 60000,
    ],
    ids=lambda text: repr(text[:12]),
)
def test_hostile_inputs_are_answered_in_one_pass(hostile: str) -> None:
    """Each of these cost quadratic time (a minute for the first) before the tokenizer
    consumed everything it scanned; now they are parsed or refused with a FilterError."""
    try:
        parse(hostile)
    except FilterError as exc:
        assert exc.position is not None


def test_length_limit() -> None:
    long_list = "a IN (" + ", ".join(["'x'"] * (MAX_EXPRESSION_LENGTH // 5)) + ")"
    assert len(long_list) > MAX_EXPRESSION_LENGTH
    with pytest.raises(FilterError, match="characters long") as info:
        parse(long_list)
    assert info.value.position is None


def test_deepest_accepted_selector_evaluates() -> None:
    text = "NOT " * (MAX_DEPTH // 2) + "(" * (MAX_DEPTH // 2 - 1) + "a = 1" + ")" * (
        MAX_DEPTH // 2 - 1
    )
    assert compile_sql(text).evaluate({"a": "1"}) is True  # an even number of NOTs


def test_long_flat_chains_evaluate_without_recursion() -> None:
    text = " OR ".join(f"a = '{i}'" for i in range(3000))
    selector = compile_sql(text)
    assert isinstance(selector.tree, sql.Or)
    assert len(selector.tree.operands) == 3000
    assert selector.matches({"a": "2999"})
    assert not selector.matches({"a": "x"})


# --- the parse cache --------------------------------------------------------------------------


def test_compile_is_cached_per_expression() -> None:
    first = compile_sql("cached = 'yes'")
    assert compile_sql("cached = 'yes'") is first
    other = compile_sql("cached  =  'yes'")
    assert other is not first
    assert other.tree == first.tree
    assert other != first  # a filter is known by its expression text


def test_failures_are_cached_and_raised_fresh_each_time() -> None:
    errors = []
    for _ in range(3):
        with pytest.raises(FilterError) as info:
            compile_sql("cached > 'no'")
        errors.append(info.value)
    assert len({id(e) for e in errors}) == 3
    assert {(e.problem, e.position) for e in errors} == {(errors[0].problem, 7)}


def test_cache_is_bounded() -> None:
    for i in range(PARSE_CACHE_SIZE * 2):
        compile_sql(f"bounded = {i}")
    assert _compile_cached.cache_info().currsize == PARSE_CACHE_SIZE


# --- rendering and round trips ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("a=1 or b=2 and c=3", "a = 1 OR b = 2 AND c = 3"),
        ("(a=1 or b=2) and c=3", "(a = 1 OR b = 2) AND c = 3"),
        ("a=1 or (b=2 or c=3)", "a = 1 OR b = 2 OR c = 3"),  # flattened
        ("not (a = 1)", "NOT (a = 1)"),
        ("not a = 1", "NOT a = 1"),
        ("a = (b = c)", "a = (b = c)"),
        ("a = b = c", "a = b = c"),
        ("- -5 > a", "- -5 > a"),
        ("-(a=1) is null", "-(a = 1) IS NULL"),
        ("+a > +5", "a > 5"),
        ("a between -1 and 2.5", "a BETWEEN -1 AND 2.5"),
        ("a in ('it''s')", "a IN ('it''s')"),
        ("a > 1.e3", "a > 1000.0"),
        ("a > 5L", "a > 5"),
    ],
)
def test_render(text: str, rendered: str) -> None:
    assert render(parse(text)) == rendered
    assert parse(rendered) == parse(text)


@given(sql_conditions)
def test_rendered_trees_parse_back_to_themselves(tree: sql.Expr) -> None:
    text = render(tree)
    assume(len(text) <= MAX_EXPRESSION_LENGTH)
    try:
        parsed = parse(text)
    except FilterError as exc:  # only the depth cap may refuse a well-formed tree
        assert "nested deeper" in exc.problem
        return
    assert parsed == tree


@given(sql_conditions, st.data())
def test_rendered_trees_survive_any_keyword_case(tree: sql.Expr, data: st.DataObject) -> None:
    tokens = sql.tokenize(render(tree))
    text = render(tree)
    pieces, last = [], 0
    for token in tokens:
        if token.kind in sql.KEYWORDS:
            word = "".join(
                c.upper() if data.draw(st.booleans()) else c.lower() for c in token.text
            )
            pieces.append(text[last : token.position] + word)
            last = token.position + len(token.text)
    pieces.append(text[last:])
    try:
        assert parse("".join(pieces)) == parse(text)
    except FilterError as exc:
        assert "nested deeper" in exc.problem


@given(sql_conditions, st.lists(sql_properties, min_size=1, max_size=5))
@example(parse("a > b"), [{"a": "1", "b": "2"}, {"a": "x", "b": "1"}, {}])
@example(parse("(a = 'x') = b"), [{"a": "x", "b": "true"}])
@example(parse("a = 1 OR b = 1 OR TAGS IS NULL"), [{"b": "1"}, {"a": "1.0", "TAGS": ""}])
def test_compiled_evaluation_matches_the_reference(
    tree: sql.Expr, property_maps: list[dict[str, str]]
) -> None:
    selector = SqlFilter(render(tree), tree, compile_tree(tree))
    for properties in property_maps:
        expected = reference_outcome(tree, properties)
        assert outcome(lambda p=properties: selector.evaluate(p)) == expected
        assert selector.matches(properties) is (expected is True)


# --- garbage ----------------------------------------------------------------------------------

_TOKEN_SOUP = st.lists(
    st.sampled_from([
        "a", "b", "TAGS", "=", "<>", "<", "<=", ">", ">=", "(", ")", ",", "+", "-", "--", "/*",
        "*/", "AND", "or", "Not", "BETWEEN", "in", "IS", "NULL", "TRUE", "false", "'x'", "'",
        "''", "1", "0", "1.5", ".5", "1e3", "2147483648", "99999999999999999999", "0.0", "L",
        "\n", " ", "#", "LIKE", "$", "é",
    ]),
    max_size=30,
).map(" ".join)


@given(st.one_of(st.text(), _TOKEN_SOUP, _TOKEN_SOUP.map(lambda s: s.replace(" ", ""))))
def test_garbage_raises_only_filter_errors(text: str) -> None:
    try:
        selector = compile_sql(text)
    except FilterError as exc:
        assert exc.position is None or 0 <= exc.position <= len(text)
        return
    assert selector.matches({}) in (True, False)
    assert selector.matches({"a": "1", "b": "x", "TAGS": "t"}) in (True, False)


# --- the reference evaluator ------------------------------------------------------------------
# A plain transcription of RocketMQ 4.9's Java rules over the tree, deliberately unlike the
# compiled closures: values carry their Java class, AND and OR are binary and left-nested as
# RocketMQ builds them, and every conversion is decided per value at run time.

Java = tuple[str, Any] | None  # (class name, value), or null


class JavaThrows(Exception):
    pass


def reference_outcome(tree: sql.Expr, properties: Mapping[str, str]) -> Outcome:
    try:
        result = _ref_condition(tree, properties)
    except JavaThrows:
        return ERROR
    return None if result is None else result[1]


def _ref_condition(node: sql.Expr, p: Mapping[str, str]) -> Java:
    value = _ref(node, p)
    if isinstance(node, sql.Property):  # UnaryExpression.createBooleanCast
        if value is None:
            return None
        return value if value[0] == "Boolean" else ("Boolean", False)
    return value


def _ref(node: sql.Expr, p: Mapping[str, str]) -> Java:
    if isinstance(node, sql.Property):
        return None if node.name not in p else ("String", p[node.name])
    if isinstance(node, sql.StringLiteral):
        return ("String", node.value)
    if isinstance(node, sql.IntegerLiteral):
        return ("Integer" if node.value <= INT_MAX else "Long", node.value)
    if isinstance(node, sql.DecimalLiteral):
        return ("Double", node.value)
    if isinstance(node, sql.BooleanLiteral):
        return None if node.value is None else ("Boolean", node.value)
    if isinstance(node, sql.Negate):
        inner = _ref(node.operand, p)
        if inner is None or inner[0] not in ("Integer", "Long", "Double"):
            return None
        return (inner[0], -inner[1])
    if isinstance(node, sql.Not):
        return _ref_not(lambda: _ref_condition(node.operand, p))
    if isinstance(node, sql.And | sql.Or):
        # RocketMQ builds a chain as ((x AND y) AND z): fold the operands back into pairs.
        combine = _ref_and if isinstance(node, sql.And) else _ref_or
        folded = _thunk(_ref_condition, node.operands[0], p)
        for operand in node.operands[1:]:
            folded = _pair(combine, folded, _thunk(_ref_condition, operand, p))
        return folded()
    if isinstance(node, sql.Comparison):
        left, right = (lambda: _ref(node.left, p)), (lambda: _ref(node.right, p))
        if node.op == "=":
            return _ref_equal(left, right)
        if node.op == "<>":
            return _ref_not(lambda: _ref_equal(left, right))
        return _ref_ordered(node.op, left, right)
    if isinstance(node, sql.IsNull):
        is_null = _ref_equal(lambda: _ref(node.operand, p), lambda: None)
        return _ref_not(lambda: is_null) if node.negated else is_null
    if isinstance(node, sql.Between):
        value = lambda: _ref(node.value, p)  # noqa: E731
        low, high = (lambda: _ref(node.low, p)), (lambda: _ref(node.high, p))
        if node.negated:
            return _ref_or(lambda: _ref_ordered("<", value, low),
                           lambda: _ref_ordered(">", value, high))
        return _ref_and(lambda: _ref_ordered(">=", value, low),
                        lambda: _ref_ordered("<=", value, high))
    assert isinstance(node, sql.In)
    value = _ref(node.property, p)
    if value is None or value[0] != "String":
        return None
    return ("Boolean", (value[1] in node.values) != node.negated)


def _thunk(
    evaluate: Callable[[sql.Expr, Mapping[str, str]], Java], node: sql.Expr, p: Mapping[str, str]
) -> Callable[[], Java]:
    return lambda: evaluate(node, p)


def _pair(
    combine: Callable[[Callable[[], Java], Callable[[], Java]], Java],
    left: Callable[[], Java],
    right: Callable[[], Java],
) -> Callable[[], Java]:
    return lambda: combine(left, right)


def _ref_not(operand: Callable[[], Java]) -> Java:
    value = operand()
    return None if value is None else ("Boolean", not value[1])


def _ref_and(left: Callable[[], Java], right: Callable[[], Java]) -> Java:
    lv = left()
    if lv is not None and not lv[1]:
        return ("Boolean", False)
    rv = right()
    if rv is not None and not rv[1]:
        return ("Boolean", False)
    return None if lv is None or rv is None else ("Boolean", True)


def _ref_or(left: Callable[[], Java], right: Callable[[], Java]) -> Java:
    lv = left()
    if lv is not None and lv[1]:
        return ("Boolean", True)
    rv = right()
    if rv is not None and rv[1]:
        return ("Boolean", True)
    return None if lv is None or rv is None else ("Boolean", False)


def _ref_equal(left: Callable[[], Java], right: Callable[[], Java]) -> Java:
    lv, rv = left(), right()
    if (lv is None) != (rv is None):
        return None if lv is None else ("Boolean", False)
    if lv is None or _java_equals(lv, rv):
        return ("Boolean", True)
    return ("Boolean", _java_compare(lv, rv) == 0)


def _ref_ordered(op: str, left: Callable[[], Java], right: Callable[[], Java]) -> Java:
    lv = left()
    if lv is None:
        return None
    rv = right()
    if rv is None:
        return None
    if lv[0] == rv[0] == "String":
        lv = ("Double", _convert(parse_double, lv[1]))
        rv = ("Double", _convert(parse_double, rv[1]))
    answer = _java_compare(lv, rv)
    return ("Boolean", {">": answer > 0, ">=": answer >= 0, "<": answer < 0, "<=": answer <= 0}[op])


def _java_equals(lv: Java, rv: Java) -> bool:
    assert lv is not None and rv is not None
    if lv[0] != rv[0]:
        return False
    if lv[0] == "Double":
        return compare_doubles(lv[1], rv[1]) == 0
    return bool(lv[1] == rv[1])


_VALUE_OF = {"Integer": parse_int, "Long": parse_long, "Double": parse_double}


def _convert(parse_fn: Callable[[str], Any], text: str) -> Any:
    try:
        return parse_fn(text)
    except NumberFormatError as exc:
        raise JavaThrows(str(exc)) from None


def _java_compare(lv: Java, rv: Java) -> int:
    assert lv is not None and rv is not None
    (lc, left), (rc, right) = lv, rv
    if lc != rc:
        if lc == "Boolean":
            if rc == "String":
                raise JavaThrows("ClassCastException")
            return -1
        if lc in ("Integer", "Long"):
            if rc == "Double":
                lc, left = "Double", float(left)
            elif rc == "String":
                right = _convert(_VALUE_OF[lc], right)
            elif rc == "Boolean":
                return -1
        elif lc == "Double":
            if rc in ("Integer", "Long"):
                right = float(right)
            elif rc == "String":
                right = _convert(parse_double, right)
            else:
                return -1
        elif lc == "String":
            if rc == "Boolean":
                left = parse_boolean(left)
            else:
                lc, left = rc, _convert(_VALUE_OF[rc], left)
    if lc == "Double":
        return compare_doubles(left, right)
    return (left > right) - (left < right)
