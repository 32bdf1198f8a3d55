"""A small graphql-transport-ws client for tests, on the real ``websockets`` library."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

PROTOCOL = "graphql-transport-ws"


class GraphQLSocket:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._inbox: dict[str, asyncio.Queue[dict[str, Any]]] = {}

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    async def receive(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next message on the socket, whatever its operation."""
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        # graphql-transport-ws speaks in text frames: a browser's client cannot read a binary one (a Blob)
        assert isinstance(frame, str), f"a binary frame: {frame[:80]!r}"
        message: dict[str, Any] = json.loads(frame)
        return message

    async def init(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.send({"type": "connection_init", **({"payload": payload} if payload is not None else {})})
        return await self.receive()

    async def subscribe(self, query: str, variables: dict[str, Any] | None = None) -> str:
        operation_id = str(next(self._ids))
        self._inbox[operation_id] = asyncio.Queue()
        payload = {"query": query, "variables": variables or {}}
        await self.send({"id": operation_id, "type": "subscribe", "payload": payload})
        return operation_id

    async def message_of(self, operation_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next message of one operation (messages of others are kept for them)."""
        inbox = self._inbox[operation_id]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while inbox.empty():
            message = await self.receive(max(0.01, deadline - loop.time()))
            if message.get("type") == "ping":
                await self.send({"type": "pong"})
                continue
            self._inbox.setdefault(str(message.get("id")), asyncio.Queue()).put_nowait(message)
        return inbox.get_nowait()

    async def results(self, operation_id: str, timeout: float = 60.0) -> AsyncIterator[dict[str, Any]]:
        """The payloads of an operation's ``next`` messages until it completes (an ``error`` raises)."""
        while True:
            message = await self.message_of(operation_id, timeout)
            if message["type"] == "complete":
                return
            if message["type"] == "error":
                raise AssertionError(f"operation {operation_id} failed: {message['payload']}")
            assert message["type"] == "next", message
            yield message["payload"]

    async def complete(self, operation_id: str) -> None:
        await self.send({"id": operation_id, "type": "complete"})

    async def closed_with(self, timeout: float = 10.0) -> int | None:
        """Wait for the server to close the connection; its close code."""
        with contextlib.suppress(ConnectionClosed):
            while True:
                await asyncio.wait_for(self.ws.recv(), timeout)
        return self.ws.close_code


@contextlib.asynccontextmanager
async def graphql_socket(
    http_url: str, *, protocols: tuple[str, ...] = (PROTOCOL,), headers: dict[str, str] | None = None
) -> AsyncIterator[GraphQLSocket]:
    url = http_url.replace("http://", "ws://", 1)
    subprotocols: list[Any] = list(protocols)
    # close_timeout: a socket left with 16 unread messages (log follows ticking on) stops reading, so it never reads the
    # server's answer to its close and waited websockets' default 10 s before dropping the connection, at each exit.
    async with connect(
        url, subprotocols=subprotocols, additional_headers=headers or {}, open_timeout=10, close_timeout=1
    ) as ws:
        yield GraphQLSocket(ws)


@contextlib.asynccontextmanager
async def authenticated_socket(http_url: str, token: str) -> AsyncIterator[GraphQLSocket]:
    """A socket whose connection was acknowledged for ``token`` (given in the connection_init payload)."""
    async with graphql_socket(http_url) as socket:
        ack = await socket.init({"authorization": f"Bearer {token}"})
        assert ack == {"type": "connection_ack"}, ack
        yield socket
