"""Pooled network namespaces for real (root, Docker, nftables, the CNI plugins): isolated like a session's only kernel
until bound, bound to one session (its peers and its published ports), never bound again, gone when deleted."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from caravan.stack.session_network import SessionNetwork, release, session_network
from node_plugins.cni_isolation import TABLE, Membership, listed_ports, pool_key, session_key
from node_plugins.namespace_pool import Client, Pooled, PoolError, bind, delete, make

PAUSE_IMAGE = os.environ.get("CARAVAN_PAUSE_IMAGE", "")
PORT = 8888

pytestmark = pytest.mark.skipif(
    not PAUSE_IMAGE or os.geteuid() != 0, reason="needs root and the stack's pause image (ops/install)"
)

SERVE = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(sys.argv[3].encode())
    connection.close()
"""
ASK = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1) as connection:
        connection.settimeout(1)
        print(connection.recv(100).decode())
except OSError as exc:
    print("refused:", exc)
"""


class Pool:
    def __init__(self, network: SessionNetwork) -> None:
        self.network = network
        self.client = Client(network.conflist(), network.cni_path)
        self.made: list[Pooled] = []
        self.servers: list[subprocess.Popen[str]] = []

    def make(self) -> Pooled:
        pooled = make(self.client, PAUSE_IMAGE)
        self.made.append(pooled)
        return pooled

    def netns(self, pooled: Pooled) -> list[str]:
        pid = subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Pid}}", pooled.name], capture_output=True, text=True, check=True
        ).stdout.strip()
        return ["nsenter", f"--net=/proc/{pid}/ns/net"]

    def serve(self, where: list[str], address: str, port: int, answer: str) -> None:
        server = subprocess.Popen(
            [*where, sys.executable, "-c", SERVE, address, str(port), answer], stdout=subprocess.PIPE, text=True
        )
        self.servers.append(server)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"

    def ask(self, where: list[str], address: str, port: int) -> str:
        done = subprocess.run([*where, sys.executable, "-c", ASK, address, str(port)], capture_output=True, text=True)
        return done.stdout.strip()

    def close(self) -> None:
        for server in self.servers:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        for pooled in self.made:
            delete(self.client, pooled.name)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    network = session_network(tmp_path / "client", tmp_path / "members")
    made = Pool(network)
    try:
        yield made
    finally:
        made.close()
        release(network)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` different free ports (outside Nomad's dynamic range, as :func:`free_port`'s)."""
    found: set[int] = set()
    while len(found) < count:
        found.add(free_port())
    return sorted(found)


def mapping(host_port: int) -> dict[str, object]:
    return {"hostIP": "127.0.0.1", "hostPort": host_port, "containerPort": PORT, "protocol": "tcp"}


def test_a_pooled_namespace_is_alone_until_bound_then_in_its_session_only(pool: Pool) -> None:
    a, b, c = pool.make(), pool.make(), pool.make()
    members = Membership(pool.network.state_dir)
    assert {members.recall(p.name).session for p in (a, b, c)} == {pool_key(p.name) for p in (a, b, c)}  # type: ignore[union-attr]
    for pooled in (a, b, c):
        pool.serve(pool.netns(pooled), "0.0.0.0", PORT, f"hello from {pooled.name}")
    host_side = pool.network.subnet.rsplit(".", 1)[0] + ".1"
    pool.serve([], host_side, PORT, "the host")  # a host service on the session network's own address
    host_port = free_port()

    # unbound: no pooled namespace reaches another, nor the host; the host's published port leads nowhere
    assert pool.ask(pool.netns(b), a.address, PORT).startswith("refused")
    assert pool.ask(pool.netns(a), b.address, PORT).startswith("refused")
    assert pool.ask(pool.netns(a), host_side, PORT).startswith("refused")
    assert pool.ask([], "127.0.0.1", host_port).startswith("refused")

    bind(pool.client, a.name, "default", "cv-s1", [mapping(host_port)])
    assert members.recall(a.name).session == session_key({"NOMAD_JOB_ID": "cv-s1"})  # type: ignore[union-attr]
    assert pool.ask([], "127.0.0.1", host_port) == f"hello from {a.name}"  # the session's published port leads in
    bind(pool.client, b.name, "default", "cv-s2", [])
    bind(pool.client, c.name, "default", "cv-s1", [])
    # another session's namespace cannot reach it, nor it the other, nor the host; its own session's peer can
    assert pool.ask(pool.netns(b), a.address, PORT).startswith("refused")
    assert pool.ask(pool.netns(a), b.address, PORT).startswith("refused")
    assert pool.ask(pool.netns(a), host_side, PORT).startswith("refused")
    assert pool.ask(pool.netns(c), a.address, PORT) == f"hello from {a.name}"


