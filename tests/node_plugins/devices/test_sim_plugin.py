"""Caravan's device plugin run as Nomad runs it: go-plugin's handshake by hand, then under a real Nomad agent (the
session's dev agent, which loads it from its own ``plugin_dir``): fingerprint, runtime health, reserve and stats.

The dev agent offers the stack's default: two ``SimGPU-16G`` devices of four shares each."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from caravan.stack.device_plugin import SimDevices, plugin_dir, protos_dir
from caravan.stack.nomad_agent import NomadAgent, start_nomad_dev
from caravan.stack.processes import StartupFailed
from core.settings import Settings
from node_plugins.devices.sim.server import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE
from node_plugins.devices.sim.state import StateDir
from nomad_jobs.client import NomadClient
from tests.conftest import STACK

NOMAD_HOME = Path(STACK.get("CARAVAN_NOMAD_HOME", "/nonexistent"))
pytestmark = pytest.mark.skipif(not NOMAD_HOME.exists(), reason="ops/install builds Nomad and the plugin stubs")


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    launcher = plugin_dir(tmp_path, NOMAD_HOME) / "caravan-device-sim"
    env = {"PATH": os.environ["PATH"], MAGIC_COOKIE_KEY: MAGIC_COOKIE_VALUE}
    with subprocess.Popen([launcher], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as process:
        assert process.stdout is not None
        yield process, process.stdout.readline().decode()
        process.terminate()
        process.wait(10)


def test_the_handshake_is_go_plugins(launched: tuple[subprocess.Popen[bytes], str]) -> None:
    process, line = launched
    core, app, network, address, protocol = line.strip().split("|")
    assert (core, app, network, protocol) == ("1", "2", "unix", "grpc")
    sys.path.insert(0, str(protos_dir(NOMAD_HOME)))
    try:
        import grpc
        from plugins.base.proto import base_pb2, base_pb2_grpc  # type: ignore[import-not-found]

        with grpc.insecure_channel(f"unix://{address}") as channel:
            info = base_pb2_grpc.BasePluginStub(channel).PluginInfo(base_pb2.PluginInfoRequest(), timeout=10)
    finally:
        sys.path.remove(str(protos_dir(NOMAD_HOME)))
    assert (info.type, info.name, list(info.plugin_api_versions)) == (base_pb2.DEVICE, "caravan-device-sim", ["0.1.0"])


def test_a_plugin_whose_agent_was_killed_stops(tmp_path: Path) -> None:
    """Nomad stops its plugins when it shuts down; an agent killed outright cannot, and the plugin must not linger
    (orphans of killed test agents used to pile up). A shell stands for the agent and is SIGKILLed."""
    launcher = plugin_dir(tmp_path, NOMAD_HOME) / "caravan-device-sim"
    env = {"PATH": os.environ["PATH"], MAGIC_COOKIE_KEY: MAGIC_COOKIE_VALUE, "PLUGIN_UNIX_SOCKET_DIR": str(tmp_path)}
    shell = ["sh", "-c", '"$0" & echo $! >&2; wait', str(launcher)]
    with subprocess.Popen(shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as agent:
        assert agent.stdout is not None and agent.stderr is not None
        plugin = int(agent.stderr.readline())
        address = agent.stdout.readline().decode().strip().split("|")[3]
        assert Path(address).exists()
        agent.kill()
        agent.wait(10)
    deadline = time.monotonic() + 60
    while _running(plugin):
        assert time.monotonic() < deadline, "the orphaned plugin kept running"
        time.sleep(0.1)
    assert not Path(address).exists()  # it stopped on its own, cleaning up (not killed)


def _running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_without_nomads_cookie_it_explains_and_exits(tmp_path: Path) -> None:
    launcher = plugin_dir(tmp_path, NOMAD_HOME) / "caravan-device-sim"
    done = subprocess.run([launcher], capture_output=True, env={"PATH": os.environ["PATH"]}, timeout=30)
    assert done.returncode == 1
    assert b"is a Nomad device plugin" in done.stderr and done.stdout == b""


@pytest.fixture
async def nomad(settings: Settings) -> AsyncIterator[NomadClient]:
    client = NomadClient(settings.nomad)
    yield client
    await client.aclose()


async def node_devices(nomad: NomadClient, node_id: str) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = (await nomad.node(node_id))["NodeResources"]["Devices"]
    return sorted(devices, key=lambda d: str(d["Name"]))


async def test_nomad_fingerprints_the_devices_with_their_attributes(
    nomad: NomadClient, nomad_agent: NomadAgent
) -> None:
    devices = await node_devices(nomad, nomad_agent.node_id)
    assert [(d["Vendor"], d["Type"], d["Name"]) for d in devices] == [
        ("caravan-sim", "gpu-share", "SimGPU-16G@gpu0"),
        ("caravan-sim", "gpu-share", "SimGPU-16G@gpu1"),
    ]
    assert [i["ID"] for i in devices[1]["Instances"]] == ["gpu1-s0", "gpu1-s1", "gpu1-s2", "gpu1-s3"]
    attributes = devices[0]["Attributes"]
    assert attributes["model"]["String"] == "SimGPU-16G"
    assert (attributes["memory"]["Int"], attributes["memory"]["Unit"]) == (16384, "MiB")
    assert attributes["compute_capability"]["String"] == "8.0"
    assert attributes["shares"]["Int"] == 4 and attributes["simulated"]["Bool"] is True


async def eventually(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)
    return found


async def test_health_changes_at_runtime(nomad: NomadClient, nomad_agent: NomadAgent) -> None:
    assert nomad_agent.device_dir is not None
    state = StateDir(nomad_agent.device_dir)

    async def gpu1_health() -> set[tuple[bool, str]]:
        gpu1 = (await node_devices(nomad, nomad_agent.node_id))[1]
        return {(i["Healthy"], i["HealthDescription"]) for i in gpu1["Instances"]}

    try:
        state.mark("gpu1", "overheating (simulated)")
        await eventually(
            lambda: _is(gpu1_health, {(False, "overheating (simulated)")}), "Nomad never saw gpu1 unhealthy"
        )
        assert all(i["Healthy"] for i in (await node_devices(nomad, nomad_agent.node_id))[0]["Instances"])
    finally:
        state.mark("gpu1", None)
    await eventually(lambda: _is(gpu1_health, {(True, "")}), "Nomad never saw gpu1 healthy again")


async def _is(read: Any, expected: object) -> bool:
    return bool(await read() == expected)


SCRIPT = (
    "env | grep ^CARAVAN_SIM_ | sort; echo 'util=87.5 mem_mib=3072' > $CARAVAN_SIM_LOAD_FILE; ls /run/caravan-sim 2>&1"
)
JOB = """
job "%(id)s" {
  datacenters = ["dc1"]
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "%(script)s; sleep 600"]
      }
      resources {
        cpu    = 50
        memory = 32
        device "caravan-sim/gpu-share" {
          count = 2
        }
      }
    }
  }
}
"""


async def test_reserve_gives_env_and_a_load_file_and_stats_report_the_load(
    nomad: NomadClient, nomad_agent: NomadAgent, settings: Settings
) -> None:
    job_id = f"{settings.nomad.job_prefix}-plugin-{uuid.uuid4().hex[:6]}"
    await nomad.register(await nomad.parse(JOB % {"id": job_id, "script": SCRIPT}))
    try:

        async def running() -> dict[str, Any] | None:
            allocs = [a for a in await nomad.job_allocations(job_id) if a["ClientStatus"] == "running"]
            return allocs[0] if allocs else None

        alloc = await eventually(running, "the job never ran")
        [granted] = (await nomad.allocation(alloc["ID"]))["AllocatedResources"]["Tasks"]["t"]["Devices"]
        device = granted["Name"].split("@")[1]
        assert sorted(granted["DeviceIDs"]) == sorted(i for i in granted["DeviceIDs"] if i.startswith(f"{device}-s"))

        async def printed() -> str:
            return await nomad.logs(alloc["ID"], "t")

        out = await eventually(lambda: _nonempty(printed), "the task printed nothing")
        assert f"CARAVAN_SIM_VISIBLE_DEVICES={device}\n" in out
        assert "CARAVAN_SIM_SHARES=0.5\n" in out and "CARAVAN_SIM_MEMORY_MIB=8192\n" in out
        assert f"CARAVAN_SIM_DEVICE_IDS={','.join(granted['DeviceIDs'])}\n" in out
        assert re.search(r"^CARAVAN_SIM_LOAD_FILE=/alloc/caravan-sim-[0-9a-f]{16}\.load$", out, re.M), out
        assert "/run/caravan-sim: No such file or directory" in out  # the reservation mounts nothing in the task

        async def device_stats() -> dict[str, Any] | None:
            usage = (await nomad.alloc_stats(alloc["ID"])).resource_usage or {}
            for group in usage.get("DeviceStats") or []:
                for instance in (group.get("InstanceStats") or {}).values():
                    if instance["Stats"]["Attributes"]["GPU utilization"].get("FloatNumeratorVal") == 87.5:
                        return dict(instance["Stats"]["Attributes"])
            return None

        stats = await eventually(device_stats, "the task's load never reached Nomad's allocation stats")
        memory = stats["Memory state"]
        assert (memory["IntNumeratorVal"], memory["IntDenominatorVal"]) == (1536, 4096)  # 3 GiB over 2 shares
    finally:
        await nomad.deregister(job_id, purge=True)


async def _nonempty(read: Any) -> str:
    return str(await read())


@pytest.mark.nomad  # starts an agent of its own
def test_bad_plugin_config_stops_the_agent_with_the_field_named(tmp_path: Path) -> None:
    with pytest.raises(StartupFailed) as failed:
        start_nomad_dev(
            tmp_path / "bad",
            nomad_home=NOMAD_HOME,
            rootfs=Path(STACK["CARAVAN_ROOTFS"]),
            want_drivers=("raw_exec",),
            log=tmp_path / "nomad.log",
            timeout=30,
            devices=SimDevices(shares=3),
        )
    assert "nomad exited" in str(failed.value)
    log = (tmp_path / "nomad.log").read_text()
    assert "caravan-device-sim config: shares must be one of 0, 1, 2, 4" in log, log[-2000:]
