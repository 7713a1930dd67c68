"""evq: an event-sourced message broker modelled on Apache RocketMQ 4.x.

``evq.Broker.open(path)`` embeds a broker in your process (see :mod:`evq.embedded`); the
command line (``evq``) runs servers, benchmarks and admin commands.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evq.embedded import Broker

__all__ = ["Broker"]


_SUBPACKAGES = frozenset({"admin", "backends", "client", "domain", "ha", "net", "spark"})


def __getattr__(name: str) -> Any:
    # Lazy so that `evq --help` does not pay for SQLAlchemy and the store; `import evq` then
    # `evq.admin.Admin(...)` works as the README writes it.
    if name == "Broker":
        from evq.embedded import Broker

        return Broker
    if name in _SUBPACKAGES:
        return importlib.import_module(f"evq.{name}")
    raise AttributeError(f"module 'evq' has no attribute {name!r}")
