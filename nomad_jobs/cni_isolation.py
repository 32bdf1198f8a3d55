"""``caravan-isolation``: the CNI plugin that keeps each session in a network of its own. Runs on every Nomad client.

Nomad starts every kernel of a session in its own network namespace (``network { mode = "cni/caravan" }``) through
the CNI network configuration that ``caravan.stack.session_network`` writes for each client: ``loopback``, ``bridge``
(one Linux bridge per client, with a subnet of its own), ``portmap`` (the published ports the session reports), then
this plugin, chained last. It is given the bridge plugin's result and Nomad's CNI arguments (``NOMAD_NAMESPACE``,
``NOMAD_JOB_ID``, ``NOMAD_GROUP_NAME``), and keeps one nftables rule set per host (:data:`RULESET`) that allows a
kernel's namespace exactly this:

- traffic with the other kernels of the *same session* (one Nomad job: namespace and job id), on the same bridge or
  routed between bridges of several clients on one host, in both directions (``peers``: pairs of addresses);
- answers to connections made *to* it: the host reaching a published port (Nomad's checks, the gateway), which
  portmap DNATs into the namespace;

and nothing else: no new connection to the host itself (any of its addresses, its loopback services included:
``route_localnet`` that portmap turns on for the bridge is no way in), to another session, or beyond the host. A
kernel cannot pretend to be another one either: a frame from a kernel's port must carry that kernel's address, in
ARP and in IP (``ports``), and only ARP and IPv4 pass a bridge port.

Membership is kept in files under ``stateDir`` (one directory per session, one file per allocation holding its
address), under one lock, so the pairs are right whatever order kernels come and go in. All of one host's clients
share the directory, so a session whose kernels run on several clients of one host (the multi-client test cluster)
is one network. Across machines the files are not shared: cross-machine traffic between kernels is then refused
(the safe way round; see the README on running Caravan's networking beyond one machine).

Standalone on purpose: Nomad runs it as ``/usr/bin/python3 -I cni_isolation.py`` with no project packages, so it
imports only the standard library. The rule set's text and the CNI result handling are pure functions, tested in
``tests/nomad_jobs/test_cni_isolation.py``; the plugin is exercised for real by the e2e networking tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CNI_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")
TABLE = "caravan_isolation"
"""The nftables table of this plugin, in both the ``inet`` and the ``bridge`` family."""

RULESET = """\
table inet {table} {{
  comment "caravan session isolation v1: sessions reach their own kernels only"
  set bridges {{ type ifname; comment "bridges of session networks"; }}
  set peers {{ type ipv4_addr . ipv4_addr; comment "(source, destination) pairs of kernels of one session"; }}
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    iifname @bridges ct state established,related accept
    iifname @bridges drop
  }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname @bridges ct state established,related accept
    iifname @bridges ip saddr . ip daddr @peers accept
    iifname @bridges drop
    oifname @bridges ct state established,related accept
    oifname @bridges ct status dnat accept
    oifname @bridges drop
  }}
}}
table bridge {table} {{
  comment "caravan session isolation v1: no spoofing, no traffic between sessions on one bridge"
  set kernel_ports {{ type ifname; comment "host ends of kernels' veth pairs"; }}
  set ports {{ type ifname . ipv4_addr; comment "each kernel port with the one address it may use"; }}
  set peers {{ type ipv4_addr . ipv4_addr; }}
  chain prerouting {{
    type filter hook prerouting priority filter - 10; policy accept;
    iifname != @kernel_ports accept
    ether type arp iifname . arp saddr ip @ports accept
    ether type ip iifname . ip saddr @ports accept
    drop
  }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname != @kernel_ports accept
    ether type arp accept
    ether type ip ip saddr . ip daddr @peers accept
    drop
  }}
}}
"""


class PluginError(Exception):
    """A failure reported to the runtime as a CNI error (code 100: generic failure)."""


@dataclass(frozen=True)
class Kernel:
    """One allocation's place in its session's network."""

    container_id: str
    """The CNI container id: Nomad's allocation id."""
    session: str
    """Who may talk to whom: a digest of the Nomad namespace and job id (one job per session)."""
    address: str
    """The kernel's IPv4 address on the bridge."""
    port: str
    """The host end of its veth pair (a port of the bridge)."""


