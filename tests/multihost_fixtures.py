"""The multi-host test cluster (``caravan.stack.multihost``): three Nomad servers in Raft and two hosts, each a network
namespace of its own with its own Nomad client, session network and session-peers daemon.

Started once per test session, only when a test asks for ``multihost_cluster``. Each host offers 3 cores
(``cpu_mhz_per_core = 1000``) and 2 GiB: a kernel of 2 cores fills a host's share for sessions, so the two kernels of
a 2-core cluster session land on different hosts whatever the placement strategy, and a 1-core kernel still fits
beside each.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from caravan.stack.multihost import MultiHostCluster, start_multihost_cluster
from caravan.stack.nomad_cluster import ClientSpec
from core.settings import Settings
from tests.cluster_fixtures import on_the_cluster, scheduler_config
from tests.harness import Caravan, running_caravan
from tests.ingress import gateway_behind, haproxy_for

HOSTS = (
    ClientSpec("cvmh-host1", cpu_mhz=3000, memory_mb=2048),
    ClientSpec("cvmh-host2", cpu_mhz=3000, memory_mb=2048),
)


@pytest.fixture(scope="session")
def multihost_cluster(state_dir: Path) -> Iterator[MultiHostCluster]:
    from tests.conftest import STACK  # not at import time: conftest imports the fixtures' modules

    cluster = start_multihost_cluster(
        state_dir / "multihost",
        nomad_home=Path(STACK["CARAVAN_NOMAD_HOME"]),
        rootfs=Path(STACK["CARAVAN_ROOTFS"]),
        hosts=HOSTS,
        want_drivers=("exec", "docker") if STACK.get("CARAVAN_PAUSE_IMAGE") else ("exec",),
        secrets_dir=state_dir / "multihost" / "secrets",
        pause_image=STACK.get("CARAVAN_PAUSE_IMAGE"),
    )
    yield cluster
    cluster.stop()


OnMultihost = Callable[..., AbstractAsyncContextManager[Caravan]]


@pytest.fixture
def on_multihost(settings: Settings, multihost_cluster: MultiHostCluster, tmp_path: Path) -> OnMultihost:
    """``async with on_multihost() as caravan``: gateway + scheduler (in this process) on the multi-host cluster;
    ``on_multihost(ingress=True)``: behind a HAProxy of their own, the data plane (on the machine: it reaches the
    hosts from the link's 172.26.255.1, the cluster's ``data_plane``)."""

    @contextlib.asynccontextmanager
    async def start(*, ingress: bool = False) -> AsyncIterator[Caravan]:
        path = tmp_path / "scheduler.hcl"
        path.write_text(scheduler_config())
        clustered = dataclasses.replace(
            on_the_cluster(settings, multihost_cluster),
            scheduler=dataclasses.replace(settings.scheduler, config_path=path, pass_interval=0.5),
        )
        if ingress:
            with haproxy_for(clustered) as proxy:
                async with gateway_behind(proxy) as caravan:
                    yield caravan
            return
        async with running_caravan(clustered) as caravan:
            yield caravan

    return start
