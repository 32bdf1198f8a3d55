"""Nomad's alloc exec WebSocket (``/v1/client/allocation/:id/exec``), typed: what python-nomad lacks.

One :class:`ExecStream` is one command run in one task of an allocation, as ``nomad alloc exec`` runs it. Every frame
is a JSON text message whose byte fields are base64 (``command/agent/alloc_endpoint.go``, ``plugins/drivers``):

- to Nomad: ``{"stdin": {"data": b64}}``, ``{"stdin": {"close": true}}``, ``{"tty_size": {"height": h, "width": w}}``;
- from Nomad: ``{"stdout": {"data": b64}}`` / ``{"stderr": …}`` (``{"close": true}`` when a stream ends), and last
  ``{"exited": true, "result": {"exit_code": n}}``; a failure (no such task, a refused driver) is a Close frame whose
  reason says why.

So bytes go both ways untouched: :meth:`ExecStream.send_stdin` takes bytes, :class:`Output` carries bytes.

ACL: ``alloc-exec`` on the namespace; tasks of drivers without isolation (``raw_exec``) need ``alloc-node-exec``,
which Caravan's gateway token never has (``caravan/stack/nomad_acl.py``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from core.errors import PermanentError, TransientError
from core.settings import NomadSettings

MAX_FRAME_BYTES = 4 << 20
"""Largest message accepted from Nomad, in bytes (its output frames are far smaller: about 4 KiB of data each)."""

StreamName = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class Output:
    """A chunk of the command's output, byte-exact."""

    stream: StreamName
    data: bytes


@dataclass(frozen=True)
class Exited:
    """The command ended; the last frame."""

    exit_code: int


ExecFrame = Output | Exited


