"""Where a kernel's traffic goes: a network namespace of its own, its published ports, and its cluster peers. Pure.

- **docker and exec kernels** run in a namespace of their own on the client's session network
  (``network { mode = "cni/caravan" }``, set up by ``caravan.stack.session_network`` and guarded by
  ``node_plugins/cni_isolation.py``): they reach the other kernels of their session and nothing else. A preopened port
  (and an INFERENCE service port) is ``port "p<port>" { to = <port> }``: the kernel listens on its own port, Nomad
  publishes it on a host port, and that host port is what ``Kernel.ports`` reports.
- **Cluster sessions** (several kernels, not INFERENCE replicas) find each other by hostname: every kernel registers a
  Nomad service (``address_mode = "alloc"``: its address on the session network, tagged with its hostname), and a
  template renders the registered addresses into ``/local/caravan-peers``; the kernel's bootstrap waits until every
  hostname of ``CARAVAN_CLUSTER_HOSTS`` is listed, adds them to ``/etc/hosts`` and exports the kernel's own address as
  ``CARAVAN_CLUSTER_ADDR`` (``nomad_jobs.session_job.BOOTSTRAP``). A registration lives as long as the kernel's
  allocation: a BATCH sub whose command succeeded stays up until main1 ends (``session_job.waits_for_main``), so no
  peer waits for the address of a sub that ended. Nomad service discovery spans the cluster, so
  multi-node sessions resolve alike; reaching each other across machines needs the nodes' session subnets routed.
- **a pooled namespace**: a single-kernel docker session (INTERACTIVE or BATCH) the scheduler handed a namespace made
  ahead (``nomad_jobs.namespace_keeper``) joins it instead (``network_mode = "container:<name>"``; Docker refuses a
  hostname there, so the pause container was made with the kernel's, :data:`POOLED_HOSTNAME`); the group's network
  is the host's with the same ports, which the keeper publishes into the namespace when it binds it to the session,
  so the kernel is isolated as in a namespace of its own.
- **raw_exec kernels** run on the host's network (they are not isolated anyway: SUPERADMIN only), and so does every
  kernel when the operator turns isolation off (``CARAVAN_SESSION_NETWORK=host``): then each kernel of a cluster gets a
  loopback address of its own (127.x.y.n) and Docker kernels the others' in ``extra_hosts``, as before networks.
- **qemu kernels** get no network block: the VM has no network card at all.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from domain.idle.network import NET_STATS_FILE
from domain.model import Driver, Kernel, Session, SessionType
from nomad_jobs.hcl import Block
from nomad_jobs.replica_service import exposed_ports, port_label, service_name

HOST = "host"
"""``CARAVAN_SESSION_NETWORK`` value for the host's network (no isolation)."""
SESSION_NETWORK = "cni/caravan"
"""The default: each kernel in a namespace of its own on the client's ``caravan`` CNI network."""
POOLED_NAME = re.compile(r"caravan-pool-[0-9a-f]{12}")
"""A pooled namespace's pause container name (``node_plugins.namespace_pool.PREFIX`` and 12 hex digits)."""
POOLED_HOSTNAME = "main1"
"""The hostname of a pooled namespace's pause container, which the kernel joining it takes (Docker refuses one of the
kernel's own there): the hostname of a single-kernel session's kernel, the only kind pooled (:func:`poolable`)."""
PEERS_FILE = "/local/caravan-peers"
"""Where a cluster kernel finds its peers' addresses, ``<address> <hostname>`` per line (the task directory's
``local/`` is mounted at ``/local`` by the docker and exec drivers)."""
NET_STATS_PATH = "/" + NET_STATS_FILE
"""Where an isolated kernel's bootstrap copies its network counters (``domain.idle.network``)."""
PEERS_TEMPLATE = '{{ range nomadService "%s" }}{{ .Address }}{{ range .Tags }} {{ . }}{{ end }}\n{{ end }}'


def is_isolated(session: Session, network_mode: str) -> bool:
    """Whether the session's kernels get a network namespace of their own."""
    return network_mode != HOST and session.driver in (Driver.DOCKER, Driver.EXEC)


def poolable(session: Session, network_mode: str) -> bool:
    """Whether the session may run in a pooled namespace: one docker kernel, isolated, not an INFERENCE endpoint (whose
    replicas are rendered again and replaced)."""
    return (
        is_isolated(session, network_mode)
        and session.driver is Driver.DOCKER
        and len(session.kernels) == 1
        and session.main_kernel.hostname == POOLED_HOSTNAME
        and session.type in (SessionType.INTERACTIVE, SessionType.BATCH)
    )


