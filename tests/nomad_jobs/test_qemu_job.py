"""The qemu driver's task config, the guest's exit code read back, and the VM image allowlist. Pure.

tests/e2e/test_qemu.py runs the VMs on real Nomad; this checks the decisions on their own."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from core.errors import Forbidden, InvalidInput
from core.settings import qemu_images_of
from domain import vm
from domain.model import Driver, Kernel, KernelObservation, Session, SessionStatus, SessionType
from domain.scheduling_config import SchedulingConfigError, parse_scheduling_config
from domain.session_requests import CreationRules, SessionRequest, build_sessions
from domain.users import Role, User
from nomad_jobs import qemu
from nomad_jobs.observe import for_driver
from nomad_jobs.session_job import JobContext, render_session_job, vm_environment

IMAGES = {"caravan/vm:1": "/images/vm-1"}
NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = SessionStatus


def fw_cfg(args: list[str], name: str) -> str:
    prefix = f"name=opt/caravan/{name},string="
    [item] = [a for a in args if a.startswith(prefix)]
    return item[len(prefix) :]


def decoded_environ(item: str) -> dict[str, str]:
    pairs = (line.split(" ", 1) for line in item.splitlines())
    return {name: base64.b64decode(value).decode() for name, value in pairs}


def vm_session(
    command: str | None = "echo hi", environ: dict[str, str] | None = None, cpu: str = "1", image: str = "caravan/vm:1"
) -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image=image, resources={"cpu": cpu, "mem": "268435456"})
    return Session(
        id="00000000-0000-0000-0000-000000000001",
        name="vm",
        owner_id="u",
        type=SessionType.BATCH,
        driver=Driver.QEMU,
        image=image,
        resources=kernel.resources,
        kernels=(kernel,),
        created_at=NOW,
        startup_command=command,
        environ=environ or {},
    )


def test_the_config_boots_the_allowlisted_image_with_no_network_and_no_writes() -> None:
    config = qemu.driver_config("/images/vm-1", "echo hi", {"A": "1"}, Decimal("1"))
    assert config["image_path"] == "/images/vm-1/initrd.img"
    assert (config["drive_interface"], config["accelerator"]) == ("none", "tcg")
    args = config["args"]
    assert isinstance(args, list)
    assert args[args.index("-kernel") + 1] == "/images/vm-1/vmlinux"
    assert args[args.index("-initrd") + 1] == "/images/vm-1/initrd.img"
    assert {"-nodefaults", "-snapshot", "-no-reboot"} <= set(args)
    assert "-smp" not in args  # one vCPU boots fastest under software emulation
    assert "isa-debug-exit,iobase=0xf4,iosize=0x01" in args


@pytest.mark.parametrize(("cores", "vcpus"), [("0.5", None), ("1", None), ("1.5", "2"), ("4", "4")])
def test_vcpus_follow_the_kernel_cores(cores: str, vcpus: str | None) -> None:
    args = qemu.driver_config("/i", "true", {}, Decimal(cores))["args"]
    assert isinstance(args, list)
    assert (args[args.index("-smp") + 1] if "-smp" in args else None) == vcpus


HOSTILE = ['say "hi"', "${node.unique.id}", "$$ $${x} %{ if }", "a,b,,c", "line\nline\r\n\ttab", "✓ \u2028 \x07", ""]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_command_and_environment_travel_as_base64_and_decode_exactly(text: str) -> None:
    session = vm_session(text + " command", {"EVIL": text, "PLAIN": "x"})
    config = qemu.driver_config(
        "/i", session.startup_command or "", vm_environment(session, session.main_kernel), Decimal("1")
    )
    args = config["args"]
    assert isinstance(args, list)
    assert base64.b64decode(fw_cfg(args, "command")).decode() == text + " command"
    environ = decoded_environ(fw_cfg(args, "environ"))
    assert (environ["EVIL"], environ["PLAIN"]) == (text, "x")
    assert environ["CARAVAN_SESSION_NAME"] == "vm" and "CARAVAN_ENCODED_ENV" not in environ
    # No user byte is visible to QEMU's option parser, Nomad's interpolation or HCL.
    for arg in args:
        assert "${" not in arg and "%{" not in arg


def test_the_rendered_job_carries_the_vm_config() -> None:
    hcl = render_session_job(vm_session(), JobContext(job_prefix="cv", qemu_images=IMAGES)).hcl
    assert 'driver = "qemu"' in hcl and '"/images/vm-1/initrd.img"' in hcl and '"/images/vm-1/vmlinux"' in hcl


def test_an_image_no_longer_allowlisted_renders_no_path() -> None:
    hcl = render_session_job(vm_session(), JobContext(job_prefix="cv", qemu_images={})).hcl
    assert re.search(r'image_path\s*=\s*"initrd.img"', hcl) and '"vmlinux"' in hcl  # missing: the VM fails to start
    assert "caravan/vm" not in hcl  # the name never becomes a path


def test_an_environment_too_large_for_one_argument_is_refused() -> None:
    with pytest.raises(vm.PayloadTooLarge):
        vm.environ_item({"V": "x" * vm.MAX_ITEM_BYTES})


@pytest.mark.parametrize(
    ("qemu_status", "code"),
    [
        (3, 0),
        (5, 1),
        (9, 3),
        (253, 125),
        (255, 126),  # reported by the guest: (min(code, 126) + 1) << 1 | 1
        (0, None),
        (1, None),
        (2, None),  # QEMU's own: stopped from outside, failed to start
    ],
)
def test_the_guest_exit_code_is_decoded(qemu_status: int, code: int | None) -> None:
    assert qemu.guest_exit_code(qemu_status) == code


@pytest.mark.parametrize(
    ("status", "raw", "after"),
    [
        (S.TERMINATED, 3, (S.TERMINATED, "task-finished", 0)),
        (S.TERMINATED, 9, (S.TERMINATED, "task-failed", 3)),
        (S.TERMINATED, 0, (S.TERMINATED, "vm-stopped", None)),
        (S.TERMINATED, 1, (S.ERROR, "failed-to-start", None)),
        (S.TERMINATED, -1, (S.TERMINATED, "vm-stopped", None)),  # killed by a signal
        (S.RUNNING, None, (S.RUNNING, "seen", None)),
    ],
)
def test_a_qemu_observation_carries_the_guest_code(
    status: SessionStatus, raw: int | None, after: tuple[SessionStatus, str, int | None]
) -> None:
    seen = KernelObservation(hostname="main1", status=status, reason="seen", exit_code=raw)
    decoded = for_driver(seen, Driver.QEMU)
    assert (decoded.status, decoded.reason, decoded.exit_code) == after
    assert for_driver(seen, Driver.EXEC) == seen


def test_the_allowlist_comes_from_settings_or_the_built_image() -> None:
    assert qemu_images_of({"CARAVAN_QEMU_IMAGES": "a=/x, b=/y/z"}) == {"a": "/x", "b": "/y/z"}
    built = {"CARAVAN_VM_IMAGE": "caravan/vm:1", "CARAVAN_VM_IMAGE_DIR": "/c/vm/1"}
    assert qemu_images_of(built) == {"caravan/vm:1": "/c/vm/1"}
    assert qemu_images_of({**built, "CARAVAN_QEMU_IMAGES": "mine=/m"}) == {"mine": "/m"}
    assert qemu_images_of({}) == {}
    with pytest.raises(ValueError, match="not name=/absolute"):
        qemu_images_of({"CARAVAN_QEMU_IMAGES": "relative=images/x"})


VIEWER = User(id="u", name="u", role=Role.USER)


def build(
    images: dict[str, str] = IMAGES,
    allowed_drivers: frozenset[str] = frozenset(d.value for d in Driver),
    **fields: object,
) -> list[Session]:
    fields = {"name": "vm-job", "type": SessionType.BATCH, "driver": Driver.QEMU, "startup_command": "true", **fields}
    request = SessionRequest(**fields)  # type: ignore[arg-type]
    rules = CreationRules(default_image="caravan/busybox:1", qemu_images=images, allowed_drivers=allowed_drivers)
    return build_sessions(request, viewer=VIEWER, now=NOW, rules=rules)


def test_a_vm_session_without_an_image_gets_the_only_allowlisted_one() -> None:
    [session] = build()
    assert session.image == "caravan/vm:1" and session.main_kernel.image == "caravan/vm:1"


@pytest.mark.parametrize(
    ("images", "fields", "field"),
    [
        (IMAGES, {"image": "caravan/busybox:1"}, "image"),
        ({}, {"image": "caravan/vm:1"}, "image"),
        ({}, {}, "image"),  # nothing allowlisted: no default either
        ({"a": "/a", "b": "/b"}, {}, "image"),  # several allowlisted: the session must name one
        (IMAGES, {"resources": {"mem": "191m"}}, "resources.mem"),  # boots from about 160m: 128m stopped at once
        (IMAGES, {"preopen_ports": (8080,)}, "preopenPorts"),
        (IMAGES, {"environ": {f"V{i}": "x" * 30000 for i in range(4)}}, "environ"),
    ],
)
def test_what_a_vm_cannot_take_is_refused_by_field(
    images: dict[str, str], fields: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        build(images, **fields)
    assert raised.value.field == field


def test_resource_groups_name_their_allowed_drivers() -> None:
    config = parse_scheduling_config(
        'default {\n  allowed_drivers = ["exec", "docker"]\n}\n'
        'resource_group "vms" {\n  allowed_drivers = ["qemu"]\n}\n'
        'resource_group "gpu" {\n  agent_selector = "concentrated"\n}\n'
    )
    assert config.drivers_allowed("vms") == {"qemu"}
    assert config.drivers_allowed("gpu") == config.drivers_allowed("other") == {"exec", "docker"}  # inherited
    assert parse_scheduling_config({}).drivers_allowed("any") == {d.value for d in Driver}
    refused = 'resource_group "vms" {\n  agent_selector = "dispersed"\n  allowed_drivers = ["kvm"]\n}\n'
    with pytest.raises(SchedulingConfigError, match=r"f.hcl:3: resource_group.vms.allowed_drivers: unknown driver"):
        parse_scheduling_config(refused, "f.hcl")


def test_a_driver_the_group_does_not_allow_is_forbidden() -> None:
    with pytest.raises(Forbidden) as raised:
        build(allowed_drivers=frozenset({"exec"}))
    assert raised.value.field == "driver"
    [session] = build(allowed_drivers=frozenset({"qemu"}))
    assert session.driver is Driver.QEMU


def test_an_empty_environment_sends_no_item() -> None:
    args = qemu.driver_config("/i", "true", {}, Decimal("1"))["args"]
    assert isinstance(args, list)
    assert not any(a.startswith("name=opt/caravan/environ") for a in args)  # QEMU refuses an empty string item
