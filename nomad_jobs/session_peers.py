"""``session-peers``: the daemon that joins a session's kernels across hosts. One runs on every Nomad client host.

The isolation plugin (``node_plugins/cni_isolation.py``) knows only the kernels of its own host (its membership files).
A session whose kernels run on several hosts needs two more things on each host, and this daemon derives both from
Nomad, read with a token that can only read (``caravan.stack.nomad_acl.SESSION_PEERS_RULES``):

- **routes**: each client advertises its session subnet and its address on the hosts' network in its node meta
  (:data:`SUBNET_META`, :data:`ADDRESS_META`); the daemon keeps a route to every other ready host's subnet through
  that host's address (routing protocol :data:`ROUTE_PROTOCOL`, so it touches no route of anyone else). Sessions'
  subnets are routed between hosts, with no encapsulation: the hosts must share a link (or their routers must know
  the subnets). With ``--overlay vxlan`` (hosts without a shared link: their network carries only their own
  addresses) the route goes instead through a VXLAN device (:data:`VXLAN_DEVICE`, VNI :data:`VXLAN_ID`, UDP
  :data:`VXLAN_PORT` between the hosts' addresses, no learning): each other host's device is a static neighbour of a
  MAC derived from its address (:func:`vxlan_mac`), behind its subnet's gateway address, in the forwarding database
  at its address. The isolation rules are the same either way (the ``peers`` pairs, whatever the interface).
- **membership**: the live allocations of every namespace, each with its address on its host's session network
  (``NetworkStatus``), give each session's kernels on the other hosts; a pair (this host's kernel, another host's
  kernel of the same session) is let through, both ways, in the plugin's ``peers`` set, under the plugin's lock, and
  listed in the plugin's ``remote-peers.json``. An allocation's address counts only if it lies in the subnet its own
  node advertises, and a subnet claimed by two nodes (or overlapping this host's) counts for neither.

Trust: the daemon believes what Nomad's servers say about nodes and allocations (a node that lies in its meta or its
allocations' network status can attract its claimed addresses' traffic, as any routed network trusts its routers),
and traffic on the hosts' link is not encrypted (a machine on that link can send with a session's source address).

Run as ``python -m nomad_jobs.session_peers --nomad-addr … --token-file … --node-name … --state-dir … --supernet …``
in the host's network namespace, as root (it writes routes and nftables). It polls (every ``--interval`` seconds):
a new kernel's peers are let through within one period after Nomad knows its address.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from core.settings import NomadSettings
from node_plugins.cni_isolation import Kernel, Membership, nft, remote_commands, session_key
from nomad_jobs.client import Json, NomadClient

SUBNET_META = "caravan_session_subnet"
"""Node meta: the client's session subnet (its bridge's /24)."""
ADDRESS_META = "caravan_host_address"
"""Node meta: the client's address on the hosts' network, where other hosts route its session subnet."""
ROUTE_PROTOCOL = "199"
"""The routing protocol number of the daemon's routes (``ip route … proto 199``): its own, listed and removed alone."""
ROUTED, VXLAN = "routed", "vxlan"
"""The overlays between hosts: their session subnets routed through their addresses, or encapsulated in VXLAN."""
VXLAN_DEVICE = "cvvx0"
VXLAN_ID = 4226
VXLAN_PORT = 4789
VXLAN_OVERHEAD = 50
"""Bytes of VXLAN over IPv4 per packet: the device's MTU is the link's less this, and so must the kernels' be (a
kernel at the link's MTU sends bulk data at a twelfth of the speed: ``bench/multihost_network``)."""

Pair = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Host:
    node_id: str
    address: str
    subnet: ipaddress.IPv4Network


@dataclasses.dataclass(frozen=True)
class RemoteKernel:
    session: str
    """``cni_isolation.session_key`` of its Nomad namespace and job."""
    node_id: str
    address: str


def hosts_of(nodes: Iterable[Json], supernet: ipaddress.IPv4Network) -> dict[str, Host]:
    """The ready nodes that advertise a session subnet inside ``supernet`` and an address, by node id; a subnet that
    overlaps another node's counts for neither of them."""
    claims: list[Host] = []
    for node in nodes:
        meta = node.get("Meta") or {}
        if node.get("Status") != "ready" or SUBNET_META not in meta or ADDRESS_META not in meta:
            continue
        try:
            subnet = ipaddress.IPv4Network(str(meta[SUBNET_META]))
            address = str(ipaddress.IPv4Address(str(meta[ADDRESS_META])))
        except ValueError:
            continue
        if subnet.subnet_of(supernet):
            claims.append(Host(str(node["ID"]), address, subnet))
    return {
        host.node_id: host
        for host in claims
        if not any(other is not host and other.subnet.overlaps(host.subnet) for other in claims)
    }


