"""A second ``caravan stack up`` (another checkout, another state directory) must not attach to the first one's
services: a taken port stops it before anything is started or written, naming the port, its use and its holder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from caravan.stack.dev_stack import check_ports
from caravan.stack.ports import PortNeed, holders, taken
from caravan.stack.processes import free_port
from core.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def listener() -> Iterator[int]:
    """A real TCP listener on a loopback port, held by this test process."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


def free_run(length: int) -> int:
    """The first of ``length`` consecutive free loopback ports (Nomad takes its HTTP port and the next two)."""
    while True:
        first = free_port()
        if not taken(PortNeed(first + n, "probe", udp=True) for n in range(length)):
            return first


def stack_env(home: Path, redis_port: int) -> dict[str, str]:
    return {
        "CARAVAN_HOME": str(home),
        "CARAVAN_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "CARAVAN_NOMAD_ADDR": f"http://127.0.0.1:{free_run(3)}",
        "CARAVAN_GATEWAY_PORT": str(free_port()),
        "CARAVAN_GATEWAY_BACKEND_PORT": str(free_port()),
    }


def test_a_listening_port_is_named_with_its_holder(listener: int) -> None:
    [found] = taken([PortNeed(listener, "Redis"), PortNeed(free_port(), "the Caravan gateway")])
    assert found.need.port == listener and found.protocol == "tcp"
    assert [h.pid for h in found.holders] == [os.getpid()]
    described = found.describe()
    assert f"tcp port {listener} (for Redis)" in described and f"pid {os.getpid()} (" in described
    assert sys.executable.rsplit("/", 1)[-1] in described or "python" in described


def udp_only() -> socket.socket:
    """A UDP socket bound on a port that is free in TCP (a random UDP port may be some other process' TCP one: seen
    once with the machine busy)."""
    for _ in range(50):
        gossip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        gossip.bind(("127.0.0.1", 0))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", gossip.getsockname()[1]))
                return gossip
            except OSError:
                gossip.close()
    raise AssertionError("no UDP port free in TCP as well")


def test_a_udp_port_is_checked_when_needed() -> None:
    with udp_only() as gossip:
        port = int(gossip.getsockname()[1])
        assert taken([PortNeed(port, "Nomad Serf")]) == []  # TCP only: free
        [found] = taken([PortNeed(port, "Nomad Serf", udp=True)])
        assert found.protocol == "udp" and [h.pid for h in holders(port, "udp")] == [os.getpid()]


def test_the_stack_reports_every_port_in_the_way(listener: int, tmp_path: Path) -> None:
    settings = load_settings(stack_env(tmp_path, listener))
    [line] = check_ports(settings)
    assert f"port {listener} (for Redis)" in line and f"pid {os.getpid()}" in line


def test_stack_up_stops_before_changing_anything(listener: int, tmp_path: Path) -> None:
    home = tmp_path / "second"
    env = {**os.environ, **stack_env(home, listener), "CARAVAN_NOMAD_HOME": "/nonexistent", "CARAVAN_ROOTFS": "/"}
    result = subprocess.run(
        [sys.executable, "-m", "caravan.cli", "stack", "up"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"port {listener} (for Redis) is taken by pid {os.getpid()}" in result.stderr
    assert "nothing started" in result.stderr
    assert not home.exists() or not any(home.iterdir())  # no secrets, no pidfiles, no logs
