"""Subscriptions: which messages of a topic a consumer asked for, and the tests that decide it.

A pull names a topic, an expression and its type (``TAG`` by default, or ``SQL92``).
Filtering runs in two stages, as in RocketMQ:

1. :attr:`Subscription.tag_filter` tests the tags code of each ConsumeQueue entry, so the
   broker skips entries without reading the log.  For a tag subscription it is the Java hash
   of each subscribed tag; ``*`` and SQL92 pass every entry (evq keeps no bloom filter).
2. :meth:`Subscription.matches` is the exact test on a candidate record: its TAGS string must
   be one of the subscribed tags (so a hash collision is not delivered; RocketMQ leaves that
   check to the client) or the SQL92 selector must be TRUE for its properties.

Tag expressions are parsed as RocketMQ's ``FilterAPI.buildSubscriptionData`` does: null,
empty or exactly ``*`` subscribes to everything; anything else is split on ``||``, each part
trimmed as Java's ``String.trim`` trims, empty parts dropped.  So ``" * "`` subscribes to the
literal tag ``*``, an expression of separators and blanks matches nothing, and one of
separators alone (``||||``) is an error, as Java's split leaves nothing to build from.  A TAGS
value is compared whole: ``a||b`` on a message is one tag, as its tags code is one hash.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from evq.domain.hashing import tags_code
from evq.domain.javalang import java_trim
from evq.domain.log import TagFilter
from evq.domain.selector import SqlFilter, compile_sql
from evq.domain.sql92 import FilterError

__all__ = [
    "SUB_ALL",
    "TAG_SEPARATOR",
    "ExpressionType",
    "FilterError",
    "Subscription",
    "parse_subscription",
]

SUB_ALL = "*"
TAG_SEPARATOR = "||"
_INT32 = 0xFFFFFFFF


class ExpressionType(enum.Enum):
    TAG = "TAG"
    SQL92 = "SQL92"

    @classmethod
    def parse(cls, value: str | ExpressionType | None) -> ExpressionType:
        """The type named on the wire, in any case; null or empty means TAG, as RocketMQ's
        ``ExpressionType.isTagType`` has it."""
        if isinstance(value, ExpressionType):
            return value
        if not value:
            return cls.TAG
        try:
            return cls(value.upper())
        except ValueError:
            raise FilterError(
                f"unknown expression type {value!r} (expected TAG or SQL92)"
            ) from None


@attrs.frozen(slots=True)
class Subscription:
    """One consumer's interest in a topic, built by :func:`parse_subscription`.

    ``expression`` is ``*`` for a subscription to everything; ``tags`` and ``codes`` (their
    Java hashes, signed) are filled for other tag subscriptions, ``sql`` for SQL92 ones.
    """

    topic: str
    expression: str
    expression_type: ExpressionType = ExpressionType.TAG
    version: int = 0
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] = frozenset()
    sql: SqlFilter | None = None

    @property
    def matches_all(self) -> bool:
        return self.expression_type is ExpressionType.TAG and self.expression == SUB_ALL

    @property
    def needs_exact_check(self) -> bool:
        """False when every entry that passes :attr:`tag_filter` matches, so the broker can
        serve the records without decoding their properties."""
        return not self.matches_all

    @property
    def tag_filter(self) -> TagFilter | None:
        """The hash test for ConsumeQueue tags codes; None when every entry may match."""
        if self.matches_all or self.expression_type is ExpressionType.SQL92:
            return None
        # RocketMQ compares (int) tagsCode: only the low 32 bits of the stored 64 count.
        unsigned = frozenset(code & _INT32 for code in self.codes)

        def accepts(code: int) -> bool:
            return (code & _INT32) in unsigned

        return accepts

    def matches(self, tags: str | None, properties: Mapping[str, str]) -> bool:
        """The exact test on a record with this TAGS value and these properties (the whole
        stored map, TAGS included, which is what a SQL92 selector sees)."""
        if self.sql is not None:
            return self.sql.matches(properties)
        return self.matches_all or tags in self.tags


def parse_subscription(
    topic: str,
    expression: str | None,
    expression_type: str | ExpressionType | None = ExpressionType.TAG,
    version: int = 0,
) -> Subscription:
    """A subscription as RocketMQ builds it from a pull or heartbeat; :class:`FilterError`
    for an unknown type, a tag expression of bare separators, or an empty or malformed SQL92
    selector (SQL92 parses are cached)."""
    kind = ExpressionType.parse(expression_type)
    if kind is ExpressionType.SQL92:
        if not expression:
            raise FilterError("SQL92 expression is empty")
        return Subscription(topic, expression, kind, version, sql=compile_sql(expression))
    if not expression or expression == SUB_ALL:
        return Subscription(topic, SUB_ALL, kind, version)
    parts = expression.split(TAG_SEPARATOR)
    if not any(parts):
        # Java's split drops trailing empty strings, leaving none; FilterAPI then throws.
        raise FilterError(f"tag expression {expression!r} has nothing between its separators")
    tags = frozenset(tag for part in parts if (tag := java_trim(part)))
    codes = frozenset(tags_code(tag) for tag in tags)
    return Subscription(topic, expression, kind, version, tags, codes)
