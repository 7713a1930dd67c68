"""The MessageLog port: what the broker needs from storage, and nothing more.

Every backend (mmap CommitLog, LMDB, RocksDB) implements :class:`MessageLog` with the same
observable behaviour, proven by one conformance suite:

* records are RocketMQ stored-message bytes (:mod:`evq.domain.record`), kept byte for byte;
* physical offsets are byte positions in one logical log, BLANK padding included, so the
  same bytes land at the same offsets on every backend and offset msgIds agree;
* queue offsets are dense per (topic, queue) and never reused;
* every projection (consume queues, key index) is rebuilt from the log after a crash;
* a replica fed :meth:`read_log` output through :meth:`append_replicated` ends up with the same
  log and projections as its source.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence, Sized

import attrs

from evq.domain.record import PutRecord, offset_msg_id


class PutStatus(enum.Enum):
    """RocketMQ ``PutMessageStatus``; the broker maps it to a send response code."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"

    # Members are singletons compared by identity, so identity hashing agrees with equality;
    # Enum's own __hash__ is a Python function, and a send's answer looks its status up.
    __hash__ = object.__hash__


class GetStatus(enum.Enum):
    """RocketMQ ``GetMessageStatus``; the value is the name Java puts in a pull's remark."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    NO_NEW_MESSAGE = "OFFSET_OVERFLOW_ONE"  # alias: asked for exactly the next offset
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class FlushMode(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class LogError(Exception):
    """Base of the errors a backend raises; driver errors are translated into these."""


class LogClosed(LogError):
    """The log was used after :meth:`MessageLog.close`."""


class LogLocked(LogError):
    """Another process holds the store directory."""


class StoreUnavailable(LogError):
    """The store directory cannot be opened: a file stands where a directory should be, no
    permission, a read-only file system.  Says so with the path, so that an operator is not
    sent looking at the port or the network."""

    def __init__(self, path: object, cause: OSError) -> None:
        self.path = path
        super().__init__(f"cannot open the store at {path}: {cause.strerror or cause}")


class ReplicationError(LogError):
    """Replicated bytes that do not continue this log (wrong offset, broken record)."""


def check_empty(min_offset: int, max_offset: int) -> None:
    """:meth:`MessageLog.begin_at`'s precondition: a log with bytes keeps its start."""
    if max_offset != min_offset:
        raise ReplicationError(f"only an empty log begins anew; this one holds "
                               f"[{min_offset}, {max_offset})")


@attrs.define(slots=True)
class AppendResult:
    """Where a record landed.  Not frozen: one is built per appended message, and attrs'
    frozen initializer costs several times a plain one on that path."""

    status: PutStatus
    physical_offset: int = -1
    size: int = 0
    queue_offset: int = -1
    store_timestamp: int = 0
    store_host: bytes = b""

    @property
    def end_offset(self) -> int:
        """The log offset durability waits for: just past this record."""
        return self.physical_offset + self.size

    @property
    def msg_id(self) -> str:
        """The offset msgId: store host and physical offset, uppercase hex."""
        return offset_msg_id(self.store_host, self.physical_offset) if self.store_host else ""


AppendSummary = tuple[int, int, int, str, int, int]
"""``(first physical offset, first queue offset, end offset, msgIds, count, bytes)`` of an
append's results: everything a send's answer reads of them, taken in one call (a sync send
read them through six properties and methods, each a cold Python frame a request).  The first
physical offset is negative when the first record was refused (the answer is a refusal)."""


class AppendedRecords:
    """What :meth:`MessageLog.append` may return instead of a list: a sequence of results
    that also sums itself up for a send's answer (its status, end, bytes and msgIds, and
    :meth:`summary`) without making an :class:`AppendResult` a record.  A backend that
    keeps its results compactly returns one (the mmap store does); the broker reads any other
    sequence result by result.

    A plain class, not an ABC (its subclasses add ``Sequence``): the broker asks
    ``isinstance`` of it several times a send, and ABCMeta's check runs Python code."""

    __slots__ = ()

    def status(self) -> PutStatus:
        """The first refused record's status, else PUT_OK."""
        raise NotImplementedError

    def end_offset(self) -> int:
        """The largest :attr:`AppendResult.end_offset` (0 when there are no results)."""
        raise NotImplementedError

    def size(self) -> int:
        """The bytes appended: the sum of the results' sizes."""
        raise NotImplementedError

    def msg_ids(self) -> str:
        """Each result's :attr:`AppendResult.msg_id`, comma-joined."""
        raise NotImplementedError

    def summary(self) -> AppendSummary:
        """The :data:`AppendSummary` of the results."""
        raise NotImplementedError

    def single(self) -> tuple[tuple[int, int, int], bytes] | None:
        """For one stored record: its physical offset, size and queue offset, and the store
        host as its msgId spells it (:func:`~evq.domain.record.offset_msg_id`); None for
        several records or a refused one.  What a single send's answer needs, without the
        summary's strings (the send lane makes the msgId itself)."""
        raise NotImplementedError