def parse_cni_args(text: str) -> dict[str, str]:
    """``CNI_ARGS`` (``K=V;K=V``) as a dict."""
    args = {}
    for item in text.split(";"):
        key, sep, value = item.partition("=")
        if sep and key:
            args[key] = value
    return args


def session_key(args: Mapping[str, str]) -> str:
    """The session a kernel belongs to, from Nomad's CNI arguments (the job is the session)."""
    job = args.get("NOMAD_JOB_ID", "")
    if not job:
        raise PluginError("no NOMAD_JOB_ID in CNI_ARGS: is this network used by a Nomad job?")
    return hashlib.sha256(f"{args.get('NOMAD_NAMESPACE', 'default')}/{job}".encode()).hexdigest()[:24]


def kernel_of(result: Mapping[str, Any], container_id: str, session: str) -> Kernel:
    """The kernel's address and bridge port from the bridge plugin's result (``prevResult``)."""
    interfaces = result.get("interfaces") or []
    address = next(
        (str(ipaddress.ip_interface(ip["address"]).ip) for ip in result.get("ips") or []
         if ipaddress.ip_interface(ip["address"]).version == 4),
        None,
    )
    if address is None:
        raise PluginError("the previous plugin gave the kernel no IPv4 address")
    host_side = [i["name"] for i in interfaces if not i.get("sandbox")]
    # the bridge plugin lists the bridge first, then the host end of the veth pair
    if len(host_side) < 2:
        raise PluginError("the previous plugin reported no host end of the kernel's veth pair")
    return Kernel(container_id=container_id, session=session, address=address, port=host_side[-1])


def pairs(address: str, others: Sequence[str]) -> list[str]:
    """nft elements of the ``peers`` sets for one kernel and its session's other kernels, both directions."""
    return [f"{a} . {b}" for other in others if other != address for a, b in ((address, other), (other, address))]


def element_commands(verb: str, kernel: Kernel, others: Sequence[str], bridge: str) -> list[str]:
    """The nft commands that add (``verb="add"``) or remove (``"delete"``) one kernel's elements."""
    commands = []
    if verb == "add":
        commands.append(f'add element inet {TABLE} bridges {{ "{bridge}" }}')
    if peer_pairs := pairs(kernel.address, others):
        joined = ", ".join(peer_pairs)
        commands += [f"{verb} element inet {TABLE} peers {{ {joined} }}",
                     f"{verb} element bridge {TABLE} peers {{ {joined} }}"]
    commands += [f'{verb} element bridge {TABLE} kernel_ports {{ "{kernel.port}" }}',
                 f'{verb} element bridge {TABLE} ports {{ "{kernel.port}" . {kernel.address} }}']
    return commands


# -- I/O: state files and nft ------------------------------------------------------------------------------


