"""Per-role kernels on real Nomad: a cluster session made from a template whose main and sub kernels ask for different
resources (and, with Docker, run different image tags) runs with each kernel's own, as Nomad allocated them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import DEFAULT_IMAGE
from tests.harness import Caravan

CREATE_TEMPLATE = "mutation($input: CreateSessionTemplateInput!) { createSessionTemplate(input: $input) { id } }"
FROM_TEMPLATE = """
mutation($id: ID!, $overrides: SessionOverridesInput!) {
  createSessionFromTemplate(templateId: $id, overrides: $overrides) { sessions { id } } }"""
MIB = 1024 * 1024
KERNELS = "query($id: ID!) { session(id: $id) { kernels { hostname role image status resources { slot amount } } } }"


async def run_from_template(caravan: Caravan, spec: dict[str, Any]) -> str:
    template = await caravan.gql(CREATE_TEMPLATE, {"input": {"name": "roles", "spec": spec}})
    overrides = {"name": "roles-" + uuid.uuid4().hex[:6]}
    data = await caravan.gql(FROM_TEMPLATE, {"id": template["createSessionTemplate"]["id"], "overrides": overrides})
    session_id = str(data["createSessionFromTemplate"]["sessions"][0]["id"])
    await caravan.wait_for(session_id, "RUNNING", timeout=90)
    return session_id


async def allocated(caravan: Caravan, session_id: str) -> dict[str, tuple[int, int]]:
    """Kernel hostname -> (CPU MHz, memory MiB) Nomad allocated to its task."""
    session = await caravan.store.get(session_id)
    assert session is not None
    found = {}
    for kernel in session.kernels:
        assert kernel.alloc_id, kernel
        alloc = await caravan.nomad.allocation(kernel.alloc_id)
        [task] = alloc["AllocatedResources"]["Tasks"].values()
        found[kernel.hostname] = (task["Cpu"]["CpuShares"], task["Memory"]["MemoryMB"])
    return found


async def test_main_and_sub_kernels_get_their_own_resources(caravan: Caravan) -> None:
    spec = {"type": "INTERACTIVE", "driver": "EXEC", "clusterSize": 3,
            "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "64m"}],
            "kernelRoles": [{"role": "MAIN", "resources": [{"slot": "mem", "amount": "96m"}]},
                            {"role": "SUB", "resources": [{"slot": "cpu", "amount": "0.25"},
                                                          {"slot": "mem", "amount": "48m"}]}]}  # fmt: skip
    session_id = await run_from_template(caravan, spec)
    resources = await allocated(caravan, session_id)
    assert {host: mib for host, (_, mib) in resources.items()} == {"main1": 96, "sub1": 48, "sub2": 48}
    main_mhz, sub_mhz = resources["main1"][0], resources["sub1"][0]
    # half a core against a quarter, each rounded to whole MHz (a core of 2,298 MHz: 1,149 against 574)
    assert resources["sub2"][0] == sub_mhz and abs(main_mhz - 2 * sub_mhz) <= 1
    hcl = (await caravan.store.get(session_id)).job_hcl  # type: ignore[union-attr]
    assert hcl is not None and "memory = 96" in hcl and "memory = 48" in hcl
    kernels = (await caravan.gql(KERNELS, {"id": session_id}))["session"]["kernels"]
    shown = {k["hostname"]: {r["slot"]: Decimal(r["amount"]) for r in k["resources"]} for k in kernels}
    assert shown == {
        "main1": {"cpu": Decimal("0.5"), "mem": 96 * MIB},
        "sub1": {"cpu": Decimal("0.25"), "mem": 48 * MIB},
        "sub2": {"cpu": Decimal("0.25"), "mem": 48 * MIB},
    }


@pytest.fixture
async def second_tag() -> AsyncIterator[str]:
    """The local busybox image under a second tag (no registry is reachable: a tag is how to get another image)."""
    repository = DEFAULT_IMAGE.rsplit(":", 1)[0]
    tag = f"{repository}:roles-{uuid.uuid4().hex[:8]}"
    tagged = await asyncio.create_subprocess_exec("docker", "tag", DEFAULT_IMAGE, tag)
    assert await tagged.wait() == 0
    yield tag
    untagged = await asyncio.create_subprocess_exec(
        "docker", "rmi", tag, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await untagged.wait()


@pytest.mark.docker
async def test_main_and_sub_kernels_run_their_own_image_tags(caravan: Caravan, second_tag: str) -> None:
    spec = {"type": "INTERACTIVE", "driver": "DOCKER", "image": DEFAULT_IMAGE, "clusterSize": 2,
            "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}],
            "kernelRoles": [{"role": "SUB", "image": second_tag,
                             "resources": [{"slot": "mem", "amount": "32m"}]}]}  # fmt: skip
    session_id = await run_from_template(caravan, spec)
    kernels = (await caravan.gql(KERNELS, {"id": session_id}))["session"]["kernels"]
    assert {k["hostname"]: k["image"] for k in kernels} == {"main1": DEFAULT_IMAGE, "sub1": second_tag}
    session = await caravan.store.get(session_id)
    assert session is not None and session.nomad_job_id
    job = await caravan.nomad.job(session.nomad_job_id)
    images = {group["Name"]: group["Tasks"][0]["Config"]["image"] for group in job["TaskGroups"]}
    assert images == {"main1": DEFAULT_IMAGE, "sub1": second_tag}
    assert {host: mib for host, (_, mib) in (await allocated(caravan, session_id)).items()} == {"main1": 64, "sub1": 32}
