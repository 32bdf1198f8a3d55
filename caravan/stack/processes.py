"""Starting real services as child processes and waiting for them by polling, never by sleeping blind."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class StartupFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(ready: Callable[[], bool], *, what: str, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except StartupFailed:
            raise
        except Exception:
            pass
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    tail = ""
    if log and log.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise StartupFailed(f"{what} was not ready after {timeout:.0f}s\n{tail}")


@dataclass
class Service:
    """A started child process, with its log file; stop() ends it and its children."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if not self.alive():
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def mounts_under(path: Path) -> list[Path]:
    """Mount points strictly below ``path`` in this process's mount namespace."""
    root = path.resolve()
    found = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            target = Path(_unescaped(line.split()[1]))
            if target.is_relative_to(root) and target != root:
                found.append(target)
    return found


def unmount(targets: Sequence[Path]) -> None:
    """Lazily unmount ``targets``, the deepest first (a mount inside another goes before it)."""
    for target in sorted(set(targets), key=lambda t: len(t.parts), reverse=True):
        subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)


def unmount_under(path: Path) -> None:
    """Lazily unmount what a stopped Nomad client left mounted (task dirs of exec allocations)."""
    unmount(mounts_under(path))


def _unescaped(field: str) -> str:
    """A /proc/mounts field with its octal escapes (``\\040`` for a space ...) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def spawn(
    name: str, argv: Sequence[str], log: Path, *, env: dict[str, str] | None = None, clean: bool = False
) -> Service:
    """Start ``argv`` in its own process group with output to ``log``; ``clean`` drops our environment."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out = log.open("ab")
    process = subprocess.Popen(
        list(argv),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**({} if clean else os.environ), **(env or {})},
        close_fds=True,
    )
    out.close()
    return Service(name=name, process=process, log=log)
