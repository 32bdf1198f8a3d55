"""``caravan-isolation``: the CNI plugin that keeps each session in a network of its own. Runs on every Nomad client.

Nomad starts every kernel of a session in its own network namespace (``network { mode = "cni/caravan" }``) through
the CNI network configuration that ``caravan.stack.session_network`` writes for each client: ``loopback``, ``bridge``
(one Linux bridge per client, with a subnet of its own), then this plugin, chained last. It is given the bridge
plugin's result, Nomad's CNI arguments (``NOMAD_NAMESPACE``, ``NOMAD_JOB_ID``) and the kernel's published ports (CNI
capability ``portMappings``), and keeps one nftables rule set per host (:data:`RULES`) that allows a kernel's
namespace exactly this:

- traffic with the other kernels of the *same session* (one Nomad job: namespace and job id), on the same bridge or
  routed between bridges of several clients on one host, in both directions (``peers``: pairs of addresses);
- answers to connections made *to* it: the host reaching a published port (Nomad's checks, the gateway), which this
  plugin DNATs into the namespace (the ``ip`` table's ``hostports``/``anyports`` maps: what CNI's ``portmap`` plugin
  did with iptables, here in the same transaction, which takes about 0.1 s off every kernel's start; a connection
  from the host's loopback is masqueraded to the bridge's address, as portmap's ``snat`` did). A port is published
  on the host's own address (``hostAddress``), and from beyond the host only the data plane (``dataPlane``: the
  addresses of the ingress that proxies the sessions' apps) reaches it: any other machine on the hosts' network is
  dropped in the forward chain;

and nothing else: no new connection to the host itself (any of its addresses, its loopback services included:
``route_localnet``, which this plugin turns on for the bridge as portmap did, is no way in), to another session, or
beyond the host. A kernel cannot pretend to be another one either: a frame from a kernel's port must carry that
kernel's address, in ARP and in IP (``ports``), and only ARP and IPv4 pass a bridge port.

Membership is kept in files under ``stateDir`` (one directory per session, one file per allocation), under one lock,
so the pairs are right whatever order kernels come and go in. All of one host's clients share the directory, so a
session whose kernels run on several clients of one host (the multi-client test cluster) is one network. Kernels on
other hosts are not in these files: ``nomad_jobs.session_peers``, a daemon on each host, learns them from Nomad's
allocations and keeps their pairs with this host's kernels in the same ``peers`` sets, under the same lock, listed in
``remote-peers.json`` (:data:`REMOTE_PEERS`). A pair arriving from another host is let in by the forward chain's
``oifname`` rule. Where no agent runs, cross-host traffic between kernels is refused (the safe way round). A kernel
that comes or goes here takes every remote pair of its address with it: an address reused by another session's
kernel never inherits the pairs of the one before, whatever the agent has not seen yet.

Every change is one ``nft -f`` transaction that also declares the tables, sets and chains and rewrites the chains'
rules: a host whose rule set was flushed (a reboot, a firewall reload) is whole again at the next kernel, and a kernel
never starts with a partial rule set. Deleting elements that may be gone already is written as add-then-delete in
the same transaction (nft 1.0.6 has no ``destroy``). Published ports are the exception: they are removed as nft lists
them under the lock, by the address they lead to (and, for a kernel that comes, by the keys it takes), whatever record
put them there or none (a record lost, a DEL that never ran): an address handed out again never inherits a port
published for the kernel before it, and a host port handed out again goes to the new kernel alone.

Standalone and quick on purpose: Nomad runs it as ``/usr/bin/python3 -I -S cni_isolation.py`` for every kernel
start and stop, with no project packages, so it imports only a few standard modules (no ``typing``, ``dataclasses``
or ``pathlib``: they would double its start-up time, which is on every session's start). The rule set's text and the
CNI result handling are pure functions, tested in ``tests/node_plugins/test_cni_isolation.py``; the plugin runs for
real in the e2e isolation tests.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import subprocess
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at run time (mypy reads it by name)
if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence
    from typing import Any

CNI_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")
TABLE = "caravan_isolation"
"""The nftables table of this plugin, in the ``inet``, ``bridge`` and ``ip`` (published ports) families."""


def _dnat_rules(chain: str) -> str:
    """A published port (``hostports``: on one host address; ``anyports``: on any) leads to its kernel's port."""
    local = f"add rule ip {TABLE} {chain} fib daddr type local meta l4proto {{ tcp, udp }} dnat ip to"
    return f"{local} ip daddr . meta l4proto . th dport map @hostports\n{local} meta l4proto . th dport map @anyports\n"


