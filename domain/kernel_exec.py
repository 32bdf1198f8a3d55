"""Running a command in a kernel (``execInKernel``, ``kernelExec``, the terminal): who may, into which kernel, with
what command, for how long, and how much output is kept. Pure: decisions on a viewer, a session and the limits.

Refusals are typed (``extensions.code``): a session or kernel the viewer cannot see, or that has no such kernel, is
NOT_FOUND, exactly as one that does not exist; a QEMU kernel has no exec path (EXEC_NOT_SUPPORTED, the VM runs no
agent Nomad could exec through); a ``raw_exec`` kernel runs on the host itself, so only a SUPERADMIN is let through,
and Nomad then still wants ``alloc-node-exec``, which Caravan's gateway token never has (EXEC_NOT_SUPPORTED for
everyone else); a session or kernel that is not RUNNING is SESSION_NOT_RUNNING.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.errors import CaravanError, InvalidInput, NotFound
from domain.access import can_access
from domain.model import Driver, Session, SessionStatus
from domain.users import Role, User

SHELL = ("/bin/sh", "-c")
"""How shell text runs: ``/bin/sh -c <text>`` (every image Caravan runs has a POSIX shell there)."""


class ExecNotSupported(CaravanError):
    code = "EXEC_NOT_SUPPORTED"


class SessionNotRunning(CaravanError):
    code = "SESSION_NOT_RUNNING"


class ExecTimeout(CaravanError):
    code = "EXEC_TIMEOUT"


class TooManyExecs(CaravanError):
    code = "TOO_MANY_EXECS"


class ExecFailed(CaravanError):
    """Nomad refused or broke off the exec (its reason in the message)."""

    code = "EXEC_FAILED"


@dataclass(frozen=True)
class ExecLimits:
    """The limits of commands run in kernels; each is set by ``CARAVAN_EXEC_<FIELD NAME>``."""

    default_timeout: float = 30.0
    """Seconds a command may run when the request names no timeout."""
    max_timeout: float = 600.0
    """Most seconds a request may give a command (and a streamed one, ``kernelExec``)."""
    max_output_bytes: int = 1 << 20
    """Bytes of stdout, and of stderr, one ``execInKernel`` returns; the rest is read and dropped (``truncated``)."""
    max_stdin_bytes: int = 256 << 10
    """Most bytes of stdin one command is given (the request's body is also held to CARAVAN_GRAPHQL_MAX_BODY_BYTES, 1
    MiB, and base64 takes 4 characters per 3 bytes)."""
    max_user_execs: int = 8
    """Commands and terminals one user runs at once in one gateway process; more are TOO_MANY_EXECS."""
    max_connection_execs: int = 4
    """``kernelExec`` subscriptions one WebSocket connection runs at once; more are TOO_MANY_EXECS."""
    activity_interval: float = 10.0
    """Seconds between two records of a running command's or terminal's traffic as the session's activity (traffic
    is recorded at most this often, not per byte)."""

    def __post_init__(self) -> None:
        if not 0 < self.default_timeout <= self.max_timeout:
            raise ValueError("CARAVAN_EXEC_DEFAULT_TIMEOUT must be positive and at most CARAVAN_EXEC_MAX_TIMEOUT")
        for name in ("max_output_bytes", "max_stdin_bytes", "max_user_execs", "max_connection_execs"):
            if getattr(self, name) < 1:
                raise ValueError(f"CARAVAN_EXEC_{name.upper()} must be positive, not {getattr(self, name)}")
        if self.activity_interval <= 0:
            raise ValueError("CARAVAN_EXEC_ACTIVITY_INTERVAL must be positive")


@dataclass(frozen=True)
class ExecTarget:
    """Where a command runs: the kernel's Nomad allocation (its task is ``nomad_jobs.meta.TASK_NAME``)."""

    session_id: str
    hostname: str
    alloc_id: str
    driver: Driver


