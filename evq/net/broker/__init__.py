"""The broker server: RocketMQ request processors over the domain broker."""

from evq.net.broker.server import BrokerServer, ListenError

__all__ = ["BrokerServer", "ListenError"]
