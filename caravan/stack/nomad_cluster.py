"""A small real Nomad cluster on one machine: one server and N client agents with different capacities.

Each client gets its own name, data directory, ports and cgroup parent, advertises a capacity of its own
(``cpu_total_compute`` MHz, ``memory_total_mb``), joins a node pool, and optionally offers simulated accelerators
through Caravan's device plugin (:mod:`node_plugins.devices.sim`; whole devices or shares, a model of its own).
Used by the tests that check where the scheduler puts sessions; everything listens on 127.0.0.1.

ACLs are on in the server and every client (:mod:`caravan.stack.nomad_acl`): the server is bootstrapped with
Caravan's secret as soon as it has a leader, and given Caravan's policies and tokens. Readiness is polled: the server
has a leader and an initialized keyring (clients registering earlier are refused and back off for many seconds), then
every client's node is ready with its drivers healthy and its devices seen.

:func:`start_nomad_single_node` starts one agent that is both server (``bootstrap_expect = 1``) and client, with
the dev agent's client configuration but its state on disk (a ``-dev`` agent keeps it in memory): killed and
restarted on the same ports and data directory it comes back with its jobs, its node id and its running tasks.
Its client may ask to register before its own server has a keyring: refused, it would ask again 15-30 s later, so
the agent is started again at once (:func:`_registration_refused`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from caravan.stack.device_plugin import DEFAULT_DEVICES, SimDevices, plugin_block, plugin_dir
from caravan.stack.nomad_acl import PLATFORM_NAMESPACE, lock_down
from caravan.stack.nomad_agent import CLEAN_ENV, _get, cgroup_parent, docker_plugin, drain, write_config
from caravan.stack.processes import Service, StartupFailed, free_port, spawn, wait_until
from caravan.stack.session_network import SessionNetwork, release, session_network

COMMON_CONFIG = """\
name       = "{name}"
bind_addr  = "{address}"
data_dir   = "{data_dir}"
log_level  = "INFO"
# No call home to checkpoint-api.hashicorp.com: Caravan sends nothing off the machine.
disable_update_check = true
# Without it a non-dev client keeps no allocation stats at all (Nomad's task stats hook is off), and the idle
# checker's utilization check reads nothing: every Nomad client Caravan uses needs it (README, "Pointing Caravan at
# an existing Nomad and Redis").
telemetry {{
  publish_allocation_metrics = true
}}
ports {{
  http = {http}
  rpc  = {rpc}
  serf = {serf}
}}
advertise {{
  http = "{address}"
  rpc  = "{address}"
  serf = "{address}"
}}
limits {{
  http_max_conns_per_client = 0
}}
acl {{
  enabled = true
}}
"""

SERVER_CONFIG = """\
server {{
  enabled          = true
  bootstrap_expect = 1
{heartbeat}}}
client {{
  enabled = false
}}
"""

CLIENT_CONFIG = """\
plugin_dir = "{plugin_dir}"
server {{
  enabled = false
}}
client {{
  enabled           = true
  servers           = [{servers}]
  node_pool         = "{node_pool}"
  cpu_total_compute = {cpu_mhz}
  memory_total_mb   = {memory_mb}
  cgroup_parent     = "{cgroup_parent}"
  network_interface = "{interface}"
{network_config}{meta}  chroot_env {{
    "{rootfs}" = "/"
  }}
  options = {{
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
    "driver.denylist"      = "{denylist}"
  }}
}}
plugin "raw_exec" {{
  config {{
    enabled = true
  }}
}}
"""


LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ClientHost:
    """Where a client of the multi-host test cluster runs (:mod:`caravan.stack.multihost`): a network namespace."""

    address: str
    """Its address on the hosts' link."""
    interface: str
    """Its interface on that link (Nomad's ``network_interface``)."""
    enter: tuple[str, ...]
    """The command prefix that runs a program in the namespace (``nsenter --net=…``)."""
    meta: tuple[tuple[str, str], ...] = ()
    """Node meta (the session subnet and address that ``nomad_jobs.session_peers`` reads), beside the session
    network's own (``SessionNetwork.meta_block``)."""


