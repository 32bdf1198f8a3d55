"""Storage folders on a cluster of several Nomad clients: a folder is a dynamic host volume on its storage node, and
a session mounting it is placed there by Caravan's scheduler (its designated agent, set at creation from the folder;
``domain.session_requests``), whatever the placement strategy prefers; a session without it goes where the strategy
says. Folders of two storage nodes in one session are refused at creation (``domain.storage.resolve_mounts``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from caravan.stack.nomad_cluster import NomadCluster
from core.settings import Settings, StorageSettings
from tests.cluster_fixtures import on_the_cluster, scheduler_config
from tests.e2e.test_scheduling import create, eventually, ran_on, status
from tests.e2e.test_storage import ready_folder
from tests.harness import running_caravan


async def test_a_session_mounting_a_folder_runs_on_the_folders_node(
    settings: Settings, nomad_cluster: NomadCluster, tmp_path: Path
) -> None:
    config = tmp_path / "scheduler.hcl"
    config.write_text(scheduler_config('default {\n  agent_selector = "dispersed"\n}'))
    clustered = dataclasses.replace(
        on_the_cluster(settings, nomad_cluster),
        scheduler=dataclasses.replace(settings.scheduler, config_path=config, pass_interval=0.5),
        storage=StorageSettings(node="small"),
    )
    async with running_caravan(clustered) as caravan:
        alice = await caravan.user("alice")
        folder = await ready_folder(caravan, alice, "data")
        assert folder["nodeId"] == nomad_cluster.node_ids["small"]
        mounted = await create(
            caravan, token=alice, driver="EXEC", mounts=[{"folder": folder["id"], "path": "/data", "mode": "RW"}]
        )
        free = await create(caravan, token=alice, driver="EXEC")
        for session_id in (mounted, free):
            await eventually(caravan, session_id, status("RUNNING"), timeout=90)
        # dispersed prefers the most cores left (large or medium); the folder's session runs on small all the same
        assert await ran_on(caravan, nomad_cluster, mounted) == {"main1": "small"}
        assert (await ran_on(caravan, nomad_cluster, free))["main1"] != "small"
