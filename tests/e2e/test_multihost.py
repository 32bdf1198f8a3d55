"""Session networks across hosts, on the multi-host test cluster (``tests/multihost_fixtures.py``): two hosts, each a
network namespace with its own Nomad client, session bridge, isolation rules and session-peers daemon; three servers.

A cluster session's two kernels land on different hosts and reach each other by hostname, both ways (their subnets
routed between the hosts, the pairs let through by each host's agent from Nomad's allocations). A kernel of another
session on each host then tries everything a tenant should not reach: the session's kernels (one on its own host, one
across), every Nomad server and every host's Nomad client (HTTP and RPC), and the machine's end of the hosts' link
(Redis, the gateway, the dev Nomad); nothing answers. When the session ends, its cross-host pairs are taken back.
Traffic goes only to the cluster's own addresses in 172.26.0.0/16.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from caravan.stack import multihost
from caravan.stack.multihost import ROOT_ADDRESS, MultiHostCluster, server_address
from caravan.stack.session_network import MEMBERSHIP_DIR
from node_plugins.cni_isolation import Membership
from nomad_jobs import session_peers
from tests.conftest import DEFAULT_IMAGE, DOCKER
from tests.harness import CREATE, Caravan
from tests.multihost_fixtures import HOSTS, OnMultihost

PORT = 7000
SERVE = (
    f'mkdir -p /tmp/w && echo "from $CARAVAN_CLUSTER_HOST" > /tmp/w/index.html && httpd -p {PORT} -h /tmp/w; '
    'other=sub1; [ "$CARAVAN_CLUSTER_ROLE" = main ] || other=main1; '
    "for i in $(seq 150); do "
    f'got=$(printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 2 $other {PORT} | tail -1); '
    '[ -n "$got" ] && break; sleep 0.2; done; '
    'echo "got=$got me=$CARAVAN_CLUSTER_ADDR"; exec sleep 3600'
)
"""Each kernel serves its name, fetches its peer's page by the peer's hostname, and prints what came back."""

DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }"
KERNEL_LOGS = "query($id: ID!) { session(id: $id) { kernels { hostname logs { stdout } } } }"


def intruder_script(targets: list[tuple[str, str, int]]) -> str:
    """Every attempt at once (a refused one waits out its timeout): ``NET <name> <addr>:<port> => <answer> rc=<n>``
    per attempt; rc 0 means a connection was made."""
    request = "GET / HTTP/1.0\\r\\n\\r\\n"
    lines = [
        f'( printf "{request}" | timeout 8 nc -w 3 {address} {port} > /tmp/{i} 2>&1; rc=$?; '
        f'out=$(head -c 200 /tmp/{i} | tr "\\r\\n" "  "); echo "NET {name} {address}:{port} => $out rc=$rc" ) &'
        for i, (name, address, port) in enumerate(targets)
    ]
    return "\n".join([*lines, "wait", "echo PROBE-DONE"]) + "\n"


def reached(line: str) -> bool:
    """A connection made (busybox nc exits 0 once connected) or anything that answered."""
    answer = line.split(" => ", 1)[1]
    return not answer.endswith("rc=1") or "HTTP/" in answer or "from " in answer


async def kernel_logs(caravan: Caravan, session_id: str) -> dict[str, str]:
    data = await caravan.gql(KERNEL_LOGS, {"id": session_id})
    return {k["hostname"]: (k["logs"] or {}).get("stdout", "") for k in data["session"]["kernels"]}


async def spanning_session(caravan: Caravan, cluster: MultiHostCluster, driver: str) -> tuple[str, dict[str, str]]:
    """A 2-kernel cluster session of ``driver`` with a kernel on each host, once each kernel fetched the other's page
    by hostname: its id and its kernels' addresses by hostname."""
    image = {"image": DEFAULT_IMAGE} if driver == "DOCKER" else {}
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "name": "spans",
                "type": "INTERACTIVE",
                "driver": driver,
                **image,
                "clusterSize": 2,
                "clusterMode": "MULTI_NODE",
                "resources": [{"slot": "cpu", "amount": "2"}, {"slot": "mem", "amount": "128m"}],
                "startupCommand": SERVE,
            }
        },
    )
    [session] = data["createSession"]["sessions"]
    await caravan.wait_for(session["id"], "RUNNING", timeout=120)
    stored = await caravan.store.get(session["id"])
    assert stored is not None
    names = cluster.node_names
    placed = {k.hostname: names[k.agent or ""] for k in stored.kernels}
    assert sorted(placed.values()) == sorted(h.name for h in HOSTS), placed  # one kernel on each host
    addresses = {
        k.hostname: (await caravan.nomad.allocation(k.alloc_id or ""))["NetworkStatus"]["Address"]
        for k in stored.kernels
    }
    deadline = time.monotonic() + 90
    logs = await kernel_logs(caravan, session["id"])
    while not all("got=" in text for text in logs.values()):
        assert time.monotonic() < deadline, logs
        await asyncio.sleep(0.5)
        logs = await kernel_logs(caravan, session["id"])
    # by hostname, across hosts, both ways
    assert f"got=from sub1 me={addresses['main1']}" in logs["main1"], logs
    assert f"got=from main1 me={addresses['sub1']}" in logs["sub1"], logs
    return session["id"], addresses