RULES = f"""\
add table inet {TABLE} {{ comment "caravan session isolation: sessions reach their own kernels only"; }}
add set inet {TABLE} bridges {{ type ifname; comment "bridges of session networks"; }}
add set inet {TABLE} peers {{ type ipv4_addr . ipv4_addr; comment "(source, destination) of one session's kernels"; }}
add set inet {TABLE} data_plane {{ type ipv4_addr; flags interval; comment "who reaches published ports from afar"; }}
add chain inet {TABLE} input {{ type filter hook input priority filter - 10; policy accept; }}
add chain inet {TABLE} forward {{ type filter hook forward priority filter - 10; policy accept; }}
flush chain inet {TABLE} input
flush chain inet {TABLE} forward
add rule inet {TABLE} input iifname @bridges ct state established,related accept
add rule inet {TABLE} input iifname @bridges drop
add rule inet {TABLE} forward iifname @bridges ct state established,related accept
add rule inet {TABLE} forward iifname @bridges ip saddr . ip daddr @peers accept
add rule inet {TABLE} forward iifname @bridges drop
add rule inet {TABLE} forward oifname @bridges ct state established,related accept
add rule inet {TABLE} forward oifname @bridges ct status dnat ip saddr @data_plane accept
add rule inet {TABLE} forward oifname @bridges ip saddr . ip daddr @peers accept
add rule inet {TABLE} forward oifname @bridges drop
add table bridge {TABLE} {{ comment "caravan session isolation: no spoofing, no traffic between sessions"; }}
add set bridge {TABLE} kernel_ports {{ type ifname; comment "host ends of kernels' veth pairs"; }}
add set bridge {TABLE} ports {{ type ifname . ipv4_addr; comment "each kernel port with its one address"; }}
add set bridge {TABLE} peers {{ type ipv4_addr . ipv4_addr; }}
add chain bridge {TABLE} prerouting {{ type filter hook prerouting priority filter - 10; policy accept; }}
add chain bridge {TABLE} forward {{ type filter hook forward priority filter - 10; policy accept; }}
flush chain bridge {TABLE} prerouting
flush chain bridge {TABLE} forward
add rule bridge {TABLE} prerouting iifname != @kernel_ports accept
add rule bridge {TABLE} prerouting ether type arp iifname . arp saddr ip @ports accept
add rule bridge {TABLE} prerouting ether type ip iifname . ip saddr @ports accept
add rule bridge {TABLE} prerouting drop
add rule bridge {TABLE} forward iifname != @kernel_ports accept
add rule bridge {TABLE} forward ether type arp accept
add rule bridge {TABLE} forward ether type ip ip saddr . ip daddr @peers accept
add rule bridge {TABLE} forward drop
add table ip {TABLE} {{ comment "caravan session isolation: kernels' published ports"; }}
add map ip {TABLE} hostports {{ type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }}
add map ip {TABLE} anyports {{ type inet_proto . inet_service : ipv4_addr . inet_service; }}
add chain ip {TABLE} prerouting {{ type nat hook prerouting priority -100; policy accept; }}
add chain ip {TABLE} output {{ type nat hook output priority -100; policy accept; }}
add chain ip {TABLE} postrouting {{ type nat hook postrouting priority 100; policy accept; }}
flush chain ip {TABLE} prerouting
flush chain ip {TABLE} output
flush chain ip {TABLE} postrouting
{_dnat_rules("prerouting")}{_dnat_rules("output")}\
add rule ip {TABLE} postrouting ip saddr 127.0.0.0/8 ct status dnat masquerade
"""


