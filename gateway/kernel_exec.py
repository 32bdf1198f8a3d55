"""Commands run in kernels through Nomad's exec (``nomad_jobs.alloc_exec``): the gateway's side, shared by the GraphQL
fields (``gateway.graphql.execs``) and the terminal (``gateway.terminal``).

- :class:`ExecSlots`: how many commands and terminals run at once, per user in this process and per connection
  (``CARAVAN_EXEC_MAX_USER_EXECS``, ``CARAVAN_EXEC_MAX_CONNECTION_EXECS``); beyond, TOO_MANY_EXECS at once.
- :class:`ActivityMeter`: a running command's or terminal's traffic is the session's activity for the idle checker
  (``stores.activity``), recorded at most once per ``CARAVAN_EXEC_ACTIVITY_INTERVAL`` seconds, not per byte.
- :func:`run_command`: a command to its end, its output capped; :func:`stream_command`: its frames as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

from core.clock import utcnow
from core.settings import NomadSettings
from domain.kernel_exec import (
    ActivityClock,
    CappedOutput,
    ExecFailed,
    ExecLimits,
    ExecTarget,
    ExecTimeout,
    TooManyExecs,
    exec_target,
)
from domain.users import User
from nomad_jobs.alloc_exec import (
    ExecFrame,
    ExecNeverStarted,
    ExecNotAnnounced,
    ExecRefused,
    ExecStream,
    Exited,
    Output,
    open_exec,
    signal_session,
)
from nomad_jobs.meta import TASK_NAME
from stores.activity import record_activity
from stores.sessions import SessionStore

log = logging.getLogger(__name__)


def exec_limits_from_env(environ: Mapping[str, str] | None = None) -> ExecLimits:
    """:class:`ExecLimits` with each ``CARAVAN_EXEC_<FIELD>`` that is set."""
    env = os.environ if environ is None else environ
    values: dict[str, float] = {}
    for f in fields(ExecLimits):
        name = f"CARAVAN_EXEC_{f.name.upper()}"
        if env.get(name):
            try:
                values[f.name] = float(env[name]) if f.type in ("float", float) else int(env[name])
            except ValueError:
                raise ValueError(f"{name} must be a number, not {env[name]!r}") from None
    return ExecLimits(**values)  # type: ignore[arg-type]


class ExecSlots:
    """The commands and terminals running in this gateway process, per user."""

    def __init__(self, limits: ExecLimits) -> None:
        self.limits = limits
        self._users: dict[str, int] = {}

    def connection(self) -> ConnectionExecs:
        return ConnectionExecs(self)

    @contextlib.contextmanager
    def claimed(self, user_id: str, connection: ConnectionExecs | None = None) -> Iterator[None]:
        """A place for one command of ``user_id`` (and of ``connection``) while the block runs."""
        limits = self.limits
        if connection is not None and connection.open >= limits.max_connection_execs:
            raise TooManyExecs(
                f"this connection already runs {connection.open} commands, the most one connection runs at once "
                "(CARAVAN_EXEC_MAX_CONNECTION_EXECS): end one first",
                limit=limits.max_connection_execs,
                per="connection",
            )
        running = self._users.get(user_id, 0)
        if running >= limits.max_user_execs:
            raise TooManyExecs(
                f"you already run {running} commands or terminals, the most one user runs at once "
                "(CARAVAN_EXEC_MAX_USER_EXECS): end one first",
                limit=limits.max_user_execs,
                per="user",
            )
        self._users[user_id] = running + 1
        if connection is not None:
            connection.open += 1
        try:
            yield
        finally:
            if connection is not None:
                connection.open -= 1
            left = self._users[user_id] - 1
            if left:
                self._users[user_id] = left
            else:
                del self._users[user_id]


class ConnectionExecs:
    def __init__(self, slots: ExecSlots) -> None:
        self.slots = slots
        self.open = 0


@dataclass
class ActivityMeter:
    """Records a session's traffic as its activity, at most once per the clock's interval."""

    store: SessionStore
    session_id: str
    clock: ActivityClock

    async def touch(self) -> None:
        if self.clock.due(time.monotonic()):
            await record_activity(self.store.redis, self.store.keys, self.session_id, utcnow())


async def find_target(store: SessionStore, viewer: User, session_id: str, hostname: str) -> ExecTarget:
    """The kernel the viewer may run a command in (NOT_FOUND, EXEC_NOT_SUPPORTED, SESSION_NOT_RUNNING otherwise)."""
    return exec_target(viewer, await store.get(session_id), session_id, hostname)


@dataclass(frozen=True)
class Completed:
    exit_code: int
    stdout: CappedOutput
    stderr: CappedOutput


async def stream_command(
    nomad: NomadSettings,
    target: ExecTarget,
    command: Sequence[str],
    *,
    stdin: bytes | None,
    timeout: float,
    meter: ActivityMeter,
) -> AsyncGenerator[ExecFrame, None]:
    """The command's output frames, then its :class:`Exited`; EXEC_TIMEOUT after ``timeout`` seconds (the command
    and what it started are killed), EXEC_FAILED when Nomad refuses it.

    The command announces itself (``nomad_jobs.alloc_exec``: run by ``/bin/sh``, its process id known once it runs)
    and is gated, so a run Nomad reports ended before it started is run again and it still runs once: its session is
    what a timeout kills, since closing the exec's socket ends nothing in the kernel. In an image without ``/bin/sh``
    it runs as it is (nothing ran: the shell could not), and a timeout cannot kill it."""
    deadline = asyncio.get_running_loop().time() + timeout
    for announce in (True, False):
        stream: ExecStream | None = None
        try:
            shell = open_exec(nomad, target.alloc_id, TASK_NAME, command, announce=announce)
            async with asyncio.timeout_at(deadline), shell as stream:
                await meter.touch()
                if stdin:
                    await stream.send_stdin(stdin)
                await stream.close_stdin()  # no stdin: the command reads end-of-file at once, never waits for input
                async for frame in stream.frames():
                    await meter.touch()
                    yield frame
            return
        except ExecNotAnnounced:
            continue  # no /bin/sh in the kernel: nothing ran
        except TimeoutError:
            pid = None if stream is None else stream.pid
            if announce and pid is None:  # gated: it never got past its shell
                outcome = "it had not started"
            elif pid is not None and await _killed(nomad, target, pid):
                outcome = "it was stopped"
            else:
                outcome = "it could not be stopped and may still run in the kernel"
            raise ExecTimeout(
                f"the command did not end within {timeout:g} s (timeoutSeconds); {outcome}",
                field="timeoutSeconds",
                timeoutSeconds=timeout,
            ) from None
        except ExecNeverStarted as exc:
            raise ExecFailed(f"{exc}; it did not run") from exc
        except ExecRefused as exc:
            if announce and "/bin/sh" in str(exc.reason or exc):
                continue  # refused for want of /bin/sh: nothing ran
            raise ExecFailed(f"Nomad refused the command: {exc.reason or exc}") from exc


async def _killed(nomad: NomadSettings, target: ExecTarget, pid: int) -> bool:
    """SIGKILL to a timed-out command's session; whether that was done."""
    try:
        await signal_session(nomad, target.alloc_id, TASK_NAME, pid, "KILL")
    except Exception:  # said in the answer: "may still run"
        log.warning(
            "exec: the timed-out command %d of allocation %s was not killed", pid, target.alloc_id, exc_info=True
        )
        return False
    return True


async def run_command(
    nomad: NomadSettings,
    target: ExecTarget,
    command: Sequence[str],
    *,
    stdin: bytes | None,
    timeout: float,
    limits: ExecLimits,
    meter: ActivityMeter,
) -> Completed:
    """The command run to its end: its exit code and its output, each stream capped at ``limits.max_output_bytes``."""
    out, err = CappedOutput.of(limits.max_output_bytes), CappedOutput.of(limits.max_output_bytes)
    exit_code = -1
    async for frame in stream_command(nomad, target, command, stdin=stdin, timeout=timeout, meter=meter):
        if isinstance(frame, Output):
            (out if frame.stream == "stdout" else err).add(frame.data)
        elif isinstance(frame, Exited):
            exit_code = frame.exit_code
    return Completed(exit_code, out, err)
