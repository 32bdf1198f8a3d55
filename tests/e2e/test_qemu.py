"""qemu sessions end to end: real Nomad running real VMs (software emulation) of the image ops/build-vm-image built."""

from __future__ import annotations

import base64
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings
from domain.model import Driver
from nomad_jobs.client import NomadClient
from nomad_jobs.session_job import JobContext, render_session_job
from tests.conftest import QEMU_IMAGES
from tests.e2e.test_hostile_strings import HOSTILE, hex_of, session_with
from tests.harness import CREATE, Caravan, GraphQLErrors, running_caravan

pytestmark = pytest.mark.qemu

IMAGE = next(iter(QEMU_IMAGES), "")
DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id status statusInfo } }"


async def create(caravan: Caravan, **fields: Any) -> str:
    image = {"image": IMAGE} if fields.get("driver", "QEMU") == "QEMU" else {}  # other drivers run no image
    data = await caravan.gql(
        CREATE, {"input": {"name": "vm-" + uuid.uuid4().hex[:8], "type": "BATCH", "driver": "QEMU", **image, **fields}}
    )
    [session] = data["createSession"]["sessions"]
    return str(session["id"])


async def test_a_batch_vm_prints_and_succeeds(caravan: Caravan) -> None:
    session_id = await create(
        caravan, name="vm-hello", startupCommand="echo hello from $CARAVAN_SESSION_NAME in $(uname -s); echo oops >&2"
    )
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert (session["status"], session["result"], session["exitCode"]) == ("TERMINATED", "SUCCESS", 0), session
    assert session["statusInfo"] == "task-finished"
    assert 'driver = "qemu"' in session["jobHcl"]
    # Exactly the command's output: no firmware or kernel messages, no \r from the serial line.
    assert session["mainKernel"]["logs"]["stdout"] == "hello from vm-hello in Linux\n"
    assert session["mainKernel"]["logs"]["stderr"] == "oops\n"


@pytest.mark.parametrize(("command", "reported"), [("exit 3", 3), ("kill -9 $$", 126)], ids=["exit-3", "killed"])
async def test_a_failing_vm_ends_failed_with_its_exit_code(caravan: Caravan, command: str, reported: int) -> None:
    session_id = await create(caravan, startupCommand=command)
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert (session["status"], session["result"], session["exitCode"]) == ("TERMINATED", "FAILURE", reported), session
    assert session["statusInfo"] == "task-failed"
    assert session["mainKernel"]["exitCode"] == reported


async def test_hostile_command_and_env_reach_the_vm_byte_for_byte(caravan: Caravan) -> None:
    evil = "".join(HOSTILE) + "${node.unique.id} $$ $${NOMAD_TASK_DIR} ,opt/x,string=y\n"
    # The guest's shell prints its own command line (the command arrives as argv[2]) and $EVIL as hex, then exits
    # before it reads the hostile lines that follow.
    command = 'od -An -tx1 -v /proc/$$/cmdline; echo; printf %s "$EVIL" | od -An -tx1 -v; exit 0\n' + evil
    session_id = await create(caravan, startupCommand=command, environ=[{"name": "EVIL", "value": evil}])
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert session["result"] == "SUCCESS", session
    cmdline_hex, env_hex = session["mainKernel"]["logs"]["stdout"].split("\n\n", 1)
    assert " ".join(cmdline_hex.split()) == hex_of("/bin/sh\0-c\0" + command + "\0")
    assert " ".join(env_hex.split()) == hex_of(evil)


async def test_an_interactive_vm_runs_until_destroyed(caravan: Caravan) -> None:
    session_id = await create(caravan, type="INTERACTIVE")
    running = await caravan.wait_for(session_id, "RUNNING")
    assert running["mainKernel"]["status"] == "RUNNING"
    [ended] = (await caravan.gql(DESTROY, {"ids": [session_id]}))["destroySession"]
    assert (ended["status"], ended["statusInfo"]) == ("TERMINATING", "user-requested")
    final = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert (final["status"], final["statusInfo"]) == ("TERMINATED", "user-requested")


async def test_without_an_image_the_allowlisted_one_is_used(caravan: Caravan) -> None:
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "name": "vm-default",
                "type": "BATCH",
                "driver": "QEMU",
                "startupCommand": "true",
                "startsAt": "1h",
            }
        },
    )
    [created] = data["createSession"]["sessions"]
    session = await caravan.store.get(created["id"])
    assert session is not None and session.image == IMAGE


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"image": "debian:12"}, "image"),
        ({"image": QEMU_IMAGES.get(IMAGE, "/")}, "image"),  # a path is not a name in the allowlist
        ({"resources": [{"slot": "mem", "amount": "64m"}]}, "resources.mem"),
        ({"preopenPorts": [8080]}, "preopenPorts"),
        ({"environ": [{"name": f"V{i}", "value": "x" * 30000} for i in range(4)]}, "environ"),
    ],
    ids=["unknown-image", "image-path", "too-little-mem", "ports", "environ-too-large"],
)
async def test_what_a_vm_cannot_take_is_refused(caravan: Caravan, change: dict[str, Any], field: str) -> None:
    with pytest.raises(GraphQLErrors) as raised:
        await create(caravan, startupCommand="true", **change)
    [error] = raised.value.errors
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("INVALID_INPUT", field), error
    assert len(await caravan.store.session_ids()) == 0


async def test_resource_groups_allow_only_their_drivers(settings: Settings, tmp_path: Path) -> None:
    config = tmp_path / "scheduler.hcl"
    config.write_text(
        'default {\n  allowed_drivers = ["exec"]\n}\nresource_group "vms" {\n  allowed_drivers = ["qemu"]\n}\n'
    )
    configured = replace(settings, scheduler=replace(settings.scheduler, config_path=config))
    async with running_caravan(configured, scheduler=False) as caravan:
        for group, driver in (("default", "QEMU"), ("vms", "EXEC")):
            with pytest.raises(GraphQLErrors) as raised:
                await create(caravan, driver=driver, resourceGroup=group, startupCommand="true")
            [error] = raised.value.errors
            assert (error["extensions"]["code"], error["extensions"]["field"]) == ("FORBIDDEN", "driver"), error
        assert len(await caravan.store.session_ids()) == 0
        for group, driver in (("vms", "QEMU"), ("default", "EXEC")):
            await create(caravan, driver=driver, resourceGroup=group, startupCommand="true", startsAt="1h")
        assert len(await caravan.store.session_ids()) == 2


async def test_nomad_parses_a_hostile_vm_job_into_one_task_with_the_exact_items(settings: Settings) -> None:
    evil = "".join(HOSTILE)
    session = session_with(evil, placeholder=False).evolve(driver=Driver.QEMU)
    rendered = render_session_job(session, JobContext(job_prefix="hostile", qemu_images=QEMU_IMAGES))
    nomad = NomadClient(settings.nomad)
    try:
        parsed = await nomad.parse(rendered.hcl)
    finally:
        await nomad.aclose()
    [group] = parsed["TaskGroups"]
    [task] = group["Tasks"]
    assert task["Driver"] == "qemu"
    args = task["Config"]["args"]
    items = {a.split(",", 1)[0]: a.split(",string=", 1)[1] for a in args if a.startswith("name=opt/caravan/")}
    assert base64.b64decode(items["name=opt/caravan/command"]).decode() == evil
    environ = dict(line.split(" ", 1) for line in items["name=opt/caravan/environ"].splitlines())
    assert base64.b64decode(environ["EVIL"]).decode() == evil