@dataclass(frozen=True)
class ClientSpec:
    name: str
    cpu_mhz: int
    """Advertised CPU (``cpu_total_compute``), whatever the machine has."""
    memory_mb: int
    node_pool: str = "default"
    devices: SimDevices | None = None
    """The simulated accelerators it offers (None: none)."""


@dataclass
class NomadCluster:
    addr: str
    server: Service
    state_dir: Path
    clients: dict[str, Service] = field(default_factory=dict)
    node_ids: dict[str, str] = field(default_factory=dict)
    """Client name -> Nomad node id."""
    networks: dict[str, SessionNetwork] = field(default_factory=dict)
    """Client name -> its session network (each client has a bridge and subnet of its own)."""
    device_dirs: dict[str, Path] = field(default_factory=dict)
    """Client name -> its device plugin's state directory (:mod:`node_plugins.devices.sim.state`)."""
    secrets_dir: Path | None = None
    """Where the management token and the components' tokens are (``<state_dir>/secrets`` if None)."""
    namespace: str = "default"
    """The namespace Caravan's policies are written for."""
    allow_raw_exec: bool = True
    platform_namespace: str = PLATFORM_NAMESPACE
    """The platform's namespace (``docker commit`` jobs; raw_exec only, the scheduler's token alone writes there)."""
    token: str | None = None
    """The management token, once bootstrapped."""

    @property
    def node_names(self) -> dict[str, str]:
        """Nomad node id -> client name."""
        return {node: name for name, node in self.node_ids.items()}

    def stop(self, drain_timeout: float = 20.0) -> None:
        """Stop every job first and wait for its tasks to end: a client that stops leaves its tasks running."""
        if self.server.alive() and self.clients:
            with contextlib.suppress(Exception):
                drain(self.addr, self.state_dir, drain_timeout, token=self.token)
        for service in self.clients.values():
            service.stop()
        self.server.stop()
        for network in self.networks.values():
            release(network)


SINGLE_NODE_CONFIG = """\
name = "{name}"
advertise {{
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}}
server {{
  enabled          = true
  bootstrap_expect = 1
}}
client {{
  enabled       = true
  cgroup_parent = "{cgroup_parent}"
}}
"""


@dataclass
class SingleNodeNomad(NomadCluster):
    """One agent as server and client, its state under ``state_dir``; :meth:`kill` and :meth:`restart` it at will."""

    argv: tuple[str, ...] = ()
    name: str = "caravan-single"
    want_drivers: tuple[str, ...] = ("raw_exec",)
    devices: SimDevices | None = DEFAULT_DEVICES
    earlier_groups: list[int] = field(default_factory=list)
    """Process groups of killed incarnations: their task executors outlive them (the restarted agent reattaches)."""

    @property
    def node_id(self) -> str:
        return self.node_ids[self.name]

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal the agent process alone (not its task executors) and wait for it to exit."""
        self.earlier_groups.append(self.server.pid)
        os.kill(self.server.pid, sig)
        self.server.process.wait(60)

    def restart(self, timeout: float = 120.0) -> None:
        self.server = spawn("nomad", self.argv, self.server.log, env=CLEAN_ENV, clean=True)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        _wait_server(self, timeout)
        spec = ClientSpec(self.name, cpu_mhz=0, memory_mb=0, devices=self.devices)  # only the name and devices are read
        wait_until(
            lambda: _clients_ready(self, [spec], self.want_drivers),
            what="the Nomad node",
            timeout=timeout,
            log=self.server.log,
        )

    def stop(self, drain_timeout: float = 20.0) -> None:
        if self.server.alive():
            with contextlib.suppress(Exception):
                drain(self.addr, self.state_dir, drain_timeout, token=self.token)
        self.server.stop()
        for pid in _leftover_executors(self.argv[0], set(self.earlier_groups)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for network in self.networks.values():
            release(network)


def _leftover_executors(binary: str, groups: set[int]) -> list[int]:
    """Processes still in the process groups of killed agents that run our Nomad binary (task executors whose
    allocation was never torn down); checked by binary, not by group alone, since a group id may be reused."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = (proc / "cmdline").read_bytes().split(b"\0")[0]
            if os.getpgid(int(proc.name)) in groups and command == binary.encode():
                found.append(int(proc.name))
    return found


