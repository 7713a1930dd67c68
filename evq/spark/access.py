"""Where the connector's messages come from: a live cluster or a store directory.

Both sides answer the same four questions — which queues, their offset bounds, the offset for
a time, and the messages of an offset range — so planning and reading do not care which one
they talk to.  Live access uses evq's client (the name servers for topics and routes, pulls
from the masters); offline access opens the store with its backend, as the broker would.

Offline, every executor opens the store itself: the driver plans from the directory at
``path`` and each task reads its slice from the directory at that same path wherever Spark
runs it, so on a cluster every executor's machine must see the same store there (a shared
filesystem).  A task that finds no store there, or one that ends before the offsets the driver
planned, fails saying so instead of returning fewer rows.

A store is one process's at a time (its lock).  Spark runs several tasks at once, so an
offline task waits for the lock (``lockTimeoutSeconds``) instead of failing; a store a
running broker holds is reported as such once that wait is over.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Protocol

from evq import logs
from evq.admin.operations import Admin, AdminError
from evq.client.blocking import LoopThread
from evq.client.errors import BrokerRefused
from evq.client.offsets import max_offset, min_offset, offset_for_time
from evq.client.pulling import PullStatus, Subscription, pull_request
from evq.domain import topics as tp
from evq.domain.log import LogLocked, MessageLog
from evq.domain.queues import MessageQueue
from evq.net.headers.pull import PullResponse
from evq.net.security import ClientSecurity
from evq.spark.options import OptionError, QueueKey, SourceOptions

log = logs.get_logger(__name__)

READER_GROUP: Final = "evq-spark-reader"
"""The group live reads pull with; it never commits, so it moves no consumer's offsets."""
PULL_BATCH: Final = 256
"""Records per store read offline (the log also stops at about 256 KiB)."""
LIVE_PULL_BATCH: Final = 1024
"""Messages per pull: the most a broker answers (it also stops at about 256 KiB); each answer
becomes one Arrow batch, so fewer, larger pulls mean less work per row on both sides."""


class QueueAccess(Protocol):
    def queues(self, opts: SourceOptions) -> list[QueueKey]: ...
    def bounds(self, queue: QueueKey) -> tuple[int, int]: ...
    def offset_for_time(self, queue: QueueKey, timestamp_ms: int) -> int: ...
    def read_blocks(self, queue: QueueKey, start: int, end: int) -> Iterator[bytes]: ...
    def close(self) -> None: ...


def open_access(opts: SourceOptions) -> QueueAccess:
    if opts.namesrv is not None:
        return LiveAccess(opts.namesrv, opts.security.client_security())
    assert opts.path is not None
    return StoreAccess(opts.path, opts.backend, opts.broker_name, opts.lock_wait_s)


def _user_topics(opts: SourceOptions, known: list[str]) -> list[str]:
    if opts.topic_pattern is None:
        missing = sorted(set(opts.topics) - set(known))
        if missing:
            raise OptionError("topic", f"no such topic: {', '.join(missing)}")
        return sorted(opts.topics)
    return sorted(t for t in known if opts.wants(t) and not tp.is_system_topic(t))


class LiveAccess:
    def __init__(self, namesrv: str, security: ClientSecurity | None = None) -> None:
        self._thread = LoopThread()
        self._admin = Admin(namesrv, security=security)
        self._routes: dict[str, dict[str, str]] = {}

    def queues(self, opts: SourceOptions) -> list[QueueKey]:
        known = self._thread.run(self._admin.topic_list())
        out: list[QueueKey] = []
        for topic in _user_topics(opts, known):
            try:
                route = self._thread.run(self._admin.topic_route(topic))
            except AdminError:
                continue  # deleted between the list and the route
            self._routes[topic] = {name: addr for name in route.brokers
                                   if (addr := route.master(name)) is not None}
            out += [(q.topic, q.broker_name, q.queue_id) for q in route.subscribe_queues()]
        return sorted(out)

    def bounds(self, queue: QueueKey) -> tuple[int, int]:
        addr, mq = self._where(queue)
        pool = self._admin.pool
        return (self._thread.run(min_offset(pool, addr, mq)),
                self._thread.run(max_offset(pool, addr, mq)))

    def offset_for_time(self, queue: QueueKey, timestamp_ms: int) -> int:
        addr, mq = self._where(queue)
        return self._thread.run(offset_for_time(self._admin.pool, addr, mq, timestamp_ms))

    def read_blocks(self, queue: QueueKey, start: int, end: int) -> Iterator[bytes]:
        """Pull answers' bodies: stored records back to back, from ``start`` until a record
        at ``end`` or past it has been seen (the last block may hold records past ``end``)."""
        addr, mq = self._where(queue)
        sub = Subscription(mq.topic)
        offset = start
        while offset < end:
            cmd = pull_request(READER_GROUP, mq, offset, sub,
                               max_nums=min(LIVE_PULL_BATCH, end - offset), suspend_ms=0)
            answer = self._thread.run(self._admin.pool.invoke(addr, cmd))
            try:
                status = PullStatus(answer.code)
            except ValueError:
                raise BrokerRefused(answer.code, answer.remark, "pull") from None
            h = PullResponse.read(answer.ext_fields)
            next_offset = h.next_begin_offset
            if status is not PullStatus.FOUND:
                if status is PullStatus.NO_MATCHED_MSG and next_offset > offset:
                    offset = next_offset
                    continue
                raise OSError(f"{mq.topic}:{mq.broker_name}:{mq.queue_id} has no messages "
                              f"{offset}..{end - 1} any more ({status.name}; the queue holds "
                              f"{h.min_offset}..{h.max_offset - 1})")
            yield answer.body
            offset = next_offset

    def _where(self, queue: QueueKey) -> tuple[str, MessageQueue]:
        topic, broker, qid = queue
        if topic not in self._routes:
            route = self._thread.run(self._admin.topic_route(topic))
            self._routes[topic] = {name: addr for name in route.brokers
                                   if (addr := route.master(name)) is not None}
        try:
            return self._routes[topic][broker], MessageQueue(topic, broker, qid)
        except KeyError:
            raise OSError(f"broker {broker!r} of {topic!r} has no master now") from None

    def close(self) -> None:
        self._thread.run(self._admin.__aexit__())
        self._thread.stop()


