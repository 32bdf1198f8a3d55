"""Session networks of Nomad clients on one host: a bridge and a /24 each, kept across restarts, freed at the end."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from caravan.stack.session_network import HOST_NETWORK, SESSION_SUPERNET, _free_subnet, release, session_network


def test_clients_get_distinct_subnets_before_any_bridge_exists(tmp_path: Path) -> None:
    first, second = session_network(tmp_path / "a"), session_network(tmp_path / "b")
    try:
        assert first.bridge != second.bridge and len(first.bridge) <= 15
        assert first.subnet != second.subnet
        assert all(ipaddress.ip_network(n.subnet).subnet_of(SESSION_SUPERNET) for n in (first, second))
        conflist = json.loads((Path(first.config_dir) / "caravan.conflist").read_text())
        assert [p["type"] for p in conflist["plugins"]] == ["loopback", "bridge", "caravan-isolation"]
        assert conflist["plugins"][1]["ipMasq"] is False  # no egress beyond the host
        shim = Path(first.bin_dir) / "caravan-isolation"
        assert shim.stat().st_mode & 0o111 and "cni_isolation.py" in shim.read_text()
    finally:
        release(first)
        release(second)


def test_a_restarted_client_keeps_its_network_and_a_released_subnet_is_free_again(tmp_path: Path) -> None:
    network = session_network(tmp_path / "a")
    assert session_network(tmp_path / "a") == network
    release(network)
    (tmp_path / "a" / "session-network.json").unlink()
    again = session_network(tmp_path / "c")
    try:
        assert again.subnet == network.subnet  # the first free /24 again
    finally:
        release(again)


def test_the_test_hosts_link_is_never_a_session_subnet() -> None:
    """172.26.255.0/24 holds the multi-host test cluster's host addresses (caravan.stack.multihost): with every other
    /24 taken the allocator says so, rather than hand that one out (and a host namespace's route would then shadow
    a bridge's)."""
    others = [net for net in SESSION_SUPERNET.subnets(new_prefix=24) if net != HOST_NETWORK]
    with pytest.raises(RuntimeError, match="no free /24"):
        _free_subnet("cvtest", others)


def test_a_host_namespace_keeps_its_membership_apart(tmp_path: Path) -> None:
    """A client in a network namespace of its own is a host of its own: its plugin's records go to its directory."""
    network = session_network(tmp_path / "a", tmp_path / "members")
    try:
        conflist = json.loads((Path(network.config_dir) / "caravan.conflist").read_text())
        assert conflist["plugins"][-1]["stateDir"] == str(tmp_path / "members")
        assert session_network(tmp_path / "a").state_dir == str(tmp_path / "members")  # kept across restarts
    finally:
        release(network)


def test_a_hosts_network_publishes_on_its_address_for_its_data_plane_at_its_mtu(tmp_path: Path) -> None:
    """A host of the multi-host cluster: its ports on its own address, reached from its data plane alone, its
    kernels at the VXLAN device's MTU; a client on one machine: its loopback, no data plane, the default MTU."""
    network = session_network(
        tmp_path / "a", tmp_path / "members", host_address="172.26.255.12", data_plane=("172.26.255.1",), mtu=1450
    )
    try:
        bridge, isolation = json.loads((Path(network.config_dir) / "caravan.conflist").read_text())["plugins"][1:]
        assert (isolation["hostAddress"], isolation["dataPlane"], bridge["mtu"]) == (
            "172.26.255.12",
            ["172.26.255.1"],
            1450,
        )
        plain = json.loads((Path(session_network(tmp_path / "a").config_dir) / "caravan.conflist").read_text())
        assert (plain["plugins"][2]["hostAddress"], plain["plugins"][2]["dataPlane"]) == ("127.0.0.1", [])
        assert "mtu" not in plain["plugins"][1]
    finally:
        release(network)
