"""What the client raises: one base class, so scripts can catch every client failure at once."""

from __future__ import annotations

from evq.domain.codes import ResponseCode


class ClientError(Exception):
    """Base of the client's own errors."""


class RouteNotFound(ClientError):
    """No name server knows a route for the topic (and no fallback applies)."""


class BrokerRefused(ClientError):
    """A broker or name server answered a request with a non-success code."""

    def __init__(self, code: int, remark: str | None, what: str) -> None:
        self.code = code
        self.remark = remark
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        super().__init__(f"{what}: {name} ({remark or 'no remark'})")


class SendFailed(ClientError):
    """Every attempt of a send failed; the last cause is chained."""


class NotStarted(ClientError):
    """The producer or consumer was used before ``start()`` or after ``shutdown()``."""


class BackgroundFailed(ClientError):
    """A client's background loop (heartbeat, rebalance, pull ...) failed over and over and
    was given up: the client no longer works and should be shut down.  The last failure is
    chained (see :mod:`evq.client.supervision`)."""
