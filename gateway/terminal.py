"""A kernel's terminal: ``/sessions/{session_id}/kernels/{kernel}/terminal``, a WebSocket relayed to a shell that runs
with a TTY in the kernel through Nomad's exec (``nomad_jobs.alloc_exec``). Docker and exec kernels; QEMU has no exec
path and raw_exec runs on the host (``domain.kernel_exec``). The shell is an announced exec: one Nomad reports ended
before it started (its docker driver does when docker is slow to start it) is run again, unseen by the client.

Authentication (:func:`authenticated`, the one check): an ``Authorization: Bearer <token>`` header on the upgrade
request, or, for browsers, which cannot set headers on a WebSocket, a first text message ``{"type": "auth", "token":
"<token>"}`` sent within 10 seconds, before anything is relayed. Never in the URL.

The protocol once open (after the auth message, if one is used):

- client → gateway: binary messages are stdin bytes as they are; text messages are JSON: ``{"type": "resize",
  "rows": 24, "cols": 80}``, ``{"type": "stdin", "data": "text"}`` (sent as UTF-8), ``{"type": "close"}`` (end of
  stdin).
- gateway → client: binary messages are the terminal's output bytes (a TTY merges stdout and stderr); when the shell
  exits, a text message ``{"type": "exit", "exitCode": n}``, then a normal close (1000).
- refusals: a text message ``{"type": "error", "code": "...", "message": "..."}`` then a close: 4401 no valid token,
  4404 no such session or kernel of the viewer's (NOT_FOUND: another user's session is not revealed), 4400 any other
  refusal (SESSION_NOT_RUNNING, EXEC_NOT_SUPPORTED, TOO_MANY_EXECS, EXEC_FAILED, INVALID_INPUT); 4403 when the token is
  revoked or expires while the terminal is open (``gateway.revocations``, as GraphQL WebSockets). With the header, a
  refusal comes before the upgrade as an HTTP answer with a JSON body instead (401, 404, 409) where the server supports
  it.

The terminal counts as an open connection of the session for the idle checker (``stores.activity``), refreshed while
it stays open, and its traffic as activity at most every ``CARAVAN_EXEC_ACTIVITY_INTERVAL`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from core.clock import utcnow
from core.errors import CaravanError, InvalidInput, Unauthenticated
from core.settings import NomadSettings
from domain.kernel_exec import ActivityClock, ExecFailed, ExecTarget
from domain.users import User
from gateway.auth import authenticate, first_message_token, header_token
from gateway.kernel_exec import ActivityMeter, ExecSlots, find_target
from gateway.revocations import RevocationWatch, Watched
from nomad_jobs.alloc_exec import (
    ExecNeverStarted,
    ExecNotAnnounced,
    ExecRefused,
    ExecStream,
    Exited,
    Output,
    open_exec,
    signal_session,
)
from nomad_jobs.client import NomadClient
from nomad_jobs.meta import TASK_NAME
from stores import activity
from stores.sessions import SessionStore
from stores.users import UserStore

log = logging.getLogger(__name__)

PATH = "/sessions/{session_id}/kernels/{kernel}/terminal"
SHELL = ("/bin/sh",)
"""What the terminal runs (busybox and every image Caravan runs have it)."""
AUTH_WAIT = 10.0
"""Seconds a connection without an Authorization header has to send its auth message."""
MAX_MESSAGE = 64 << 10
"""Largest message a client may send, in bytes."""


@dataclass
class Viewer:
    user: User
    token: str
    watched: Watched | None


async def authenticated(
    websocket: WebSocket, users: UserStore, revocations: RevocationWatch | None, *, accepted: bool
) -> Viewer:
    """Who the terminal is for: the ``Authorization`` header's token, else (once ``accepted``) the first message's.

    The token is registered with the revocation watch before it is checked (no revocation slips in between)."""
    token = header_token(websocket.headers)
    if not token and accepted:
        token = await first_message_token(websocket, AUTH_WAIT)
    if not token:
        raise Unauthenticated(
            "send an API token: 'Authorization: Bearer <token>', or a first message {\"type\": "
            '"auth", "token": "<token>"}'
        )
    found = await authenticate(users, token, revocations)
    if found is None:
        raise Unauthenticated("the token is not valid")
    return Viewer(found.user, token, found.watched)


def close_code(error: CaravanError) -> int:
    return {"UNAUTHENTICATED": 4401, "NOT_FOUND": 4404}.get(error.code, 4400)


def http_status(error: CaravanError) -> int:
    return {"UNAUTHENTICATED": 401, "NOT_FOUND": 404}.get(error.code, 409)


async def refuse(websocket: WebSocket, error: CaravanError) -> None:
    """Answer a refusal: over HTTP before the upgrade when the server can, else as a message and a close code."""
    body = {"type": "error", "code": error.code, "message": error.message}
    if websocket.client_state is WebSocketState.CONNECTING:
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(JSONResponse(body, status_code=http_status(error)))
            return
        await websocket.accept()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await websocket.send_text(json.dumps(body))
        await websocket.close(code=close_code(error), reason=error.code)


class Terminals:
    """The terminal endpoint (a Starlette WebSocket route's endpoint)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    async def endpoint(self, websocket: WebSocket) -> None:
        state = self.state
        users: UserStore = state["users"]
        sessions: SessionStore = state["sessions"]
        slots: ExecSlots = state["execs"]
        revocations: RevocationWatch | None = state.get("revocations")
        session_id = websocket.path_params["session_id"]
        hostname = websocket.path_params["kernel"]
        viewer: Viewer | None = None
        try:
            header = bool(header_token(websocket.headers))
            if header:  # everything is checked before the upgrade: a refusal can be an HTTP answer
                viewer = await authenticated(websocket, users, revocations, accepted=False)
                target = await find_target(sessions, viewer.user, session_id, hostname)
                await websocket.accept()
            else:
                await websocket.accept()
                viewer = await authenticated(websocket, users, revocations, accepted=True)
                target = await find_target(sessions, viewer.user, session_id, hostname)
            with slots.claimed(viewer.user.id):
                await self._serve(websocket, viewer, target, state["nomad"], sessions, slots)
        except CaravanError as error:
            await refuse(websocket, error)
        finally:
            if viewer is not None and viewer.watched is not None and revocations is not None:
                revocations.forget(viewer.watched)

    async def _serve(
        self,
        websocket: WebSocket,
        viewer: Viewer,
        target: ExecTarget,
        nomad: NomadClient,
        sessions: SessionStore,
        slots: ExecSlots,
    ) -> None:
        meter = ActivityMeter(sessions, target.session_id, ActivityClock(slots.limits.activity_interval))
        async with open_connection(sessions, target.session_id):
            try:
                # announced and gated: a shell Nomad reports ended before it started (its docker driver does, now
                # and then, when docker is slow to start the exec) is run again, and the cut-off run never starts it
                shell = open_exec(nomad.settings, target.alloc_id, TASK_NAME, SHELL, tty=True, announce=True)
                async with shell as stream:
                    exit_code = await relay(websocket, stream, meter, viewer.watched)
                if exit_code is None and stream.exit_code is None and stream.pid is not None:
                    await hang_up(nomad.settings, target.alloc_id, stream.pid)
            except ExecRefused as exc:
                raise ExecFailed(f"Nomad refused the terminal: {exc.reason or exc}") from exc
            except ExecNeverStarted as exc:
                raise ExecFailed(f"the terminal's shell never started: {exc}") from exc
            except ExecNotAnnounced as exc:
                raise ExecFailed(f"the kernel has no /bin/sh for a terminal: {exc}") from exc
        if exit_code is None:
            return  # the client left, or the token was revoked (the socket is closed already)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await websocket.send_text(json.dumps({"type": "exit", "exitCode": exit_code}))
            await websocket.close(code=1000)


async def hang_up(settings: NomadSettings, alloc_id: str, pid: int) -> None:
    """What closing a terminal does to its shell: SIGHUP to it and to what runs in its session (the program in the
    foreground, its jobs: as a shell that passes the hangup on to its jobs, like bash). Docker does not end an exec
    whose client went away: every tab closed left its shell, and what ran in it, in the kernel. A program that asked
    to outlive its terminal (``nohup``, a session of its own) does."""
    try:
        await signal_session(settings, alloc_id, TASK_NAME, pid, "HUP")
    except Exception as exc:  # the client is gone: nobody to tell but the log
        log.warning("terminal: shell %d of allocation %s left running: %s: %s", pid, alloc_id, type(exc).__name__, exc)


@contextlib.asynccontextmanager
async def open_connection(sessions: SessionStore, session_id: str) -> AsyncIterator[None]:
    """The terminal as an open connection of the session (``stores.activity``), refreshed while it is open."""
    connection_id = "terminal-" + uuid.uuid4().hex
    redis, keys = sessions.redis, sessions.keys

    async def refresh() -> None:
        while True:
            await activity.open_connection(redis, keys, session_id, connection_id, utcnow())
            await asyncio.sleep(activity.CONNECTION_TTL / 3)

    refresher = asyncio.create_task(refresh(), name="terminal-activity")
    try:
        yield
    finally:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await refresher
        with contextlib.suppress(Exception):  # Redis away: the connection lapses by itself after its ttl
            await activity.close_connection(redis, keys, session_id, connection_id, utcnow())


async def relay(websocket: WebSocket, stream: ExecStream, meter: ActivityMeter, watched: Watched | None) -> int | None:
    """Relay both ways until the shell exits (its exit code), the client leaves or the token is revoked (None)."""
    output = asyncio.create_task(to_client(websocket, stream, meter))
    inbound = asyncio.create_task(to_kernel(websocket, stream, meter))
    revoked = asyncio.create_task(until_revoked(websocket, watched))
    tasks = (output, inbound, revoked)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    failure = None if inbound.cancelled() else inbound.exception()
    if isinstance(failure, CaravanError):
        raise failure  # a bad message: refused with its code
    ended = output.exception() if output.done() and not output.cancelled() else None
    if isinstance(ended, ExecNeverStarted):
        raise ended
    return output.result() if output.done() and not output.cancelled() and ended is None else None


async def to_client(websocket: WebSocket, stream: ExecStream, meter: ActivityMeter) -> int | None:
    """The terminal's output to the client; the exit code once the shell exits."""
    async for frame in stream.frames():
        if isinstance(frame, Exited):
            return frame.exit_code
        if isinstance(frame, Output):
            await websocket.send_bytes(frame.data)
            await meter.touch()
    return None


async def to_kernel(websocket: WebSocket, stream: ExecStream, meter: ActivityMeter) -> None:
    """The client's keys and control messages to the shell, until the client leaves."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("bytes") is not None:
            await stream.send_stdin(message["bytes"][:MAX_MESSAGE])
        elif message.get("text") is not None:
            await control(stream, message["text"])
        await meter.touch()


async def until_revoked(websocket: WebSocket, watched: Watched | None) -> None:
    """Close the terminal (4403) once its token is revoked or expires; never returns otherwise."""
    if watched is None:
        await asyncio.Event().wait()
        return
    await watched.tripped.wait()
    log.info("closing a terminal: its token was %s", watched.reason)
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await websocket.close(code=4403, reason="Forbidden")


async def control(stream: ExecStream, text: str) -> None:
    """One JSON control message of the client: resize, stdin as text, or the end of stdin."""
    try:
        message = json.loads(text)
    except ValueError:
        raise InvalidInput("a text message must be JSON: resize, stdin or close") from None
    kind = message.get("type") if isinstance(message, dict) else None
    if kind == "resize":
        rows, cols = message.get("rows"), message.get("cols")
        if not (isinstance(rows, int) and isinstance(cols, int) and 0 < rows <= 1000 and 0 < cols <= 1000):
            raise InvalidInput("resize needs rows and cols, whole numbers from 1 to 1000", field="rows")
        await stream.resize(rows, cols)
    elif kind == "stdin" and isinstance(message.get("data"), str):
        await stream.send_stdin(message["data"].encode())
    elif kind == "close":
        await stream.close_stdin()
    elif kind != "auth":  # a late auth message is ignored
        raise InvalidInput("unknown message: send binary stdin, or JSON of type resize, stdin or close")
