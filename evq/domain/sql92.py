"""RocketMQ's SQL92 message selector: the language, parsed into a tree.

A consumer subscribing with expression type ``SQL92`` sends a selector over message properties,
for example ``region = 'eu' AND (price > 10.5 OR vip IS NOT NULL)``.  This module accepts
exactly the language of RocketMQ 4.9's ``SelectorParser.jj`` (ActiveMQ's JMS selector grammar
with LIKE, ESCAPE, arithmetic, hex and octal literals removed; the CONTAINS, STARTSWITH and
ENDSWITH operators only arrived in RocketMQ 5, so they are not here).  What an expression
*means* for a message is :mod:`evq.domain.selector`'s business.

Grammar, lowest precedence first (keywords case-insensitive)::

    selector    := or
    or          := and ( OR and )*
    and         := equality ( AND equality )*
    equality    := comparison ( ( '=' | '<>' ) comparison | IS [NOT] NULL )*
    comparison  := unary ( ( '>' | '>=' | '<' | '<=' ) unary
                         | [NOT] BETWEEN unary AND unary
                         | [NOT] IN '(' string ( ',' string )* ')' )*
    unary       := '+' unary | '-' unary | NOT unary | primary
    primary     := string | integer | decimal | TRUE | FALSE | NULL | identifier | '(' or ')'

    identifier  := [A-Za-z_$][A-Za-z0-9_$]*         (a property name)
    string      := "'" ( "''" | any char but "'" )* "'"
    integer     := '0' | [1-9][0-9]* [lL]?          (Java int when it fits, else long)
    decimal     := digits '.' digits? exponent? | '.' digits exponent? | digits exponent
    comments    := '--' to the end of the line, '/*' ... '*/'

Two RocketMQ quirks worth knowing when writing selectors: NOT binds tighter than comparisons
(``NOT a = 'x'`` is ``(NOT a) = 'x'``, which never matches; write ``NOT (a = 'x')``), and ``-5``
is the negation of the literal 5, not a constant.

Checks RocketMQ makes while parsing are made here too, each a :class:`FilterError` with the
position of the offending token: only numbers, properties and negations may stand beside
``<``/``>``/``BETWEEN``; NULL may not stand beside ``=``/``<>``; a TRUE/FALSE constant may only
be equated with another; IN needs a property; AND, OR, NOT and the whole selector need a
condition or a property; constant BETWEEN bounds must be in order; integer literals must fit a
Java long and decimal literals must be finite and non-zero.  One departure: RocketMQ silently
ignores anything after the first complete expression (``a = 1 b = 2`` selects ``a = 1``, and
``a = 007`` is ``a = 0``); evq rejects it.  Nesting is capped at :data:`MAX_DEPTH` and
length at :data:`MAX_EXPRESSION_LENGTH`, and tokenizing is one pass, so a hostile selector can
neither exhaust the stack of a broker thread nor hold it for long.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import TypeAlias

import attrs

from evq.domain.javalang import LONG_MAX, compare_doubles

MAX_EXPRESSION_LENGTH = 65536
MAX_DEPTH = 64
_LONG_DIGITS = len(str(LONG_MAX))  # longer literals cannot fit (and int() refuses > 4300)

KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
ORDERING_OPERATORS = (">", ">=", "<", "<=")
EQUALITY_OPERATORS = ("=", "<>")


class FilterError(ValueError):
    """A subscription that cannot be used: unknown expression type or a bad selector.

    ``position`` is the 0-based index in the expression where the problem was found, or
    ``None`` when the problem is not at one place (an empty expression, an unknown type).
    """

    def __init__(self, problem: str, position: int | None = None) -> None:
        super().__init__(problem if position is None else f"{problem} at position {position}")
        self.problem = problem
        self.position = position


# --- the tree ---------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Property:
    name: str


@attrs.frozen(slots=True)
class StringLiteral:
    value: str


@attrs.frozen(slots=True)
class IntegerLiteral:
    """A non-negative integer constant (a minus sign is a :class:`Negate` around it)."""

    value: int


@attrs.frozen(slots=True)
class DecimalLiteral:
    """A positive double constant."""

    value: float


@attrs.frozen(slots=True)
class BooleanLiteral:
    """TRUE, FALSE or NULL (``None``): RocketMQ types all three as boolean constants."""

    value: bool | None


@attrs.frozen(slots=True)
class Negate:
    operand: Expr


@attrs.frozen(slots=True)
class Not:
    operand: Expr


@attrs.frozen(slots=True)
class Comparison:
    """``left op right`` for ``=``, ``<>``, ``>``, ``>=``, ``<`` and ``<=``."""

    op: str
    left: Expr
    right: Expr


@attrs.frozen(slots=True)
class IsNull:
    operand: Expr
    negated: bool = False


@attrs.frozen(slots=True)
class Between:
    value: Expr
    low: Expr
    high: Expr
    negated: bool = False


@attrs.frozen(slots=True)
class In:
    property: Property
    values: tuple[str, ...]
    negated: bool = False


@attrs.frozen(slots=True)
class And:
    """Conjunction of two or more operands, flattened: AND is associative and evaluated left
    to right, so a chain needs no nesting (and no recursion to evaluate)."""

    operands: tuple[Expr, ...]

    @classmethod
    def of(cls, *operands: Expr) -> And:
        return cls(tuple(_flatten(cls, operands)))


@attrs.frozen(slots=True)
class Or:
    """Disjunction of two or more operands, flattened like :class:`And`."""

    operands: tuple[Expr, ...]

    @classmethod
    def of(cls, *operands: Expr) -> Or:
        return cls(tuple(_flatten(cls, operands)))


Expr: TypeAlias = (
    Property | StringLiteral | IntegerLiteral | DecimalLiteral | BooleanLiteral | Negate | Not
    | Comparison | IsNull | Between | In | And | Or
)

CONSTANTS = (StringLiteral, IntegerLiteral, DecimalLiteral, BooleanLiteral)
NUMBERS = (IntegerLiteral, DecimalLiteral)
CONDITIONS = (BooleanLiteral, Not, Comparison, IsNull, Between, In, And, Or)
"""Nodes RocketMQ types as boolean expressions; a bare property is cast to one where needed."""

_Rule: TypeAlias = Callable[[], Expr]
_Build: TypeAlias = Callable[..., Expr]


def _flatten(kind: type[And] | type[Or], operands: tuple[Expr, ...]) -> Iterator[Expr]:
    for operand in operands:
        if isinstance(operand, kind):
            yield from operand.operands
        else:
            yield operand


# --- rendering --------------------------------------------------------------------------------

_OR, _AND, _EQUALITY, _COMPARISON, _UNARY, _PRIMARY = range(1, 7)


def _level(node: Expr) -> int:
    if isinstance(node, Or):
        return _OR
    if isinstance(node, And):
        return _AND
    if isinstance(node, IsNull) or (
        isinstance(node, Comparison) and node.op in EQUALITY_OPERATORS
    ):
        return _EQUALITY
    if isinstance(node, Comparison | Between | In):
        return _COMPARISON
    if isinstance(node, Negate | Not):
        return _UNARY
    return _PRIMARY


def render(node: Expr) -> str:
    """Selector text that parses back to ``node``, with only the parentheses it needs."""
    if isinstance(node, Property):
        return node.name
    if isinstance(node, StringLiteral):
        return quote(node.value)
    if isinstance(node, IntegerLiteral | DecimalLiteral):
        return repr(node.value)
    if isinstance(node, BooleanLiteral):
        return {True: "TRUE", False: "FALSE", None: "NULL"}[node.value]
    if isinstance(node, Negate):
        operand = _operand_text(node.operand, _UNARY)
        return f"- {operand}" if operand.startswith("-") else f"-{operand}"  # "--" is a comment
    if isinstance(node, Not):
        return f"NOT {_operand_text(node.operand, _UNARY)}"
    if isinstance(node, Comparison):
        left_level = _EQUALITY if node.op in EQUALITY_OPERATORS else _COMPARISON
        left = _operand_text(node.left, left_level)
        return f"{left} {node.op} {_operand_text(node.right, left_level + 1)}"
    if isinstance(node, IsNull):
        return f"{_operand_text(node.operand, _EQUALITY)} IS {'NOT ' if node.negated else ''}NULL"
    if isinstance(node, Between):
        value, low, high = (
            _operand_text(node.value, _COMPARISON),
            _operand_text(node.low, _UNARY),
            _operand_text(node.high, _UNARY),
        )
        return f"{value} {'NOT ' if node.negated else ''}BETWEEN {low} AND {high}"
    if isinstance(node, In):
        values = ", ".join(map(quote, node.values))
        return f"{node.property.name} {'NOT ' if node.negated else ''}IN ({values})"
    joiner = " AND " if isinstance(node, And) else " OR "
    level = _EQUALITY if isinstance(node, And) else _AND
    return joiner.join(_operand_text(operand, level) for operand in node.operands)


def _operand_text(node: Expr, min_level: int) -> str:
    text = render(node)
    return f"({text})" if _level(node) < min_level else text


def quote(value: str) -> str:
    """A string literal: single quotes, an inner quote doubled."""
    return "'" + value.replace("'", "''") + "'"


# --- tokens -----------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
      (?P<skip> [ \t\n\r\f]+ | /\*[^*]*\*+(?:[^*/][^*]*\*+)*/ )
    | (?P<number> [0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)? | \.[0-9]+(?:[eE][+-]?[0-9]+)? )
    | (?P<string> '(?:''|[^'])*' )
    | (?P<word> [A-Za-z_$][A-Za-z0-9_$]* )
    | (?P<op> <> | <= | >= | [=<>(),+-] )
    """,
    re.VERBOSE,
)
_LINE_END = re.compile(r"\r\n|\n|\r")
_INTEGER_SUFFIX = "lL"


