"""What a client brings to a secured broker or name server: credentials and TLS.

One value, handed from the CLI, the client library, the admin tools and the Spark connector
down to every :class:`~evq.net.transport.RemotingClient` they open, so that no connection a
client opens (to a name server, a master, a slave) is left unsigned or in clear text.
"""

from __future__ import annotations

import ssl

import attrs

from evq.acl.signature import Credentials


@attrs.frozen(slots=True)
class ClientSecurity:
    credentials: Credentials | None = None
    """Signs every request (RocketMQ's ``AclClientRPCHook``); None sends them unsigned."""
    tls: ssl.SSLContext | None = attrs.field(default=None, eq=False)
    """Opens connections over TLS with this context; None connects in clear text."""