async def nothing_reached(
    caravan: Caravan, cluster: MultiHostCluster, driver: str, targets: list[tuple[str, str, int]]
) -> None:
    """A BATCH session of ``driver`` on each host (another session: another tenant's network) tries every target;
    none answers."""
    image = {"image": DEFAULT_IMAGE} if driver == "DOCKER" else {}
    intruders = {}
    for host in HOSTS:
        created = await caravan.gql(
            CREATE,
            {
                "input": {
                    "name": f"intruder-{host.name}",
                    "type": "BATCH",
                    "driver": driver,
                    **image,
                    "designatedAgent": cluster.node_ids[host.name],
                    "startupCommand": intruder_script(targets),
                }
            },
        )
        intruders[host.name] = created["createSession"]["sessions"][0]["id"]
    for host_name, intruder in intruders.items():
        ended = await caravan.wait_for(intruder, "TERMINATED", "ERROR", timeout=120)
        stdout = ended["mainKernel"]["logs"]["stdout"]
        assert "PROBE-DONE" in stdout, ended
        attempts = [line for line in stdout.splitlines() if line.startswith("NET ")]
        assert len(attempts) == len(targets), stdout
        assert [line for line in attempts if reached(line)] == [], f"from {host_name}: reached what it must not"


KILLED_RUN = """
import json, sys, time, urllib.request
from pathlib import Path
from caravan.stack.multihost import start_multihost_cluster
from caravan.stack.nomad_cluster import ClientSpec

state, nomad_home, rootfs = map(Path, sys.argv[1:4])
pause, image = sys.argv[4:6]  # with Docker: a docker kernel too
cluster = start_multihost_cluster(
    state, nomad_home=nomad_home, rootfs=rootfs, hosts=[ClientSpec("cvmh-host1", 1000, 512)],
    want_drivers=("exec", "docker") if pause else ("exec",), pause_image=pause or None,
)
task = {"Name": "t", "Driver": "exec", "Config": {"command": "/bin/sleep", "args": ["3600"]},
        "Resources": {"CPU": 100, "MemoryMB": 32}}
groups = [{"Name": "g", "Networks": [{"Mode": "cni/caravan"}], "Tasks": [task]}]
if pause:
    docker = {**task, "Driver": "docker", "Config": {"image": image, "command": "/bin/sleep", "args": ["3600"]}}
    groups.append({"Name": "d", "Networks": [{"Mode": "cni/caravan"}], "Tasks": [docker]})
job = {"ID": "cvmh-swept", "Type": "service", "Datacenters": ["dc1"], "TaskGroups": groups}
headers = {"X-Nomad-Token": cluster.token or "", "Content-Type": "application/json"}
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(cluster.addr + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())
call("POST", "/v1/jobs", {"Job": job})
for _ in range(600):
    running = {a["TaskGroup"]: a["ID"] for a in call("GET", "/v1/job/cvmh-swept/allocations")
               if a["ClientStatus"] == "running"}
    if len(running) == len(groups):
        break
    time.sleep(0.2)
started = {"subnet": cluster.hosts["cvmh-host1"].network.subnet, "alloc": running["g"], "docker": running.get("d")}
print(json.dumps(started), flush=True)
time.sleep(3600)
"""


