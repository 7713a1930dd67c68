"""What a SQL92 selector means for one message, compiled once into closures.

RocketMQ evaluates a selector over the message's properties, whose values are all strings,
with Java's typing rules; the consumer receives the message only when the result is TRUE.
The rules, as RocketMQ 4.9's ``ComparisonExpression``, ``LogicExpression`` and
``UnaryExpression`` apply them:

* Values are Java types: properties and string literals are ``String``; integer literals are
  ``Integer`` when they fit 32 bits, else ``Long``; decimal literals are ``Double``; TRUE and
  FALSE are ``Boolean``; NULL and missing properties are null.
* Three-valued logic: a comparison with a null side is unknown (null); NOT unknown is unknown;
  AND is FALSE if either side is FALSE, OR is TRUE if either side is TRUE, else unknown wins.
  Operands are evaluated left to right and AND/OR stop at the first deciding operand.
* ``=`` differs: null on the right only is FALSE, null on both sides is TRUE, so ``a = b``
  holds when both properties are missing.  ``x IS NULL`` is never unknown.
* Mixed types convert before comparing: a string beside a number is parsed as that number's
  type (``Integer.valueOf``, ``Long.valueOf`` or ``Double.valueOf``), a string beside a boolean
  by ``Boolean.valueOf``; two strings under ``<``, ``>``, ``<=``, ``>=`` are both parsed as
  doubles; int and long widen to double beside a double.  A boolean beside a number compares
  as "less".  A boolean on the left of a string is a Java ClassCastException.
* A failed conversion or cast is an error that aborts the whole evaluation; the RocketMQ
  broker logs it and does not deliver the message.  :meth:`SqlFilter.evaluate` raises
  :class:`EvaluationError`; :meth:`SqlFilter.matches` answers False.
* A bare property used as a condition is FALSE when present (a string is not a Boolean) and
  unknown when missing; ``-x`` of anything but a number is null.
* ``IN`` is an exact string match on a present property.

Every operand's Java type is known when compiling (a property is always a string or null), so
each comparison gets its conversion chosen once instead of testing types per message.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeAlias

import attrs

from evq.domain.javalang import (
    INT_MAX,
    NumberFormatError,
    compare_doubles,
    parse_boolean,
    parse_double,
    parse_int,
    parse_long,
)
from evq.domain.sql92 import (
    And,
    Between,
    BooleanLiteral,
    Comparison,
    DecimalLiteral,
    Expr,
    FilterError,
    In,
    IntegerLiteral,
    IsNull,
    Negate,
    Not,
    Or,
    Property,
    StringLiteral,
    parse,
)

Properties: TypeAlias = Mapping[str, str]
Value: TypeAlias = str | int | float | bool
Evaluate: TypeAlias = Callable[[Properties], Any]
"""Returns a Value or None; conditions return True, False or None (unknown)."""
Relation: TypeAlias = Callable[[Any, Any], bool]
"""Decides ``left op right`` for two non-null values."""

PARSE_CACHE_SIZE = 256


class EvaluationError(ValueError):
    """The selector cannot be evaluated on this message (a property that does not convert to
    the type it is compared with); RocketMQ does not deliver such a message."""


class Kind(enum.Enum):
    """The Java type an operand evaluates to when it is not null."""

    STRING = "String"
    INT = "Integer"
    LONG = "Long"
    DOUBLE = "Double"
    BOOLEAN = "Boolean"
    NULL = "null"  # always null: NULL itself, or the negation of a non-number


_NUMBERS = (Kind.INT, Kind.LONG, Kind.DOUBLE)
_PARSERS: dict[Kind, Callable[[str], Value]] = {
    Kind.INT: parse_int,
    Kind.LONG: parse_long,
    Kind.DOUBLE: parse_double,
}
_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


@attrs.frozen(slots=True)
class SqlFilter:
    """A parsed and compiled selector; immutable and safe to share between threads."""

    expression: str
    tree: Expr
    _evaluate: Evaluate = attrs.field(eq=False, repr=False)

    def evaluate(self, properties: Properties) -> bool | None:
        """True, False or None (unknown); :class:`EvaluationError` where RocketMQ throws."""
        try:
            result: bool | None = self._evaluate(properties)
        except NumberFormatError as exc:
            raise EvaluationError(str(exc)) from None
        return result

    def matches(self, properties: Properties) -> bool:
        """Whether RocketMQ would deliver a message with these properties."""
        try:
            return self._evaluate(properties) is True
        except (EvaluationError, NumberFormatError):
            return False


def compile_sql(expression: str) -> SqlFilter:
    """The filter of a selector, parsed once per distinct expression (successes and failures
    are both cached, as RocketMQ's parser does, so a consumer repeating a bad selector on
    every pull costs a dictionary lookup)."""
    result = _compile_cached(expression)
    if isinstance(result, FilterError):
        raise FilterError(result.problem, result.position)  # fresh: no traceback build-up
    return result


@lru_cache(maxsize=PARSE_CACHE_SIZE)
def _compile_cached(expression: str) -> SqlFilter | FilterError:
    try:
        tree = parse(expression)
    except FilterError as exc:
        return exc.with_traceback(None)
    return SqlFilter(expression, tree, compile_tree(tree))


def compile_tree(tree: Expr) -> Evaluate:
    """The selector as a function of a message's properties (the tree must come from
    :func:`evq.domain.sql92.parse`, which has made RocketMQ's construction checks)."""
    return _condition(tree)