class PluginError(Exception):
    """A failure reported to the runtime as a CNI error (code 100: generic failure)."""


class Kernel(collections.namedtuple("Kernel", "container_id session address port published", defaults=((),))):
    """One allocation's place in its session's network: ``container_id`` is the CNI container id (Nomad's
    allocation id); ``session`` who may talk to whom (from the Nomad namespace and job id: one job per session);
    ``address`` its IPv4 address on the bridge; ``port`` the host end of its veth pair (a port of the bridge);
    ``published`` its ports published on the host, ``(host address, protocol, host port, kernel port)`` tuples
    (host address ``""``: any of the host's)."""

    __slots__ = ()


def parse_cni_args(text: str) -> dict[str, str]:
    """``CNI_ARGS`` (``K=V;K=V``) as a dict."""
    args = {}
    for item in text.split(";"):
        key, sep, value = item.partition("=")
        if sep and key:
            args[key] = value
    return args


def session_key(args: Mapping[str, str]) -> str:
    """The session a kernel belongs to, from Nomad's CNI arguments (the job is the session), as a file name."""
    job = args.get("NOMAD_JOB_ID", "")
    if not job:
        raise PluginError("no NOMAD_JOB_ID in CNI_ARGS: is this network used by a Nomad job?")
    return f"{args.get('NOMAD_NAMESPACE', 'default')}/{job}".encode().hex()


def kernel_of(result: Mapping[str, Any], container_id: str, session: str) -> Kernel:
    """The kernel's address and bridge port from the bridge plugin's result (``prevResult``)."""
    address = next(
        (str(ip["address"]).split("/")[0] for ip in result.get("ips") or [] if ":" not in str(ip.get("address", ":"))),
        None,
    )
    if address is None:
        raise PluginError("the previous plugin gave the kernel no IPv4 address")
    host_side = [str(i["name"]) for i in result.get("interfaces") or [] if not i.get("sandbox")]
    # the bridge plugin lists the bridge first, then the host end of the veth pair
    if len(host_side) < 2:
        raise PluginError("the previous plugin reported no host end of the kernel's veth pair")
    return Kernel(container_id, session, address, host_side[-1])


ANY_ADDRESS = ("", "0.0.0.0", "::")
"""A port mapping's host address meaning any of the host's (``anyports``), unless the configuration names the host's
address (``hostAddress``)."""


def published_ports(config: Mapping[str, Any]) -> tuple[tuple[str, str, int, int], ...]:
    """The port mappings the runtime asks for (CNI capability ``portMappings``, Nomad's ports with a ``to``), checked
    strictly: they are written into an nft script. IPv6 host addresses are skipped (the session network is IPv4).
    A mapping without a host address (Nomad gives none in a CNI network) is published on the configuration's
    ``hostAddress`` (the client's own address: 127.0.0.1 on one machine, its address on the hosts' network on a
    cluster), never on every address of the host; without ``hostAddress``, on any (``anyports``)."""
    default_host = str(config.get("hostAddress") or "")
    if default_host and not _is_ipv4(default_host):
        raise PluginError(f"hostAddress {default_host!r} is not an IPv4 address")
    found = []
    for given in (config.get("runtimeConfig") or {}).get("portMappings") or []:
        mapping = {str(k).lower(): v for k, v in given.items()}  # Nomad writes HostPort, CNI's convention hostPort
        host, protocol = str(mapping.get("hostip") or ""), str(mapping.get("protocol") or "tcp").lower()
        host_port, port = int(mapping["hostport"]), int(mapping["containerport"])
        if protocol not in ("tcp", "udp") or not (0 < host_port < 65536 and 0 < port < 65536):
            raise PluginError(f"unsupported port mapping {given!r}")
        if host in ANY_ADDRESS:
            host = default_host
        elif ":" in host:
            continue
        elif not _is_ipv4(host):
            raise PluginError(f"unsupported host address in port mapping {given!r}")
        found.append((host, protocol, host_port, port))
    return tuple(found)