def namespaces() -> list[str]:
    listed = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return [str(n["name"]) for n in json.loads(listed or "[]")]


def members(namespace: str) -> list[int]:
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    return [int(pid) for pid in listed.split()]


def containers(allocation: str) -> list[str]:
    """Docker's containers (running or not) of a Nomad allocation."""
    label = f"label={multihost.ALLOC_LABEL}={allocation}"
    return subprocess.run(["docker", "ps", "-aq", "--filter", label], capture_output=True, text=True).stdout.split()


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def all_dead(pids: list[int], within: float = 10.0) -> list[int]:
    """The pids still running after ``within`` seconds (a SIGKILL lands at once, but not in the same instant)."""
    deadline = time.monotonic() + within
    while (running := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return running


@pytest.mark.cluster
def test_what_a_killed_run_left_is_swept_at_the_next_start(tmp_path: Path) -> None:
    """A run killed with its cluster up leaves servers, a client, an agent, a kernel in its own allocation namespace,
    the hosts' namespaces and link, a subnet reservation (and, with Docker, a docker kernel and its pause
    container in the machine's daemon); the sweep (the next start's first step) removes them all.
    (Runs first in this module: one multi-host cluster at a time on a machine, and the fixture's is not up yet.)"""
    from tests.conftest import STACK

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLED_RUN,
            str(tmp_path / "state"),
            STACK["CARAVAN_NOMAD_HOME"],
            STACK["CARAVAN_ROOTFS"],
            STACK.get("CARAVAN_PAUSE_IMAGE", "") if DOCKER else "",
            DEFAULT_IMAGE,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=multihost.PROJECT,
    )
    try:
        assert child.stdout is not None
        started = json.loads(child.stdout.readline() or "{}")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()  # else it is closed at garbage collection, with a ResourceWarning (an error here)
    assert started, "the killed run never got its kernel running"
    subnet = ipaddress.IPv4Network(started["subnet"])
    reservation = MEMBERSHIP_DIR / "subnets" / str(subnet).replace("/", "_")
    left = [pid for namespace in ("cvmh-host1", "cvmh-srv1", started["alloc"]) for pid in members(namespace)]
    kernels = members(started["alloc"])
    assert kernels and left and reservation.exists() and "cvmh-link" in namespaces()
    if DOCKER:  # the docker kernel and its pause container, in the machine's one Docker daemon
        assert len(containers(started["docker"])) == 2, containers(started["docker"])

    multihost.sweep()

    assert [n for n in namespaces() if n.startswith("cvmh-")] == []
    assert started["alloc"] not in namespaces()  # the kernel's allocation namespace, found by its address
    assert all_dead(left) == [], "processes of the killed run (its kernel too) are alive"
    assert not reservation.exists() and not multihost.RECORDS.exists()
    assert subprocess.run(["ip", "link", "show", multihost.ROOT_VETH], capture_output=True).returncode != 0
    assert subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split() == []
    if DOCKER:
        assert containers(started["docker"]) == [], "the killed run's docker kernel is left in Docker"