def test_a_pooled_namespace_serves_one_session_and_is_gone_once_deleted(pool: Pool) -> None:
    a = pool.make()
    with pytest.raises(PoolError, match="not to the caravan-pool namespace"):
        bind(pool.client, a.name, "caravan-pool", "anything", [])
    first_port, host_port = free_ports(2)
    bind(pool.client, a.name, "default", "cv-s1", [mapping(first_port)])
    with pytest.raises(PoolError, match="never reused"):
        bind(pool.client, a.name, "default", "cv-s2", [])
    with pytest.raises(PoolError, match="never reused"):
        bind(pool.client, "caravan-pool-000000000000", "default", "cv-s2", [])
    pool.serve(pool.netns(a), "0.0.0.0", PORT, "still cv-s1")
    assert pool.ask([], "127.0.0.1", first_port) == "still cv-s1"
    # its session's replacement allocation (other host ports): bound again, its ports replace the first's
    bind(pool.client, a.name, "default", "cv-s1", [mapping(host_port)])
    assert published(a.address) == [f"127.0.0.1 . tcp . {host_port}"]
    assert pool.ask([], "127.0.0.1", host_port) == "still cv-s1"
    assert pool.ask([], "127.0.0.1", first_port).startswith("refused")
    assert Membership(pool.network.state_dir).recall(a.name).session == session_key({"NOMAD_JOB_ID": "cv-s1"})  # type: ignore[union-attr]

    delete(pool.client, a.name)
    assert Membership(pool.network.state_dir).recall(a.name) is None
    ports = subprocess.run(["nft", "list", "map", "ip", TABLE, "anyports"], capture_output=True, text=True).stdout
    ports += subprocess.run(["nft", "list", "map", "ip", TABLE, "hostports"], capture_output=True, text=True).stdout
    assert f"{a.address} . {PORT}" not in ports
    assert pool.ask([], "127.0.0.1", host_port).startswith("refused")
    with pytest.raises(PoolError, match="never reused"):
        bind(pool.client, a.name, "default", "cv-s1", [])  # deleted: not even to its own session
    delete(pool.client, a.name)  # idempotent


def published(address: str) -> list[str]:
    """The host ports (``hostports``' keys) that lead to ``address`` now."""
    listing = subprocess.run(["nft", "-j", "list", "table", "ip", TABLE], capture_output=True, text=True).stdout
    return [key for _, key, to in listed_ports(listing) if to == address]


def leave_stray_port(host_port: int, address: str) -> None:
    """An injected fault: a published port that no record names, as a DEL that never ran or lost records leave one
    (the plugin cannot be made to leave one on purpose)."""
    element = f"{{ 127.0.0.1 . tcp . {host_port} : {address} . {PORT} }}"
    subprocess.run(["nft", "add", "element", "ip", TABLE, "hostports", element], check=True)


def test_a_port_no_record_names_never_leads_into_a_namespace_nor_blocks_its_ports(pool: Pool) -> None:
    """Ports published for namespaces whose records were gone once stayed in the map after their namespaces were
    deleted (3 of 14 launches of bench/jupyter_launch), leading host ports to whichever kernel got that address next.
    Ports are now removed as nft lists them: those leading to an address handed out or given back, and a host port a
    namespace takes, whoever's it was."""
    network_prefix = pool.network.subnet.rsplit(".", 1)[0]
    ports = free_ports(40)
    for host in range(2, 40):
        leave_stray_port(ports.pop(), f"{network_prefix}.{host}")
    a = pool.make()
    assert published(a.address) == []  # made (ADD): the port left at its address is gone
    assert published(f"{network_prefix}.{1 + int(a.address.rsplit('.', 1)[1])}") != []  # the others are not

    stale, taken = ports.pop(), ports.pop()
    leave_stray_port(stale, a.address)
    leave_stray_port(taken, f"{network_prefix}.250")  # another's, no record names it: the bind takes it
    pool.serve(pool.netns(a), "0.0.0.0", PORT, "from a")
    bind(pool.client, a.name, "default", "cv-s1", [mapping(taken)])
    assert published(a.address) == [f"127.0.0.1 . tcp . {taken}"]
    assert pool.ask([], "127.0.0.1", taken) == "from a"
    assert published(f"{network_prefix}.250") == []

    leave_stray_port(stale, a.address)
    delete(pool.client, a.name)
    assert published(a.address) == []  # deleted (DEL): its own port and the one no record named
    release(pool.network)  # the client gone for good: nothing leads into its subnet any more
    listing = subprocess.run(["nft", "-j", "list", "table", "ip", TABLE], capture_output=True, text=True).stdout
    assert [to for _, _, to in listed_ports(listing) if to.startswith(f"{network_prefix}.")] == []
