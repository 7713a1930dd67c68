"""evq's own asyncio client: producer, push and pull consumers over the remoting protocol."""
