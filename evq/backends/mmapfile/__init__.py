"""The default backend: RocketMQ's CommitLog + ConsumeQueue + IndexFile on mapped files."""

from evq.backends.mmapfile.store import MmapMessageLog

__all__ = ["MmapMessageLog"]
