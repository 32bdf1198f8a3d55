"""The dev stack's kind of Nomad agent (``start_nomad_single_node``, not ``-dev``) keeps allocation statistics: a busy
task reads busy. Without ``telemetry { publish_allocation_metrics = true }`` Nomad measures nothing outside dev mode,
and the idle checker's utilization check would judge every session of the dev stack by nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from caravan.stack.nomad_cluster import start_nomad_single_node
from core.secrets import nomad_token_path, read_secret
from core.settings import NomadSettings
from idle.samples import kernel_sample
from nomad_jobs.client import NomadClient
from tests.conftest import STACK

pytestmark = [
    pytest.mark.skipif("CARAVAN_NOMAD_HOME" not in STACK, reason="ops/install-nomad builds Nomad"),
    pytest.mark.nomad,
]  # its own single-node agent

BUSY = """
job "busy" {
  datacenters = ["dc1"]
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do :; done"]
      }
      resources {
        cpu    = 200
        memory = 64
      }
    }
  }
}
"""


async def test_a_busy_task_on_the_dev_stacks_agent_reads_busy(tmp_path: Path) -> None:
    agent = await asyncio.to_thread(
        start_nomad_single_node,
        tmp_path / "nomad",
        nomad_home=Path(STACK["CARAVAN_NOMAD_HOME"]),
        rootfs=Path(STACK["CARAVAN_ROOTFS"]),
        want_drivers=("exec",),
        secrets_dir=tmp_path / "secrets",
        devices=None,
    )
    nomad = NomadClient(
        NomadSettings(addr=agent.addr, token=read_secret(nomad_token_path(tmp_path / "secrets", "admin")))
    )
    try:
        await nomad.register(await nomad.parse(BUSY))
        deadline, sample = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            running = [a for a in await nomad.job_allocations("busy") if a["ClientStatus"] == "running"]
            if running:
                sample = kernel_sample(await nomad.alloc_stats(running[0]["ID"]), cores=1, memory_bytes=64 * 2**20)
                if sample.get("cpu_util", 0) > 10:
                    break
            await asyncio.sleep(0.5)
        assert sample.get("cpu_util", 0) > 10, f"a busy task read {sample} (an empty sample: nothing measured)"
    finally:
        await nomad.aclose()
        await asyncio.to_thread(agent.stop)
