"""The network sessions run in on a Nomad client: a CNI network named ``caravan``
(``network { mode = "cni/caravan" }``).

Each Nomad client the stack starts gets a session network of its own:

- a Linux **bridge** (``cv<6 hex>``) with a /24 of :data:`SESSION_SUPERNET`, the client's gateway address on it, and
  host-local address management (its state under the client's directory);
- **caravan-isolation** (``node_plugins/cni_isolation.py``), chained last: a kernel reaches the other kernels of its own
  session and nothing else (not the host and its loopback services, not another session, not beyond the host); and,
  in the same nftables transaction, a kernel's ports are published on the client's own address (its loopback on one
  machine, its address on the hosts' network on a cluster: ``host_address``) as Nomad-allocated host ports (CNI's
  ``portMappings``), so the port a session reports is the port that answers (``127.0.0.1:<host port>`` → the
  kernel's own port); from beyond the host only the ``data_plane`` addresses reach it. It does what CNI's
  ``portmap`` plugin did, without its separate process and its iptables calls (about 0.1 s off every kernel's
  start, ``bench/jupyter_launch``).

No masquerading is configured: sessions have no egress beyond the host (see the README for the operator's choice in
production). The CNI plugins come from Debian's ``containernetworking-plugins`` (``/usr/lib/cni``); the isolation
plugin is a small shim written next to the configuration that runs the module with the system Python.

The network is chosen once per client state directory and kept in ``session-network.json`` there, so a persisted agent
comes back on the same bridge and subnet (its running allocations keep their addresses). Subnets are picked among the
/24s no route of the host uses yet; tests start several clients on one machine, each on a bridge of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nomad_jobs.namespace_keeper import NETWORK_META

CNI_NETWORK = "caravan"
"""The CNI network name sessions use: their groups say ``network { mode = "cni/caravan" }``."""
SYSTEM_CNI_PLUGINS = Path("/usr/lib/cni")
SESSION_SUPERNET = ipaddress.IPv4Network("172.26.0.0/16")
"""Where session subnets are taken from, a /24 per client."""
MEMBERSHIP_DIR = Path("/run/caravan-cni")
"""Which kernel belongs to which session on this host, shared by every client of the host (see cni_isolation)."""
HOST_NETWORK = ipaddress.IPv4Network("172.26.255.0/24")
"""Never a session subnet: the hosts' own addresses on the multi-host test cluster's link
(:mod:`caravan.stack.multihost`)."""
LOOPBACK = "127.0.0.1"
ISOLATION_MODULE = Path(__file__).resolve().parents[2] / "node_plugins" / "cni_isolation.py"


@dataclass(frozen=True)
class SessionNetwork:
    bridge: str
    """The Linux bridge the client's kernels are attached to."""
    subnet: str
    """The client's /24 of session addresses; ``.1`` is the host's end."""
    config_dir: str
    """The client's ``cni_config_dir``: holds ``caravan.conflist``."""
    bin_dir: str
    """Holds the ``caravan-isolation`` plugin shim; the client's ``cni_path`` is the system plugins, then this."""
    ipam_dir: str
    """host-local's record of the addresses handed out."""
    state_dir: str = str(MEMBERSHIP_DIR)
    """The isolation plugin's membership records: one directory per host (every client of a host shares it; each
    network namespace of the multi-host test cluster is a host of its own, with a directory of its own)."""
    host_address: str = LOOPBACK
    """Where the kernels' ports are published: the client's own address (its ``network_interface``'s, which Nomad
    reports as the ports' address), never every address of the host."""
    data_plane: tuple[str, ...] = ()
    """The only addresses beyond the host that reach a published port (the ingress proxying the apps; none on one
    machine, where the ingress is on the host itself)."""
    mtu: int | None = None
    """The bridge's and kernels' MTU (None: the kernel's default, 1500); under a VXLAN overlay, the device's."""

    @property
    def cni_path(self) -> str:
        return f"{SYSTEM_CNI_PLUGINS}:{self.bin_dir}"

    @property
    def client_dir(self) -> str:
        """Where it is recorded (``session-network.json``): its client's directory, which holds ``config_dir``."""
        return str(Path(self.config_dir).parent)

    def client_config(self) -> str:
        """The lines of a Nomad ``client { }`` block that point it at this network."""
        return f'  cni_path       = "{self.cni_path}"\n  cni_config_dir = "{self.config_dir}"\n'

    def meta_block(self, *extra: tuple[str, str]) -> str:
        """The client's ``meta { }`` block: where this network is recorded (``NETWORK_META``: a namespace keeper on
        its host finds it there, ``nomad_jobs.namespace_keeper``), and ``extra``."""
        lines = "".join(f'    "{key}" = "{value}"\n' for key, value in ((NETWORK_META, self.client_dir), *extra))
        return f"  meta {{\n{lines}  }}\n"

    def conflist(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {"type": "loopback"},
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "forceAddress": True,
                    **({"mtu": self.mtu} if self.mtu else {}),
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": self.ipam_dir,
                    },
                },
                {
                    "type": "caravan-isolation",
                    "bridge": self.bridge,
                    "stateDir": self.state_dir,
                    "hostAddress": self.host_address,
                    "dataPlane": list(self.data_plane),
                    "capabilities": {"portMappings": True},
                },
            ],
        }