def has_peers(session: Session) -> bool:
    """Kernels that must find each other by hostname: a cluster session (INFERENCE replicas serve alone)."""
    return len(session.kernels) > 1 and session.type is not SessionType.INFERENCE


def peers_service_name(session: Session) -> str:
    return service_name(session, "caravan-peers-")


def add_network(
    group: Block,
    session: Session,
    kernel: Kernel,
    network_mode: str,
    static_ports: Mapping[int, int] | None = None,
    pooled: str | None = None,
) -> None:
    """The group's ``network`` block (and the peers service of an isolated cluster kernel). ``static_ports``: the
    main kernel's ports published on a host port of their own (container port -> host port: the apps' preferred
    ports the scheduler granted, ``domain.apps.grant_preferred_ports``); every other port gets a dynamic one.
    ``pooled``: the pooled namespace the kernel joins (the host's network mode, the ports published by its keeper)."""
    ports = exposed_ports(session)
    static = (static_ports or {}) if kernel.is_main else {}
    if pooled is not None:
        network = group.block("network")
        for port in ports:
            network.block("port", port_label(port), static=static.get(port), to=port)
    elif is_isolated(session, network_mode):
        # exec cannot set the namespace's hostname (Nomad refuses), docker can: its /etc/hosts then names the kernel
        hostname = kernel.hostname if session.driver is Driver.DOCKER else None
        network = group.block("network", mode=network_mode, hostname=hostname)
        for port in ports:
            network.block("port", port_label(port), static=static.get(port), to=port)
        if has_peers(session):
            group.block(
                "service",
                provider="nomad",
                name=peers_service_name(session),
                tags=[kernel.hostname],
                address_mode="alloc",
            )
    elif ports:
        network = group.block("network")
        for port in ports:
            network.block("port", port_label(port), static=static.get(port))


def add_peers_template(task: Block, session: Session, network_mode: str) -> None:
    """The template that keeps ``/local/caravan-peers`` current (a change does not restart the kernel)."""
    if is_isolated(session, network_mode) and has_peers(session):
        task.block(
            "template",
            destination="local/caravan-peers",
            change_mode="noop",
            data=PEERS_TEMPLATE % peers_service_name(session),
        )


def network_environment(session: Session, kernel: Kernel, network_mode: str) -> dict[str, str]:
    """``CARAVAN_CLUSTER_PEERS`` (isolated clusters: the bootstrap resolves the peers and sets the address) and
    ``CARAVAN_NET_STATS`` (an isolated kernel: where the bootstrap copies its namespace's network counters,
    ``domain.idle.network``), else ``CARAVAN_CLUSTER_ADDR``, the kernel's loopback address on the host's network (whose
    counters are the host's, not the kernel's: not copied)."""
    if is_isolated(session, network_mode):
        net = {"CARAVAN_NET_STATS": NET_STATS_PATH}
        return {"CARAVAN_CLUSTER_PEERS": PEERS_FILE, **net} if has_peers(session) else net
    return {"CARAVAN_CLUSTER_ADDR": loopback_addresses(session)[kernel.hostname]}


def loopback_addresses(session: Session) -> dict[str, str]:
    """Each kernel's address on the host's network: a loopback address of its own (127.x.y.n), so that every kernel
    of a cluster can listen on the same port. ``x.y`` come from the session id, ``n`` is the kernel's index."""
    digest = hashlib.sha256(session.id.encode()).digest()
    first, second = 1 + digest[0] % 254, digest[1]
    return {k.hostname: f"127.{first}.{second}.{k.index}" for k in session.kernels}


def docker_network_config(
    session: Session, kernel: Kernel, network_mode: str, pooled: str | None = None
) -> dict[str, object]:
    """The docker driver's own network settings: none in a namespace of the session network (the group sets it up),
    the pooled namespace's container in one (``pooled``)."""
    if pooled is not None:
        return {"network_mode": f"container:{pooled}"}
    if is_isolated(session, network_mode):
        return {}
    return {
        "network_mode": "host",
        "hostname": kernel.hostname,
        "extra_hosts": [f"{host}:{address}" for host, address in loopback_addresses(session).items()],
    }