@attrs.frozen(slots=True)
class ReadResult:
    """A pull's worth of raw records from one queue.

    ``records`` are views of the stored bytes (for mmap, of the mapped segment): concatenated
    they are a pull response body.  ``last_physical_offset`` is where the last scanned entry
    points; with :attr:`MessageLog.max_physical_offset` it tells how far behind the reader is.
    """

    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    records: list[memoryview] = attrs.field(factory=list)
    queue_offsets: list[int] = attrs.field(factory=list)
    last_physical_offset: int = -1

    @property
    def total_bytes(self) -> int:
        return sum(len(r) for r in self.records)


@attrs.frozen(slots=True)
class KeyQueryResult:
    records: list[memoryview]
    physical_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_physical_offset: int


@attrs.frozen(slots=True)
class Dispatched:
    """One record applied to the projections; handed to dispatch subscribers."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    sysflag: int


DispatchCallback = Callable[[Sequence[Dispatched]], None]


@attrs.frozen(slots=True)
class ExpiryReport:
    deleted_segments: int
    deleted_bytes: int
    min_physical_offset: int


@attrs.frozen(slots=True)
class DiskStatus:
    """How full the store's file system is, and whether that stops puts.

    ``used_ratio`` is the share of the file system in use (0 to 1), as RocketMQ's
    ``commitLogDiskRatio`` reports it; ``refused`` says why puts are refused (they are answered
    SERVICE_NOT_AVAILABLE), empty while they are taken.  Reads never stop."""

    path: str
    used_ratio: float
    refused: str = ""

    @property
    def writable(self) -> bool:
        return not self.refused


TagFilter = Callable[[int], bool]
"""Decides from a ConsumeQueue tag code whether an entry may match (hash test only)."""


class MessageLog(abc.ABC):
    """The storage port.  Thread-safe: appends serialize on one put lock, reads do not block."""

    # --- writing --------------------------------------------------------------------------

    @abc.abstractmethod
    def append(self, records: Sequence[PutRecord]) -> Sequence[AppendResult]:
        """Append records in order, as one batch under the put lock; one result a record.

        Each gets its physical offset, the next queue offset of its (topic, queue) (prepared
        and rollback transaction records get queue offset 0 and no ConsumeQueue entry) and a
        store timestamp; those fields are patched into the bytes.  Durability is *not* awaited:
        see :meth:`wait_durable`.  Any sequence will do (a list, or an
        :class:`AppendedRecords` that makes each result when it is read, as the mmap
        backend's does).

        A full disk never raises: the records it could not take are SERVICE_NOT_AVAILABLE
        (see :attr:`disk_status`), and nothing of them is kept.
        """

    @abc.abstractmethod
    def wait_durable(self, end_offset: int, timeout: float) -> bool:
        """Block until the log is durable up to ``end_offset``; False on timeout.

        Many waiters are served by one flush (group commit).  Under ASYNC_FLUSH this returns
        at once: the flush policy, not the caller, decides when bytes reach the disk.
        """

    @abc.abstractmethod
    def on_durable(self, end_offset: int, callback: Callable[[bool], None], timeout: float) -> None:
        """Call ``callback(True)`` once durable up to ``end_offset``, ``callback(False)`` on
        timeout; from the flusher's thread.  The non-blocking form of :meth:`wait_durable`."""

    @abc.abstractmethod
    def make_readable(self, end_offset: int) -> None:
        """Let readers see the records below ``end_offset`` now.  Appended records are
        readable at once on every backend but mmap with the transient store pool, whose commit
        service publishes them within its interval; the broker's metadata events, applied from
        the log right after they are written, ask for theirs at once."""

    # --- reading --------------------------------------------------------------------------

    @abc.abstractmethod
    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 256 * 1024,
        tag_filter: TagFilter | None = None,
    ) -> ReadResult:
        """Records of one queue from ``offset``, at most ``max_count`` and about ``max_bytes``
        (always at least one record when one matches)."""

    @abc.abstractmethod
    def lookup(self, physical_offset: int) -> memoryview | None:
        """The record starting at ``physical_offset``, or None if there is none."""

    @abc.abstractmethod
    def query_keys(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> KeyQueryResult:
        """Records indexed under ``topic#key`` (KEYS words and UNIQ_KEY) whose store time lies
        in ``[begin_ms, end_ms]``, newest first."""

    @abc.abstractmethod
    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is >= ``timestamp_ms``; the max offset
        when every message is older, the min offset when every message is newer."""

    @abc.abstractmethod
    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """``(min, max)`` queue offsets: min is the oldest readable, max the next to write."""

    @abc.abstractmethod
    def queues(self) -> dict[tuple[str, int], int]:
        """Every (topic, queue) this log holds, with its max offset."""

    @abc.abstractmethod
    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        """Store timestamp of the message at a queue offset; -1 if there is none."""

    # --- the raw log (replication) --------------------------------------------------------

    @property
    @abc.abstractmethod
    def min_physical_offset(self) -> int:
        """Oldest log offset still held (moves forward with expiry)."""

    @property
    @abc.abstractmethod
    def max_record_size(self) -> int:
        """The largest stored record :meth:`append` takes; bigger ones are MESSAGE_ILLEGAL."""

    @property
    @abc.abstractmethod
    def max_physical_offset(self) -> int:
        """The log end: where the next byte will be written."""

    @property
    @abc.abstractmethod
    def durable_offset(self) -> int:
        """How far the log is known to be on disk."""

    @abc.abstractmethod
    def read_log(self, physical_offset: int, max_bytes: int) -> bytes:
        """Raw log bytes from ``physical_offset`` (BLANK padding included), never crossing a
        segment end and never past the log end; empty when there is nothing there yet."""

    @abc.abstractmethod
    def append_replicated(self, physical_offset: int, data: bytes | memoryview) -> int:
        """Append bytes read from another log's :meth:`read_log` at the same offset and
        dispatch every record they complete.  Returns the new max physical offset.  Raises
        :class:`ReplicationError` if ``physical_offset`` is not this log's end."""

    @abc.abstractmethod
    def begin_at(self, physical_offset: int) -> None:
        """Make this empty log begin at ``physical_offset`` instead of 0: how a new replica
        joins a master whose first segments expired (RocketMQ starts it at the master's
        current log).  Raises :class:`ReplicationError` if the log holds bytes."""

    @abc.abstractmethod
    def truncate(self, physical_offset: int) -> None:
        """Cut the log (and every projection) back to ``physical_offset``, a record boundary:
        how a replica drops a divergent tail."""

    # --- disk and lifecycle ---------------------------------------------------------------

    @property
    @abc.abstractmethod
    def disk_status(self) -> DiskStatus:
        """Disk use as last sampled, and whether puts are refused for it: above the warning
        level, or once an allocation found no space, :meth:`append` answers every record
        SERVICE_NOT_AVAILABLE until space is back (no restart needed)."""

    # --- projections ----------------------------------------------------------------------

    @abc.abstractmethod
    def subscribe_dispatch(self, callback: DispatchCallback,
                           wanted: Sized | None = None) -> Callable[[], None]:
        """Call ``callback`` with each dispatched batch (after the ConsumeQueue and index hold
        it); returns the unsubscribe function.  An append under way when this is called
        finishes before it returns, and what was appended before is readable once it returns
        (a store with a transient store pool commits it), so a listener that reads after
        subscribing and then waits for reports misses nothing.

        ``wanted``: a collection of the listener's that is empty while it has nothing to do
        with a batch (its parked pulls, its slaves); the call is skipped then.  The store
        looks at it once the batch is readable, so a listener that adds to it and then reads
        misses nothing either."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Make everything appended so far durable, projections included."""

    @abc.abstractmethod
    def expire(self, now_ms: int | None = None, *, force: bool = False) -> ExpiryReport:
        """Delete log segments past retention (or, ``force``, the oldest when disk is short),
        and the projection entries that pointed into them."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush, stop background services, release files and mark a clean shutdown."""

    def __enter__(self) -> MessageLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
