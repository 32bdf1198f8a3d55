"""The isolation plugin's pure parts (its nftables rules run for real in tests/e2e/test_isolation.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from node_plugins import cni_isolation
from node_plugins.cni_isolation import (
    RULES,
    TABLE,
    Kernel,
    PluginError,
    element_commands,
    kernel_of,
    pairs,
    parse_cni_args,
    removal_commands,
    session_key,
)

BRIDGE_RESULT: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "cv1a2b3c", "mac": "aa"},
        {"name": "veth1234", "mac": "bb"},
        {"name": "eth0", "mac": "cc", "sandbox": "/var/run/netns/x"},
    ],
    "ips": [
        {"interface": 2, "address": "172.26.3.7/24", "gateway": "172.26.3.1"},
        {"interface": 2, "address": "fd00::7/64"},
    ],
}


def test_cni_args_as_nomad_passes_them() -> None:
    args = parse_cni_args("IgnoreUnknown=true;NOMAD_NAMESPACE=default;NOMAD_JOB_ID=cv-s1;NOMAD_GROUP_NAME=main1;x")
    assert args == {
        "IgnoreUnknown": "true",
        "NOMAD_NAMESPACE": "default",
        "NOMAD_JOB_ID": "cv-s1",
        "NOMAD_GROUP_NAME": "main1",
    }


def test_a_session_is_a_job_in_a_namespace() -> None:
    key = session_key({"NOMAD_NAMESPACE": "default", "NOMAD_JOB_ID": "cv-s1"})
    assert key == session_key({"NOMAD_JOB_ID": "cv-s1"})
    assert key != session_key({"NOMAD_NAMESPACE": "other", "NOMAD_JOB_ID": "cv-s1"})
    assert key != session_key({"NOMAD_JOB_ID": "cv-s2"})
    with pytest.raises(PluginError, match="NOMAD_JOB_ID"):
        session_key({"IgnoreUnknown": "true"})


def test_the_kernel_is_its_ipv4_address_and_the_host_end_of_its_veth() -> None:
    assert kernel_of(BRIDGE_RESULT, "alloc1", "s") == Kernel("alloc1", "s", "172.26.3.7", "veth1234")
    assert session_key({"NOMAD_JOB_ID": "a/../b"}).isalnum()  # a file name, whatever the job id
    with pytest.raises(PluginError, match="IPv4"):
        kernel_of({**BRIDGE_RESULT, "ips": BRIDGE_RESULT["ips"][1:]}, "alloc1", "s")
    with pytest.raises(PluginError, match="veth"):
        kernel_of({**BRIDGE_RESULT, "interfaces": BRIDGE_RESULT["interfaces"][2:]}, "alloc1", "s")


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        ([], []),
        (["10.0.0.2"], ["10.0.0.1 . 10.0.0.2", "10.0.0.2 . 10.0.0.1"]),
        (
            ["10.0.0.2", "10.0.0.3"],
            ["10.0.0.1 . 10.0.0.2", "10.0.0.2 . 10.0.0.1", "10.0.0.1 . 10.0.0.3", "10.0.0.3 . 10.0.0.1"],
        ),
        (["10.0.0.1"], []),  # itself (a stale record of its own address) is no peer
    ],
)
def test_peers_are_pairs_both_ways(others: list[str], expected: list[str]) -> None:
    assert pairs("10.0.0.1", others) == expected


def test_adding_a_kernel_names_its_bridge_port_address_and_peers_in_both_tables() -> None:
    kernel = Kernel("a", "s", "10.0.0.1", "veth1")
    added = element_commands("add", kernel, ["10.0.0.2"], "cv1")
    assert added == [
        f'add element inet {TABLE} bridges {{ "cv1" }}',
        f"add element inet {TABLE} peers {{ 10.0.0.1 . 10.0.0.2, 10.0.0.2 . 10.0.0.1 }}",
        f"add element bridge {TABLE} peers {{ 10.0.0.1 . 10.0.0.2, 10.0.0.2 . 10.0.0.1 }}",
        f'add element bridge {TABLE} kernel_ports {{ "veth1" }}',
        f'add element bridge {TABLE} ports {{ "veth1" . 10.0.0.1 }}',
    ]
    removed = element_commands("delete", kernel, [], "")
    assert removed == [
        f'delete element bridge {TABLE} kernel_ports {{ "veth1" }}',
        f'delete element bridge {TABLE} ports {{ "veth1" . 10.0.0.1 }}',
    ]


def test_removal_adds_first_so_that_an_element_already_gone_is_no_error() -> None:
    kernel = Kernel("a", "s", "10.0.0.1", "veth1")
    assert removal_commands(kernel, []) == [
        f'add element bridge {TABLE} kernel_ports {{ "veth1" }}',
        f'add element bridge {TABLE} ports {{ "veth1" . 10.0.0.1 }}',
        f'delete element bridge {TABLE} kernel_ports {{ "veth1" }}',
        f'delete element bridge {TABLE} ports {{ "veth1" . 10.0.0.1 }}',
    ]


def test_the_rules_and_elements_are_one_valid_nftables_transaction() -> None:
    kernel = Kernel("a", "s", "10.0.0.1", "veth1")
    script = "\n".join(
        [RULES, *element_commands("add", kernel, ["10.0.0.2"], "cv1"), *removal_commands(kernel, ["10.0.0.2"])]
    )
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_a_torn_record_is_skipped_and_records_are_written_whole(tmp_path: Path) -> None:
    """A plugin killed mid-write once left an empty record, and every later ADD on the host failed ("Expecting
    value"), so every docker and exec kernel went to ERROR. Records are now renamed into place, and a torn one
    (left by an older plugin) is skipped."""
    members = cni_isolation.Membership(str(tmp_path))
    first = cni_isolation.Kernel("c1", "ns/job-a", "10.99.0.2", "veth1")
    second = cni_isolation.Kernel("c2", "ns/job-a", "10.99.0.3", "veth2")
    members.remember(first)
    members.remember(second)
    (tmp_path / "containers" / "torn").write_text("")
    session_dir = next((tmp_path / "sessions").iterdir())
    (session_dir / "torn").write_text("{")
    assert members.all_kernels() == [first, second]
    assert members.others(first) == ["10.99.0.3"]
    assert members.recall("torn") is None
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # nothing half-written left behind


def test_remote_pairs_go_both_ways_in_the_inet_table_and_validate_with_the_rules() -> None:
    remote = [["10.0.0.1", "10.0.9.1"]]
    assert cni_isolation.remote_commands("add", remote) == [
        f"add element inet {TABLE} peers {{ 10.0.0.1 . 10.0.9.1, 10.0.9.1 . 10.0.0.1 }}"
    ]
    assert cni_isolation.remote_commands("delete", []) == []
    script = "\n".join([RULES, *cni_isolation.remote_commands("delete", remote)])
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_a_kernel_that_comes_or_goes_takes_its_remote_pairs_with_it(tmp_path: Path) -> None:
    """An address reused on this host must not inherit the cross-host pairs of the kernel that had it before: the
    plugin drops them (record and nft commands) whatever the session-peers daemon has not seen yet."""
    members = cni_isolation.Membership(str(tmp_path))
    assert members.without_remote(["10.0.0.1"]) == ([], None)
    members.keep_remote_pairs([["10.0.0.1", "10.0.9.1"], ["10.0.0.2", "10.0.9.1"]])
    commands, kept = members.without_remote(["10.0.0.1"])
    assert kept == [["10.0.0.2", "10.0.9.1"]]
    assert commands == cni_isolation.remote_commands("delete", [["10.0.0.1", "10.0.9.1"]])
    assert members.remote_pairs() == [["10.0.0.1", "10.0.9.1"], ["10.0.0.2", "10.0.9.1"]]  # kept once nft applied


def test_published_ports_as_nomad_passes_them_and_nothing_else() -> None:
    """Nomad writes the CNI ``portMappings`` with Go's field names (``HostPort``...), CNI's convention is
    ``hostPort``: both are read; anything that is not a port, a protocol or an IPv4 address is refused (the values
    are written into an nft script), an IPv6 host address skipped (the session network is IPv4)."""
    mappings = [
        {"HostPort": 31001, "ContainerPort": 8888, "Protocol": "tcp", "HostIP": ""},
        {"hostPort": 31001, "containerPort": 8888, "protocol": "udp", "hostIP": "127.0.0.1"},
        {"hostPort": 31002, "containerPort": 22, "protocol": "tcp", "hostIP": "fd00::1"},
    ]
    config = {"runtimeConfig": {"portMappings": mappings}}
    assert cni_isolation.published_ports(config) == (("", "tcp", 31001, 8888), ("127.0.0.1", "udp", 31001, 8888))
    assert cni_isolation.published_ports({}) == ()
    for bad in (
        {"hostPort": 31001, "containerPort": 8888, "protocol": "sctp"},
        {"hostPort": 0, "containerPort": 8888},
        {"hostPort": 31001, "containerPort": 8888, "hostIP": "127.0.0.1 } ; flush ruleset ; {"},
    ):
        with pytest.raises(PluginError, match="port mapping"):
            cni_isolation.published_ports({"runtimeConfig": {"portMappings": [bad]}})


def test_a_kernels_published_ports_come_and_go_with_it_in_the_same_transaction() -> None:
    """CNI's portmap plugin (a process of its own and a dozen iptables calls per kernel) is replaced by two nft maps
    of this plugin's transaction: a published port leads to the kernel's port, and goes when the kernel does."""
    kernel = Kernel("a", "s", "10.0.0.1", "veth1", (("", "tcp", 31001, 8888), ("127.0.0.1", "udp", 31001, 53)))
    added = element_commands("add", kernel, [], "cv1")
    assert added[-2:] == [
        f"add element ip {TABLE} anyports {{ tcp . 31001 : 10.0.0.1 . 8888 }}",
        f"add element ip {TABLE} hostports {{ 127.0.0.1 . udp . 31001 : 10.0.0.1 . 53 }}",
    ]
    listed = [("anyports", "tcp . 31001", "10.0.0.1"), ("hostports", "127.0.0.1 . udp . 31001", "10.0.0.1")]
    removed = cni_isolation.unpublish(listed, ["10.0.0.1"])
    assert removed == [
        f"delete element ip {TABLE} anyports {{ tcp . 31001 }}",
        f"delete element ip {TABLE} hostports {{ 127.0.0.1 . udp . 31001 }}",
    ]
    assert not any("ports" in c and " ip " in c for c in removal_commands(kernel, []))  # only as listed, below
    script = "\n".join([RULES, *added, *removed])
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert "dnat ip to" in RULES and "masquerade" in RULES


def test_a_host_port_handed_out_again_goes_to_the_new_kernel_only(tmp_path: Path) -> None:
    """An older record still holding the host port (its DEL never ran) loses that port, and only that: the new
    kernel's element is added after the old one's is removed (the same key with another value would fail the whole
    transaction), and the old record no longer names the port, so its late DEL cannot remove the new kernel's."""
    old = Kernel("old", "s1", "10.0.0.5", "veth5", (("", "tcp", 31001, 80), ("", "tcp", 31009, 81)))
    other = Kernel("other", "s2", "10.0.0.6", "veth6", (("", "tcp", 31002, 80),))
    new = Kernel("new", "s3", "10.0.0.7", "veth7", (("", "tcp", 31001, 8888),))
    losing = cni_isolation.ports_taken_over(new, [old, other])
    assert losing == [old._replace(published=(("", "tcp", 31009, 81),))]
    listed = [
        ("anyports", "tcp . 31001", "10.0.0.5"),
        ("anyports", "tcp . 31009", "10.0.0.5"),
        ("anyports", "tcp . 31002", "10.0.0.6"),
    ]
    commands = cni_isolation.unpublish(listed, [new.address], cni_isolation.taken_keys(new))
    assert commands == [f"delete element ip {TABLE} anyports {{ tcp . 31001 }}"]
    script = "\n".join(
        [RULES, *element_commands("add", old, [], "cv1"), *commands, *element_commands("add", new, [], "cv1")]
    )
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    members = cni_isolation.Membership(str(tmp_path))
    members.remember(losing[0])
    assert members.recall("old") == losing[0]  # published ports survive the record's round trip


def test_a_port_without_a_host_address_is_published_on_the_hosts_own_address() -> None:
    """Nomad gives no host address in a CNI network: the port goes on the configuration's ``hostAddress`` (the client's
    own address), never on every address of the host (``anyports``), which a machine on the hosts' network reaches."""
    mappings = [{"HostPort": 31001, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""}]
    config = {"hostAddress": "172.26.255.12", "runtimeConfig": {"portMappings": mappings}}
    assert cni_isolation.published_ports(config) == (("172.26.255.12", "tcp", 31001, 8080),)
    with pytest.raises(PluginError, match="hostAddress"):
        cni_isolation.published_ports({**config, "hostAddress": "172.26.255.12 } ; flush ruleset ; {"})


def test_only_the_data_plane_reaches_a_published_port_from_beyond_the_host() -> None:
    """The forward chain lets a DNATed connection in only from the ``data_plane`` set, which every transaction sets
    to the configuration's ``dataPlane`` (none: only the host itself, whose own connections are never forwarded)."""
    assert "oifname @bridges ct status dnat ip saddr @data_plane accept" in RULES
    assert "oifname @bridges ct status dnat accept" not in RULES
    commands = cni_isolation.data_plane_commands({"dataPlane": ["172.26.255.1", "172.26.254.0/24"]})
    assert commands == [
        f"flush set inet {TABLE} data_plane",
        f"add element inet {TABLE} data_plane {{ 172.26.255.1, 172.26.254.0/24 }}",
    ]
    assert cni_isolation.data_plane_commands({}) == [f"flush set inet {TABLE} data_plane"]
    for bad in (["172.26.255.1 } ; flush ruleset ; {"], ["10.0.0.0/33"], "172.26.255.1"):
        with pytest.raises(PluginError, match="dataPlane"):
            cni_isolation.data_plane_commands({"dataPlane": bad})
    checked = subprocess.run(
        ["nft", "-c", "-f", "-"], input="\n".join([RULES, *commands]), text=True, capture_output=True
    )
    assert checked.returncode == 0, checked.stderr


NFT_LISTING = {
    "nftables": [
        {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
        {"table": {"family": "ip", "name": TABLE, "handle": 5}},
        {
            "map": {
                "family": "ip",
                "name": "hostports",
                "table": TABLE,
                "type": ["ipv4_addr", "inet_proto", "inet_service"],
                "map": "ipv4_addr . inet_service",
                "elem": [
                    [{"concat": ["127.0.0.1", "tcp", 34883]}, {"concat": ["172.26.28.2", 8888]}],
                    [{"concat": ["127.0.0.1", "udp", 6]}, {"concat": ["172.26.28.3", 53]}],
                    {"elem": {"val": "not ours", "timeout": 5}},  # a form this plugin never writes: skipped
                ],
            }
        },
        {"map": {"family": "ip", "name": "anyports", "table": TABLE, "type": ["inet_proto", "inet_service"]}},
        {"chain": {"family": "ip", "table": TABLE, "name": "prerouting"}},
    ]
}


def test_published_ports_are_read_from_nfts_listing_and_removed_by_where_they_lead() -> None:
    """A port published for a kernel whose record is gone (a DEL that never ran, records lost) once stayed in the map
    after its namespace was deleted, leading a host port to the next kernel given that address. Ports are now removed
    as nft lists them: by the address they lead to, and for a kernel that comes, by the keys it takes."""
    listed = cni_isolation.listed_ports(json.dumps(NFT_LISTING))
    assert listed == [
        ("hostports", "127.0.0.1 . tcp . 34883", "172.26.28.2"),
        ("hostports", "127.0.0.1 . udp . 6", "172.26.28.3"),
    ]
    assert cni_isolation.unpublish(listed, ["172.26.28.2"]) == [
        f"delete element ip {TABLE} hostports {{ 127.0.0.1 . tcp . 34883 }}"
    ]
    coming = Kernel("new", "s", "172.26.28.9", "veth9", (("127.0.0.1", "udp", 6, 8080),))
    assert cni_isolation.unpublish(listed, [coming.address], cni_isolation.taken_keys(coming)) == [
        f"delete element ip {TABLE} hostports {{ 127.0.0.1 . udp . 6 }}"
    ]
    assert cni_isolation.unpublish(listed, ["172.26.28.4"]) == []
