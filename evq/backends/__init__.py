"""Storage backends implementing :class:`evq.domain.log.MessageLog`."""
