"""Fault injection the real parts cannot produce on demand without disturbing other tests.

:class:`NetworkCut` is a loopback TCP relay in front of a real service (Redis or Nomad): while it
is cut, new connections are refused and open ones are dropped, as when the service's host vanishes.
It is a fault injector, not a fake: everything that gets through reaches the real service.
"""

from __future__ import annotations

import asyncio
import contextlib

from caravan.stack.processes import free_port


class NetworkCut:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.cut = False
        self.refused = 0
        """Connections refused while cut, in all: each one a client's try to get through."""
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> NetworkCut:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.sever()
        await self._server.wait_closed()

    def sever(self) -> None:
        """Drop every open connection; with ``cut`` set, refuse new ones."""
        for writer in list(self._streams):
            writer.transport.abort()
        self._streams.clear()

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            self.sever()

    async def refused_at_least(self, count: int, *, timeout: float = 60.0) -> None:
        """Return once ``count`` connections in all were refused while cut (its clients kept trying and failing)."""
        async with asyncio.timeout(timeout):
            while self.refused < count:
                await asyncio.sleep(0.05)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._streams |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._streams -= {writer, up_writer}
