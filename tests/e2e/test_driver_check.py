"""The scheduler places a session only on nodes with its task driver healthy, on the real 4-client cluster
(``tests/cluster_fixtures.py``), whose clients deny the docker, qemu and java drivers: a Docker session waits naming
the driver, and holds back nobody behind it."""

from __future__ import annotations

from tests.cluster_fixtures import OnCluster
from tests.e2e.test_scheduling import create, eventually, status


async def test_a_session_whose_driver_no_node_has_waits_naming_it(on_cluster: OnCluster) -> None:
    async with on_cluster() as caravan:
        docker = await create(caravan, driver="DOCKER")
        behind = await create(caravan, type="BATCH", startupCommand="exit 0")  # strict FIFO, yet not blocked
        waiting = await eventually(caravan, docker, lambda s: bool(s["waitReasons"]))
        assert waiting["status"] == "PENDING"
        assert waiting["waitReasons"] == [
            "never-fits: no schedulable agent of resource group default has driver:docker"
        ], waiting["waitReasons"]
        await eventually(caravan, behind, status("TERMINATED"))
        assert (await eventually(caravan, docker, status("PENDING")))["kernels"][0]["agent"] is None
