"""Session networks across hosts, on the multi-host test cluster (``tests/multihost_fixtures.py``): two hosts, each a
network namespace with its own Nomad client, session bridge, isolation rules and session-peers agent; three servers.

A cluster session's two kernels land on different hosts and reach each other by hostname, both ways (their subnets
routed between the hosts, the pairs let through by each host's agent from Nomad's allocations). A kernel of another
session on each host then tries everything a tenant should not reach: the session's kernels (one on its own host, one
across), every Nomad server and every host's Nomad client (HTTP and RPC), and the machine's end of the hosts' link
(Redis, the gateway, the dev Nomad); nothing answers. When the session ends, its cross-host pairs are taken back.
Traffic goes only to the cluster's own addresses in 172.26.0.0/16.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlparse

from caravan.stack.multihost import ROOT_ADDRESS, MultiHostCluster, server_address
from nomad_jobs.cni_isolation import Membership
from tests.harness import CREATE, Caravan
from tests.multihost_fixtures import HOSTS, OnMultihost, multihost_cluster, on_multihost  # noqa: F401

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


async def test_a_cluster_session_spans_two_hosts_and_nothing_else_reaches_its_kernels(
    on_multihost: OnMultihost,  # noqa: F811
    multihost_cluster: MultiHostCluster,  # noqa: F811
) -> None:
    cluster = multihost_cluster
    async with on_multihost() as caravan:
        data = await caravan.gql(
            CREATE,
            {
                "input": {
                    "name": "spans",
                    "type": "INTERACTIVE",
                    "driver": "EXEC",
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

        settings = caravan.settings
        root_ports = {
            "redis": urlparse(settings.redis.url).port or 6379,
            "gateway": urlparse(caravan.url).port or 80,
        }
        targets = [(f"kernel-{name}", address, PORT) for name, address in addresses.items()]
        targets += [(f"server{i + 1}-{p}", server_address(i), p) for i in range(3) for p in (4646, 4647)]
        targets += [(f"client-{h.name}-{p}", h.address, p) for h in cluster.hosts.values() for p in (4646, 4647)]
        targets += [(f"machine-{name}", ROOT_ADDRESS, port) for name, port in root_ports.items()]
        intruders = {}
        for host in HOSTS:
            created = await caravan.gql(
                CREATE,
                {
                    "input": {
                        "name": f"intruder-{host.name}",
                        "type": "BATCH",
                        "driver": "EXEC",
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

        await caravan.gql(DESTROY, {"ids": [session["id"]]})
        await caravan.wait_for(session["id"], "TERMINATED", timeout=90)
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
