"""Store settings shared by every backend (segment sizes only matter to mmap).

Names follow RocketMQ's ``MessageStoreConfig`` where one exists, so a broker.conf translates
one to one; defaults are RocketMQ's.
"""

from __future__ import annotations

import attrs

from evq.domain.log import FlushMode
from evq.domain.message import Host

MIB = 1024 * 1024


@attrs.frozen(slots=True, kw_only=True)
class StoreConfig:
    flush: FlushMode = FlushMode.ASYNC_FLUSH
    commitlog_segment_size: int = 1024 * MIB  # mappedFileSizeCommitLog
    consume_queue_entries: int = 300_000  # mappedFileSizeConsumeQueue / 20
    index_slots: int = 5_000_000  # maxHashSlotNum
    index_entries: int = 20_000_000  # maxIndexNum
    flush_interval_ms: int = 500  # flushIntervalCommitLog
    flush_least_pages: int = 4  # flushCommitLogLeastPages
    flush_thorough_interval_ms: int = 10_000  # flushCommitLogThoroughInterval
    flush_consume_queue_interval_ms: int = 1000  # flushIntervalConsumeQueue
    # evq: how often the projection flush also writes the live index file's head back (its
    # hash slots, 20 MB at 5 million, nearly all changed within a second of sends with unique
    # keys).  RocketMQ writes an index file back only once it is full; here a crash re-indexes
    # what was put since the last write-back, so this bounds that work instead.
    flush_index_interval_ms: int = 10_000
    sync_flush_timeout_ms: int = 5000  # syncFlushTimeout
    max_message_size: int = 4 * MIB  # maxMessageSize, whole stored record
    store_host: Host = ("127.0.0.1", 10911)
    check_crc_on_recover: bool = True  # checkCRCOnRecover
    file_reserved_hours: float = 72  # fileReservedTime
    delete_when: str = "04"  # deleteWhen: hours of the day, ';'-separated
    # Disk watermarks (see evq.backends.disk): the share of the store's file system in use
    # past which expired files go early, the oldest go even unexpired, and puts are refused.
    disk_max_used_space_ratio: int = 75  # diskMaxUsedSpaceRatio, percent
    disk_space_clean_forcibly_ratio: float = 0.85  # rocketmq.broker.diskSpaceCleanForciblyRatio
    disk_space_warning_level_ratio: float = 0.90  # rocketmq.broker.diskSpaceWarningLevelRatio
    disk_check_interval_s: float = 1.0  # evq: how often disk use is sampled
    clean_interval_s: float = 10.0  # cleanResourceInterval
    warm_segments: bool = True  # warmMapedFileEnable, done off the hot path here
    # RocketMQ's transient store pool (see evq.backends.mmapfile.transient_pool): mmap only,
    # and only under ASYNC_FLUSH on a master (transient_pool_refusal).
    transient_store_pool_enable: bool = False  # transientStorePoolEnable
    transient_store_pool_size: int = 5  # transientStorePoolSize: buffers of a segment's size
    commit_interval_ms: int = 200  # commitIntervalCommitLog
    commit_least_pages: int = 4  # commitCommitLogLeastPages
    commit_thorough_interval_ms: int = 200  # commitCommitLogThoroughInterval

    def __attrs_post_init__(self) -> None:
        if self.commitlog_segment_size < 4096:
            raise ValueError("commitlog_segment_size must be at least 4096 bytes")
        if self.consume_queue_entries < 1 or self.index_slots < 1 or self.index_entries < 2:
            raise ValueError("consume queue and index sizes must be positive")
        if not 0 < self.disk_max_used_space_ratio <= 100:
            raise ValueError("disk_max_used_space_ratio is a percentage, 1 to 100")
        if not (0 < self.disk_space_clean_forcibly_ratio <= 1
                and 0 < self.disk_space_warning_level_ratio <= 1):
            raise ValueError("disk_space_clean_forcibly_ratio and disk_space_warning_level_ratio "
                             "are fractions of the disk, above 0 and at most 1")
        if self.disk_check_interval_s <= 0:
            raise ValueError("disk_check_interval_s must be positive")
        if self.transient_store_pool_size < 1:
            raise ValueError("transient_store_pool_size must be at least 1")
        if self.flush_index_interval_ms < 0:
            raise ValueError("flush_index_interval_ms must not be negative (0: every round)")
        if self.commit_interval_ms < 1 or self.commit_thorough_interval_ms < 0:
            raise ValueError("commit_interval_ms must be positive and "
                             "commit_thorough_interval_ms not negative")

    def delete_hours(self) -> frozenset[int]:
        return frozenset(int(h) for h in self.delete_when.split(";") if h.strip())


def transient_pool_refusal(config: StoreConfig, *, slave: bool = False) -> str:
    """Why the transient store pool is not used although enabled (empty if it is, or is off).

    RocketMQ's rule (``MessageStoreConfig.isTransientStorePoolEnable``): only under
    ASYNC_FLUSH on a master.  A SYNC_FLUSH acknowledgement promises the record is on disk,
    and a record in a pool buffer is not even in the file yet; a slave writes the bytes its
    master sends and serves them at once.  Such a config is not refused but run without the
    pool, as RocketMQ runs it, with a warning at start saying so: a broker.conf that RocketMQ
    starts, evq starts too, with the durability its flush type promises.
    """
    if not config.transient_store_pool_enable:
        return ""
    if config.flush is not FlushMode.ASYNC_FLUSH:
        return f"flushDiskType is {config.flush.value}; the pool works under ASYNC_FLUSH only"
    if slave:
        return "brokerRole is SLAVE; the pool works on a master only"
    return ""
