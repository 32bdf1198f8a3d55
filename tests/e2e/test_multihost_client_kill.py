"""A host's Nomad client killed on the multi-host test cluster (``tests/multihost_fixtures.py``), and started again.

Killed at the worst moment for a BATCH kernel, while the client sets up its allocation's network (held there: the
host's ``caravan-isolation`` CNI plugin, the last of the set-up, is wrapped so that its ADD waits for the test): at
the client's restart Nomad fails that allocation (``network already configured but not found in state``) before its
task ever started. The session says so (``start-retried``, Nomad's failure as the detail), and since its command never
ran, the kernel is placed again and runs once (``domain.start_retry``). An INTERACTIVE session running on the same host
meanwhile keeps its task: the restarted client reattaches to it (a service kernel is not replaced for an agent's
restart). Nothing of the other host is touched.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

from caravan.stack import multihost
from caravan.stack.multihost import MultiHostCluster
from caravan.stack.nomad_cluster import ClientSpec
from tests.harness import CREATE, Caravan
from tests.multihost_fixtures import HOSTS, OnMultihost

HELD_ISOLATION = """#!/bin/sh
# the test's hold on the session network's set-up: an ADD waits here while the file below is missing
if [ "$CNI_COMMAND" = ADD ] && [ ! -e "{release}" ]; then
  touch "{entered}"
  while [ ! -e "{release}" ]; do sleep 0.1; done
fi
exec "{real}" "$@"
"""
HISTORY = "query($id: ID!) { session(id: $id) { status exitCode statusHistory { status reason detail } } }"


async def create_on(caravan: Caravan, cluster: MultiHostCluster, name: str, **fields: object) -> str:
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "name": name,
                "driver": "EXEC",
                "designatedAgent": cluster.node_ids[HOSTS[0].name],
                "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "48m"}],
                **fields,
            }
        },
    )
    return str(data["createSession"]["sessions"][0]["id"])


async def restart_client(cluster: MultiHostCluster, host: ClientSpec) -> None:
    """Start the host's killed Nomad client again (same state and session network)."""
    from tests.conftest import STACK

    nomad_home, rootfs = Path(STACK["CARAVAN_NOMAD_HOME"]), Path(STACK["CARAVAN_ROOTFS"])
    await asyncio.to_thread(multihost.restart_client, cluster, host, nomad_home=nomad_home, rootfs=rootfs)


async def host_ready(caravan: Caravan, name: str) -> None:
    async with asyncio.timeout(120):
        while not any(n["Name"] == name and n["Status"] == "ready" for n in await caravan.nomad.nodes()):
            await asyncio.sleep(0.5)


async def test_a_hosts_client_killed_during_a_batch_kernels_set_up_reports_it_and_runs_the_command_once(
    on_multihost: OnMultihost,
    multihost_cluster: MultiHostCluster,
    tmp_path: Path,
) -> None:
    cluster, host = multihost_cluster, HOSTS[0]
    shim = Path(cluster.hosts[host.name].network.bin_dir) / "caravan-isolation"
    real = shim.with_name("caravan-isolation.real")
    entered, release = tmp_path / "entered", tmp_path / "release"
    async with on_multihost() as caravan:
        interactive = await create_on(caravan, cluster, "stays", type="INTERACTIVE", startupCommand="exec sleep 3600")
        await caravan.wait_for(interactive, "RUNNING", timeout=120)
        before = await caravan.store.get(interactive)
        assert before is not None
        shutil.copy2(shim, real)
        shim.write_text(HELD_ISOLATION.format(release=release, entered=entered, real=real))
        try:
            batch = await create_on(caravan, cluster, "held", type="BATCH", startupCommand="exit 5")
            async with asyncio.timeout(90):
                while not entered.exists():
                    await asyncio.sleep(0.05)
            client = cluster.clients[host.name]
            os.kill(client.pid, signal.SIGKILL)
            await asyncio.to_thread(client.process.wait, 30)
            release.touch()
            await restart_client(cluster, host)
        finally:
            shutil.copy2(real, shim)
            release.touch()
        await host_ready(caravan, host.name)
        ended = await caravan.wait_for(batch, "TERMINATED", "ERROR", timeout=180)
        found = (await caravan.gql(HISTORY, {"id": batch}))["session"]
        assert (found["status"], found["exitCode"]) == ("TERMINATED", 5), (ended, found["statusHistory"])
        [retried] = [c for c in found["statusHistory"] if c["reason"] == "start-retried"]
        assert retried["status"] == "PREPARING" and "network already configured" in retried["detail"], retried
        after = await caravan.store.get(interactive)
        assert after is not None and after.status.value == "RUNNING", (after.status, after.status_info)
        assert [k.alloc_id for k in after.kernels] == [k.alloc_id for k in before.kernels]  # reattached, not replaced
        await caravan.gql("mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }", {"ids": [interactive]})
        await caravan.wait_for(interactive, "TERMINATED", timeout=90)