# --- conditions -------------------------------------------------------------------------------


def _condition(node: Expr) -> Evaluate:
    if isinstance(node, Property):
        return _boolean_cast(node.name)
    if isinstance(node, BooleanLiteral):
        return _constant(node.value)
    if isinstance(node, Not):
        return _not(_condition(node.operand))
    if isinstance(node, And):
        return _all_of([_condition(operand) for operand in node.operands])
    if isinstance(node, Or):
        return _any_of([_condition(operand) for operand in node.operands])
    if isinstance(node, Comparison):
        left, right = _operand(node.left), _operand(node.right)
        if node.op == "=":
            return _equal(left, right)
        if node.op == "<>":
            return _not(_equal(left, right))
        return _ordered(node.op, left, right)
    if isinstance(node, IsNull):
        return _is_null(_operand(node.operand).evaluate, node.negated)
    if isinstance(node, Between):
        value, low, high = _operand(node.value), _operand(node.low), _operand(node.high)
        if node.negated:
            return _any_of([_ordered("<", value, low), _ordered(">", value, high)])
        return _all_of([_ordered(">=", value, low), _ordered("<=", value, high)])
    if isinstance(node, In):
        return _in(node.property.name, frozenset(node.values), node.negated)
    raise TypeError(f"{node!r} is not a condition")  # parse() never produces this


def _constant(value: Any) -> Evaluate:
    return lambda _properties: value


def _boolean_cast(name: str) -> Evaluate:
    def cast(properties: Properties) -> bool | None:
        return None if properties.get(name) is None else False

    return cast


def _not(operand: Evaluate) -> Evaluate:
    def negation(properties: Properties) -> bool | None:
        value = operand(properties)
        return None if value is None else not value

    return negation


def _all_of(operands: Sequence[Evaluate]) -> Evaluate:
    def conjunction(properties: Properties) -> bool | None:
        unknown = False
        for operand in operands:
            value = operand(properties)
            if value is False:
                return False
            if value is None:
                unknown = True
        return None if unknown else True

    return conjunction


def _any_of(operands: Sequence[Evaluate]) -> Evaluate:
    def disjunction(properties: Properties) -> bool | None:
        unknown = False
        for operand in operands:
            value = operand(properties)
            if value is True:
                return True
            if value is None:
                unknown = True
        return None if unknown else False

    return disjunction


def _is_null(operand: Evaluate, negated: bool) -> Evaluate:
    if negated:
        return lambda properties: operand(properties) is not None
    return lambda properties: operand(properties) is None


def _in(name: str, values: frozenset[str], negated: bool) -> Evaluate:
    def membership(properties: Properties) -> bool | None:
        value = properties.get(name)
        return None if value is None else (value in values) is not negated

    return membership


