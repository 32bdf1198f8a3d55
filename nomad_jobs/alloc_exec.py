"""Nomad's alloc exec WebSocket (``/v1/client/allocation/:id/exec``), typed: what python-nomad lacks.

One :class:`ExecStream` is one command run in one task of an allocation, as ``nomad alloc exec`` runs it. Every frame
is a JSON text message whose byte fields are base64 (``command/agent/alloc_endpoint.go``, ``plugins/drivers``):

- to Nomad: ``{"stdin": {"data": b64}}``, ``{"stdin": {"close": true}}``, ``{"tty_size": {"height": h, "width": w}}``;
- from Nomad: ``{"stdout": {"data": b64}}`` / ``{"stderr": …}`` (``{"close": true}`` when a stream ends), and last
  ``{"exited": true, "result": {"exit_code": n}}``; a failure (no such task, a refused driver) is a Close frame whose
  reason says why.

So bytes go both ways untouched: :meth:`ExecStream.send_stdin` takes bytes, :class:`Output` carries bytes.

An exec's reported end can be false: Nomad's docker driver (``drivers/docker/driver.go``, ``ExecTaskStreaming``, 1.11
and its main branch) inspects the exec as soon as it has attached to it, and dockerd answers the attach before it
marks the exec running; an exec docker is slow to start (CPU load, the container's lock held by a ``docker cp``) is
inspected not running, its exit code unset, and reported ``exited`` with code 0 before the command ran, no output
sent; the command may start after, cut off from the socket. So an exec can be *announced* (``open_exec(announce=
True)``): run by ``/bin/sh`` that first prints :data:`STARTED`, which :meth:`ExecStream.frames` reads (and never
passes on) before anything else; a run reported ended before it is replaced by a new one (:data:`START_ATTEMPTS`).
The shell then waits for a line on its stdin (``kernelExec``'s commands may not run twice, nor a terminal's
shell), which the gateway sends only once it has read the announcement on that same run's socket (``gated``,
:func:`announced`): a run Nomad reported ended reads the end of its stdin instead (Nomad closes it) and exits without
running the command, so running it again never runs it twice. A terminal's TTY has its echo off while its shell waits
for the line. An announced command's process id is what a timeout or a hang-up signals
(:func:`signal_session`).

ACL: ``alloc-exec`` on the namespace; tasks of drivers without isolation (``raw_exec``) need ``alloc-node-exec``,
which Caravan's gateway token never has (``caravan/stack/nomad_acl.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from core.errors import PermanentError, TransientError
from core.settings import NomadSettings

log = logging.getLogger(__name__)

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


class ExecNeverStarted(TransientError):
    """Nomad reported an announced command's exit before the command had said it started, every time it was run."""


class ExecNotAnnounced(PermanentError):
    """A gated command ended, not zero, without its announcement and with docker saying ``/bin/sh`` could not run (an
    image without it): nothing ran, so the command may be run as it is."""


STARTED = b"\x1b_caravan-exec-started\x1b\\"
"""What an announced command prints first: an APC string (a terminal shows nothing of it), never passed on; with its
process id in the task after a ``;`` (:data:`ANNOUNCEMENT`)."""
ANNOUNCEMENT = re.compile(rb"\x1b_caravan-exec-started(?:;(\d{1,10}))?\x1b\\")

START_ATTEMPTS = 30
"""How many times an announced command is run while Nomad reports its end before it started, with pauses between
runs from 50 ms doubling up to a second (about 25 s in all). Under CPU load the false end came about once in 200
execs; while docker stays slow to start execs (its container's lock held by a ``docker cp``) it can be most runs."""


AHEAD_BYTES = 64 << 10
"""Output an announced command may send before :data:`STARTED` (a TTY's echo of keys typed ahead); past it, the
command is taken as one that does not announce itself."""


_ANNOUNCE = "printf '\\033_caravan-exec-started;%s\\033\\\\' \"$$\""
"""Prints :data:`STARTED` with the shell's process id (``exec "$@"`` keeps it the command's)."""


def announced(command: Sequence[str], *, gated: bool = False, tty: bool = False) -> list[str]:
    """``command`` run by ``/bin/sh`` once it has printed :data:`STARTED` with its process id (its argv as it is:
    ``exec "$@"``, so the id is the command's); ``gated``: and then read a line from its stdin (:data:`GO`), which
    a run whose socket Nomad closed never gets (``read`` fails at the end of stdin, so the command does not run). A
    shell reads a line from a pipe byte by byte: the command's stdin starts right after it.

    A gated ``tty`` run turns the terminal's echo off before it announces itself (:data:`GO` is sent only after the
    announcement, so it is never echoed) and on again before the command: a ``stty`` missing from the image leaves
    only that line echoed, once."""
    if gated and tty:
        script = _QUIET + _ANNOUNCE + _GATE + ' && { stty echo 2>/dev/null; exec "$@"; }'
        return ["/bin/sh", "-c", script, "sh", *command]
    gate = _GATE if gated else ""
    return ["/bin/sh", "-c", _ANNOUNCE + gate + ' && exec "$@"', "sh", *command]


