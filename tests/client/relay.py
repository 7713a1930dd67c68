"""A TCP relay between clients and a server on 127.0.0.1, for tests that must see what a client
really sent: it forwards every frame (decoded and encoded again with evq's codec), counts the
requests that come from the client side by code, and replaces addresses in answer bodies, so
that a name server's routes send clients to a broker through another relay."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import attrs

from evq.net.protocol import FrameDecoder
from evq.net.transport import split_address

HOST = "127.0.0.1"
CHUNK = 64 * 1024


@attrs.define
class Relay:
    target: str
    rewrite: dict[str, str] = attrs.field(factory=dict)
    """Address -> address, replaced (as a quoted JSON string) in every answer body."""
    requests: Counter[int] = attrs.field(factory=Counter)
    """Requests clients sent through the relay, by request code."""
    address: str = ""
    _writers: set[asyncio.StreamWriter] = attrs.field(factory=set)

    async def serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
                     ) -> None:
        server_r, server_w = await asyncio.open_connection(*split_address(self.target))
        self._writers |= {client_w, server_w}
        await asyncio.gather(self._pump(client_r, server_w, from_client=True),
                             self._pump(server_r, client_w, from_client=False))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    from_client: bool) -> None:
        decoder = FrameDecoder()
        swaps = [(f'"{a}"'.encode(), f'"{b}"'.encode()) for a, b in self.rewrite.items()]
        try:
            while data := await reader.read(CHUNK):
                decoder.feed(data)
                while (cmd := decoder.next_command()) is not None:
                    if from_client and not cmd.is_response:
                        self.requests[cmd.code] += 1
                    if cmd.is_response:
                        for old, new in swaps:
                            cmd.body = cmd.body.replace(old, new)
                    writer.write(cmd.encode())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def close(self) -> None:
        for writer in self._writers:
            writer.close()


@contextlib.asynccontextmanager
async def relay(target: str, rewrite: dict[str, str] | None = None) -> AsyncIterator[Relay]:
    """A running :class:`Relay` to ``target``; its connections are closed on the way out."""
    r = Relay(target, rewrite or {})
    server = await asyncio.start_server(r.serve, HOST, 0)
    r.address = f"{HOST}:{server.sockets[0].getsockname()[1]}"
    try:
        yield r
    finally:
        r.close()
        server.close()
        await server.wait_closed()
