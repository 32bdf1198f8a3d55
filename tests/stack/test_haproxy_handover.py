"""A new HAProxy on a state directory where one serves already (the ingress job's upgrade: ``caravan ingress``) is
given the serving one's listening sockets (``caravan.stack.haproxy.start_haproxy``, HAProxy's ``-x``): both accept
from one socket, so the old one's soft stop resets no connection waiting to be accepted. Real HAProxy processes, a
real stream of new connections."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from caravan.stack.haproxy import Haproxy, ingress_config, start_haproxy
from caravan.stack.processes import StartupFailed, free_port, spawn
from core.settings import load_settings
from gateway.apps.ingress_config import SOCKET_PATH_MAX, IngressConfig, IngressPaths, write_files
from gateway.endpoints.ingress import activator_socket

ROUNDS = 8


@pytest.fixture
def state() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cvx-", dir="/tmp") as folder:  # a unix socket path: 107 bytes at most
        yield Path(folder)


class Gateway(BaseHTTPRequestHandler):
    """What HAProxy's gateway backend reaches here: 200 to every GET."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def wanted(state: Path) -> Iterator[IngressConfig]:
    """The configuration of a stack's HAProxy in front of a gateway (:class:`Gateway`)."""
    with ThreadingHTTPServer(("127.0.0.1", 0), Gateway) as gateway:
        threading.Thread(target=gateway.serve_forever, daemon=True).start()
        settings = load_settings({"CARAVAN_HOME": str(state / "home")})
        yield ingress_config(settings, free_port(), gateway.server_address[1])
        gateway.shutdown()


def listeners(port: int) -> int:
    """How many listening TCP sockets there are on 127.0.0.1:``port`` (``/proc/net/tcp``: state 0A)."""
    local = f"0100007F:{port:04X}"
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in rows if row.split()[1] == local and row.split()[3] == "0A")


class NewConnections:
    """Four threads opening a connection per request (GET /healthz) until stopped, and what failed: refused, reset
    or another answer than 200."""

    def __init__(self, port: int) -> None:
        self.port, self.sent, self.failures = port, 0, list[str]()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run) for _ in range(4)]

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as client:
                    client.sendall(b"GET /healthz HTTP/1.0\r\nHost: caravan\r\n\r\n")
                    head = client.recv(64)
                    while client.recv(4096):
                        pass
                if head[:9] not in (b"HTTP/1.0 ", b"HTTP/1.1 ") or head[9:13] != b"200 ":
                    self.failures.append(f"no HTTP answer: {head!r}")
            except OSError as failed:
                self.failures.append(repr(failed))
            self.sent += 1

    def __enter__(self) -> NewConnections:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()


@pytest.fixture
def start(state: Path, wanted: IngressConfig) -> Iterator[Callable[[], Haproxy]]:
    """``start_haproxy`` on ``wanted`` in ``state``/haproxy; every HAProxy started is stopped at the end."""
    started: list[Haproxy] = []

    def one() -> Haproxy:
        started.append(start_haproxy(wanted, state / "haproxy", log=state / "haproxy.log"))
        return started[-1]

    yield one
    for haproxy in started:
        haproxy.stop()


def soft_stopped(haproxy: Haproxy) -> None:
    haproxy.process.send_signal(signal.SIGUSR1)
    assert haproxy.process.wait(10) == 0


def test_each_new_haproxy_takes_the_listeners_over_and_no_connection_is_reset(
    state: Path, wanted: IngressConfig, start: Callable[[], Haproxy]
) -> None:
    paths = IngressPaths(state / "haproxy")
    serving = start()
    with NewConnections(wanted.port) as stream:
        for _ in range(ROUNDS):
            assert listeners(wanted.port) == 1
            before = stream.sent
            new = start()
            # the two HAProxies share one listening socket; the runtime API's link is the new one's
            assert listeners(wanted.port) == 1
            assert paths.socket.resolve() == new.runtime and new.runtime != serving.runtime
            old, serving = serving, new
            soft_stopped(old)
            while stream.sent < before + 50:
                time.sleep(0.01)
        assert listeners(wanted.port) == 1
    assert stream.failures == [], f"{len(stream.failures)} of {stream.sent}: {stream.failures[:3]}"
    # each ended HAProxy's runtime socket was cleared by the next start but one: two are left at most
    assert paths.own_sockets() == sorted({old.runtime, serving.runtime})


def test_a_haproxy_that_does_not_hand_its_listeners_over_is_bound_beside(
    state: Path, wanted: IngressConfig, start: Callable[[], Haproxy]
) -> None:
    """A HAProxy of a release before the handover (no ``expose-fd listeners``): the new one binds its own socket
    beside it (``SO_REUSEPORT``), as before, and starts."""
    paths = IngressPaths(state / "haproxy")
    own = paths.own_socket("older")
    write_files(wanted, paths, own)
    text = paths.config.read_text()
    paths.config.write_text(text.replace(" expose-fd listeners", ""))
    older = spawn("haproxy", ["haproxy", "-db", "-f", str(paths.config)], state / "older.log")
    try:
        while not own.exists():
            assert older.alive()
        os.symlink(own.name, paths.socket)
        new = start()
        assert listeners(wanted.port) == 2
        assert paths.socket.resolve() == new.runtime
    finally:
        older.stop()


def test_a_link_to_an_ended_haproxy_is_no_handover(
    state: Path, wanted: IngressConfig, start: Callable[[], Haproxy]
) -> None:
    """HAProxy killed (-9): its socket file and the link to it are left; the next start binds afresh and clears
    the dead socket."""
    paths = IngressPaths(state / "haproxy")
    first = start()
    first.process.kill()
    first.process.wait(10)
    assert first.runtime.exists() and paths.socket.resolve() == first.runtime
    second = start()
    assert paths.own_sockets() == [second.runtime] and paths.socket.resolve() == second.runtime
    assert listeners(wanted.port) == 1


def test_a_haproxys_runtime_socket_is_no_longer_than_the_link_to_it(
    state: Path, wanted: IngressConfig, start: Callable[[], Haproxy]
) -> None:
    """HAProxy binds a unix socket path of at most 97 bytes: its own socket's path is as long as ``admin.sock``'s,
    which a stack's state directory was chosen to fit, and a state directory too long for it is refused up front."""
    haproxy = start()
    paths = IngressPaths(state / "haproxy")
    assert len(bytes(haproxy.runtime)) == len(bytes(paths.socket))
    deep = state / ("d" * (SOCKET_PATH_MAX - len(bytes(state / "api-abcdef"))))
    assert len(bytes(deep / "api-abcdef")) == SOCKET_PATH_MAX + 1
    with pytest.raises(StartupFailed, match="at most 97: give it a shorter state directory"):
        start_haproxy(wanted, deep, log=state / "deep.log")
    # the activator's socket, which HAProxy connects to, is the longest: a directory where only it is too long is
    # refused too (before, HAProxy exited at start on it, "socket path too long": found with the suite's workers)
    deep = state / ("d" * (SOCKET_PATH_MAX - len(bytes(state / "activator.sock"))))
    assert len(bytes(activator_socket(deep))) == SOCKET_PATH_MAX + 1
    assert len(bytes(deep / "api-abcdef")) < SOCKET_PATH_MAX
    with pytest.raises(StartupFailed, match="activator.sock would be 98 bytes long"):
        start_haproxy(wanted, deep, log=state / "deep.log")