def exec_argv(command: Sequence[str], *, tty: bool, announce: bool) -> list[str]:
    """What :func:`open_exec` runs for ``command``: announced and gated (:func:`announced`), or as it is."""
    return announced(command, gated=True, tty=tty) if announce else list(command)


_GATE = " && read -r go"
_QUIET = "stty -echo 2>/dev/null; "


GO = b"\n"
"""What a gated command's shell waits for on its stdin: sent once its announcement was read on the same socket."""


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
    """One running command: send its stdin and terminal size, read its output frames until :class:`Exited`.

    With ``reopen`` (an announced command, :func:`open_exec`), :meth:`frames` first reads the command's
    :data:`STARTED` and, while Nomad reports its end before it, runs it again on a new socket from ``reopen``. A
    ``gated`` command's stdin (:func:`announced`) is held until then and sent after :data:`GO`."""

    def __init__(
        self,
        connection: ClientConnection,
        *,
        reopen: Callable[[], Awaitable[ClientConnection]] | None = None,
        first_pause: float = 0.05,
        gated: bool = False,
    ) -> None:
        self._ws = connection
        self._reopen = reopen
        self._first_pause = first_pause
        """Seconds before the second run; twice as long before each next one, up to a second."""
        self.runs = 1
        """How many times the command was run (more than once: Nomad reported its end before it started)."""
        self.exit_code: int | None = None
        """Set once the command's exit was received."""
        self.pid: int | None = None
        """An announced command's process id in its task, once it announced itself."""
        self._size: tuple[int, int] | None = None
        """The last terminal size asked for (rows, columns), sent again once the command has started."""
        self._started = False
        self._start_known = reopen is None
        """Whether the command's start is known: an announced command's once its :data:`STARTED` is read."""
        self._gated = gated
        self._held: list[str] = []
        """A gated command's stdin messages, sent once it has started."""
        self._pending: deque[ExecFrame] = deque()
        """Frames read ahead (waiting for :data:`STARTED`), passed on first."""

    async def send_stdin(self, data: bytes) -> None:
        if data:
            await self._send_stdin(encode_stdin(data))

    async def close_stdin(self) -> None:
        await self._send_stdin(encode_close_stdin())

    async def _send_stdin(self, message: str) -> None:
        if self._gated and not self._start_known:
            self._held.append(message)  # its shell reads GO first, sent once this run announced itself
        else:
            await self._send(message)

    async def resize(self, height: int, width: int) -> None:
        """The terminal's size in rows and columns (meaningful with ``tty``). A size asked for before the command
        has started is sent again at its first output: Nomad's docker driver drops a resize that reaches the exec
        before docker has started it, which left the shell with no size (``stty size`` failing)."""
        self._size = (height, width)
        await self._send(encode_resize(height, width))

    async def close(self) -> None:
        await self._ws.close()

    async def _send(self, message: str) -> None:
        try:
            await self._ws.send(message)
        except ConnectionClosed as exc:
            if not self._start_known:
                return  # a run Nomad ended before it started: the next one gets the size; keys typed ahead are lost
            raise closed_error(exc) from exc

    async def frames(self) -> AsyncIterator[ExecFrame]:
        """The command's output, then its :class:`Exited` (the iteration ends after it).

        Raises :class:`ExecRefused` when Nomad closes the socket with an error (its reason in the message),
        :class:`ExecBroken` when the socket breaks without one, and :class:`ExecNeverStarted` when an announced
        command was reported ended before it started :data:`START_ATTEMPTS` times."""
        while not self._start_known:
            if await self._until_started():
                self._start_known = True
            else:
                await self._run_again()
        while True:
            frame = self._pending.popleft() if self._pending else await self._receive()
            if isinstance(frame, Output):
                await self._output_seen()
            yield frame
            if isinstance(frame, Exited):
                self.exit_code = frame.exit_code
                return

    async def _until_started(self) -> bool:
        """Read an announced command's :data:`STARTED`, keeping the rest for :meth:`frames`: True. False when Nomad
        reports the command's exit before any output: it never ran, as far as the socket can tell. Output before the
        announcement (a TTY's echo of keys typed ahead) is kept; output without it (docker's own error when it cannot
        run ``/bin/sh``) is kept as it came, at the exit or past :data:`AHEAD_BYTES`: True. Stderr, a stream of its
        own without a TTY, is kept as it comes meanwhile."""
        head = b""
        while True:
            frame = await self._receive()
            if isinstance(frame, Exited):
                if not (head or self._pending):
                    # never started, as far as this socket can tell: run again. Its run may start after all, cut
                    # off: gated, it does not run the command (its stdin ends before GO)
                    return False
                if self._gated and frame.exit_code in (126, 127) and self._shell_missing(head):
                    raise ExecNotAnnounced(f"/bin/sh did not run (exit code {frame.exit_code}): {head[:200]!r}")
                self._pending.extend((Output("stdout", head), frame) if head else (frame,))
                return True
            if frame.stream == "stderr":
                self._pending.append(frame)
                continue
            head += frame.data
            announcement = ANNOUNCEMENT.search(head)
            if announcement or len(head) > AHEAD_BYTES:
                if announcement:
                    pid = announcement.group(1)
                    self.pid = int(pid) if pid else None
                    head = head[: announcement.start()] + head[announcement.end() :]
                if head:
                    self._pending.append(Output("stdout", head))
                if announcement and self._gated:
                    await self._send(encode_stdin(GO))
                    for message in self._held:
                        await self._send(message)
                    self._held.clear()
                await self._output_seen()
                return True

    def _shell_missing(self, head: bytes) -> bool:
        """Whether what came before an exit (126 or 127), without the announcement, is docker's word that
        ``/bin/sh`` could not run (``OCI runtime exec failed: exec: "/bin/sh": ...``), so nothing ran."""
        said = head + b"".join(f.data for f in self._pending if isinstance(f, Output))
        return b"exec failed" in said and b"/bin/sh" in said

    async def _run_again(self) -> None:
        """The command once more, on a new socket (Nomad reported its end before it started), with its size."""
        assert self._reopen is not None  # only an announced command awaits its start
        if self.runs >= START_ATTEMPTS:
            raise ExecNeverStarted(f"Nomad reported the command ended before it started, {self.runs} times in a row")
        log.info("Nomad reported an exec's end before it started (run %d); running it again", self.runs)
        await self._ws.close()
        await asyncio.sleep(min(self._first_pause * 2 ** (self.runs - 1), 1.0))  # docker slow a while: let it pass
        self._ws = await self._reopen()
        self.runs += 1
        if self._size is not None:
            await self._send(encode_resize(*self._size))

    async def _receive(self) -> ExecFrame:
        """The next frame from Nomad that carries something."""
        while True:
            try:
                message = await self._ws.recv()
            except ConnectionClosed as exc:
                raise closed_error(exc) from exc
            frame = decode_frame(message)
            if frame is not None:
                return frame

    async def _output_seen(self) -> None:
        """At the command's first output, its size asked for is sent again (see :meth:`resize`)."""
        if self._started:
            return
        self._started = True
        if self._size is not None:
            with contextlib.suppress(ExecBroken, ExecRefused):  # the next read reports a closed socket
                await self._send(encode_resize(*self._size))