def start_nomad_single_node(
    state_dir: Path,
    *,
    nomad_home: Path,
    rootfs: Path,
    want_drivers: tuple[str, ...] = ("raw_exec",),
    timeout: float = 120.0,
    http: int | None = None,
    qemu_image_dirs: tuple[Path, ...] = (),
    log: Path | None = None,
    pause_image: str | None = None,
    raw_exec: bool | None = None,
    secrets_dir: Path | None = None,
    namespace: str = "default",
    devices: SimDevices | None = DEFAULT_DEVICES,
    platform_namespace: str = PLATFORM_NAMESPACE,
) -> SingleNodeNomad:
    """A non-dev agent (server + client) on loopback ports of its own, with simulated accelerators (``devices``), ACLs
    on and its tokens in ``secrets_dir`` (default ``<state_dir>/secrets``; a restart reuses them). ``raw_exec``: whether
    the users' namespace allows raw_exec jobs (default: when it is wanted). The client runs the raw_exec plugin either
    way: the platform's jobs (``docker commit``) use it, in the platform's namespace, which only the scheduler writes.

    With ``http`` given, RPC and Serf take the next two ports: a server that keeps its state must come back on
    the same addresses, or its Raft peer (itself, as stored) is unreachable and no leader is elected.
    """
    raw_exec = "raw_exec" in want_drivers if raw_exec is None else raw_exec
    binary = _binary(nomad_home)
    state_dir.mkdir(parents=True, exist_ok=True)
    rpc, serf = single_node_ports(http) if http else (free_port(), free_port())
    http = http or free_port()
    network = session_network(state_dir)
    write_config(
        state_dir / "nomad.hcl",
        data_dir=state_dir / "data",
        nomad_home=nomad_home,
        rootfs=rootfs,
        image_dir=state_dir / "images",
        device_dir=state_dir / "devices",
        http=http,
        rpc=rpc,
        serf=serf,
        qemu_image_dirs=qemu_image_dirs,
        network=network,
        pause_image=pause_image,
        raw_exec=True,
        devices=devices,
    )
    name = f"caravan-single-{state_dir.name}"
    (state_dir / "single.hcl").write_text(SINGLE_NODE_CONFIG.format(name=name, cgroup_parent=cgroup_parent(name)))
    argv = (str(binary), "agent", f"-config={state_dir / 'nomad.hcl'}", f"-config={state_dir / 'single.hcl'}")
    log = log or state_dir / "nomad.log"
    logged_before = log.stat().st_size if log.exists() else 0
    server = spawn("nomad", argv, log, env=CLEAN_ENV, clean=True)
    nomad_agent = SingleNodeNomad(
        addr=f"http://127.0.0.1:{http}",
        server=server,
        state_dir=state_dir,
        argv=argv,
        name=name,
        want_drivers=want_drivers,
        devices=devices,
        networks={name: network},
        device_dirs={name: state_dir / "devices"},
        secrets_dir=secrets_dir,
        namespace=namespace,
        allow_raw_exec=raw_exec,
        platform_namespace=platform_namespace,
    )
    try:
        _wait_server(nomad_agent, timeout)
        if _registration_refused(log, logged_before):
            nomad_agent.server.stop()  # nothing placed yet: the agent started again registers at once
            nomad_agent.restart(timeout)
        else:
            nomad_agent._wait_ready(timeout)
    except BaseException:
        nomad_agent.server.stop()  # not stop(): that purges every job, and a persisted agent's jobs are the user's
        raise
    return nomad_agent