class Membership:
    """Kernels per session on this host, in files under ``state_dir``, changed only under :meth:`locked`."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.root / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def others(self, session: str, container_id: str) -> list[str]:
        directory = self.root / "sessions" / session
        if not directory.is_dir():
            return []
        return [json.loads(f.read_text())["address"] for f in sorted(directory.iterdir()) if f.name != container_id]

    def remember(self, kernel: Kernel) -> None:
        record = json.dumps(kernel.__dict__)
        for path in (self.root / "sessions" / kernel.session / kernel.container_id,
                     self.root / "containers" / kernel.container_id):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.write_text(record)

    def recall(self, container_id: str) -> Kernel | None:
        path = self.root / "containers" / container_id
        return Kernel(**json.loads(path.read_text())) if path.exists() else None

    def all_kernels(self) -> list[Kernel]:
        directory = self.root / "containers"
        return [Kernel(**json.loads(f.read_text())) for f in sorted(directory.iterdir())] if directory.is_dir() else []

    def forget(self, kernel: Kernel) -> None:
        directory = self.root / "sessions" / kernel.session
        (directory / kernel.container_id).unlink(missing_ok=True)
        (self.root / "containers" / kernel.container_id).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            directory.rmdir()  # the session's last kernel on this host


def nft(script: str, *, check: bool = True) -> None:
    done = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
    if check and done.returncode != 0:
        raise PluginError(f"nft refused the rules: {done.stderr.strip()}")


def ensure_ruleset() -> None:
    """Load the rule set once per host (boot); kept afterwards, only its sets change."""
    present = subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True).returncode == 0
    if not present:
        nft(RULESET.format(table=TABLE))


def add(config: Mapping[str, Any], env: Mapping[str, str], members: Membership) -> dict[str, Any]:
    result = config.get("prevResult")
    if not isinstance(result, dict):
        raise PluginError("caravan-isolation must be chained after the bridge plugin (no prevResult)")
    kernel = kernel_of(result, env["CNI_CONTAINERID"], session_key(parse_cni_args(env.get("CNI_ARGS", ""))))
    with members.locked():
        ensure_ruleset()
        for stale in members.all_kernels():  # left by a client killed before it could DEL: its address is reused now
            if stale.address == kernel.address and stale.container_id != kernel.container_id:
                _remove(stale, members)
        others = members.others(kernel.session, kernel.container_id)
        nft("\n".join(element_commands("add", kernel, others, str(config["bridge"]))))
        members.remember(kernel)
    return result


def delete(env: Mapping[str, str], members: Membership) -> None:
    """Idempotent, as CNI requires: a kernel already gone (or never added) is no error."""
    with members.locked():
        kernel = members.recall(env["CNI_CONTAINERID"])
        if kernel is not None:
            _remove(kernel, members)


def release(subnet: str, members: Membership) -> None:
    """Forget every kernel of a client's subnet (the client is gone for good, maybe killed without DELs)."""
    network = ipaddress.ip_network(subnet)
    with members.locked():
        for kernel in members.all_kernels():
            if ipaddress.ip_address(kernel.address) in network:
                _remove(kernel, members)


def _remove(kernel: Kernel, members: Membership) -> None:
    others = members.others(kernel.session, kernel.container_id)
    for command in element_commands("delete", kernel, others, ""):
        nft(command, check=False)  # an element already gone (a flushed table) is fine
    members.forget(kernel)


def check(config: Mapping[str, Any], env: Mapping[str, str], members: Membership) -> None:
    """CHECK (Nomad runs it when it finds an allocation's namespace after a restart): the kernel is known, and its
    elements are (re)asserted, since a reboot or a flush may have emptied the sets."""
    with members.locked():
        kernel = members.recall(env["CNI_CONTAINERID"])
        if kernel is None:
            raise PluginError(f"allocation {env['CNI_CONTAINERID']} is not in a session network on this host")
        ensure_ruleset()
        nft("\n".join(element_commands("add", kernel, members.others(kernel.session, kernel.container_id),
                                       str(config["bridge"]))))


def main() -> int:
    env = os.environ
    if sys.argv[1:2] == ["release"]:  # caravan.stack.session_network.release: release <subnet> <state dir>
        release(sys.argv[2], Membership(Path(sys.argv[3])))
        return 0
    command = env.get("CNI_COMMAND", "")
    config: dict[str, Any] = {}
    if command != "VERSION":
        config = json.loads(sys.stdin.read() or "{}")
    version = str(config.get("cniVersion", "0.4.0"))
    try:
        members = Membership(Path(str(config.get("stateDir", "/run/caravan-cni"))))
        if command == "ADD":
            print(json.dumps(add(config, env, members)))
        elif command == "DEL":
            delete(env, members)
        elif command == "CHECK":
            check(config, env, members)
        elif command == "VERSION":
            print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": list(CNI_VERSIONS)}))
        else:
            raise PluginError(f"unknown CNI_COMMAND {command!r}")
    except (PluginError, KeyError, ValueError, OSError) as exc:
        print(json.dumps({"cniVersion": version, "code": 100, "msg": "caravan-isolation", "details": str(exc)}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