def remote_kernels(allocations: Iterable[Json], hosts: Mapping[str, Host], me: str) -> list[RemoteKernel]:
    """Other hosts' kernels: live allocations (with ``NetworkStatus``) on a known host other than ``me`` whose
    address lies in that host's subnet."""
    found = []
    for alloc in allocations:
        host = hosts.get(str(alloc.get("NodeID", "")))
        address = str((alloc.get("NetworkStatus") or {}).get("Address") or "")
        if host is None or host.node_id == me or not address:
            continue
        try:
            inside = ipaddress.IPv4Address(address) in host.subnet
        except ValueError:
            continue
        if inside:
            args = {"NOMAD_NAMESPACE": str(alloc.get("Namespace", "default")), "NOMAD_JOB_ID": str(alloc["JobID"])}
            found.append(RemoteKernel(session_key(args), host.node_id, address))
    return found


def wanted_pairs(local: Iterable[Kernel], remote: Iterable[RemoteKernel]) -> set[Pair]:
    """(local address, remote address) for every local kernel and every other host's kernel of its session."""
    by_session: dict[str, set[str]] = {}
    for kernel in remote:
        by_session.setdefault(kernel.session, set()).add(kernel.address)
    return {(k.address, other) for k in local for other in by_session.get(k.session, ())}


def wanted_routes(hosts: Mapping[str, Host], me: str, overlay: str = ROUTED) -> dict[str, str]:
    """Each other host's subnet → where it is routed: the host's address, or (VXLAN) its subnet's gateway address,
    a neighbour on the VXLAN device."""
    others = [h for h in hosts.values() if h.node_id != me]
    if overlay == VXLAN:
        return {str(h.subnet): str(h.subnet[1]) for h in others}
    return {str(h.subnet): h.address for h in others}


def vxlan_mac(address: str) -> str:
    """The VXLAN device's MAC of the host at ``address``: locally administered, the address's four bytes."""
    return "02:ca:" + ":".join(f"{byte:02x}" for byte in ipaddress.IPv4Address(address).packed)


# -- I/O ---------------------------------------------------------------------------------------------------


def sync_routes(wanted: Mapping[str, str], device: str | None = None) -> None:
    """Make this namespace's routes of :data:`ROUTE_PROTOCOL` exactly ``wanted`` (through ``device``, its gateways
    on-link there, when given)."""
    shown = subprocess.run(
        ["ip", "-j", "-4", "route", "show", "proto", ROUTE_PROTOCOL], capture_output=True, text=True, check=True
    )
    present = {str(r["dst"]): (str(r.get("gateway", "")), r.get("dev")) for r in json.loads(shown.stdout or "[]")}
    for destination in present.keys() - wanted.keys():
        subprocess.run(["ip", "route", "del", destination, "proto", ROUTE_PROTOCOL], capture_output=True, check=False)
    through = ["dev", device, "onlink"] if device else []
    for destination, via in wanted.items():
        if present.get(destination, ("", None))[0] != via or (device and present[destination][1] != device):
            subprocess.run(
                ["ip", "route", "replace", destination, "via", via, *through, "proto", ROUTE_PROTOCOL],
                capture_output=True,
                check=True,
            )


def _listed(*argv: str) -> list[Json]:
    """What ``ip -j``/``bridge -j`` lists (nothing when the device is not there)."""
    found = json.loads(subprocess.run(argv, capture_output=True, text=True, check=False).stdout or "[]")
    return found if isinstance(found, list) else []


def sync_vxlan(local: str | None, remotes: Mapping[str, str]) -> None:
    """This host's VXLAN device from its address ``local`` (None: no device), and exactly ``remotes`` (each other
    host's address → its subnet's gateway address) as its static neighbours and forwarding entries."""
    exists = bool(_listed("ip", "-j", "link", "show", VXLAN_DEVICE))
    if local is None:
        if exists:
            subprocess.run(["ip", "link", "delete", VXLAN_DEVICE], capture_output=True, check=False)
        return
    if not exists:
        add = ["ip", "link", "add", VXLAN_DEVICE, "type", "vxlan", "id", str(VXLAN_ID), "local", local]
        subprocess.run([*add, "dstport", str(VXLAN_PORT), "nolearning"], capture_output=True, check=True)
        subprocess.run(["ip", "link", "set", VXLAN_DEVICE, "address", vxlan_mac(local), "up"], check=True)
    macs = {vxlan_mac(address): address for address in remotes}
    neighbours = {gateway: vxlan_mac(address) for address, gateway in remotes.items()}
    for entry in _listed("ip", "-j", "neigh", "show", "dev", VXLAN_DEVICE):
        if neighbours.get(str(entry.get("dst"))) != entry.get("lladdr"):
            subprocess.run(["ip", "neigh", "del", str(entry["dst"]), "dev", VXLAN_DEVICE], check=False)
    for entry in _listed("bridge", "-j", "fdb", "show", "dev", VXLAN_DEVICE):
        mac = str(entry.get("mac", ""))
        if entry.get("dst") and macs.get(mac) != entry.get("dst"):
            subprocess.run(["bridge", "fdb", "del", mac, "dev", VXLAN_DEVICE, "dst", str(entry["dst"])], check=False)
    for address, gateway in remotes.items():
        mac = vxlan_mac(address)
        fdb = ["bridge", "fdb", "replace", mac, "dev", VXLAN_DEVICE, "dst", address, "self", "permanent"]
        subprocess.run(fdb, capture_output=True, check=True)
        neighbour = ["ip", "neigh", "replace", gateway, "lladdr", mac, "dev", VXLAN_DEVICE, "nud", "permanent"]
        subprocess.run(neighbour, capture_output=True, check=True)