def data_plane_commands(config: Mapping[str, Any]) -> list[str]:
    """The ``data_plane`` set as the configuration gives it (``dataPlane``: IPv4 addresses or networks): the only
    sources beyond the host that may reach a published port (the ingress that proxies the sessions' apps). Empty by
    default: then only the host itself does (its own connections are never forwarded)."""
    given = config.get("dataPlane") or []
    if not isinstance(given, list):
        raise PluginError("dataPlane is a list of IPv4 addresses or networks")
    for entry in given:
        address, _, length = str(entry).partition("/")
        if not _is_ipv4(address) or (length and not (length.isdigit() and int(length) <= 32)):
            raise PluginError(f"dataPlane entry {entry!r} is not an IPv4 address or network")
    elements = ", ".join(str(entry) for entry in given)
    added = [f"add element inet {TABLE} data_plane {{ {elements} }}"] if given else []
    return [f"flush set inet {TABLE} data_plane", *added]


def _is_ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and len(p) <= 3 and int(p) <= 255 for p in parts)


def port_element(address: str, mapping: Sequence[Any]) -> tuple[str, str, str]:
    """``(map, key, value)`` of one published port of the kernel at ``address`` in the ``ip`` table's maps."""
    host, protocol, host_port, port = mapping
    if host:
        return "hostports", f"{host} . {protocol} . {host_port}", f"{address} . {port}"
    return "anyports", f"{protocol} . {host_port}", f"{address} . {port}"


def port_commands(verb: str, address: str, published: Sequence[Sequence[Any]]) -> list[str]:
    """Add (key and value) or delete (key) published ports of the kernel at ``address``."""
    elements = [port_element(address, mapping) for mapping in published]
    if verb == "add":
        return [f"add element ip {TABLE} {m} {{ {key} : {value} }}" for m, key, value in elements]
    return [f"delete element ip {TABLE} {m} {{ {key} }}" for m, key, _ in elements]


def taken_keys(kernel: Kernel) -> set[tuple[str, str]]:
    """``(map, key)`` of each port the kernel publishes."""
    return {port_element(kernel.address, mapping)[:2] for mapping in kernel.published}


def ports_taken_over(kernel: Kernel, others: Sequence[Kernel]) -> list[Kernel]:
    """A host port Nomad hands out again while an older record still holds it (a DEL that never ran, a client
    killed): the newest kernel wins. The others' records without those ports (so their DEL leaves the new kernel's
    ports alone); the ports themselves go with :func:`unpublish`."""
    taking = taken_keys(kernel)
    losing = []
    for other in others:
        lost = [p for p in other.published if port_element(other.address, p)[:2] in taking]
        if lost:
            losing.append(other._replace(published=tuple(p for p in other.published if p not in lost)))
    return losing


PORT_MAPS = ("hostports", "anyports")


def listed_ports(listing: str) -> list[tuple[str, str, str]]:
    """The published ports in ``nft -j list table ip <TABLE>``'s output: ``(map, key, address)``, the key in nft's
    syntax and the address of the kernel it leads to."""
    found = []
    for item in json.loads(listing).get("nftables", []):
        listed = item.get("map")
        if not isinstance(listed, dict) or listed.get("name") not in PORT_MAPS:
            continue
        for element in listed.get("elem") or []:
            try:
                key, value = element
                found.append((str(listed["name"]), " . ".join(str(p) for p in key["concat"]), str(value["concat"][0])))
            except (KeyError, TypeError, IndexError, ValueError):
                continue  # not one of ours (this plugin adds no other form): left alone rather than fail a kernel
    return found


