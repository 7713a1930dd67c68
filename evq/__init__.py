"""evq: an event-sourced message broker modelled on Apache RocketMQ 4.x.

``evq.Broker.open(path)`` embeds a broker in your process (see :mod:`evq.embedded`); the
command line (``evq``) runs servers, benchmarks and admin commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evq.embedded import Broker

__all__ = ["Broker"]


def __getattr__(name: str) -> Any:
    # Lazy so that `evq --help` does not pay for SQLAlchemy and the store.
    if name == "Broker":
        from evq.embedded import Broker

        return Broker
    raise AttributeError(f"module 'evq' has no attribute {name!r}")
