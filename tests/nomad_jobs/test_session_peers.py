"""The session-peers daemon's pure decisions (it runs for real in tests/e2e/test_multihost.py)."""

from __future__ import annotations

import ipaddress
from typing import Any

from node_plugins.cni_isolation import Kernel, session_key
from nomad_jobs import session_peers
from nomad_jobs.session_peers import (
    ADDRESS_META,
    SUBNET_META,
    RemoteKernel,
    hosts_of,
    remote_kernels,
    wanted_pairs,
    wanted_routes,
)

SUPERNET = ipaddress.IPv4Network("172.26.0.0/16")


def node(node_id: str, subnet: str, address: str, status: str = "ready") -> dict[str, Any]:
    return {"ID": node_id, "Status": status, "Meta": {SUBNET_META: subnet, ADDRESS_META: address}}


def alloc(node_id: str, job: str, address: str, namespace: str = "default") -> dict[str, Any]:
    return {"NodeID": node_id, "JobID": job, "Namespace": namespace, "NetworkStatus": {"Address": address}}


def test_hosts_are_ready_nodes_with_a_session_subnet_of_the_supernet_claimed_by_no_other() -> None:
    hosts = hosts_of(
        [
            node("a", "172.26.1.0/24", "172.26.255.11"),
            node("b", "172.26.2.0/24", "172.26.255.12"),
            node("down", "172.26.3.0/24", "172.26.255.13", status="down"),
            node("outside", "10.1.0.0/24", "172.26.255.14"),
            node("liar", "172.26.2.128/25", "172.26.255.15"),  # overlaps b: neither counts
            {"ID": "plain", "Status": "ready", "Meta": {}},
            node("bad", "not a subnet", "172.26.255.16"),
        ],
        SUPERNET,
    )
    assert set(hosts) == {"a"}
    assert wanted_routes(hosts, me="x") == {"172.26.1.0/24": "172.26.255.11"}
    assert wanted_routes(hosts, me="a") == {}


def test_over_vxlan_a_hosts_subnet_goes_to_its_gateway_behind_a_mac_of_its_address() -> None:
    """VXLAN: the route goes to the other host's subnet gateway, a static neighbour on the device whose MAC (locally
    administered) is derived from that host's address, found in the forwarding database at the address."""
    hosts = hosts_of([node("a", "172.26.1.0/24", "172.26.255.11")], SUPERNET)
    assert wanted_routes(hosts, me="x", overlay=session_peers.VXLAN) == {"172.26.1.0/24": "172.26.1.1"}
    assert session_peers.vxlan_mac("172.26.255.11") == "02:ca:ac:1a:ff:0b"


def test_remote_kernels_are_other_hosts_allocations_inside_their_own_subnet() -> None:
    hosts = hosts_of(
        [node("a", "172.26.1.0/24", "172.26.255.11"), node("b", "172.26.2.0/24", "172.26.255.12")], SUPERNET
    )
    found = remote_kernels(
        [
            alloc("b", "job1", "172.26.2.5"),
            alloc("b", "job1", "172.26.1.9"),  # claims an address of another host's subnet: ignored
            alloc("a", "job1", "172.26.1.5"),  # on this host: the plugin's own records
            alloc("b", "job2", ""),  # no address yet
            alloc("unknown", "job1", "172.26.7.5"),
        ],
        hosts,
        me="a",
    )
    session = session_key({"NOMAD_NAMESPACE": "default", "NOMAD_JOB_ID": "job1"})
    assert found == [RemoteKernel(session, "b", "172.26.2.5")]


def test_pairs_join_each_local_kernel_to_its_own_sessions_remote_kernels_only() -> None:
    one = session_key({"NOMAD_NAMESPACE": "default", "NOMAD_JOB_ID": "job1"})
    two = session_key({"NOMAD_NAMESPACE": "other", "NOMAD_JOB_ID": "job1"})  # same job id, another namespace
    local = [Kernel("c1", one, "172.26.1.5", "veth1"), Kernel("c2", two, "172.26.1.6", "veth2")]
    remote = [RemoteKernel(one, "b", "172.26.2.5"), RemoteKernel(one, "b", "172.26.2.6")]
    assert wanted_pairs(local, remote) == {("172.26.1.5", "172.26.2.5"), ("172.26.1.5", "172.26.2.6")}
