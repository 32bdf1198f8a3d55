"""A multi-host Nomad cluster on one machine: each host a network namespace of its own, three servers in Raft.

Topology (every name starts with :data:`PREFIX`; every address is in ``session_network.HOST_NETWORK``,
172.26.255.0/24, which the session subnet allocator never hands out):

- ``cvmh-link``: a namespace holding the hosts' link, the bridge ``cvmh0`` (in a namespace of its own so that the
  machine's own firewall, Docker's ``FORWARD`` policy through ``br_netfilter`` say, never sees the hosts' traffic);
- ``cvmh-srv1..3`` (172.26.255.2-4): a Nomad server each, ``bootstrap_expect = 3``: a real Raft quorum;
- a namespace per host, named as its node (``cvmh-host1``…; 172.26.255.11…): a Nomad client each, on its own
  address with Nomad's default ports, with its own session network (a bridge and a /24 reserved machine-wide like
  every client's, its own isolation rule set and membership directory) advertised in its node meta, and its own
  ``session-peers`` daemon (``nomad_jobs.session_peers``: routes to the other hosts' subnets and the cross-host pairs
  of each session, from Nomad, with a read-only token; routed over the link, or through VXLAN:
  :meth:`MultiHostCluster.set_overlay`); its kernels' ports published on its own address for the data plane alone,
  and, with ``pause_image``, the docker driver on the machine's one Docker daemon;
- the machine itself reaches the link as 172.26.255.1 (``cvmh-root``): the tests' Caravan talks to the first server.

Processes enter a namespace with ``nsenter --net`` (not ``ip netns exec``, which would also give them a mount namespace
of their own: Nomad's allocation mounts and namespaces must stay visible to the machine, as for every other client).

Cleaning up: :meth:`MultiHostCluster.stop` stops every process, deletes every namespace (their veths, bridges and
nftables rule sets go with them), frees the hosts' subnets and removes the records under :data:`RECORDS`. A killed
test run is swept at the next start (:func:`sweep`): its processes (found by network namespace), its namespaces,
the allocation namespaces left with an address in its subnets (and their kernels), its mounts and its reservations.
One such cluster runs on a machine at a time; the records name the process that owns it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from caravan.stack.nomad_acl import session_peers_token
from caravan.stack.nomad_agent import CLEAN_ENV, drain
from caravan.stack.nomad_cluster import (
    COMMON_CONFIG,
    ClientHost,
    ClientSpec,
    NomadCluster,
    _binary,
    _clients_ready,
    _start_client,
    _wait_server,
)
from caravan.stack.processes import Service, StartupFailed, spawn, unmount_under, wait_until
from caravan.stack.session_network import (
    HOST_NETWORK,
    MEMBERSHIP_DIR,
    SESSION_SUPERNET,
    SessionNetwork,
    recorded_network,
    session_network,
    unreserve,
)
from nomad_jobs.session_peers import ADDRESS_META, ROUTED, SUBNET_META, VXLAN_OVERHEAD

PREFIX = "cvmh"
"""Every namespace (``cvmh-…``) and interface of the cluster on the machine's side."""
LINK_NAMESPACE = f"{PREFIX}-link"
LINK_BRIDGE = f"{PREFIX}0"
ROOT_VETH = f"{PREFIX}-root"
INTERFACE = "eth0"
"""Each host's and server's interface on the link, inside its namespace."""
ROOT_ADDRESS = str(HOST_NETWORK[1])
SESSION_MTU = 1500 - VXLAN_OVERHEAD
"""The hosts' session networks' MTU: room for the VXLAN header, so the overlay can be switched either way
(:meth:`MultiHostCluster.set_overlay`) with the kernels running."""
SERVERS = 3
RECORDS = MEMBERSHIP_DIR / "multihost"
"""``owner`` (the pid of the process that runs the cluster), ``clients`` (the client directories, whose subnets are
reserved), ``hosts/<name>/`` (each host's membership directory)."""
PROJECT = Path(__file__).resolve().parents[2]

SERVER_CONFIG = """\
server {{
  enabled          = true
  bootstrap_expect = {expect}
  server_join {{
    retry_join     = [{peers}]
    retry_interval = "1s"
  }}
}}
client {{
  enabled = false
}}
"""


def server_address(index: int) -> str:
    return str(HOST_NETWORK[2 + index])


def host_address(index: int) -> str:
    return str(HOST_NETWORK[11 + index])


def enter(namespace: str) -> tuple[str, ...]:
    return ("nsenter", f"--net=/run/netns/{namespace}", "--")