@contextlib.asynccontextmanager
async def open_exec(
    settings: NomadSettings,
    alloc_id: str,
    task: str,
    command: Sequence[str],
    *,
    tty: bool = False,
    open_timeout: float = 10.0,
    announce: bool = False,
) -> AsyncIterator[ExecStream]:
    """Run ``command`` (argv, not shell text) in ``task`` of ``alloc_id``; leaving the block closes the socket, which
    ends the command's session on Nomad's side.

    ``announce``: the command is run by ``/bin/sh`` (:func:`announced`): its process id is known once it runs
    (``stream.pid``), and it is run again while Nomad reports its end before it started (:class:`ExecStream`). It is
    gated, so it never runs twice (a terminal's shell too: its echo is off while it waits), and
    :class:`ExecNotAnnounced` says when ``/bin/sh`` cannot run (nothing ran)."""
    if not command:
        raise ValueError("an exec needs a command")
    gated = announce
    url = exec_url(settings, alloc_id, task, exec_argv(command, tty=tty, announce=announce), tty=tty)

    async def reopen() -> ClientConnection:
        return await connect_exec(settings, url, open_timeout)

    stream = ExecStream(await reopen(), reopen=reopen if announce else None, gated=gated)
    try:
        yield stream
    finally:
        await stream.close()


SIGNAL_SESSION = """s=$1 sig=$2
for d in /proc/[0-9]*; do
  read -r stat < "$d/stat" 2>/dev/null || continue
  set -- ${stat##*) }
  [ "$4" = "$s" ] && kill -"$sig" "${d#/proc/}" 2>/dev/null
done
exit 0"""
"""A signal (``$2``) to every process of the session led by ``$1``, read off each ``/proc/<pid>/stat`` (state,
parent, group, session after the command's name): POSIX sh, as every kernel an announced command ran in has it."""


async def signal_session(
    settings: NomadSettings, alloc_id: str, task: str, pid: int, signal: str, *, wait: float = 10.0
) -> None:
    """``signal`` (``HUP``, ``KILL``) to the processes of the session an announced command leads (docker and Nomad's
    executor start each exec in a session of its own; ``exec "$@"`` keeps the announced process id the command's):
    what ends it and what it started, when its socket closing does not (docker never ends an exec whose client went
    away). Raises what an exec raises, ``TimeoutError`` past ``wait`` seconds."""
    command = ("/bin/sh", "-c", SIGNAL_SESSION, "sh", str(pid), signal)
    async with asyncio.timeout(wait), open_exec(settings, alloc_id, task, command) as stream:
        await stream.close_stdin()
        async for _ in stream.frames():
            pass


async def connect_exec(settings: NomadSettings, url: str, open_timeout: float) -> ClientConnection:
    """The exec's WebSocket, open: the command runs."""
    headers = {"X-Nomad-Token": settings.token} if settings.token else {}
    ssl_context = None
    if url.startswith("wss:"):
        from nomad_jobs.client import tls_context

        ssl_context = tls_context()
    try:
        return await connect(
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
