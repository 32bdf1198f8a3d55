"""A host's Nomad client killed just after it started a BATCH kernel's task (the multi-host test cluster), and started
again: the wrong final states of bench/chaos's short run (a session TERMINATED with exit 130, 137 or 143, Nomad's
signal, instead of its command's code).

The mechanism: the killed client had started the task but not yet kept the allocation's network in its state; at its
restart the network pre-run hook finds ``network already configured but not found in state``, Nomad fails the
allocation's set-up and kills the task it had started (``Terminated`` with SIGKILL's 137 here; the exec driver's
SIGINT 130 or 143 in the chaos run). That exit code is Nomad's, not the command's: the kernel is placed again
(``domain.start_retry``) and the session reports the new run's exit code, its history saying why. The command may so
run twice, the first run cut short: a BATCH command runs at least once.

The kill lands in that window by watching the client's own log for the task's ``Started`` event.
"""

from __future__ import annotations

import asyncio
import os
import signal

from caravan.stack.multihost import MultiHostCluster
from tests.e2e.test_multihost_client_kill import HISTORY, create_on, host_ready, restart_client
from tests.multihost_fixtures import HOSTS, OnMultihost


async def test_a_hosts_client_killed_just_after_starting_a_batch_task_runs_it_again_and_reports_its_exit_code(
    on_multihost: OnMultihost,
    multihost_cluster: MultiHostCluster,
) -> None:
    cluster, host = multihost_cluster, HOSTS[0]
    async with on_multihost() as caravan:
        client = cluster.clients[host.name]
        seen = client.log.stat().st_size
        batch = await create_on(caravan, cluster, "killed-started", type="BATCH", startupCommand="sleep 5; exit 3")
        async with asyncio.timeout(90):
            while "type=Started" not in client.log.read_text(errors="replace")[seen:]:
                await asyncio.sleep(0.005)
        os.kill(client.pid, signal.SIGKILL)
        await asyncio.to_thread(client.process.wait, 30)
        await restart_client(cluster, host)
        await host_ready(caravan, host.name)
        ended = await caravan.wait_for(batch, "TERMINATED", "ERROR", timeout=180)
        session = await caravan.store.get(batch)
        assert session is not None and session.nomad_job_id
        allocs = sorted(await caravan.nomad.job_allocations(session.nomad_job_id), key=lambda a: a["CreateIndex"])
        first = await caravan.nomad.allocation(allocs[0]["ID"])
        events = [e["Type"] for e in first["TaskStates"]["kernel"]["Events"]]
        assert "Setup Failure" in events and events[-1] == "Terminated", events  # the window was hit: Nomad killed it
        found = (await caravan.gql(HISTORY, {"id": batch}))["session"]
        assert (found["status"], found["exitCode"]) == ("TERMINATED", 3), (ended, found["statusHistory"])
        [retried] = [c for c in found["statusHistory"] if c["reason"] == "start-retried"]
        assert "network already configured" in retried["detail"], retried
        assert "killed by Nomad" in retried["detail"] and retried["detail"].endswith("its command runs again"), retried
        assert len(allocs) == 2, allocs  # placed once again, not more
