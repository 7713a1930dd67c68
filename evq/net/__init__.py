"""RocketMQ remoting protocol, name server, broker server and the evq client."""
