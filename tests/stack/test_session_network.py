"""Session networks of Nomad clients on one host: a bridge and a /24 each, kept across restarts, freed at the end."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from caravan.stack.session_network import SESSION_SUPERNET, release, session_network


def test_clients_get_distinct_subnets_before_any_bridge_exists(tmp_path: Path) -> None:
    first, second = session_network(tmp_path / "a"), session_network(tmp_path / "b")
    try:
        assert first.bridge != second.bridge and len(first.bridge) <= 15
        assert first.subnet != second.subnet
        assert all(ipaddress.ip_network(n.subnet).subnet_of(SESSION_SUPERNET) for n in (first, second))
        conflist = json.loads((Path(first.config_dir) / "caravan.conflist").read_text())
        assert [p["type"] for p in conflist["plugins"]] == ["loopback", "bridge", "portmap", "caravan-isolation"]
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