def _equal(left: _Operand, right: _Operand) -> Evaluate:
    same = _relation(left.kind, "=", right.kind)
    left_value, right_value = left.evaluate, right.evaluate

    def equal(properties: Properties) -> bool | None:
        lv, rv = left_value(properties), right_value(properties)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        return same(lv, rv)

    return equal


def _ordered(op: str, left: _Operand, right: _Operand) -> Evaluate:
    holds = _relation(left.kind, op, right.kind)
    left_value, right_value = left.evaluate, right.evaluate

    def ordered(properties: Properties) -> bool | None:
        lv = left_value(properties)
        if lv is None:
            return None
        rv = right_value(properties)
        if rv is None:
            return None
        return holds(lv, rv)

    return ordered


# --- operands ---------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class _Operand:
    kind: Kind
    evaluate: Evaluate


def _operand(node: Expr) -> _Operand:
    if isinstance(node, Property):
        name = node.name
        return _Operand(Kind.STRING, lambda properties: properties.get(name))
    if isinstance(node, StringLiteral):
        return _Operand(Kind.STRING, _constant(node.value))
    if isinstance(node, IntegerLiteral):
        kind = Kind.INT if node.value <= INT_MAX else Kind.LONG
        return _Operand(kind, _constant(node.value))
    if isinstance(node, DecimalLiteral):
        return _Operand(Kind.DOUBLE, _constant(node.value))
    if isinstance(node, BooleanLiteral):
        return _Operand(Kind.NULL if node.value is None else Kind.BOOLEAN, _constant(node.value))
    if isinstance(node, Negate):
        return _negate(_operand(node.operand))
    return _Operand(Kind.BOOLEAN, _condition(node))


def _negate(inner: _Operand) -> _Operand:
    value = inner.evaluate
    if inner.kind in _NUMBERS:

        def negative(properties: Properties) -> Any:
            number = value(properties)
            return None if number is None else -number

        return _Operand(inner.kind, negative)

    def non_number(properties: Properties) -> None:
        value(properties)  # still evaluated: a condition inside may throw, as in RocketMQ
        return None

    return _Operand(Kind.NULL, non_number)


# --- Java's __compare -------------------------------------------------------------------------


def _relation(left: Kind, op: str, right: Kind) -> Relation:
    """Java's ``__compare`` of two non-null values of these kinds, after its conversions,
    followed by the operator's test of the answer.  Where both sides end up as ints, strings or
    booleans (total orders) the test applies to the values directly, saving a call."""
    test = _TESTS[op]
    if Kind.NULL in (left, right):
        return test  # never called: that side's value is always null
    if left is right:
        if left is Kind.STRING and op != "=":
            return _as_doubles(test, parse_double, parse_double)
        return _as_doubles(test, _same, _same) if left is Kind.DOUBLE else test
    if Kind.BOOLEAN in (left, right):
        if left is Kind.BOOLEAN and right is Kind.STRING:
            return _class_cast
        if left is Kind.STRING:
            return lambda a, b: test(parse_boolean(a), b)
        answer = test(-1, 0)  # a boolean beside a number: Java answers -1, "less"
        return lambda _a, _b: answer
    if left is Kind.STRING:
        parse = _PARSERS[right]
        if right is Kind.DOUBLE:
            return _as_doubles(test, parse, _same)
        return lambda a, b: test(parse(a), b)
    if right is Kind.STRING:
        parse = _PARSERS[left]
        if left is Kind.DOUBLE:
            return _as_doubles(test, _same, parse)
        return lambda a, b: test(a, parse(b))
    if Kind.DOUBLE in (left, right):
        return _as_doubles(test, float, float)
    return test  # int beside long


def _as_doubles(
    test: Callable[[Any, Any], bool],
    convert_left: Callable[[Any], float],
    convert_right: Callable[[Any], float],
) -> Relation:
    """Double's order is not Python's (NaN, -0.0), so doubles go through ``Double.compare``."""
    return lambda a, b: test(compare_doubles(convert_left(a), convert_right(b)), 0)


def _same(value: float) -> float:
    return value


def _class_cast(a: Any, b: Any) -> bool:
    raise EvaluationError(f"cannot compare boolean {a} with string {b!r} (ClassCastException)")