def unpublish(
    listed: Sequence[tuple[str, str, str]], addresses: Collection[str], keys: Collection[tuple[str, str]] = ()
) -> list[str]:
    """Delete every listed port that leads to one of ``addresses`` or has one of ``keys`` (``(map, key)``). Listed
    under the lock just before, each is there: a plain delete."""
    return [
        f"delete element ip {TABLE} {m} {{ {key} }}"
        for m, key, address in listed
        if address in addresses or (m, key) in keys
    ]


def pairs(address: str, others: Sequence[str]) -> list[str]:
    """nft elements of the ``peers`` sets for one kernel and its session's other kernels, both directions."""
    return [f"{a} . {b}" for other in others if other != address for a, b in ((address, other), (other, address))]


def element_commands(verb: str, kernel: Kernel, others: Sequence[str], bridge: str = "") -> list[str]:
    """The nft commands that add (``verb="add"``) or remove (``"delete"``) one kernel's elements."""
    commands = [f'add element inet {TABLE} bridges {{ "{bridge}" }}'] if verb == "add" else []
    if peer_pairs := pairs(kernel.address, others):
        joined = ", ".join(peer_pairs)
        commands += [
            f"{verb} element inet {TABLE} peers {{ {joined} }}",
            f"{verb} element bridge {TABLE} peers {{ {joined} }}",
        ]
    commands += [
        f'{verb} element bridge {TABLE} kernel_ports {{ "{kernel.port}" }}',
        f'{verb} element bridge {TABLE} ports {{ "{kernel.port}" . {kernel.address} }}',
    ]
    return commands + port_commands(verb, kernel.address, kernel.published)


def removal_commands(kernel: Kernel, others: Sequence[str]) -> list[str]:
    """Remove a kernel's elements whether or not they are still there: add, then delete, in one transaction. Its
    published ports are not among them: :func:`unpublish` removes those as nft lists them."""
    unpublished = kernel._replace(published=())
    return element_commands("add", unpublished, others)[1:] + element_commands("delete", unpublished, others)


REMOTE_PEERS = "remote-peers.json"
"""In the state directory: the pairs (this host's kernel, another host's kernel of its session) in the ``inet``
``peers`` set, as ``nomad_jobs.session_peers`` applied them."""


def remote_commands(verb: str, remote: Sequence[Sequence[str]]) -> list[str]:
    """nft commands that add or delete the pairs of (local, remote) kernels, both directions, in the ``inet`` table
    (only routed traffic crosses hosts: the bridge table never sees it). Deleting is add-then-delete."""
    elements = [element for local, other in remote for element in pairs(local, [other])]
    if not elements:
        return []
    joined = ", ".join(elements)
    adds = [f"add element inet {TABLE} peers {{ {joined} }}"]
    return adds if verb == "add" else [*adds, f"delete element inet {TABLE} peers {{ {joined} }}"]


# -- I/O: state files and nft ------------------------------------------------------------------------------


