"""A kernel with an accelerator and a storage folder sees both (issue 23, item 6): every driver × with and without a
device × with and without a folder, on the dev agent (Caravan's device plugin, a folder on its storage node); docker
kernels also in namespaces made ahead (a namespace keeper running: each single-kernel session runs in one).

Nomad's task runner keeps the mounts of its latest prestart hook that returned any: a device reservation with mounts
replaced the task's folder mounts, and a kernel with both had no ``/data``. Each combination is one BATCH session
that prints its device environment, writes and reads its folder and its device's load file; the combinations of a
driver run at once."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from caravan.stack.nomad_agent import NomadAgent
from tests.conftest import DEFAULT_IMAGE
from tests.e2e.test_devices import sim_shares_known
from tests.e2e.test_storage import CREATE_SESSION, ready_folder
from tests.harness import Caravan, GraphQLErrors
from tests.namespace_keeping import keeping

CHECK = """\
echo "== sim"; env | grep '^CARAVAN_SIM_' | sort
echo "== data"
if [ -e /data ]; then echo "$PROBE" > "/data/$PROBE_NAME" && cat "/data/$PROBE_NAME"; else ls /data 2>&1; fi
echo "== load"
load=${CARAVAN_SIM_LOAD_FILE:-}
if [ -n "$load" ]; then echo 'util=42 mem_mib=1024' > "$load" && cat "$load"; fi
echo "== end"
"""


@dataclass(frozen=True)
class Case:
    device: bool
    folder: bool
    extra: str = ""
    """``app``: the session serves an app too; ``cluster``: two kernels (the main one is checked)."""

    @property
    def name(self) -> str:
        parts = ("gpu" if self.device else "cpu", "folder" if self.folder else "nofolder", self.extra)
        return "-".join(p for p in parts if p)


CASES = [Case(device, folder) for device in (True, False) for folder in (True, False)]
CASES += [Case(True, True, "app"), Case(True, True, "cluster")]


async def folder_host_path(caravan: Caravan, folder_id: str) -> Path:
    volumes = await caravan.nomad._json("GET", "/v1/volumes", params={"type": "host"})
    [volume] = [v for v in volumes if v["Name"] == f"caravan-folder-{folder_id}"]
    detail = await caravan.nomad._json("GET", f"/v1/volume/host/{volume['ID']}")
    return Path(detail["HostPath"])


def sections(out: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("== "):
            current = line[3:]
            found[current] = []
        elif current:
            found[current].append(line)
    return found


async def run_case(caravan: Caravan, token: str, driver: str, case: Case, folder_id: str) -> dict[str, Any]:
    probe = uuid.uuid4().hex
    resources = [{"slot": "cpu", "amount": "0.1"}, {"slot": "mem", "amount": "64m"}]
    if case.device:
        resources.append({"slot": "sim.shares", "amount": "0.5"})
    spec: dict[str, Any] = {
        "name": f"{driver.lower()}-{case.name}",
        "type": "BATCH",
        "driver": driver,
        "startupCommand": CHECK,
        "resources": resources,
        "environ": [{"name": "PROBE", "value": probe}, {"name": "PROBE_NAME", "value": f"{case.name}.txt"}],
    }
    if driver == "DOCKER":
        spec["image"] = DEFAULT_IMAGE
    if case.folder:
        spec["mounts"] = [{"folder": folder_id, "path": "/data", "mode": "RW"}]
    if case.extra == "app":
        spec["apps"] = [{"name": "web", "port": 8080}]
    if case.extra == "cluster":  # the sub kernel stays up a while: the main one waits to know its address
        spec |= {"clusterSize": 2, "startupCommand": CHECK + '[ "$CARAVAN_CLUSTER_ROLE" = main ] || sleep 5\n'}
    data = await caravan.gql(CREATE_SESSION, {"input": spec}, token=token)
    session = await caravan.wait_for(data["createSession"]["sessions"][0]["id"], "TERMINATED", "ERROR", timeout=120)
    return {"probe": probe, **session}


def problems(case: Case, session: dict[str, Any], host_dir: Path) -> list[str]:
    """What ``case``'s kernel got wrong (nothing: it saw exactly its folder and its device)."""
    logs = session["mainKernel"]["logs"]
    out, wrong = logs["stdout"], []
    if session["result"] != "SUCCESS" or "== end" not in out:
        return [f"result {session['result']}: {out!r} {logs['stderr']!r}"]
    seen = sections(out)
    sim = dict(line.split("=", 1) for line in seen["sim"])
    if case.device:
        if sim.get("CARAVAN_SIM_SHARES") != "0.5" or not sim.get("CARAVAN_SIM_VISIBLE_DEVICES", "").startswith("gpu"):
            wrong.append(f"device env missing: {seen['sim']}")
        if seen["load"] != ["util=42 mem_mib=1024"]:
            wrong.append(f"load file not written: {seen['load']}")
    elif sim:
        wrong.append(f"device env without a device: {seen['sim']}")
    if case.folder:
        if seen["data"] != [session["probe"]]:
            wrong.append(f"folder not at /data: {seen['data']}")
        written = host_dir / f"{case.name}.txt"
        if not written.is_file() or written.read_text() != session["probe"] + "\n":
            wrong.append(f"the kernel's write is not in the folder on the storage node ({written})")
    elif not seen["data"] or "No such file" not in seen["data"][0]:
        wrong.append(f"a /data without a folder: {seen['data']}")
    return wrong