class ExecRefused(PermanentError):
    """Nomad refused the exec: ``status`` is the handshake's HTTP status (403 without ``alloc-exec``, or for a
    ``raw_exec`` task without ``alloc-node-exec``; 404 for an unknown allocation), or None when Nomad accepted the
    WebSocket and then closed it with ``reason`` (an unknown task, a task not running)."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class ExecBroken(TransientError):
    """The exec's WebSocket broke before the command's exit was reported (Nomad or its client went away)."""


def encode_stdin(data: bytes) -> str:
    return json.dumps({"stdin": {"data": base64.b64encode(data).decode("ascii")}})


def encode_close_stdin() -> str:
    return json.dumps({"stdin": {"close": True}})


def encode_resize(height: int, width: int) -> str:
    return json.dumps({"tty_size": {"height": height, "width": width}})


def decode_frame(message: str | bytes) -> ExecFrame | None:
    """One message from Nomad as a frame; None for one that carries nothing (a stream's close, a heartbeat)."""
    frame = json.loads(message)
    if frame.get("exited"):
        return Exited(int((frame.get("result") or {}).get("exit_code", 0)))
    for name in ("stdout", "stderr"):
        data = (frame.get(name) or {}).get("data")
        if data:
            stream: StreamName = "stdout" if name == "stdout" else "stderr"
            return Output(stream, base64.b64decode(data))
    return None


def exec_url(settings: NomadSettings, alloc_id: str, task: str, command: Sequence[str], *, tty: bool) -> str:
    """The WebSocket URL of an exec (``http`` → ``ws``, ``https`` → ``wss``); the command travels as JSON."""
    base = urllib.parse.urlsplit(settings.addr)
    scheme = "wss" if base.scheme == "https" else "ws"
    query = urllib.parse.urlencode(
        {
            "task": task,
            "command": json.dumps(list(command)),
            "tty": "true" if tty else "false",
            "namespace": settings.namespace,
        }
    )
    path = f"{base.path.rstrip('/')}/v1/client/allocation/{urllib.parse.quote(alloc_id, safe='')}/exec"
    return urllib.parse.urlunsplit((scheme, base.netloc, path, query, ""))


def closed_error(closed: ConnectionClosed) -> ExecRefused | ExecBroken:
    """What a socket closed before the command's exit means: Nomad's refusal (a Close frame with a reason, such as
    ``Permission denied`` or an unknown task), or a broken connection."""
    received = closed.rcvd
    if received is not None and received.code not in (1000, 1001) and received.reason:
        return ExecRefused(f"Nomad ended the exec: {received.reason}", reason=received.reason)
    return ExecBroken(f"the exec's connection closed before the command exited ({closed})")


class ExecStream:
    """One running command: send its stdin and terminal size, read its output frames until :class:`Exited`."""

    def __init__(self, connection: ClientConnection) -> None:
        self._ws = connection
        self.exit_code: int | None = None
        """Set once the command's exit was received."""
        self._size: tuple[int, int] | None = None
        """The last terminal size asked for (rows, columns), sent again once the command has started."""
        self._started = False

    async def send_stdin(self, data: bytes) -> None:
        if data:
            await self._send(encode_stdin(data))

    async def close_stdin(self) -> None:
        await self._send(encode_close_stdin())

    async def resize(self, height: int, width: int) -> None:
        """The terminal's size in rows and columns (meaningful with ``tty``). A size asked for before the command
        has started is sent again at its first output: Nomad's docker driver drops a resize that reaches the exec
        before docker has started it, which left the shell with no size (``stty size`` failing)."""
        self._size = (height, width)
        await self._send(encode_resize(height, width))

    async def _send(self, message: str) -> None:
        try:
            await self._ws.send(message)
        except ConnectionClosed as exc:
            raise closed_error(exc) from exc

    async def frames(self) -> AsyncIterator[ExecFrame]:
        """The command's output, then its :class:`Exited` (the iteration ends after it).

        Raises :class:`ExecRefused` when Nomad closes the socket with an error (its reason in the message), and
        :class:`ExecBroken` when the socket breaks without one."""
        while True:
            try:
                message = await self._ws.recv()
            except ConnectionClosed as exc:
                raise closed_error(exc) from exc
            frame = decode_frame(message)
            if frame is None:
                continue
            if not self._started and isinstance(frame, Output):
                self._started = True
                if self._size is not None:
                    with contextlib.suppress(ExecBroken, ExecRefused):  # the next read reports a closed socket
                        await self._send(encode_resize(*self._size))
            yield frame
            if isinstance(frame, Exited):
                self.exit_code = frame.exit_code
                return


@contextlib.asynccontextmanager
async def open_exec(
    settings: NomadSettings,
    alloc_id: str,
    task: str,
    command: Sequence[str],
    *,
    tty: bool = False,
    open_timeout: float = 10.0,
) -> AsyncIterator[ExecStream]:
    """Run ``command`` (argv, not shell text) in ``task`` of ``alloc_id``; leaving the block closes the socket, which
    ends the command's session on Nomad's side."""
    if not command:
        raise ValueError("an exec needs a command")
    headers = {"X-Nomad-Token": settings.token} if settings.token else {}
    url = exec_url(settings, alloc_id, task, command, tty=tty)
    ssl_context = None
    if url.startswith("wss:"):
        from nomad_jobs.client import tls_context

        ssl_context = tls_context()
    try:
        connection = await connect(
            url,
            additional_headers=headers,
            open_timeout=open_timeout,
            max_size=MAX_FRAME_BYTES,
            compression=None,
            proxy=None,  # Nomad is reached directly, never through a proxy of the environment
            ssl=ssl_context,
            ping_interval=20,
            ping_timeout=20,
            close_timeout=2,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        body = exc.response.body.decode(errors="replace").strip() if exc.response.body else ""
        raise ExecRefused(f"Nomad refused the exec ({status}): {body}", status=status, reason=body) from exc
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise TransientError(f"Nomad at {settings.addr} is unreachable for an exec: {exc!r}") from exc
    try:
        yield ExecStream(connection)
    finally:
        await connection.close()