@dataclass
class NetHost:
    name: str
    namespace: str
    address: str
    network: SessionNetwork
    members_dir: Path
    """The host's isolation plugin ``stateDir``."""
    peers: Service | None = None
    """Its session-peers daemon."""


@dataclass
class MultiHostCluster(NomadCluster):
    servers: list[Service] = field(default_factory=list)
    hosts: dict[str, NetHost] = field(default_factory=dict)
    pause_image: str | None = None
    """The hosts' docker driver's infra container image (None: no docker driver)."""
    peers_token: Path | None = None
    """The session-peers daemons' read-only Nomad token (a file)."""
    overlay: str = ROUTED
    """Between the hosts: routed subnets or VXLAN (``nomad_jobs.session_peers``)."""

    @property
    def server_addrs(self) -> list[str]:
        return [f"http://{server_address(i)}:4646" for i in range(len(self.servers))]

    def in_host(self, name: str, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in host ``name``'s namespace (the tests look at its routes and rules)."""
        return subprocess.run([*enter(self.hosts[name].namespace), *argv], capture_output=True, text=True)

    def set_overlay(self, overlay: str) -> None:
        """Restart every host's session-peers daemon with ``overlay`` (it replaces the other's routes and device)."""
        assert self.peers_token is not None
        for host in self.hosts.values():
            if host.peers:
                host.peers.stop()
            host.peers = _start_peers(self.state_dir, host, self.peers_token, overlay)
        self.overlay = overlay

    def stop(self, drain_timeout: float = 20.0) -> None:
        if self.clients and any(s.alive() for s in self.servers):
            with contextlib.suppress(Exception):
                drain(self.addr, self.state_dir, drain_timeout, token=self.token)
        for host in self.hosts.values():
            if host.peers:
                host.peers.stop()
        for service in [*self.clients.values(), *self.servers]:
            service.stop()
        sweep(own=True)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise StartupFailed(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _namespaces() -> list[str]:
    listed = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [str(n["name"]) for n in json.loads(listed or "[]")]


def _owner_alive() -> int | None:
    """The pid of another live process that owns the cluster's records, if any."""
    try:
        pid = int((RECORDS / "owner").read_text())
    except (OSError, ValueError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _recorded_clients() -> list[Path]:
    path = RECORDS / "clients"
    return [Path(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def sweep(*, own: bool = False) -> None:
    """Remove whatever a cluster of :data:`PREFIX` left: what a killed run left (``own=False``: refused while the
    cluster's owner lives), or this process's own cluster (``own=True``, its processes stopped already)."""
    if not own and (pid := _owner_alive()) is not None:
        raise StartupFailed(f"a multi-host test cluster already runs on this machine (owned by pid {pid})")
    ours = [n for n in _namespaces() if n.startswith(f"{PREFIX}-")]
    for namespace in ours:  # the agents, clients, servers and task executors of a killed run
        _kill_members(namespace)
    _remove_containers(_recorded_clients())
    networks = [n for n in map(recorded_network, _recorded_clients()) if n is not None]
    _delete_allocation_namespaces([ipaddress.IPv4Network(n.subnet) for n in networks])
    for namespace in ours:
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
    subprocess.run(["ip", "link", "delete", ROOT_VETH], capture_output=True, check=False)
    for client_dir in _recorded_clients():
        unmount_under(client_dir)
    for network in networks:
        unreserve(network)
    shutil.rmtree(RECORDS, ignore_errors=True)


def _kill_members(namespace: str) -> None:
    """Kill every process in the named network namespace."""
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    for member in listed.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(member), signal.SIGKILL)


ALLOC_LABEL = "com.hashicorp.nomad.alloc_id"


def _remove_containers(client_dirs: list[Path]) -> None:
    """The docker kernels (and their pause containers) of the clients' allocations: a killed client leaves them
    running in the machine's Docker daemon, which no namespace holds. Found by allocation id (Nomad's label, and its
    names ``<task>-<alloc id>``, ``nomad_init_<alloc id>``), among the allocation directories the clients made."""
    directories = [client_dir / "alloc" for client_dir in client_dirs]
    allocations = {entry.name for directory in directories if directory.is_dir() for entry in directory.iterdir()}
    if not allocations or shutil.which("docker") is None:
        return
    listed = subprocess.run(
        ["docker", "ps", "-a", "--format", f'{{{{.ID}}}} {{{{.Names}}}} {{{{.Label "{ALLOC_LABEL}"}}}}'],
        capture_output=True,
        text=True,
    ).stdout
    ours = []
    for line in listed.splitlines():
        container, name, *label = [*line.split(), ""]
        if label[0] in allocations or any(name.endswith(allocation) for allocation in allocations):
            ours.append(container)
    if ours:
        subprocess.run(["docker", "rm", "-f", *ours], capture_output=True, check=False)


def _delete_allocation_namespaces(subnets: list[ipaddress.IPv4Network]) -> None:
    """Nomad's namespaces of allocations a killed client never tore down: those with an address in ``subnets``."""
    if not subnets:
        return
    for namespace in _namespaces():
        if namespace.startswith(f"{PREFIX}-"):
            continue
        shown = subprocess.run(["ip", "-n", namespace, "-j", "-4", "addr"], capture_output=True, text=True)
        addresses = [
            ipaddress.IPv4Address(a["local"])
            for link in json.loads(shown.stdout or "[]")
            for a in link.get("addr_info", [])
        ]
        if any(address in subnet for address in addresses for subnet in subnets):
            _kill_members(namespace)  # the kernel
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)


def _link(namespace: str, port: str, address: str) -> None:
    """A namespace on the hosts' link: a veth pair, one end (``port``) on the link's bridge, the other its
    :data:`INTERFACE` with ``address``."""
    _ip("netns", "add", namespace)
    _ip("-n", LINK_NAMESPACE, "link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns", namespace)
    _ip("-n", LINK_NAMESPACE, "link", "set", port, "master", LINK_BRIDGE, "up")
    _ip("-n", namespace, "addr", "add", f"{address}/{HOST_NETWORK.prefixlen}", "dev", INTERFACE)
    _ip("-n", namespace, "link", "set", INTERFACE, "up")
    _ip("-n", namespace, "link", "set", "lo", "up")


def _make_link() -> None:
    _ip("netns", "add", LINK_NAMESPACE)
    _ip("-n", LINK_NAMESPACE, "link", "add", LINK_BRIDGE, "type", "bridge")
    _ip("-n", LINK_NAMESPACE, "link", "set", LINK_BRIDGE, "up")
    _ip("link", "add", ROOT_VETH, "type", "veth", "peer", "name", "root", "netns", LINK_NAMESPACE)
    _ip("-n", LINK_NAMESPACE, "link", "set", "root", "master", LINK_BRIDGE, "up")
    _ip("addr", "add", f"{ROOT_ADDRESS}/{HOST_NETWORK.prefixlen}", "dev", ROOT_VETH)
    _ip("link", "set", ROOT_VETH, "up")


def start_multihost_cluster(
    state_dir: Path,
    *,
    nomad_home: Path,
    rootfs: Path,
    hosts: Sequence[ClientSpec],
    want_drivers: tuple[str, ...] = ("raw_exec",),
    timeout: float = 180.0,
    secrets_dir: Path | None = None,
    namespace: str = "default",
    pause_image: str | None = None,
    data_plane: tuple[str, ...] = (ROOT_ADDRESS,),
) -> MultiHostCluster:
    """Sweep, then build the link, :data:`SERVERS` servers and one host per ``hosts`` spec (the spec's name is the
    host's namespace and its node's name: ``cvmh-host1``…). ``pause_image``: the hosts run the docker driver too
    (the machine's one Docker daemon, shared by every host), with this infra container image. ``data_plane``: the
    only addresses beyond a host that reach its kernels' published ports (the tests' gateway and HAProxy run on the
    machine, :data:`ROOT_ADDRESS`); each host publishes them on its own address."""
    sweep()
    RECORDS.mkdir(parents=True, exist_ok=True, mode=0o700)
    (RECORDS / "owner").write_text(str(os.getpid()))
    binary = _binary(nomad_home)
    state_dir.mkdir(parents=True, exist_ok=True)
    cluster = MultiHostCluster(
        addr=f"http://{server_address(0)}:4646",
        server=None,  # type: ignore[arg-type]  # set to the first server below
        state_dir=state_dir,
        secrets_dir=secrets_dir,
        namespace=namespace,
        allow_raw_exec="raw_exec" in want_drivers,
        pause_image=pause_image,
    )
    try:
        _make_link()
        for i in range(SERVERS):
            _link(f"{PREFIX}-srv{i + 1}", f"srv{i + 1}", server_address(i))
            cluster.servers.append(_start_server(binary, state_dir, i))
        cluster.server = cluster.servers[0]
        _wait_server(cluster, timeout)
        for i, spec in enumerate(hosts):
            host = _make_host(state_dir, spec.name, i, data_plane)
            cluster.hosts[spec.name] = host
            cluster.networks[spec.name] = host.network
            cluster.device_dirs[spec.name] = state_dir / spec.name / "devices"
            _start_host_client(cluster, spec, binary, nomad_home, rootfs)
        assert cluster.token is not None
        token_file = (secrets_dir or state_dir / "secrets") / "nomad-session-peers.token"
        session_peers_token(cluster.addr, cluster.token, token_file)
        cluster.peers_token = token_file
        for host in cluster.hosts.values():
            host.peers = _start_peers(state_dir, host, token_file, ROUTED)
        wait_until(
            lambda: _clients_ready(cluster, hosts, want_drivers),
            what="the hosts' Nomad clients",
            timeout=timeout,
            log=state_dir / f"{hosts[-1].name}.log" if hosts else None,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def restart_client(cluster: MultiHostCluster, spec: ClientSpec, *, nomad_home: Path, rootfs: Path) -> None:
    """Start host ``spec.name``'s Nomad client again (after it was killed): same address, state and session network,
    so it reattaches to the tasks it left running."""
    _start_host_client(cluster, spec, _binary(nomad_home), nomad_home, rootfs)


def _start_host_client(
    cluster: MultiHostCluster, spec: ClientSpec, binary: Path, nomad_home: Path, rootfs: Path
) -> None:
    """Host ``spec.name``'s Nomad client, in its namespace, joined to the three servers."""
    host = cluster.hosts[spec.name]
    servers = [f"{server_address(i)}:4647" for i in range(SERVERS)]
    cluster.clients[spec.name] = _start_client(
        binary,
        cluster.state_dir,
        spec,
        servers,
        nomad_home,
        rootfs,
        host.network,
        host=_placed(host),
        pause_image=cluster.pause_image,
    )


def _placed(host: NetHost) -> ClientHost:
    return ClientHost(
        address=host.address,
        interface=INTERFACE,
        enter=enter(host.namespace),
        meta=((SUBNET_META, host.network.subnet), (ADDRESS_META, host.address)),
    )


def _start_server(binary: Path, state_dir: Path, index: int) -> Service:
    name = f"srv{index + 1}"
    address = server_address(index)
    peers = ", ".join(f'"{server_address(i)}"' for i in range(SERVERS) if i != index)
    config = COMMON_CONFIG.format(
        name=f"{PREFIX}-{name}", address=address, data_dir=state_dir / name, http=4646, rpc=4647, serf=4648
    ) + SERVER_CONFIG.format(expect=SERVERS, peers=peers)
    path = state_dir / f"{name}.hcl"
    path.write_text(config)
    argv = [*enter(f"{PREFIX}-{name}"), str(binary), "agent", f"-config={path}"]
    return spawn(f"nomad-{name}", argv, state_dir / f"{name}.log", env=CLEAN_ENV, clean=True)


def _make_host(state_dir: Path, name: str, index: int, data_plane: tuple[str, ...]) -> NetHost:
    if not name.startswith(f"{PREFIX}-"):
        raise ValueError(f"a host's name starts with {PREFIX}- (its namespace is named after it)")
    namespace = name
    address = host_address(index)
    _link(namespace, f"host{index + 1}", address)
    subprocess.run([*enter(namespace), "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    members = RECORDS / "hosts" / name
    client_dir = state_dir / name
    with open(RECORDS / "clients", "a") as records:  # before the reservation: a killed run's is found again
        records.write(f"{client_dir.resolve()}\n")
    network = session_network(client_dir, members, host_address=address, data_plane=data_plane, mtu=SESSION_MTU)
    return NetHost(name, namespace, address, network, members)


def _start_peers(state_dir: Path, host: NetHost, token_file: Path, overlay: str) -> Service:
    argv = [
        *enter(host.namespace),
        sys.executable,
        "-m",
        "nomad_jobs.session_peers",
        f"--nomad-addr=http://{host.address}:4646",
        f"--token-file={token_file}",
        f"--node-name={host.name}",
        f"--state-dir={host.members_dir}",
        f"--supernet={SESSION_SUPERNET}",
        f"--overlay={overlay}",
    ]
    env = {**CLEAN_ENV, "PYTHONPATH": str(PROJECT)}
    return spawn(f"session-peers-{host.name}", argv, state_dir / f"{host.name}-peers.log", env=env, clean=True)