class Membership:
    """Kernels per session on this host, in files under ``state_dir``; change it only while holding :meth:`lock`."""

    def __init__(self, state_dir: str) -> None:
        self.root = state_dir

    def lock(self) -> int:
        """Take the host-wide lock (released when the process exits, or with :func:`os.close` on the result)."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.root, "lock"), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _session_dir(self, session: str) -> str:
        return os.path.join(self.root, "sessions", session)

    def others(self, kernel: Kernel) -> list[str]:
        return [other.address for other in self._records(self._session_dir(kernel.session), but=kernel.container_id)]

    def remember(self, kernel: Kernel) -> None:
        """Write the kernel's records whole or not at all (a temporary file renamed over): a plugin killed mid-write
        must not leave a torn record that every later ADD on the host would trip over."""
        record = json.dumps(kernel._asdict())
        for directory in (self._session_dir(kernel.session), os.path.join(self.root, "containers")):
            os.makedirs(directory, mode=0o700, exist_ok=True)
            temporary = os.path.join(directory, f".{kernel.container_id}.{os.getpid()}.tmp")
            with open(temporary, "w") as file:
                file.write(record)
            os.replace(temporary, os.path.join(directory, kernel.container_id))

    def recall(self, container_id: str) -> Kernel | None:
        path = os.path.join(self.root, "containers", container_id)
        return self._read(path) if os.path.exists(path) else None

    def all_kernels(self) -> list[Kernel]:
        return self._records(os.path.join(self.root, "containers"))

    def _records(self, directory: str, but: str | None = None) -> list[Kernel]:
        """The readable records in ``directory`` (temporary files and ``but`` left out)."""
        if not os.path.isdir(directory):
            return []
        found = (
            self._read(os.path.join(directory, name))
            for name in sorted(os.listdir(directory))
            if not name.startswith(".") and name != but
        )
        return [kernel for kernel in found if kernel is not None]

    def remote_pairs(self) -> list[list[str]]:
        """The (local, remote) pairs applied now (see :data:`REMOTE_PEERS`)."""
        path = os.path.join(self.root, REMOTE_PEERS)
        try:
            with open(path) as file:
                found = json.load(file)
        except (OSError, ValueError):
            return []
        return [[str(a), str(b)] for a, b in found] if isinstance(found, list) else []

    def keep_remote_pairs(self, remote: Sequence[Sequence[str]]) -> None:
        """Record the applied pairs whole (a temporary file renamed over)."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        temporary = os.path.join(self.root, f".{REMOTE_PEERS}.{os.getpid()}.tmp")
        with open(temporary, "w") as file:
            json.dump([list(pair) for pair in remote], file)
        os.replace(temporary, os.path.join(self.root, REMOTE_PEERS))

    def without_remote(self, addresses: Sequence[str]) -> tuple[list[str], list[list[str]] | None]:
        """For kernels that come or go on this host: the nft commands that remove every remote pair of their
        ``addresses``, and the record to keep once they are applied (None: nothing changes)."""
        remote = self.remote_pairs()
        kept = [pair for pair in remote if pair[0] not in addresses]
        if len(kept) == len(remote):
            return [], None
        return remote_commands("delete", [pair for pair in remote if pair[0] in addresses]), kept

    def forget(self, kernel: Kernel) -> None:
        path = os.path.join(self.root, "containers", kernel.container_id)
        if os.path.exists(path):
            os.unlink(path)
        self.leave(kernel)

    def leave(self, kernel: Kernel) -> None:
        """Drop the kernel's record from its session's directory only (a pooled namespace bound to a session keeps
        its container record, rewritten with the session's key)."""
        directory = self._session_dir(kernel.session)
        path = os.path.join(directory, kernel.container_id)
        if os.path.exists(path):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # the session's last kernel on this host

    @staticmethod
    def _read(path: str) -> Kernel | None:
        """The record at ``path``; None (and a line on stderr, which Nomad logs) when it is torn or not a record,
        as one left by an older plugin killed mid-write: skipped, so one bad file cannot stop every kernel."""
        try:
            with open(path) as file:
                kernel = Kernel(**json.load(file))
            return kernel._replace(published=tuple(tuple(p) for p in kernel.published))
        except (OSError, ValueError, TypeError) as exc:
            print(f"caravan-isolation: skipping the unreadable record {path}: {exc}", file=sys.stderr)
            return None


def nft(commands: Sequence[str]) -> None:
    """One atomic nft transaction."""
    done = subprocess.run(["nft", "-f", "-"], input="\n".join(commands) + "\n", text=True, capture_output=True)
    if done.returncode != 0:
        raise PluginError(f"nft refused the rules: {done.stderr.strip()}")


