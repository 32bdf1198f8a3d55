"""A real Nomad cluster of several clients with different capacities, for the tests of where sessions land.

Started once per test session, and only when a test asks for ``nomad_cluster`` (about 15 s). With
``cpu_mhz_per_core = 1000`` (see :func:`scheduler_config`) the clients offer:

=======  =========  =====  ========  ===========================================================
client   node pool  cores  memory    devices (Caravan's simulated accelerator, ``node_plugins/devices/sim``)
=======  =========  =====  ========  ===========================================================
small    default    2      2 GiB
medium   default    4      4 GiB
large    default    8      8 GiB     2 × ``sim.device`` (whole ``SimGPU-A``, 40 GiB, 8.0)
edge     edge       2      1 GiB
gpu-b    gpu        4      4 GiB     1 ``SimGPU-B`` (16 GiB, 7.5) as 4 shares: ``sim.shares`` 1
gpu-c    gpu        4      4 GiB     2 × ``sim.device`` (whole ``SimGPU-C``, 24 GiB, 8.6)
=======  =========  =====  ========  ===========================================================

Node pool ``gpu`` (resource group ``gpu``) keeps the device tests' clients out of the placement tests' arithmetic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from caravan.stack.device_plugin import SimDevices
from caravan.stack.nomad_cluster import ClientSpec, NomadCluster, start_nomad_cluster
from core.secrets import ROLES, redis_password_path
from core.settings import Settings
from stores.known_resources import known_resource_groups
from tests.harness import Caravan, running_caravan

CLIENTS = (
    ClientSpec("small", cpu_mhz=2000, memory_mb=2048),
    ClientSpec("medium", cpu_mhz=4000, memory_mb=4096),
    ClientSpec("large", cpu_mhz=8000, memory_mb=8192, devices=SimDevices(2, "SimGPU-A", 40960, "8.0", shares=0)),
    ClientSpec("edge", cpu_mhz=2000, memory_mb=1024, node_pool="edge"),
    ClientSpec("gpu-b", cpu_mhz=4000, memory_mb=4096, node_pool="gpu", devices=SimDevices(1, "SimGPU-B", 16384, "7.5")),
    ClientSpec(
        "gpu-c",
        cpu_mhz=4000,
        memory_mb=4096,
        node_pool="gpu",
        devices=SimDevices(2, "SimGPU-C", 24576, "8.6", shares=0),
    ),
)
MHZ_PER_CORE = 1000


@contextlib.contextmanager
def cluster_of(
    directory: Path, clients: tuple[ClientSpec, ...], *, heartbeat: tuple[float, float] | None = None
) -> Iterator[NomadCluster]:
    """A Nomad server and ``clients`` on this machine, their state under ``directory``; stopped at the end.
    ``heartbeat``: the server's minimum heartbeat TTL and grace (``start_nomad_cluster``)."""
    from tests.conftest import STACK  # not at import time: conftest imports this module

    cluster = start_nomad_cluster(
        directory,
        nomad_home=Path(STACK["CARAVAN_NOMAD_HOME"]),
        rootfs=Path(STACK["CARAVAN_ROOTFS"]),
        clients=clients,
        secrets_dir=directory / "secrets",
        heartbeat=heartbeat,
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def nomad_cluster(state_dir: Path) -> Iterator[NomadCluster]:
    with cluster_of(state_dir / "cluster", CLIENTS) as cluster:
        yield cluster


def on_the_cluster(settings: Settings, cluster: NomadCluster) -> Settings:
    """``settings`` pointed at the cluster: its management token for the test, its component tokens for Caravan's
    components (its secrets directory, given a copy of the Redis passwords)."""
    assert cluster.secrets_dir is not None
    for role in ROLES:
        if not redis_password_path(cluster.secrets_dir, role).exists():
            shutil.copy2(redis_password_path(settings.secrets, role), redis_password_path(cluster.secrets_dir, role))
    return dataclasses.replace(
        settings,
        secrets_dir=cluster.secrets_dir,
        nomad=dataclasses.replace(settings.nomad, addr=cluster.addr, token=cluster.token),
    )


def scheduler_config(body: str = "") -> str:
    """A scheduler configuration for the cluster: its MHz per core, then ``body``."""
    return f"cpu_mhz_per_core = {MHZ_PER_CORE}\n{body}"


def scheduled_on(settings: Settings, cluster: NomadCluster, directory: Path, config: str = "") -> Settings:
    """``settings`` on the cluster, with a scheduler configuration (``config`` after the MHz per core) in
    ``directory`` and a scheduler pass every half second."""
    path = directory / "scheduler.hcl"
    path.write_text(scheduler_config(config))
    return dataclasses.replace(
        on_the_cluster(settings, cluster),
        scheduler=dataclasses.replace(settings.scheduler, config_path=path, pass_interval=0.5),
    )


OnCluster = Callable[..., AbstractAsyncContextManager[Caravan]]


async def _pools_known(caravan: Caravan, timeout: float = 30.0) -> None:
    """Wait for the scheduler's first pass to record the clients' node pools: creation refuses unknown groups."""
    pools = {client.node_pool for client in CLIENTS}
    deadline = time.monotonic() + timeout
    while not pools <= await known_resource_groups(caravan.store.redis, caravan.store.keys):
        assert time.monotonic() < deadline, f"the scheduler did not record the node pools {pools}"
        await asyncio.sleep(0.05)


@pytest.fixture
def on_cluster(settings: Settings, nomad_cluster: NomadCluster, tmp_path: Path) -> OnCluster:
    """``async with on_cluster(config_text) as caravan``: gateway + scheduler on the cluster, with that config."""

    @contextlib.asynccontextmanager
    async def start(config: str = "") -> AsyncIterator[Caravan]:
        async with running_caravan(scheduled_on(settings, nomad_cluster, tmp_path, config)) as caravan:
            await _pools_known(caravan)
            yield caravan

    return start
