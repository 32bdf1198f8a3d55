"""Is a port the stack needs free on 127.0.0.1, and if not, who holds it.

A second stack started from another checkout must not attach to the first one's services (and, say, write its
bootstrap token into the first one's Redis): ``caravan stack up`` checks every port first and names what is in the
way, read from ``/proc`` (``/proc/net/{tcp,tcp6,udp,udp6}`` for the socket, ``/proc/<pid>/fd`` for its owner).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

TCP_LISTEN = "0A"


@dataclass(frozen=True)
class PortNeed:
    port: int
    purpose: str
    """What the stack wants the port for ("Redis", "Nomad HTTP API", ...)."""
    udp: bool = False
    """Also needed as a UDP port (Nomad's Serf gossip)."""


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    """Its command line, arguments separated by spaces."""


@dataclass(frozen=True)
class TakenPort:
    need: PortNeed
    protocol: str
    holders: list[Holder] = field(default_factory=list)

    def describe(self) -> str:
        held = ", ".join(f"pid {h.pid} ({h.command})" for h in self.holders) or "a process not visible from here"
        return f"{self.protocol} port {self.need.port} (for {self.need.purpose}) is taken by {held}"


def taken(needs: Iterable[PortNeed]) -> list[TakenPort]:
    """The needed ports that cannot be bound on 127.0.0.1, each with the processes holding it."""
    found = []
    for need in needs:
        for protocol in ("tcp", "udp") if need.udp else ("tcp",):
            if not _bindable(need.port, protocol):
                found.append(TakenPort(need, protocol, holders(need.port, protocol)))
    return found


def _bindable(port: int, protocol: str) -> bool:
    kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no owner
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def holders(port: int, protocol: str) -> list[Holder]:
    """Processes with a socket bound to ``port`` (listening, for TCP), from ``/proc``."""
    inodes = _socket_inodes(port, protocol)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                        found.append(Holder(int(proc.name), command.strip()))
                        break
    return sorted(found, key=lambda h: h.pid)


def _socket_inodes(port: int, protocol: str) -> set[str]:
    inodes = set()
    for table in (f"/proc/net/{protocol}", f"/proc/net/{protocol}6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines, None)  # header
            for line in lines:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and (protocol == "udp" or fields[3] == TCP_LISTEN):
                    inodes.add(fields[9])
    return inodes