def published_now() -> list[tuple[str, str, str]]:
    """The ports published on this host now (:func:`listed_ports`); none before the first kernel made the table.
    Read under the lock, as every writer of the maps holds it."""
    done = subprocess.run(["nft", "-j", "list", "table", "ip", TABLE], text=True, capture_output=True)
    try:
        return listed_ports(done.stdout) if done.returncode == 0 else []
    except ValueError:  # not JSON: nothing to clean up rather than a kernel failed for it
        return []


def add(config: Mapping[str, Any], env: Mapping[str, str], members: Membership) -> dict[str, Any]:
    result = config.get("prevResult")
    if not isinstance(result, dict):
        raise PluginError("caravan-isolation must be chained after the bridge plugin (no prevResult)")
    kernel = kernel_of(result, env["CNI_CONTAINERID"], session_key(parse_cni_args(env.get("CNI_ARGS", ""))))
    kernel = kernel._replace(published=published_ports(config))
    bridge = str(config["bridge"])
    members.lock()
    commands = [RULES, *data_plane_commands(config)]
    known = [k for k in members.all_kernels() if k.container_id != kernel.container_id]
    # left by a client killed before its DEL: the address is reused now
    stale = [k for k in known if k.address == kernel.address]
    for old in stale:
        commands += removal_commands(old, members.others(old))
    dropped, kept = members.without_remote([kernel.address])
    losing = enter(kernel, [k for k in known if k not in stale], members, bridge, [*commands, *dropped])
    if kept is not None:
        members.keep_remote_pairs(kept)
    for old in stale:
        members.forget(old)
    for other in losing:
        members.remember(other)
    members.remember(kernel)
    return result


def enter(
    kernel: Kernel, known: Sequence[Kernel], members: Membership, bridge: str, before: Sequence[str]
) -> list[Kernel]:
    """One nft transaction: ``before``; every published port that leads to the kernel's address (a kernel's before it
    there) or that the kernel takes (a ``known`` kernel's, or one no record names); the kernel's elements (its
    session's pairs and its ports among them). Returns the kernels that lost ports, as they must be remembered now."""
    losing = ports_taken_over(kernel, known)
    if kernel.published:
        # what portmap did: connections to 127.0.0.1 may be routed to the bridge (then masqueraded, see RULES)
        with open(f"/proc/sys/net/ipv4/conf/{os.path.basename(bridge)}/route_localnet", "w") as file:
            file.write("1")
    taken = unpublish(published_now(), [kernel.address], taken_keys(kernel))
    nft([*before, *taken, *element_commands("add", kernel, members.others(kernel), bridge)])
    return losing


POOL_NAMESPACE = "caravan-pool"
"""The Nomad namespace of a pooled network namespace's placeholder session (its job id is its own container id, so
it is a session of its own: no peer). No Nomad job runs in it; a job of a namespace of this name is never bound to."""


def pool_key(container_id: str) -> str:
    """The placeholder session of the pooled namespace ``container_id`` (``node_plugins.namespace_pool``)."""
    return session_key({"NOMAD_NAMESPACE": POOL_NAMESPACE, "NOMAD_JOB_ID": container_id})