REGISTRATION_REFUSED = 'error registering: error="rpc error: failed to sign node identity claims: keyring has not been'
"""What a new agent's client part logs when it asked to register before its own server initialized the keyring (a
race it loses about as often as not, by a tenth of a second): refused, it asks again only 15-30 s later (Nomad's
register retry interval), which a dev stack's first ``up`` and every test starting a single node waited out."""


def _registration_refused(log: Path, offset: int) -> bool:
    """Whether the agent logged, past ``offset`` in ``log`` (its own lines), its client's registration refused."""
    with log.open("rb") as lines:
        lines.seek(offset)
        return REGISTRATION_REFUSED.encode() in lines.read()


def single_node_ports(http: int) -> tuple[int, int]:
    """RPC and Serf ports of a single-node agent given its HTTP port: the next two."""
    return http + 1, http + 2


def _binary(nomad_home: Path) -> Path:
    binary = nomad_home / "bin" / "nomad"
    if binary.exists():
        return binary
    found = shutil.which("nomad")
    if not found:
        raise StartupFailed("nomad is not installed (ops/install-nomad builds it)")
    return Path(found)


def start_nomad_cluster(
    state_dir: Path,
    *,
    nomad_home: Path,
    rootfs: Path,
    clients: Sequence[ClientSpec],
    want_drivers: tuple[str, ...] = ("raw_exec",),
    timeout: float = 120.0,
    secrets_dir: Path | None = None,
    namespace: str = "default",
    heartbeat: tuple[float, float] | None = None,
) -> NomadCluster:
    """``heartbeat``: the server's ``(min_heartbeat_ttl, heartbeat_grace)`` in seconds (default Nomad's 10 s and 10 s:
    a client that stopped heartbeating is marked down about 20 s on); a test that waits for a node down gives shorter
    ones."""
    binary = _binary(nomad_home)
    state_dir.mkdir(parents=True, exist_ok=True)
    http, rpc = free_port(), free_port()
    server_log = state_dir / "server.log"
    (state_dir / "server.hcl").write_text(
        COMMON_CONFIG.format(
            name="caravan-server",
            address=LOOPBACK,
            data_dir=state_dir / "server",
            http=http,
            rpc=rpc,
            serf=free_port(),
        )
        + SERVER_CONFIG.format(heartbeat=_heartbeat_config(heartbeat))
    )
    server = spawn(
        "nomad-server",
        [str(binary), "agent", f"-config={state_dir / 'server.hcl'}"],
        server_log,
        env=CLEAN_ENV,
        clean=True,
    )
    cluster = NomadCluster(
        addr=f"http://127.0.0.1:{http}",
        server=server,
        state_dir=state_dir,
        secrets_dir=secrets_dir,
        namespace=namespace,
        allow_raw_exec="raw_exec" in want_drivers,
    )
    try:
        _wait_server(cluster, timeout)
        for spec in clients:
            cluster.networks[spec.name] = session_network(state_dir / spec.name)
            cluster.device_dirs[spec.name] = state_dir / spec.name / "devices"
            cluster.clients[spec.name] = _start_client(
                binary, state_dir, spec, [f"{LOOPBACK}:{rpc}"], nomad_home, rootfs, cluster.networks[spec.name]
            )
        wait_until(
            lambda: _clients_ready(cluster, clients, want_drivers),
            what="Nomad client nodes",
            timeout=timeout,
            log=state_dir / f"{clients[-1].name}.log" if clients else None,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _heartbeat_config(heartbeat: tuple[float, float] | None) -> str:
    if heartbeat is None:
        return ""
    ttl, grace = heartbeat
    return f'  min_heartbeat_ttl = "{round(ttl * 1000)}ms"\n  heartbeat_grace   = "{round(grace * 1000)}ms"\n'


def _start_client(
    binary: Path,
    state_dir: Path,
    spec: ClientSpec,
    servers: Sequence[str],
    nomad_home: Path,
    rootfs: Path,
    network: SessionNetwork,
    *,
    host: ClientHost | None = None,
    pause_image: str | None = None,
) -> Service:
    """A client agent; ``host``: in a network namespace of its own (on its address, default ports, the session
    network in its node meta), else on loopback ports of its own. ``pause_image``: with the docker driver (its infra
    container image), else without."""
    data_dir = state_dir / spec.name
    device_dir = data_dir / "devices"
    device_dir.mkdir(parents=True, exist_ok=True)
    ports = (4646, 4647, 4648) if host else (free_port(), free_port(), free_port())
    config = COMMON_CONFIG.format(
        name=spec.name,
        address=host.address if host else LOOPBACK,
        data_dir=data_dir,
        http=ports[0],
        rpc=ports[1],
        serf=ports[2],
    )
    config += CLIENT_CONFIG.format(
        plugin_dir=plugin_dir(data_dir, nomad_home),
        servers=", ".join(f'"{server}"' for server in servers),
        interface=host.interface if host else "lo",
        meta=network.meta_block(*(host.meta if host else ())),
        node_pool=spec.node_pool,
        cpu_mhz=spec.cpu_mhz,
        memory_mb=spec.memory_mb,
        cgroup_parent=cgroup_parent(spec.name),
        rootfs=rootfs,
        network_config=network.client_config(),
        denylist="qemu,java" if pause_image else "docker,qemu,java",
    )
    config += docker_plugin(pause_image, shared_daemon=True) if pause_image else ""
    config += plugin_block(spec.devices, device_dir, data_dir)
    path = state_dir / f"{spec.name}.hcl"
    path.write_text(config)
    return spawn(
        f"nomad-{spec.name}",
        [*(host.enter if host else ()), str(binary), "agent", f"-config={path}"],
        state_dir / f"{spec.name}.log",
        env=CLEAN_ENV,
        clean=True,
    )


def _wait_server(cluster: NomadCluster, timeout: float) -> None:
    """A leader, the ACLs bootstrapped and configured, then an initialized keyring (read with the management token)."""

    def leader() -> bool:
        if not cluster.server.alive():
            raise StartupFailed("the Nomad server exited")
        return bool(_get(f"{cluster.addr}/v1/status/leader"))

    def keyring() -> bool:
        keys = _get(f"{cluster.addr}/v1/operator/keyring/keys", cluster.token)
        return isinstance(keys, list) and bool(keys)

    wait_until(leader, what="a Nomad server leader", timeout=timeout, log=cluster.server.log)
    cluster.token = lock_down(
        cluster.addr,
        cluster.secrets_dir or cluster.state_dir / "secrets",
        namespace=cluster.namespace,
        allow_raw_exec=cluster.allow_raw_exec,
        platform=cluster.platform_namespace,
        timeout=timeout,
        log=cluster.server.log,
    )
    wait_until(keyring, what="the Nomad keyring", timeout=timeout, log=cluster.server.log)


def _clients_ready(cluster: NomadCluster, specs: Sequence[ClientSpec], want_drivers: tuple[str, ...]) -> bool:
    for name, service in cluster.clients.items():
        if not service.alive():
            raise StartupFailed(f"Nomad client {name} exited")
    nodes = _get(f"{cluster.addr}/v1/nodes?resources=true", cluster.token)
    by_name = {n["Name"]: n for n in nodes if n.get("Status") == "ready"} if isinstance(nodes, list) else {}
    for spec in specs:
        node = by_name.get(spec.name)
        if node is None or not all((node.get("Drivers") or {}).get(d, {}).get("Healthy") for d in want_drivers):
            return False
        devices = (node.get("NodeResources") or {}).get("Devices") or []
        if sum(len(d.get("Instances") or []) for d in devices) < (spec.devices.instances if spec.devices else 0):
            return False
        cluster.node_ids[spec.name] = str(node["ID"])
    return True