EVERY_EXECUTOR: Final = (
    "an offline read opens the store in the driver to plan and in every executor to read, so "
    "the same store must be readable at this path on every machine that runs Spark tasks (a "
    "shared filesystem), or read the topic live with the 'namesrv' option")


def _here() -> str:
    """Where a message comes from: on a cluster, the driver and each executor are different
    hosts and processes, and a path one of them sees another may not."""
    return f"(as seen from {socket.gethostname()}, process {os.getpid()})"


LOCK_WAIT_NOTICE_S: Final = 10.0
"""How often a read waiting for a locked store says so."""


class StoreAccess:
    def __init__(self, path: str, backend: str, broker_name: str, lock_wait_s: float) -> None:
        from evq.backends.registry import open_log

        self.broker_name = broker_name
        self.path = path
        if not Path(path).is_dir():
            raise OptionError("path", f"no evq store directory at {path} {_here()}; "
                                      f"{EVERY_EXECUTOR}")
        started = time.monotonic()
        said = -LOCK_WAIT_NOTICE_S
        while True:
            try:
                self._log: MessageLog = open_log(backend, path, background=False)
                break
            except LogLocked:
                waited = time.monotonic() - started
                if waited > lock_wait_s:
                    raise OSError(f"the store at {path} stayed locked for {lock_wait_s:.0f} s: "
                                  "a running broker holds it (read it live with the "
                                  "'namesrv' option, or stop the broker)") from None
                if waited - said >= LOCK_WAIT_NOTICE_S:  # a silent wait looks like a hang
                    said = waited
                    log.warning("waiting for a locked store", path=path,
                                waited_s=round(waited), gives_up_after_s=round(lock_wait_s),
                                why="a running broker holds it; stop it, or read it live "
                                    "with the 'namesrv' option")
                time.sleep(0.05)

    def queues(self, opts: SourceOptions) -> list[QueueKey]:
        held = self._log.queues()
        topics = _user_topics(opts, sorted({t for t, _ in held}))
        return sorted((t, self.broker_name, q) for t, q in held if t in topics)

    def bounds(self, queue: QueueKey) -> tuple[int, int]:
        return self._log.bounds(queue[0], queue[2])

    def offset_for_time(self, queue: QueueKey, timestamp_ms: int) -> int:
        return self._log.offset_for_time(queue[0], queue[2], timestamp_ms)

    def read_blocks(self, queue: QueueKey, start: int, end: int) -> Iterator[bytes]:
        """The records of ``[start, end)``, a read's worth joined into one block."""
        topic, _, qid = queue
        offset = start
        while offset < end:
            r = self._log.read(topic, qid, offset, max_count=min(PULL_BATCH, end - offset))
            if not r.records:
                if r.next_offset > offset:
                    offset = r.next_offset
                    continue
                raise OSError(f"the store at {self.path} {_here()} holds {topic}:{qid} only "
                              f"up to offset {offset}, but the read was planned up to {end}; "
                              f"{EVERY_EXECUTOR}")
            yield b"".join(view for view, qo in zip(r.records, r.queue_offsets, strict=True)
                           if qo < end)
            offset = r.queue_offsets[-1] + 1

    def close(self) -> None:
        self._log.close()
