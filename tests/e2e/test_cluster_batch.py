"""BATCH cluster sessions on real Nomad, on the session network: every kernel runs the command; a sub whose command
ends is still known to its peers (main1 never waits for it), each kernel's ``/etc/hosts`` names every kernel once, and
the result follows the README's rule (main1's command decides; a sub's failing command fails the session at once)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.conftest import DEFAULT_IMAGE
from tests.harness import CREATE, Caravan

NOT_KNOWN = "not every cluster peer is known"
"""What the bootstrap says when it gave up waiting for a peer's address (``nomad_jobs.session_job.BOOTSTRAP``)."""
SESSION = """query($id: ID!) { session(id: $id) {
  status statusInfo statusDetail result exitCode
  kernels { hostname status statusInfo exitCode logs { stdout stderr } } } }"""
DRIVERS = [pytest.param("DOCKER", marks=pytest.mark.docker), "EXEC"]


async def run(caravan: Caravan, driver: str, size: int, command: str) -> dict[str, Any]:
    """A BATCH cluster session of ``size`` kernels running ``command``, once it ended, with every kernel's logs."""
    image = {"image": DEFAULT_IMAGE} if driver == "DOCKER" else {}
    spec = {"name": "c-" + uuid.uuid4().hex[:8], "type": "BATCH", "driver": driver, "clusterSize": size, **image,
            "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}],
            "startupCommand": command}  # fmt: skip
    data = await caravan.gql(CREATE, {"input": spec})
    [session_id] = [s["id"] for s in data["createSession"]["sessions"]]
    # Generous: before the fix main1 waited 120 s for a peer that had ended, and the assertions below say so.
    await caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=240)
    session: dict[str, Any] = (await caravan.gql(SESSION, {"id": session_id}))["session"]
    return session


def kernel(session: dict[str, Any], hostname: str) -> dict[str, Any]:
    [found] = [k for k in session["kernels"] if k["hostname"] == hostname]
    return found


def hosts_lines(stdout: str) -> dict[str, list[str]]:
    """Hostname -> the lines of the printed ``/etc/hosts`` (between the markers) that name it."""
    lines = stdout.split("--hosts--\n", 1)[1].split("--end--\n", 1)[0].splitlines()
    named: dict[str, list[str]] = {}
    for line in lines:
        if not line.split() or line.startswith("#"):
            continue
        address, *names = line.split()
        for name in names:
            named.setdefault(name, []).append(address)
    return named


PRINT_HOSTS = 'echo --hosts--; cat /etc/hosts; echo --end--; echo "addr=$CARAVAN_CLUSTER_ADDR"'


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_sub_that_ends_at_once_is_known_and_a_running_sub_is_reached_by_name(
    caravan: Caravan, driver: str
) -> None:
    # sub2's command ends at once; sub1 serves until the session ends; main1 fetches from sub1 by its name.
    command = (
        'case "$CARAVAN_CLUSTER_HOST" in sub2) exit 0 ;; sub1) mkdir -p /tmp/w'
        ' && echo "from $CARAVAN_CLUSTER_HOST" > /tmp/w/index.html'
        ' && exec httpd -f -p "$CARAVAN_CLUSTER_ADDR:7000" -h /tmp/w ;; esac; '
        'for i in $(seq 100); do wget -q -O - "http://sub1:7000/" && break; sleep 0.2; done; ' + PRINT_HOSTS
    )
    session = await run(caravan, driver, 3, command)
    main = kernel(session, "main1")
    assert NOT_KNOWN not in main["logs"]["stderr"], main["logs"]["stderr"]
    assert (session["status"], session["result"], session["exitCode"]) == ("TERMINATED", "SUCCESS", 0), session
    stdout = main["logs"]["stdout"]
    assert stdout.startswith("from sub1\n"), stdout
    named = hosts_lines(stdout)
    # Each kernel once, with its session-network address: main1's is the one its bootstrap exported.
    assert {h: len(a) for h, a in named.items() if h in ("main1", "sub1", "sub2")} == {"main1": 1, "sub1": 1, "sub2": 1}
    assert f"addr={named['main1'][0]}\n" in stdout
    assert all(named[h][0].startswith("172.26.") for h in ("main1", "sub1", "sub2")), named
    # sub2 waited for main1 (0), unless it was stopped before its command ended (143: a TERM, not a failure).
    sub2 = kernel(session, "sub2")
    assert (sub2["status"], sub2["exitCode"] in (0, 143)) == ("TERMINATED", True), sub2


@pytest.mark.docker
async def test_a_two_kernel_session_whose_sub_ends_at_once_does_not_wait_for_it(caravan: Caravan) -> None:
    session = await run(caravan, "DOCKER", 2, '[ "$CARAVAN_CLUSTER_ROLE" = sub ] && exit 0; ' + PRINT_HOSTS)
    main = kernel(session, "main1")
    assert NOT_KNOWN not in main["logs"]["stderr"], main["logs"]["stderr"]
    assert (session["status"], session["result"], session["statusInfo"]) == ("TERMINATED", "SUCCESS", "task-finished")
    named = hosts_lines(main["logs"]["stdout"])
    assert len(named["main1"]) == len(named["sub1"]) == 1 and named["sub1"][0].startswith("172.26."), named


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_failing_sub_fails_the_session_at_once(caravan: Caravan, driver: str) -> None:
    # main1 would end well 30 s later: the sub's failure ends the session first, main1 stopped.
    session = await run(caravan, driver, 2, '[ "$CARAVAN_CLUSTER_ROLE" = sub ] && exit 3; sleep 30; exit 0')
    assert (session["status"], session["result"], session["exitCode"]) == ("TERMINATED", "FAILURE", 3), session
    assert session["statusInfo"] == "task-failed"
    assert session["statusDetail"].startswith("sub1: Terminated: Exit Code: 3"), session["statusDetail"]
    assert (kernel(session, "sub1")["status"], kernel(session, "sub1")["exitCode"]) == ("TERMINATED", 3)


@pytest.mark.docker
async def test_a_failing_main_decides_the_result_whatever_its_sub_did(caravan: Caravan) -> None:
    session = await run(
        caravan, "DOCKER", 2, '[ "$CARAVAN_CLUSTER_ROLE" = sub ] && exit 0; ' + PRINT_HOSTS + "; exit 4"
    )
    main = kernel(session, "main1")
    assert NOT_KNOWN not in main["logs"]["stderr"], main["logs"]["stderr"]
    assert (session["status"], session["result"], session["exitCode"]) == ("TERMINATED", "FAILURE", 4), session
    assert session["statusInfo"] == "task-failed" and session["statusDetail"].startswith("main1: "), session
    assert "sub1" in hosts_lines(main["logs"]["stdout"])
    # sub1 succeeded and waited for main1 (0), or was stopped before its command ended (143): either decides nothing.
    assert (kernel(session, "sub1")["status"], kernel(session, "sub1")["exitCode"] in (0, 143)) == ("TERMINATED", True)
