"""User strings can never change a job's structure, and reach the task byte for byte."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from domain.model import Driver, Kernel, Session, SessionStatus, SessionType, StatusChange
from nomad_jobs.client import NomadClient
from nomad_jobs.hcl import runtime_text
from nomad_jobs.session_job import NOMAD_ENV_REFERENCE, JobContext, render_session_job
from tests.harness import CREATE, Caravan

HOSTILE = [
    'say "hi"',
    "${attr.unique.hostname}",
    "%{ if true }x%{ endif }",
    "unclosed %{ directive",
    "$${literal}",
    "$$${double}",
    "back\\slash\\\\ and \\n not a newline",
    "line one\nline two\r\n\ttabbed",
    '" }\n  task "evil" { driver = "raw_exec" config { command = "/bin/sh" } }\n  x = "',
    '"}} group "injected" { count = 5 } #',
    "unicode ✓ ünïcödé \u2028 and \x07 bell",
    '\\"${x}\\"',
]


def placeholder_for(text: str) -> str:
    """A harmless value that takes the same path through the renderer as ``text``."""
    return "${PLACEHOLDER}" if NOMAD_ENV_REFERENCE.search(text) else "PLACEHOLDER"


def encodings(value: str) -> tuple[str, ...]:
    return value, runtime_text(value), base64.b64encode(value.encode()).decode()


def session_with(text: str, placeholder: bool) -> Session:
    now = datetime.now(UTC)
    value = placeholder_for(text) if placeholder else text
    return Session(
        id="00000000-0000-0000-0000-000000000001",
        name=value,
        owner_id="u",
        type=SessionType.BATCH,
        driver=Driver.DOCKER,
        image="img:1",
        resources={"cpu": "1", "mem": "268435456"},
        kernels=(Kernel(role="main", index=1, hostname="main1", image="img:1", resources={"cpu": "1"}),),
        created_at=now,
        status_history=(StatusChange(SessionStatus.PENDING, now, "created"),),
        startup_command=value,
        environ={"EVIL": value},
    )


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Leaves where two parsed jobs differ; raises if their shapes differ at all."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"keys differ at {path}"
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"list length differs at {path}"
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path, a, b)]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
async def test_hostile_text_changes_only_its_own_values(nomad_agent: Any, settings: Any, text: str) -> None:
    nomad = NomadClient(settings.nomad)
    ctx = JobContext(job_prefix="hostile")
    try:
        hostile = await nomad.parse(render_session_job(session_with(text, False), ctx).hcl)
        benign = await nomad.parse(render_session_job(session_with(text, True), ctx).hcl)
    finally:
        await nomad.aclose()
    changed = differences(benign, hostile)
    assert changed, "the hostile text should appear somewhere"
    allowed = set(zip(encodings(placeholder_for(text)), encodings(text), strict=True))
    for path, before, after in changed:
        assert (before, after) in allowed, (path, before, after)
    task = hostile["TaskGroups"][0]["Tasks"][0]
    if NOMAD_ENV_REFERENCE.search(text):  # travels base64-encoded: Nomad would rewrite it
        assert base64.b64decode(task["Env"]["CARAVAN_B64_EVIL"]).decode() == text
    else:
        assert task["Env"]["EVIL"] == text
    # Task config is evaluated once more as a template when the task starts.
    assert task["Config"]["args"][3] == runtime_text(text)
    assert hostile["Meta"]["caravan_session_name"] == text
    assert len(hostile["TaskGroups"]) == 1 and len(hostile["TaskGroups"][0]["Tasks"]) == 1


def hex_of(text: str) -> str:
    return " ".join(f"{b:02x}" for b in text.encode())


async def test_hostile_env_and_command_reach_the_task_byte_for_byte(caravan: Caravan) -> None:
    evil = "".join(HOSTILE)
    # The shell prints its own command line (the command arrives as argv[2]) and $EVIL as hex, then
    # exits before it reads the hostile lines that follow.
    command = 'od -An -tx1 -v /proc/$$/cmdline; echo; printf %s "$EVIL" | od -An -tx1 -v; exit 0\n' + evil
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "name": "hostile-" + uuid.uuid4().hex[:6],
                "type": "BATCH",
                "driver": "EXEC",
                "startupCommand": command,
                "environ": [{"name": "EVIL", "value": evil}],
            }
        },
    )
    session_id = data["createSession"]["sessions"][0]["id"]
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert session["result"] == "SUCCESS", session
    cmdline_hex, env_hex = session["mainKernel"]["logs"]["stdout"].split("\n\n", 1)
    assert " ".join(cmdline_hex.split()) == hex_of("/bin/sh\0-c\0" + command + "\0")
    assert " ".join(env_hex.split()) == hex_of(evil)


async def test_hostile_object_keys_parse_back_exactly(nomad_agent: Any, settings: Any) -> None:
    from nomad_jobs.hcl import Block, render

    keys = HOSTILE + ["%{", "%%{", "a%{b", "${", "$${"]
    job = Block("job", "keys", meta={k: k for k in keys})
    job.block("group", "g").block("task", "t", driver="raw_exec").block("config", command="/bin/true")
    nomad = NomadClient(settings.nomad)
    try:
        parsed = await nomad.parse(render(job))
    finally:
        await nomad.aclose()
    assert parsed["Meta"] == {k: k for k in keys}
