"""A Nomad client down long enough for Nomad to mark its node down (SIGKILLed, on a cluster of two clients of its own on
this machine): the INTERACTIVE and BATCH sessions it ran are reported ``ERROR`` ``job-lost`` (their kernels' state was
on that node: not replaced, docs/sessions.md), the detail naming the lost node (it said ``Tasks are running; alloc is
lost since its node is down``: the client's stale last word, no node). The client started again stops what it still
ran: the sessions end TERMINATED."""

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
from tests.cluster_fixtures import cluster_of, scheduled_on
from tests.harness import CREATE, Caravan, running_caravan

pytestmark = [pytest.mark.nomad, pytest.mark.redis]

CLIENTS = (ClientSpec("alpha", cpu_mhz=2000, memory_mb=2048), ClientSpec("beta", cpu_mhz=2000, memory_mb=2048))
STATUS = "query($id: ID!) { session(id: $id) { status statusInfo statusDetail } }"


@pytest.fixture
def two_clients(state_dir: Path) -> Iterator[NomadCluster]:
    with cluster_of(state_dir / "two-clients", CLIENTS) as cluster:
        yield cluster


async def node_status(caravan: Caravan, name: str, status: str) -> None:
    async with asyncio.timeout(180):
        while not any(n["Name"] == name and n["Status"] == status for n in await caravan.nomad.nodes()):
            await asyncio.sleep(0.5)


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
            cluster.clients["alpha"] = spawn(
                "nomad-alpha",
                [str(a) for a in client.process.args],
                client.log,
                env=CLEAN_ENV,
                clean=True,
            )
            await node_status(caravan, "alpha", "ready")
        # back, the client stops the lost allocations Nomad told it to: the kernels end, and so do their sessions
        for session_id in ids.values():
            await caravan.wait_for(session_id, "TERMINATED", timeout=120)