def sync_pairs(members: Membership, remote: Sequence[RemoteKernel]) -> tuple[int, int]:
    """Under the plugin's lock: the remote pairs of this host's kernels made what Nomad says; (added, removed)."""
    lock = members.lock()
    try:
        wanted = wanted_pairs(members.all_kernels(), remote)
        applied = {(a, b) for a, b in members.remote_pairs()}
        added, removed = sorted(wanted - applied), sorted(applied - wanted)
        if added or removed:
            nft([*remote_commands("delete", removed), *remote_commands("add", added)])
            members.keep_remote_pairs(sorted(wanted))
        return len(added), len(removed)
    finally:
        os.close(lock)


@dataclasses.dataclass
class PeerDaemon:
    client: NomadClient
    node_name: str
    members: Membership
    supernet: ipaddress.IPv4Network
    overlay: str = ROUTED
    _nodes: dict[str, tuple[int, Json]] = dataclasses.field(default_factory=dict)
    _allocs: dict[str, tuple[int, Json]] = dataclasses.field(default_factory=dict)

    async def once(self) -> None:
        nodes = [await self._detail(self._nodes, stub, self.client.node) for stub in await self.client.nodes()]
        me = next((str(n["ID"]) for n in nodes if n.get("Name") == self.node_name), "")
        if not me:
            raise RuntimeError(f"no Nomad node named {self.node_name!r} yet")
        hosts = hosts_of(nodes, self.supernet)
        stubs = [a for a in await self.client.live_allocations() if a.get("NodeID") != me]
        allocs = [await self._detail(self._allocs, stub, self.client.allocation) for stub in stubs]
        live = {str(a["ID"]) for a in stubs}
        for gone in self._allocs.keys() - live:
            del self._allocs[gone]
        routes = wanted_routes(hosts, me, self.overlay)
        if self.overlay == VXLAN:
            remotes = {h.address: str(h.subnet[1]) for h in hosts.values() if h.node_id != me}
            local = hosts[me].address if me in hosts else None
            await asyncio.to_thread(sync_vxlan, local, remotes)
            await asyncio.to_thread(sync_routes, routes if local else {}, VXLAN_DEVICE)
        else:
            await asyncio.to_thread(sync_vxlan, None, {})
            await asyncio.to_thread(sync_routes, routes)
        added, removed = await asyncio.to_thread(sync_pairs, self.members, remote_kernels(allocs, hosts, me))
        if added or removed:
            print(f"session-peers: {added} pair(s) let through, {removed} taken back", file=sys.stderr, flush=True)

    @staticmethod
    async def _detail(cache: dict[str, tuple[int, Json]], stub: Json, read: object) -> Json:
        """The object's full record, read again only when its ModifyIndex changed."""
        key, index = str(stub["ID"]), int(stub.get("ModifyIndex", 0))
        known = cache.get(key)
        if known is None or known[0] != index:
            assert callable(read)
            known = (index, await read(key))
            cache[key] = known
        return known[1]


async def run(args: argparse.Namespace) -> None:
    token = (await asyncio.to_thread(Path(args.token_file).read_text)).strip()
    client = NomadClient(NomadSettings(addr=args.nomad_addr, token=token))
    supernet = ipaddress.IPv4Network(args.supernet)
    daemon = PeerDaemon(client, args.node_name, Membership(args.state_dir), supernet, args.overlay)
    try:
        while True:
            try:
                await daemon.once()
            except Exception as exc:  # Nomad away, the node not registered yet: try again next period
                print(f"session-peers: {exc!r}", file=sys.stderr, flush=True)
            await asyncio.sleep(args.interval)
    finally:
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="session-peers", description=__doc__.splitlines()[0])
    parser.add_argument("--nomad-addr", required=True, help="this host's Nomad agent (its HTTP API)")
    parser.add_argument("--token-file", required=True, help="a Nomad token that reads nodes and allocations")
    parser.add_argument("--node-name", required=True, help="this host's Nomad node name")
    parser.add_argument("--state-dir", required=True, help="the isolation plugin's stateDir on this host")
    parser.add_argument("--supernet", required=True, help="where session subnets lie, e.g. 172.26.0.0/16")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--overlay", choices=(ROUTED, VXLAN), default=ROUTED, help="between hosts (default: routed)")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
