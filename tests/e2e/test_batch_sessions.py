"""A batch session end to end over HTTP GraphQL: real Redis, real Nomad, real Docker."""

from __future__ import annotations

import pytest

from tests.conftest import DEFAULT_IMAGE
from tests.harness import CREATE, Caravan

DRIVERS = [pytest.param("DOCKER", marks=pytest.mark.docker, id="docker"), pytest.param("EXEC", id="exec")]


async def create(caravan: Caravan, **fields: object) -> str:
    if fields.get("driver") != "DOCKER":
        fields.pop("image", None)  # the other drivers run no image (and refuse one)
    data = await caravan.gql(CREATE, {"input": {"type": "BATCH", **fields}})
    [session] = data["createSession"]["sessions"]
    assert session["status"] == "PENDING"
    return str(session["id"])


@pytest.mark.parametrize("driver", DRIVERS)
async def test_exit_zero_is_success_with_logs(caravan: Caravan, driver: str) -> None:
    session_id = await create(
        caravan,
        name="ok-job",
        driver=driver,
        image=DEFAULT_IMAGE,
        startupCommand="echo hello from $CARAVAN_SESSION_NAME; echo oops >&2",
    )
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert (session["status"], session["result"], session["exitCode"]) == ("TERMINATED", "SUCCESS", 0)
    assert session["statusInfo"] == "task-finished"
    assert session["nomadJobId"] == f"{caravan.settings.nomad.job_prefix}-{session_id}"
    assert f'driver = "{driver.lower()}"' in session["jobHcl"]
    history = [change["status"] for change in session["statusHistory"]]
    assert history[0] == "PENDING" and history[-1] == "TERMINATED"
    assert history.index("SCHEDULED") < history.index("TERMINATED")
    stamps = [change["at"] for change in session["statusHistory"]]
    assert stamps == sorted(stamps)
    kernel = session["mainKernel"]
    assert kernel["logs"]["stdout"] == "hello from ok-job\n"
    assert kernel["logs"]["stderr"] == "oops\n"
    assert kernel["agent"]


@pytest.mark.parametrize("driver", DRIVERS)
async def test_exit_three_is_failure_with_its_code(caravan: Caravan, driver: str) -> None:
    session_id = await create(caravan, name="bad-job", driver=driver, image=DEFAULT_IMAGE, startupCommand="exit 3")
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert (session["status"], session["result"], session["exitCode"]) == ("TERMINATED", "FAILURE", 3)
    assert session["statusInfo"] == "task-failed"
    assert session["mainKernel"]["exitCode"] == 3


async def test_raw_exec_runs_for_admins(caravan: Caravan) -> None:
    session_id = await create(caravan, name="admin-raw", driver="RAW_EXEC", startupCommand="exit 0")
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert session["result"] == "SUCCESS"


@pytest.mark.parametrize("run", range(4))
@pytest.mark.docker
async def test_a_docker_kernels_last_output_is_not_lost_when_it_exits(caravan: Caravan, run: int) -> None:
    """Nomad stops copying a container's output as soon as the container exits (hashicorp/nomad#6931): a kernel that
    prints and exits at once could lose its last lines. Docker kernels linger a moment after their command, so the
    output arrives whole, and the exit code is still the command's."""
    lines = 2000
    session_id = await create(
        caravan,
        name=f"burst-{run}",
        driver="DOCKER",
        image=DEFAULT_IMAGE,
        startupCommand=f'i=0; while [ $i -lt {lines} ]; do echo "line $i"; i=$((i+1)); done; echo last; exit 7',
    )
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    assert (session["status"], session["exitCode"]) == ("TERMINATED", 7)
    out = session["mainKernel"]["logs"]["stdout"].splitlines()
    assert out[-1] == "last" and len(out) == lines + 1, out[-3:]