def exec_target(viewer: User, session: Session | None, session_id: str, hostname: str) -> ExecTarget:
    """The kernel ``hostname`` of ``session`` (None: not found) if ``viewer`` may run commands in it now."""
    if session is None or not can_access(viewer, session.owner_id, session.project):
        raise NotFound(f"no session {session_id}", field="sessionId")
    kernel = next((k for k in session.kernels if k.hostname == hostname), None)
    if kernel is None:
        raise NotFound(f"session {session_id} has no kernel {hostname!r}", field="kernel")
    if session.driver is Driver.QEMU:
        raise ExecNotSupported(
            "a QEMU kernel is a virtual machine Nomad cannot exec into: reach it through its preopened ports",
            field="kernel",
        )
    if session.driver is Driver.RAW_EXEC and viewer.role is not Role.SUPERADMIN:
        raise ExecNotSupported(
            "a raw_exec kernel runs on the host itself: only a SUPERADMIN may run commands in it (and the gateway's "
            "Nomad token needs alloc-node-exec for that, which Caravan does not grant)",
            field="kernel",
        )
    if session.status is not SessionStatus.RUNNING or kernel.status is not SessionStatus.RUNNING or not kernel.alloc_id:
        raise SessionNotRunning(
            f"session {session_id} is {session.status.value} (kernel {hostname} {kernel.status.value}): commands run "
            "in RUNNING sessions only",
            field="sessionId",
            status=session.status.value,
        )
    return ExecTarget(session.id, hostname, kernel.alloc_id, session.driver)


def command_of(argv: Sequence[str] | None, shell: str | None) -> list[str]:
    """The argv to run: ``argv`` as given, or ``shell`` text as ``/bin/sh -c <text>``; exactly one of them."""
    if (argv is None) == (shell is None):
        raise InvalidInput("give the command as argv (a list) or as shell text, one of the two", field="argv")
    if shell is not None:
        if not shell.strip():
            raise InvalidInput("the shell text is empty", field="shell")
        if "\0" in shell:
            raise InvalidInput("shell text cannot hold a NUL character", field="shell")
        return [*SHELL, shell]
    assert argv is not None
    if not argv or not argv[0]:
        raise InvalidInput("argv needs at least the program to run", field="argv")
    if any("\0" in item for item in argv):
        raise InvalidInput("an argv item cannot hold a NUL character (a process's arguments end at one)", field="argv")
    return list(argv)


def timeout_of(seconds: float | None, limits: ExecLimits) -> float:
    """The command's timeout in seconds: ``seconds`` checked against the maximum, or the default."""
    if seconds is None:
        return limits.default_timeout
    if not 0 < seconds <= limits.max_timeout:
        raise InvalidInput(
            f"timeoutSeconds must be above 0 and at most {limits.max_timeout:g}",
            field="timeoutSeconds",
            max=limits.max_timeout,
        )
    return seconds


def stdin_of(data: bytes | None, limits: ExecLimits) -> bytes | None:
    if data is not None and len(data) > limits.max_stdin_bytes:
        raise InvalidInput(
            f"stdin is {len(data)} bytes, more than the {limits.max_stdin_bytes} one command takes",
            field="stdin",
            max=limits.max_stdin_bytes,
        )
    return data


@dataclass
class CappedOutput:
    """One stream's bytes, kept up to ``cap``; what comes after is counted and dropped."""

    cap: int
    data: bytearray
    dropped: int = 0
    """Bytes dropped past the cap."""

    @classmethod
    def of(cls, cap: int) -> CappedOutput:
        return cls(cap, bytearray())

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        self.data += chunk[: max(room, 0)]
        self.dropped += max(len(chunk) - max(room, 0), 0)

    @property
    def truncated(self) -> bool:
        return self.dropped > 0


@dataclass
class ActivityClock:
    """When a command's or terminal's traffic next counts as the session's activity: at most once per ``interval``
    seconds (monotonic clock passed in), not per byte."""

    interval: float
    last: float | None = None

    def due(self, now: float) -> bool:
        """Record now? (and if so, count it as recorded)."""
        if self.last is not None and now - self.last < self.interval:
            return False
        self.last = now
        return True