def session_network(
    client_dir: Path,
    state_dir: Path = MEMBERSHIP_DIR,
    *,
    host_address: str = LOOPBACK,
    data_plane: tuple[str, ...] = (),
    mtu: int | None = None,
) -> SessionNetwork:
    """The client's session network: the one it had, else a new one (bridge and a free /24), written to disk with
    its CNI configuration and plugin shim. ``state_dir``: the host's membership records (a client in a network
    namespace of its own is a host of its own). Subnets are reserved machine-wide either way, so no two hosts of
    this machine share one. ``host_address``, ``data_plane`` and ``mtu``: where its kernels' ports are published, who
    beyond the host reaches them, the kernels' MTU (see :class:`SessionNetwork`)."""
    client_dir = client_dir.resolve()
    record = client_dir / "session-network.json"
    with _reservations() as reserved:
        if record.exists():
            network = SessionNetwork(**json.loads(record.read_text()))
            network = replace(network, host_address=host_address, data_plane=tuple(data_plane), mtu=mtu)
        else:
            bridge = "cv" + hashlib.sha256(str(client_dir).encode()).hexdigest()[:6]
            network = SessionNetwork(
                bridge=bridge,
                subnet=str(_free_subnet(bridge, _taken(reserved))),
                config_dir=str(client_dir / "cni"),
                bin_dir=str(client_dir / "cni-bin"),
                ipam_dir=str(client_dir / "cni-ipam"),
                state_dir=str(state_dir),
                host_address=host_address,
                data_plane=tuple(data_plane),
                mtu=mtu,
            )
        (reserved / _reservation_name(network.subnet)).write_text(str(client_dir))
        _write(network)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(asdict(network), indent=2))
    return network


def recorded_network(client_dir: Path) -> SessionNetwork | None:
    """The session network a client directory has (None if it never had one), without making one."""
    record = client_dir.resolve() / "session-network.json"
    return SessionNetwork(**json.loads(record.read_text())) if record.exists() else None


def release(network: SessionNetwork) -> None:
    """After the client stopped for good: remove its bridge (its kernels are gone), whatever membership records a
    killed client left, and its subnet's reservation. A persisted agent that is only restarted keeps its network."""
    subprocess.run(["ip", "link", "delete", network.bridge], capture_output=True, check=False)
    subprocess.run(
        [sys.executable, "-I", str(ISOLATION_MODULE), "release", network.subnet, network.state_dir],
        capture_output=True,
        check=False,
    )
    unreserve(network)


def unreserve(network: SessionNetwork) -> None:
    """Free the network's subnet for other clients (its bridge and records are gone: a host namespace deleted)."""
    with _reservations() as reserved:
        (reserved / _reservation_name(network.subnet)).unlink(missing_ok=True)


@contextlib.contextmanager
def _reservations() -> Iterator[Path]:
    """The directory of subnet reservations (one file per /24, holding the client directory), under the host's lock:
    a client's bridge appears only with its first kernel, so routes alone cannot tell a subnet is taken."""
    directory = MEMBERSHIP_DIR / "subnets"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(MEMBERSHIP_DIR / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield directory


def _reservation_name(subnet: str) -> str:
    return subnet.replace("/", "_")


def _taken(reserved: Path) -> list[ipaddress.IPv4Network]:
    """Subnets reserved by clients whose directory still exists (a deleted test directory frees its subnet)."""
    taken = []
    for entry in reserved.iterdir():
        if Path(entry.read_text().strip(), "session-network.json").exists():
            taken.append(ipaddress.IPv4Network(entry.name.replace("_", "/")))
    return taken


def _write(network: SessionNetwork) -> None:
    config_dir, bin_dir = Path(network.config_dir), Path(network.bin_dir)
    config_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / f"{CNI_NETWORK}.conflist").write_text(json.dumps(network.conflist(), indent=2))
    shim = bin_dir / "caravan-isolation"
    shim.write_text(f'#!/bin/sh\nexec /usr/bin/python3 -I -S "{ISOLATION_MODULE}" "$@"\n')
    shim.chmod(0o755)


def _free_subnet(bridge: str, reserved: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /24 of the supernet that no route of this host covers (a bridge of ours or anything else), no
    other client has reserved, and that is not the test hosts' link (:data:`HOST_NETWORK`)."""
    used = [HOST_NETWORK, *_routed_networks(), *reserved]
    for candidate in SESSION_SUPERNET.subnets(new_prefix=24):
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError(f"no free /24 left in {SESSION_SUPERNET} for the session bridge {bridge}")


def _routed_networks() -> list[ipaddress.IPv4Network]:
    routes = json.loads(
        subprocess.run(
            ["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True, text=True, check=True
        ).stdout
        or "[]"
    )
    found = []
    for route in routes:
        destination = route.get("dst", "")
        if destination and destination != "default":
            try:
                found.append(ipaddress.ip_network(destination, strict=False))
            except ValueError:
                continue
    return [n for n in found if isinstance(n, ipaddress.IPv4Network)]