@pytest.mark.parametrize("driver", ["EXEC", pytest.param("DOCKER", marks=pytest.mark.docker)])
async def test_a_cluster_session_spans_two_hosts_and_nothing_else_reaches_its_kernels(
    on_multihost: OnMultihost,
    multihost_cluster: MultiHostCluster,
    driver: str,
) -> None:
    """The session's kernels and the intruders run with ``driver``: exec, or docker (the machine's one Docker daemon
    serves every host; each host's client runs the CNI chain in its own namespace)."""
    cluster = multihost_cluster
    async with on_multihost() as caravan:
        session_id, addresses = await spanning_session(caravan, cluster, driver)

        settings = caravan.settings
        root_ports = {
            "redis": urlparse(settings.redis.url).port or 6379,
            "gateway": urlparse(caravan.url).port or 80,
        }
        targets = [(f"kernel-{name}", address, PORT) for name, address in addresses.items()]
        targets += [(f"server{i + 1}-{p}", server_address(i), p) for i in range(3) for p in (4646, 4647)]
        targets += [(f"client-{h.name}-{p}", h.address, p) for h in cluster.hosts.values() for p in (4646, 4647)]
        targets += [  # each host's end of its session bridge
            (f"bridge-{h.name}", str(ipaddress.IPv4Network(h.network.subnet)[1]), 4646) for h in cluster.hosts.values()
        ]
        targets += [(f"machine-{name}", ROOT_ADDRESS, port) for name, port in root_ports.items()]
        await nothing_reached(caravan, cluster, driver, targets)

        await caravan.gql(DESTROY, {"ids": [session_id]})
        await caravan.wait_for(session_id, "TERMINATED", timeout=90)
        ours = set(addresses.values())
        deadline = time.monotonic() + 30
        while left := [
            pair
            for host in cluster.hosts.values()
            for pair in Membership(str(host.members_dir)).remote_pairs()
            if ours & set(pair)
        ]:
            assert time.monotonic() < deadline, f"cross-host pairs of an ended session are still let through: {left}"
            await asyncio.sleep(0.5)


HOSTS_ONLY = f"""
table bridge {multihost.PREFIX}_hosts_only {{
  chain forward {{
    type filter hook forward priority 0; policy accept;
    ether type ip ip saddr != {multihost.HOST_NETWORK} drop
    ether type ip ip daddr != {multihost.HOST_NETWORK} drop
  }}
}}
"""
"""The hosts' link made a network that carries only the hosts' own addresses (no router there knows the sessions'
subnets): what the VXLAN overlay is for."""


def hosts_only(on: bool) -> None:
    script = HOSTS_ONLY if on else f"delete table bridge {multihost.PREFIX}_hosts_only\n"
    subprocess.run([*multihost.enter(multihost.LINK_NAMESPACE), "nft", "-f", "-"], input=script, text=True, check=on)


async def test_over_vxlan_a_session_spans_hosts_whose_link_carries_only_their_own_addresses(
    on_multihost: OnMultihost,
    multihost_cluster: MultiHostCluster,
) -> None:
    """The session-peers daemons switched to ``--overlay vxlan``; the link then drops every packet from or to
    anything but a host's address, so routed session subnets cannot cross it (the routed overlay fails here: its
    kernels never fetch each other's page). Over VXLAN the kernels reach each other by hostname, each host's routes
    go through its VXLAN device, and another session's kernel on either host still reaches neither kernel."""
    cluster = multihost_cluster
    cluster.set_overlay(session_peers.VXLAN)
    hosts_only(True)
    try:
        async with on_multihost() as caravan:
            session_id, addresses = await spanning_session(caravan, cluster, "EXEC")
            for host in cluster.hosts.values():
                shown = cluster.in_host(host.name, ["ip", "-j", "route", "show", "proto", session_peers.ROUTE_PROTOCOL])
                assert {r["dev"] for r in json.loads(shown.stdout)} == {session_peers.VXLAN_DEVICE}, shown.stdout
            targets = [(f"kernel-{name}", address, PORT) for name, address in addresses.items()]
            await nothing_reached(caravan, cluster, "EXEC", targets)
            await caravan.gql(DESTROY, {"ids": [session_id]})
            await caravan.wait_for(session_id, "TERMINATED", timeout=90)
    finally:
        hosts_only(False)
        cluster.set_overlay(session_peers.ROUTED)