def bind(config: Mapping[str, Any], container_id: str, args: Mapping[str, str], members: Membership) -> Kernel:
    """Hand the pooled namespace ``container_id`` to a session (``args``: its ``NOMAD_NAMESPACE`` and ``NOMAD_JOB_ID``)
    with its published ports (``config``: ``bridge`` and CNI's ``runtimeConfig.portMappings``), in one nft
    transaction under the lock: it joins the session's pairs and its ports lead into it. To one session only: a
    namespace bound to another (or unknown) is refused, so a pooled namespace serves one session and is then deleted,
    never reused. Bound again to its own session, its ports are replaced by those given (a replacement allocation's)."""
    members.lock()
    pooled = members.recall(container_id)
    session = session_key(args)
    if pooled is None or pooled.session not in (pool_key(container_id), session):
        raise PluginError(f"{container_id} is not a pooled namespace of this host free for this session: never reused")
    if args.get("NOMAD_NAMESPACE") == POOL_NAMESPACE:
        raise PluginError(f"a pooled namespace is bound to a session, not to the {POOL_NAMESPACE} namespace")
    kernel = pooled._replace(session=session, published=published_ports(config))
    known = [k for k in members.all_kernels() if k.container_id != container_id]
    losing = enter(kernel, known, members, str(config["bridge"]), [RULES])
    for other in losing:
        members.remember(other)
    members.remember(kernel)
    if pooled.session != session:
        members.leave(pooled)
    return kernel


def delete(env: Mapping[str, str], members: Membership) -> None:
    """Idempotent, as CNI requires: a kernel already gone (or never added) is no error."""
    members.lock()
    kernel = members.recall(env["CNI_CONTAINERID"])
    if kernel is not None:
        dropped, kept = members.without_remote([kernel.address])
        unpublished = unpublish(published_now(), [kernel.address])
        nft([RULES, *dropped, *removal_commands(kernel, members.others(kernel)), *unpublished])
        if kept is not None:
            members.keep_remote_pairs(kept)
        members.forget(kernel)


def check(config: Mapping[str, Any], env: Mapping[str, str], members: Membership) -> None:
    """CHECK (Nomad runs it when it finds an allocation's namespace after a restart): the kernel is known, and its
    elements are asserted again, since a reboot or a flush may have emptied the sets."""
    members.lock()
    kernel = members.recall(env["CNI_CONTAINERID"])
    if kernel is None:
        raise PluginError(f"allocation {env['CNI_CONTAINERID']} is not in a session network on this host")
    elements = element_commands("add", kernel, members.others(kernel), str(config["bridge"]))
    nft([RULES, *data_plane_commands(config), *elements])


def release(subnet: str, members: Membership) -> None:
    """Forget every kernel of a client's subnet (the client is gone for good, maybe killed before its DELs)."""
    import ipaddress  # only here: not on the path of every kernel's start

    network = ipaddress.ip_network(subnet)
    members.lock()
    gone = [k for k in members.all_kernels() if ipaddress.ip_address(k.address) in network]
    listed = published_now()
    # every port leading into the subnet, a record's or not: the subnet is free for another client now
    unpublished = unpublish(listed, {address for _, _, address in listed if ipaddress.ip_address(address) in network})
    if gone or unpublished:
        dropped, kept = members.without_remote([k.address for k in gone])
        nft([RULES, *dropped, *(c for k in gone for c in removal_commands(k, members.others(k))), *unpublished])
        if kept is not None:
            members.keep_remote_pairs(kept)
    for kernel in gone:
        members.forget(kernel)


def main() -> int:
    env = os.environ
    if sys.argv[1:2] == ["release"]:  # caravan.stack.session_network.release: release <subnet> <state dir>
        release(sys.argv[2], Membership(sys.argv[3]))
        return 0
    if sys.argv[1:2] == ["bind"]:  # node_plugins.namespace_pool.bind: bind <container id> <CNI_ARGS>, config on stdin
        try:
            given = json.loads(sys.stdin.read() or "{}")
            bind(given, sys.argv[2], parse_cni_args(sys.argv[3]), Membership(str(given["stateDir"])))
        except (PluginError, KeyError, ValueError, OSError) as exc:
            print(f"caravan-isolation bind: {exc}", file=sys.stderr)
            return 1
        return 0
    command = env.get("CNI_COMMAND", "")
    config: dict[str, Any] = json.loads(sys.stdin.read() or "{}") if command != "VERSION" else {}
    version = str(config.get("cniVersion", "0.4.0"))
    try:
        members = Membership(str(config.get("stateDir", "/run/caravan-cni")))
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
