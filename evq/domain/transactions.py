"""Transactional messages: half records, op records, and the check-back of forgotten halves.

    producer --half--> RMQ_SYS_TRANS_HALF_TOPIC (invisible to consumers)
    producer --END_TRANSACTION commit--> real topic record + op record
    producer --END_TRANSACTION rollback--> op record
    checker: half with no op, older than its immunity -> re-put a copy (check times + 1,
             TRAN_PREPARED_QUEUE_OFFSET = the first half's queue offset) and ask a live
             producer of the group; after ``transactionCheckMax`` copies it goes to
             TRANS_CHECK_MAX_TIME_TOPIC instead

Op records (RMQ_SYS_TRANS_OP_HALF_TOPIC, tag ``d``, body = the half's queue offset in decimal)
are the transaction state: everything here is rebuilt from the log.  The checker's progress
is the consumer offset of group CID_RMQ_SYS_TRANS on the half and op queues, as in RocketMQ.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from evq import logs
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import Broker, SendResult
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.log import GetStatus, PutStatus
from evq.domain.message import Message, Prop
from evq.domain.record import decode

log = logs.get_logger(__name__)

OP_TAG = "d"
_CHECK_BATCH = 32
_MAX_CHECKED_PER_RUN = 2000


class TransactionCheckPort(Protocol):
    """How the checker reaches a producer; the network layer sends CHECK_TRANSACTION_STATE."""

    def check_back(self, producer_group: str, half: Message) -> bool:
        """Ask one live producer of the group about ``half``; False when none is connected."""
        ...


@attrs.frozen(slots=True)
class CheckReport:
    checked: int = 0
    discarded: int = 0
    waiting: int = 0


class TransactionService:
    def __init__(self, broker: Broker, port: TransactionCheckPort | None = None) -> None:
        self._broker = broker
        self.port = port
        self._done: set[int] = set()  # half queue offsets that have an op record
        self._ops: list[tuple[int, int]] = []  # (op queue offset, half queue offset), unretired
        self._op_scanned = max(
            0, broker.query_offset(tp.TRANS_CHECK_GROUP, tp.TRANS_OP_HALF_TOPIC, 0))
        self._next_check_ms = broker.clock.now_ms() + broker.config.transaction_check_interval_ms
        self.check_passes = 0
        """Checker passes finished since start (runtime info ``evqTransactionCheckPasses``): a
        count of rounds, so that whoever waits for "a few passes, and nothing checked" waits
        for passes rather than for a time that may hold fewer on a busy machine."""
        broker.add_tick_hook(self.run)

    # --- END_TRANSACTION ------------------------------------------------------------------

    def end(
        self, producer_group: str, tran_state_table_offset: int, commit_log_offset: int,
        commit: bool | None,
    ) -> SendResult | None:
        """Commit (True), roll back (False) or ignore (None: state unknown) a half message.

        Returns the stored real message for a commit, None otherwise.  A half that already has
        an op record (answered twice, or committed by one producer and checked by another) is
        not committed again.  One whose records the store refused (a full disk) is not ended:
        the transaction check asks its producer again.
        """
        if self._broker.config.is_slave:
            raise BrokerError(ResponseCode.SLAVE_NOT_AVAILABLE,
                              "a slave does not end transactions; send to the master")
        if commit is None:
            return None
        view = self._broker.log.lookup(commit_log_offset)
        half = decode(view, check_crc=False) if view is not None else None
        if half is None or half.topic != tp.TRANS_HALF_TOPIC:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              "Find prepared transaction message failed")
        if half.properties.get(Prop.PGROUP) != producer_group:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != tran_state_table_offset:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              "The transaction state table offset wrong")
        self._scan_ops()
        if self._is_done(half):
            log.info("transaction_already_ended", half_offset=half.queue_offset)
            return None
        # A re-put copy closes its first half too, so a late answer for either is ignored.
        ended = sorted({half.queue_offset, _int_prop(half, Prop.TRAN_PREPARED_QUEUE_OFFSET,
                                                     half.queue_offset)})
        ops = [self._op_message(half.queue_id, qo) for qo in ended]
        self._done.update(ended)
        real = self._broker.route(self._committed(half)) if commit else None
        results = self._broker.store([real, *ops] if real is not None else ops)
        status = next((r.status for r in results if r.status is not PutStatus.PUT_OK),
                      PutStatus.PUT_OK)
        if status is not PutStatus.PUT_OK:  # not ended (a full disk): the check asks again
            self._done.difference_update(ended)
        if real is None:
            return None
        return SendResult(status, real.topic, real.queue_id, (results[0],))

    @staticmethod
    def _committed(half: Message) -> Message:
        props = dict(half.properties)
        topic, queue_id = props.pop(Prop.REAL_TOPIC, half.topic), int(props.pop(Prop.REAL_QID, 0))
        props.pop(Prop.TRAN_MSG, None)
        return Message(
            topic=topic, body=half.body, flag=half.flag, properties=props, queue_id=queue_id,
            sysflag=(half.sysflag & ~sf.TRANSACTION_MASK) | sf.TRANSACTION_COMMIT_TYPE,
            born_timestamp=half.born_timestamp, born_host=half.born_host,
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.commit_log_offset,
        )

    def _op_message(self, queue_id: int, half_offset: int) -> Message:
        return Message(topic=tp.TRANS_OP_HALF_TOPIC, queue_id=queue_id,
                       body=str(half_offset).encode(), properties={Prop.TAGS: OP_TAG},
                       born_timestamp=self._broker.clock.now_ms(),
                       born_host=self._broker.config.store_host)

    # --- ops ------------------------------------------------------------------------------

    def _scan_ops(self) -> None:
        while True:
            r = self._broker.log.read(tp.TRANS_OP_HALF_TOPIC, 0, self._op_scanned, max_count=256)
            if r.status is GetStatus.OFFSET_TOO_SMALL:
                self._op_scanned = r.next_offset
                continue
            if r.status is not GetStatus.FOUND:
                return
            for view, qo in zip(r.records, r.queue_offsets, strict=True):
                try:
                    half_offset = int(decode(view, check_crc=False).body)
                except ValueError:
                    log.error("bad_op_record", queue_offset=qo)
                    continue
                self._done.add(half_offset)
                self._ops.append((qo, half_offset))
            self._op_scanned = r.next_offset

    def _is_done(self, half: Message) -> bool:
        origin = _int_prop(half, Prop.TRAN_PREPARED_QUEUE_OFFSET, -1)
        return half.queue_offset in self._done or origin in self._done

    # --- the checker ------------------------------------------------------------------------

    def run(self, now: int) -> None:
        if now >= self._next_check_ms:
            self._next_check_ms = now + self._broker.config.transaction_check_interval_ms
            self.check(now)

    def check(self, now: int) -> CheckReport:
        """One checker pass over the half queue, from the checker's offset to the queue end
        as it was when the pass began (copies re-put by this pass wait for the next)."""
        b = self._broker
        self._scan_ops()
        offset = max(0, b.query_offset(tp.TRANS_CHECK_GROUP, tp.TRANS_HALF_TOPIC, 0))
        _lo, end = b.log.bounds(tp.TRANS_HALF_TOPIC, 0)
        checked = discarded = 0
        waiting = False
        while offset < end and checked < _MAX_CHECKED_PER_RUN and not waiting:
            r = b.log.read(tp.TRANS_HALF_TOPIC, 0, offset, max_count=_CHECK_BATCH)
            if r.status is GetStatus.OFFSET_TOO_SMALL:
                offset = r.next_offset
                continue
            if r.status is not GetStatus.FOUND:
                break
            for view, qo in zip(r.records, r.queue_offsets, strict=True):
                if qo >= end:
                    break
                half = decode(view, check_crc=False)
                if not self._is_done(half):
                    verdict = self._check_one(half, now)
                    if verdict == "wait":
                        waiting = True
                        break
                    checked += verdict == "checked"
                    discarded += verdict == "discarded"
                offset = qo + 1
        b.commit_offset(tp.TRANS_CHECK_GROUP, tp.TRANS_HALF_TOPIC, 0, offset)
        self._retire_ops(offset)
        self.check_passes += 1
        return CheckReport(checked, discarded, int(waiting))

    def _check_one(self, half: Message, now: int) -> str:
        b = self._broker
        times = _int_prop(half, Prop.TRANSACTION_CHECK_TIMES, 0)
        if times >= b.config.transaction_check_max:
            b.ensure_topic(tp.TRANS_CHECK_MAX_TIME_TOPIC)
            moved = attrs.evolve(half, topic=tp.TRANS_CHECK_MAX_TIME_TOPIC, queue_id=0)
            if b.store([moved])[0].status is not PutStatus.PUT_OK:
                return "wait"  # not stored (a full disk): the next pass tries again
            log.warning("transaction_discarded", half_offset=half.queue_offset, checks=times)
            return "discarded"
        if now - half.store_timestamp > b.config.file_reserved_hours * 3_600_000:
            log.warning("transaction_expired", half_offset=half.queue_offset)
            return "discarded"
        immunity = _int_prop(half, Prop.CHECK_IMMUNITY_TIME_IN_SECONDS, -1) * 1000
        if immunity < 0:
            immunity = b.config.transaction_timeout_ms
        if now - half.born_timestamp < immunity:
            return "wait"
        props = dict(half.properties)
        props[Prop.TRANSACTION_CHECK_TIMES] = str(times + 1)
        props.setdefault(Prop.TRAN_PREPARED_QUEUE_OFFSET, str(half.queue_offset))
        copy = attrs.evolve(half, properties=props)
        (stored,) = b.store([copy])
        if stored.status is not PutStatus.PUT_OK:
            return "wait"  # not re-put (a full disk): the pass stops here, the next one asks
        copy.queue_offset, copy.commit_log_offset = stored.queue_offset, stored.physical_offset
        group = props.get(Prop.PGROUP, "")
        if self.port is None or not self.port.check_back(group, copy):
            log.info("transaction_check_no_producer", group=group, half_offset=half.queue_offset)
        return "checked"

    def _retire_ops(self, half_offset: int) -> None:
        """Ops for halves the checker has passed are no longer needed to skip them; the op
        queue's checker offset moves past the leading run of such ops.  Their half offsets
        stay in the done set (bounded below) so late answers for a re-put copy are still
        recognised."""
        retired = 0
        while retired < len(self._ops) and self._ops[retired][1] < half_offset:
            retired += 1
        if retired:
            next_op = self._ops[retired][0] if retired < len(self._ops) else self._op_scanned
            del self._ops[:retired]
            self._broker.commit_offset(tp.TRANS_CHECK_GROUP, tp.TRANS_OP_HALF_TOPIC, 0, next_op)
        if len(self._done) > 1_000_000:
            self._done = {o for o in self._done if o >= half_offset}


def _int_prop(m: Message, name: str, default: int) -> int:
    """A numeric property the broker wrote itself; anything else reads as ``default``."""
    value = m.properties.get(name, "")
    return int(value) if value.isdigit() else default