@attrs.frozen(slots=True)
class Token:
    """``kind`` is the keyword in upper case, the operator itself, or one of ``identifier``,
    ``integer``, ``decimal``, ``string`` and ``end``."""

    kind: str
    text: str
    position: int


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``, each the longest match at its place as JavaCC picks them.

    Every step consumes what it scanned, so hostile input costs linear time: a ``--``
    comment is only tried where a line end follows, and a number is scanned once as the
    longest run of number characters and then classified.
    """
    tokens: list[Token] = []
    pos, end = 0, len(text)
    last_line_end = max(text.rfind("\n"), text.rfind("\r"))
    while pos < end:
        if pos < last_line_end and text.startswith("--", pos):
            line_end = _LINE_END.search(text, pos)
            assert line_end is not None  # one exists after pos
            pos = line_end.end()
            continue
        match = _TOKEN.match(text, pos)
        if match is None:
            raise FilterError(_lexical_problem(text, pos), pos)
        kind, lexeme = match.lastgroup, match.group()
        if kind == "number":
            token = _number(text, lexeme, pos)
            tokens.append(token)
            pos += len(token.text)
            continue
        if kind == "word":
            upper = lexeme.upper()
            tokens.append(Token(upper if upper in KEYWORDS else "identifier", lexeme, pos))
        elif kind == "op":
            tokens.append(Token(lexeme, lexeme, pos))
        elif kind == "string":
            tokens.append(Token(kind, lexeme, pos))
        pos = match.end()
    tokens.append(Token("end", "", end))
    return tokens


def _number(text: str, lexeme: str, pos: int) -> Token:
    """A run of number characters: a decimal if it has a point or an exponent, else an
    integer, which (JavaCC's ``"0" | [1-9][0-9]* [lL]?``) never has a leading zero and may
    carry a long suffix."""
    if not lexeme.isdigit():
        return Token("decimal", lexeme, pos)
    if len(lexeme) > 1 and lexeme.startswith("0"):
        # JavaCC would split "007" into three integers; no grammar rule takes two in a row.
        raise FilterError(f"integer literal {_shortened(lexeme)} has a leading zero", pos)
    suffix = text[pos + len(lexeme) : pos + len(lexeme) + 1]
    if suffix and suffix in _INTEGER_SUFFIX and lexeme != "0":
        lexeme += suffix
    return Token("integer", lexeme, pos)


def _lexical_problem(text: str, pos: int) -> str:
    if text.startswith("'", pos):
        return "unterminated string literal"
    if text.startswith("/*", pos):
        return "unterminated comment"
    return f"unexpected character {text[pos]!r}"


# --- parsing ----------------------------------------------------------------------------------


def parse(text: str) -> Expr:
    """The tree of a selector, or :class:`FilterError` saying what is wrong and where."""
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise FilterError(
            f"expression is {len(text)} characters long, the limit is {MAX_EXPRESSION_LENGTH}"
        )
    return _Parser(tokenize(text)).selector()


class _Parser:
    """Recursive descent over the token list, one method per grammar rule.

    ``_depth`` counts what makes the tree deeper (parentheses, unary operators, chained
    equalities, operand lists of AND and OR, comparisons), so the tree's depth, the parser's
    recursion and the evaluator's recursion all stay below a fixed multiple of MAX_DEPTH.
    """

    __slots__ = ("_depth", "_i", "_tokens")

    def __init__(self, tokens: list[Token]) -> None:
        self._tokens = tokens
        self._i = 0
        self._depth = 0

    def selector(self) -> Expr:
        start = self._peek()
        node = self._or()
        trailing = self._peek()
        if trailing.kind != "end":
            raise FilterError(f"unexpected {_describe(trailing)} after the expression",
                              trailing.position)
        return _condition(node, start)

    def _or(self) -> Expr:
        return self._chain("OR", self._and, Or.of)

    def _and(self) -> Expr:
        return self._chain("AND", self._equality, And.of)

    def _chain(self, keyword: str, operand: _Rule, build: _Build) -> Expr:
        first = self._peek()
        node = operand()
        if self._peek().kind != keyword:
            return node
        saved = self._depth
        self._descend(first)
        operands = [_condition(node, first)]
        try:
            while self._peek().kind == keyword:
                self._advance()
                start = self._peek()
                operands.append(_condition(operand(), start))
        finally:
            self._depth = saved
        return build(*operands)

    def _equality(self) -> Expr:
        node = self._comparison()
        saved = self._depth
        try:
            while True:
                token = self._peek()
                if token.kind in EQUALITY_OPERATORS:
                    self._advance()
                    self._descend(token)
                    right = self._comparison()
                    _check_equality(node, right, token)
                    node = Comparison(token.kind, node, right)
                elif token.kind == "IS":
                    self._advance()
                    self._descend(token)
                    negated = self._accept("NOT")
                    self._expect("NULL", "NULL or NOT NULL after IS")
                    node = IsNull(node, negated)
                else:
                    return node
        finally:
            self._depth = saved

    def _comparison(self) -> Expr:
        node = self._unary()
        saved = self._depth
        try:
            while True:
                token = self._peek()
                negated = token.kind == "NOT" and self._after().kind in ("BETWEEN", "IN")
                if negated:
                    self._advance()
                    token = self._peek()
                if token.kind in ORDERING_OPERATORS:
                    self._advance()
                    self._descend(token)
                    right = self._unary()
                    _check_ordered(node, token)
                    _check_ordered(right, token)
                    node = Comparison(token.kind, node, right)
                elif token.kind == "BETWEEN":
                    self._advance()
                    self._descend(token)
                    node = self._between(node, token, negated)
                elif token.kind == "IN":
                    self._advance()
                    self._descend(token)
                    node = self._in(node, token, negated)
                else:
                    return node
        finally:
            self._depth = saved

    def _between(self, value: Expr, token: Token, negated: bool) -> Between:
        low = self._unary()
        self._expect("AND", "AND between the bounds of BETWEEN")
        high = self._unary()
        if not negated:
            _check_bounds(low, high, token)
        for operand in (value, low, high):
            _check_ordered(operand, token)
        return Between(value, low, high, negated)

    def _in(self, left: Expr, token: Token, negated: bool) -> In:
        self._expect("(", "'(' after IN")
        values = [self._string()]
        while self._accept(","):
            values.append(self._string())
        self._expect(")", "')' closing the IN list")
        if not isinstance(left, Property):
            raise FilterError(f"IN needs a property on its left, not {_shown(left)}",
                              token.position)
        return In(left, tuple(values), negated)

    def _string(self) -> str:
        token = self._expect("string", "a string literal in the IN list")
        return token.text[1:-1].replace("''", "'")

    def _unary(self) -> Expr:
        token = self._peek()
        if token.kind not in ("+", "-", "NOT"):
            return self._primary()
        self._advance()
        self._descend(token)
        try:
            start = self._peek()
            operand = self._unary()
        finally:
            self._depth -= 1
        if token.kind == "+":
            return operand
        if token.kind == "-":
            return Negate(operand)
        return Not(_condition(operand, start))

    def _primary(self) -> Expr:
        token = self._advance()
        kind = token.kind
        if kind == "identifier":
            return Property(token.text)
        if kind == "string":
            return StringLiteral(token.text[1:-1].replace("''", "'"))
        if kind == "integer":
            return _integer(token)
        if kind == "decimal":
            return _decimal(token)
        if kind in ("TRUE", "FALSE", "NULL"):
            return BooleanLiteral({"TRUE": True, "FALSE": False, "NULL": None}[kind])
        if kind == "(":
            self._descend(token)
            try:
                node = self._or()
            finally:
                self._depth -= 1
            self._expect(")", "')'")
            return node
        raise FilterError(f"unexpected {_describe(token)}", token.position)

    # -- token plumbing

    def _peek(self) -> Token:
        return self._tokens[self._i]

    def _after(self) -> Token:
        """The token after a current one that is not the end (the end token is last)."""
        return self._tokens[self._i + 1]

    def _advance(self) -> Token:
        token = self._peek()
        if token.kind != "end":
            self._i += 1
        return token

    def _accept(self, kind: str) -> bool:
        if self._peek().kind != kind:
            return False
        self._i += 1
        return True

    def _expect(self, kind: str, wanted: str) -> Token:
        token = self._peek()
        if token.kind != kind:
            raise FilterError(f"expected {wanted}, found {_describe(token)}", token.position)
        return self._advance()

    def _descend(self, token: Token) -> None:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise FilterError(f"expression nested deeper than {MAX_DEPTH} levels",
                              token.position)


def _describe(token: Token) -> str:
    if token.kind == "end":
        return "end of expression"
    if token.kind in KEYWORDS:
        return f"keyword {token.kind}"
    text = _shortened(token.text)
    return f"{token.kind} {text}" if token.kind in ("integer", "decimal") else repr(text)


def _shown(node: Expr) -> str:
    return _shortened(render(node))


def _shortened(text: str, limit: int = 40) -> str:
    """Error messages quote the offending part, but never a whole hostile expression."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _integer(token: Token) -> IntegerLiteral:
    digits = token.text.rstrip(_INTEGER_SUFFIX)
    if len(digits) > _LONG_DIGITS or int(digits) > LONG_MAX:
        raise FilterError(f"integer literal {token.text} does not fit a Java long",
                          token.position)
    return IntegerLiteral(int(digits))


def _decimal(token: Token) -> DecimalLiteral:
    value = float(token.text)
    if math.isinf(value):
        raise FilterError(f"decimal literal {token.text} is too large for a double",
                          token.position)
    if value == 0.0:
        # RocketMQ checks "value < Double.MIN_VALUE", which rejects zero and underflow.
        raise FilterError(f"decimal literal {token.text} is zero, which RocketMQ rejects",
                          token.position)
    return DecimalLiteral(value)


# --- RocketMQ's construction checks -----------------------------------------------------------


def _condition(node: Expr, where: Token) -> Expr:
    if isinstance(node, (*CONDITIONS, Property)):
        return node
    raise FilterError(f"{_shown(node)} is not a condition", where.position)


def _check_ordered(node: Expr, op: Token) -> None:
    if isinstance(node, NUMBERS) or not isinstance(node, (*CONSTANTS, *CONDITIONS)):
        return
    raise FilterError(
        f"{_shown(node)} cannot be compared with {op.text} "
        "(only numbers, properties and negations can)",
        op.position,
    )


def _check_equality(left: Expr, right: Expr, op: Token) -> None:
    for side in (left, right):
        if side == BooleanLiteral(None):
            raise FilterError(f"NULL cannot be compared with {op.text}; use IS NULL",
                              op.position)
    if (
        isinstance(left, BooleanLiteral)
        and isinstance(right, CONSTANTS)
        and not isinstance(right, BooleanLiteral)
    ):
        raise FilterError(f"{_shown(left)} cannot be compared with {_shown(right)}",
                          op.position)


def _check_bounds(low: Expr, high: Expr, op: Token) -> None:
    if not (isinstance(low, NUMBERS) and isinstance(high, NUMBERS)):
        return
    lo, hi = low.value, high.value
    if isinstance(lo, float) or isinstance(hi, float):
        out_of_order = compare_doubles(float(hi), float(lo)) < 0  # Java widens to double
    else:
        out_of_order = hi < lo
    if out_of_order:
        raise FilterError(
            f"BETWEEN bounds out of order: {render(low)} is greater than {render(high)}",
            op.position,
        )