POOLED = re.compile(r'network_mode\s*=\s*"container:caravan-pool-')


@pytest.mark.parametrize(
    ("driver", "pooled"),
    [
        pytest.param("DOCKER", False, marks=pytest.mark.docker, id="docker"),
        pytest.param("DOCKER", True, marks=pytest.mark.docker, id="docker-pooled"),
        pytest.param("EXEC", False, id="exec"),
    ],
)
async def test_a_kernel_sees_its_folder_and_its_device_together(
    caravan: Caravan, nomad_agent: NomadAgent, driver: str, pooled: bool
) -> None:
    await sim_shares_known(caravan)
    alice = await caravan.user("alice")
    folder = await ready_folder(caravan, alice, "data")
    host_dir = await folder_host_path(caravan, folder["id"])
    single = [case for case in CASES if case.extra != "cluster"]
    async with keeping(caravan, nomad_agent, len(single)) if pooled else contextlib.nullcontext():
        sessions = await asyncio.gather(*(run_case(caravan, alice, driver, case, folder["id"]) for case in CASES))
    found = {
        case.name: wrong for case, s in zip(CASES, sessions, strict=True) if (wrong := problems(case, s, host_dir))
    }
    if pooled:  # each single-kernel session ran in a namespace made ahead, the cluster in its own
        for case, session in zip(CASES, sessions, strict=True):
            if bool(POOLED.search(str(session["jobHcl"]))) != (case in single):
                found.setdefault(case.name, []).append("pooled" if case not in single else "not pooled")
    assert not found, "\n".join(f"{name}: {'; '.join(wrong)}" for name, wrong in found.items())


async def test_a_vm_refuses_a_folder_with_or_without_a_device(caravan: Caravan) -> None:
    """qemu kernels mount no folders (README): the request is refused, typed, device or not."""
    alice = await caravan.user("alice")
    folder = await ready_folder(caravan, alice, "vm-data")
    for device in ([], [{"slot": "sim.shares", "amount": "0.5"}]):
        spec = {
            "name": "vm-check",
            "type": "BATCH",
            "driver": "QEMU",
            "startupCommand": "true",
            "resources": [{"slot": "mem", "amount": "256m"}, *device],
            "mounts": [{"folder": folder["id"], "path": "/data", "mode": "RW"}],
        }
        with pytest.raises(GraphQLErrors) as refused:
            await caravan.gql(CREATE_SESSION, {"input": spec}, token=alice)
        [error] = refused.value.errors
        assert (error["extensions"]["code"], error["extensions"].get("field")) == ("INVALID_INPUT", "mounts"), error
