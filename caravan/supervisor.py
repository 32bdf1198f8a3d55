"""``caravan dev``: the gateway, the scheduler and the idle checker, each in a process of its own, supervised.

As in production, each service runs as its own ``caravan <role>`` process, with its own event loop and its own
Redis and Nomad connection pools: a gateway busy with heavy queries cannot delay the scheduler's or the idle
checker's lease renewals. The supervisor:

- restarts a child that dies (after :func:`restart_delay`, growing while it keeps dying soon after its start);
- exits with 2 when a child exits with 2 (its configuration was refused, see ``caravan.cli``): restarting it would
  only be refused again; the other children are stopped first;
- on SIGTERM or SIGINT stops every child (SIGTERM, then SIGKILL after :data:`STOP_GRACE` seconds) and exits 0;
- forwards SIGHUP to the idle checker (which reloads its policy file on it);
- takes its children with it even when it is SIGKILLed: each asks the kernel for SIGKILL when its parent dies
  (Linux ``PR_SET_PDEATHSIG``), as the gateway's uvicorn workers do.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

ROLES = ("gateway", "scheduler", "idle")
REFUSED = 2
"""Exit status of a ``caravan`` command whose configuration was refused."""
QUICK = 10.0
"""Seconds: a child that dies sooner after its start died quickly (its restarts back off)."""
FIRST_DELAY = 0.5
"""Seconds before the first restart of a child."""
MAX_DELAY = 30.0
"""Seconds between restarts at most, however often a child dies."""
MAX_DOUBLINGS = 32
"""Times the delay doubles at most (FIRST_DELAY * 2**32 is far past MAX_DELAY): a child dying for days stays finite."""
STOP_GRACE = 10.0
"""Seconds a child has to stop after SIGTERM before it is killed."""
PR_SET_PDEATHSIG = 1
SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
"""What the supervisor waits for (blocked, and taken with sigtimedwait: no handler runs between two checks)."""


def restart_delay(quick_deaths: int) -> float:
    """Seconds before restarting a child that died quickly ``quick_deaths`` times in a row (0: it had run a while)."""
    doublings = min(max(0, quick_deaths - 1), MAX_DOUBLINGS)  # past MAX_DELAY anyway; 2.0 ** 1024 overflows
    return min(MAX_DELAY, FIRST_DELAY * 2.0**doublings)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exit at once if ``parent`` is already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it died before we asked
            os._exit(1)


@dataclass
class Child:
    role: str
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    """When it was last started (monotonic seconds)."""
    quick_deaths: int = 0
    """Deaths in a row, each sooner than QUICK seconds after its start."""
    restart_at: float | None = None
    """When to start it again (monotonic seconds), while it is dead."""


@dataclass
class Supervisor:
    argv: Callable[[str], Sequence[str]]
    """The command of a role's process."""
    env: Mapping[str, str]
    roles: Sequence[str] = ROLES
    clock: Callable[[], float] = time.monotonic
    children: dict[str, Child] = field(default_factory=dict)

    def run(self) -> int:
        """Start every role and supervise until told to stop (0) or a child's configuration is refused (2)."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            for role in self.roles:
                self.children[role] = Child(role)
                self._start(self.children[role])
            while True:
                received = signal.sigtimedwait(SIGNALS, self._wait())
                if received is not None and received.si_signo in (signal.SIGTERM, signal.SIGINT):
                    log.info("stopping on %s", signal.Signals(received.si_signo).name)
                    self._stop_all()
                    return 0
                if received is not None and received.si_signo == signal.SIGHUP:
                    self._forward(signal.SIGHUP, "idle")
                if (refused := self._reap()) is not None:
                    log.error("the %s's configuration was refused; stopping", refused)
                    self._stop_all()
                    return REFUSED
                for child in self.children.values():
                    if child.restart_at is not None and self.clock() >= child.restart_at:
                        self._start(child)
        finally:
            self._stop_all()
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _start(self, child: Child) -> None:
        parent = os.getpid()

        def prepare() -> None:  # in the child, before exec
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            die_with_parent(parent)

        child.process = subprocess.Popen(
            list(self.argv(child.role)), env=dict(self.env), preexec_fn=prepare, stdin=subprocess.DEVNULL
        )
        child.started, child.restart_at = self.clock(), None
        log.info("%s started (pid %d)", child.role, child.process.pid)

    def _reap(self) -> str | None:
        """Note the children that died and when to restart each; the role of one refused, if any."""
        for child in self.children.values():
            if child.process is None or child.restart_at is not None:
                continue
            status = child.process.poll()
            if status is None:
                continue
            if status == REFUSED:
                return child.role
            now = self.clock()
            child.quick_deaths = child.quick_deaths + 1 if now - child.started < QUICK else 0
            child.restart_at = now + restart_delay(child.quick_deaths)
            log.warning(
                "%s (pid %d) exited with %s; restarting it in %.1f s",
                child.role,
                child.process.pid,
                status,
                child.restart_at - now,
            )
        return None

    def _wait(self) -> float:
        """Seconds to wait for a signal: until the next restart is due, at most a second (a missed SIGCHLD)."""
        due = [c.restart_at - self.clock() for c in self.children.values() if c.restart_at is not None]
        return max(0.01, min([1.0, *due]))

    def _forward(self, signum: signal.Signals, role: str) -> None:
        child = self.children.get(role)
        if child is not None and child.process is not None and child.process.poll() is None:
            child.process.send_signal(signum)

    def _stop_all(self) -> None:
        running = [c.process for c in self.children.values() if c.process is not None and c.process.poll() is None]
        for process in running:
            process.terminate()
        deadline = self.clock() + STOP_GRACE
        for process in running:
            try:
                process.wait(max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
