"""A Nomad client down long enough for Nomad to mark its node down (SIGKILLed, on a cluster of two clients of its own on
this machine): the INTERACTIVE and BATCH sessions it ran are reported ``ERROR`` ``job-lost`` (their kernels' state was
on that node: not replaced, docs/sessions.md), the detail naming the lost node (it said ``Tasks are running; alloc is
lost since its node is down``: the client's stale last word, no node). The client started again stops what it still
ran: the sessions end TERMINATED.

An INFERENCE endpoint's replica on the lost client is placed again by Caravan's scheduler on the other client (the
replica is pinned to its node, so Nomad alone would leave it lost until the node returns), and the endpoint answers
through it; the client back stops the old allocation, which does not count: the endpoint keeps one replica."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from caravan.stack.nomad_agent import CLEAN_ENV
from caravan.stack.nomad_cluster import ClientSpec, NomadCluster
from caravan.stack.processes import spawn
from core.settings import Settings
from domain.model import SessionStatus
from tests.cluster_fixtures import cluster_of, scheduled_on
from tests.e2e.test_inference import eventually
from tests.e2e.test_inference_endpoints import MODEL, _create, _serving, _settings
from tests.harness import CREATE, Caravan, running_caravan
from tests.ingress import caravan_behind_haproxy

pytestmark = [pytest.mark.nomad, pytest.mark.redis]

CLIENTS = (ClientSpec("alpha", cpu_mhz=2000, memory_mb=2048), ClientSpec("beta", cpu_mhz=2000, memory_mb=2048))
STATUS = "query($id: ID!) { session(id: $id) { status statusInfo statusDetail } }"


HEARTBEAT = (2.0, 5.0)
"""The cluster server's minimum heartbeat TTL and grace: a client killed is marked down within about 9 s, not Nomad's
20-30 s (a live client's heartbeat may still come 5 s late)."""


@pytest.fixture(scope="module")
def two_clients(state_dir: Path) -> Iterator[NomadCluster]:
    """Both tests' cluster: each kills a client and starts it again, ready, before it ends (``restart``)."""
    with cluster_of(state_dir / "two-clients", CLIENTS, heartbeat=HEARTBEAT) as cluster:
        yield cluster


async def node_status(caravan: Caravan, name: str, status: str) -> None:
    async with asyncio.timeout(180):
        while not any(n["Name"] == name and n["Status"] == status for n in await caravan.nomad.nodes()):
            await asyncio.sleep(0.5)


def restart(cluster: NomadCluster, name: str) -> None:
    """The client ``name`` started again as it was (after a SIGKILL)."""
    client = cluster.clients[name]
    cluster.clients[name] = spawn(
        f"nomad-{name}", [str(a) for a in client.process.args], client.log, env=CLEAN_ENV, clean=True
    )


async def test_a_client_lost_reports_its_sessions_naming_the_node(
    settings: Settings, two_clients: NomadCluster, tmp_path: Path
) -> None:
    cluster = two_clients
    async with running_caravan(scheduled_on(settings, cluster, tmp_path)) as caravan:
        ids = {}
        for kind in ("INTERACTIVE", "BATCH"):
            created = await caravan.gql(
                CREATE,
                {
                    "input": {
                        "name": kind.lower(),
                        "type": kind,
                        "driver": "EXEC",
                        "startupCommand": "exec sleep 3600",
                        "designatedAgent": cluster.node_ids["alpha"],
                        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "48m"}],
                    }
                },
            )
            ids[kind] = created["createSession"]["sessions"][0]["id"]
        for session_id in ids.values():
            await caravan.wait_for(session_id, "RUNNING", timeout=120)
        client = cluster.clients["alpha"]
        os.kill(client.pid, signal.SIGKILL)
        await asyncio.to_thread(client.process.wait, 30)
        try:
            await node_status(caravan, "alpha", "down")
            for session_id in ids.values():
                await caravan.wait_for(session_id, "ERROR", timeout=120)
                found = (await caravan.gql(STATUS, {"id": session_id}))["session"]
                assert found["statusInfo"] == "job-lost", found
                assert found["statusDetail"].startswith("node alpha is down: "), found
        finally:
            # started again, the client stops what it still ran (its allocations are lost)
            restart(cluster, "alpha")
            await node_status(caravan, "alpha", "ready")
        # back, the client stops the lost allocations Nomad told it to: the kernels end, and so do their sessions
        for session_id in ids.values():
            await caravan.wait_for(session_id, "TERMINATED", timeout=120)


async def test_an_endpoint_replica_on_a_lost_client_is_placed_on_the_other(
    settings: Settings, two_clients: NomadCluster, tmp_path: Path
) -> None:
    cluster = two_clients
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    model.chmod(0o644)
    tmp_path.chmod(0o755)
    names = {node_id: name for name, node_id in cluster.node_ids.items()}
    async with caravan_behind_haproxy(_settings(scheduled_on(settings, cluster, tmp_path))) as (caravan, _):
        endpoint = await _create(caravan, model, replicas=1)
        await _serving(endpoint, 1)
        session = await caravan.store.get(endpoint.session_id)
        assert session is not None and session.kernels[0].agent is not None
        lost = names[session.kernels[0].agent]
        [other] = set(cluster.node_ids) - {lost}
        client = cluster.clients[lost]
        os.kill(client.pid, signal.SIGKILL)
        await asyncio.to_thread(client.process.wait, 30)
        try:
            await node_status(caravan, lost, "down")

            async def on_the_other() -> bool | None:
                now = await caravan.store.get(endpoint.session_id)
                assert now is not None and now.status is SessionStatus.RUNNING, now
                [replica] = now.kernels
                placed = replica.agent == cluster.node_ids[other] and replica.status is SessionStatus.RUNNING
                return True if placed and replica.healthy else None

            # before the fix the replica stayed PREPARING "recovering: job-lost", pinned to the lost node
            await eventually(on_the_other, f"the replica placed again on {other}", timeout=180)
            await _serving(endpoint, 1)
        finally:
            restart(cluster, lost)
            await node_status(caravan, lost, "ready")
        assert session.nomad_job_id is not None
        job = session.nomad_job_id

        async def old_stopped() -> bool | None:
            allocs = await caravan.nomad.job_allocations(job)
            live = [a for a in allocs if a.get("ClientStatus") in ("pending", "running")]
            return True if [names[a["NodeID"]] for a in live] == [other] else None

        # back, the client stops the lost allocation: one replica, on the other client, still answering
        await eventually(old_stopped, f"the allocation on {lost} stopped, the one on {other} running", timeout=120)
        await _serving(endpoint, 1)
        now = await caravan.store.get(endpoint.session_id)
        assert now is not None and now.status is SessionStatus.RUNNING
        assert [(k.hostname, k.agent) for k in now.kernels] == [("main1", cluster.node_ids[other])], now.kernels
        assert (await endpoint.view())["endpoints"] and len((await endpoint.view())["endpoints"]) == 1
