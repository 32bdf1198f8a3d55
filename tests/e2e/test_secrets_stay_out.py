"""Caravan's credentials never reach a session: not in its environment, not in its job spec, not in a file its task
can read (exec and docker tasks; a raw_exec task runs as root on the host, which is why only admins get it)."""

from __future__ import annotations

import json

import pytest

from core.settings import Settings
from tests.conftest import DEFAULT_IMAGE
from tests.harness import CREATE, Caravan

ISOLATED = [pytest.param("DOCKER", marks=pytest.mark.docker, id="docker"), pytest.param("EXEC", id="exec")]


def secrets_of(settings: Settings) -> dict[str, str]:
    found = {path.name: path.read_text().strip() for path in settings.secrets.iterdir() if path.is_file()}
    assert any(name.startswith("nomad-") for name in found) and any(name.startswith("redis-") for name in found)
    return found


async def run(caravan: Caravan, driver: str, command: str) -> dict[str, object]:
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "type": "BATCH",
                "name": f"peek-{driver.lower()}",
                "driver": driver,
                "startupCommand": command,
                **({"image": DEFAULT_IMAGE} if driver == "DOCKER" else {}),
            }
        },
    )
    session = await caravan.wait_for(data["createSession"]["sessions"][0]["id"], "TERMINATED", "ERROR")
    assert session["status"] == "TERMINATED", session
    return session


CREDENTIAL_VARIABLES = {
    "CARAVAN_NOMAD_TOKEN",
    "NOMAD_TOKEN",
    "CARAVAN_REDIS_URL",
    "CARAVAN_SECRETS_DIR",
    "CARAVAN_HOME",
    "CARAVAN_ADMIN_TOKEN",
}


def names_of(env_output: str) -> set[str]:
    return {line.split("=", 1)[0] for line in env_output.splitlines() if "=" in line}


def assert_no_secret_in(text: str, secrets: dict[str, str]) -> None:
    leaked = [name for name, value in secrets.items() if name.endswith((".token", ".password")) and value in text]
    assert not leaked, f"{leaked} leaked"


@pytest.mark.parametrize("driver", ISOLATED)
async def test_an_isolated_task_sees_no_secret(caravan: Caravan, driver: str) -> None:
    secrets = secrets_of(caravan.settings)
    directory = caravan.settings.secrets
    # "done" shows the whole output arrived (docker kernels linger for it: nomad_jobs.session_job.BOOTSTRAP)
    session = await run(
        caravan, driver, f"printf '%s\\ndone\\n' \"$(env; cat {directory}/* 2>&1; ls -la {directory} 2>&1)\""
    )
    stdout = session["mainKernel"]["logs"]["stdout"]  # type: ignore[index]
    assert "done" in stdout and "PATH=" in stdout, session
    assert_no_secret_in(stdout, secrets)
    assert not names_of(stdout) & CREDENTIAL_VARIABLES
    job = await caravan.nomad.job(str(session["nomadJobId"]))
    assert_no_secret_in(json.dumps(job) + str(session["jobHcl"]), secrets)


async def test_a_raw_exec_task_inherits_no_secret_from_nomad_or_caravan(caravan: Caravan) -> None:
    secrets = secrets_of(caravan.settings)
    session = await run(caravan, "RAW_EXEC", "env; echo done")
    stdout = session["mainKernel"]["logs"]["stdout"]  # type: ignore[index]
    assert "done" in stdout
    assert_no_secret_in(stdout, secrets)
    assert not names_of(stdout) & CREDENTIAL_VARIABLES
