"""``caravan dev``: the gateway, the scheduler and the idle checker each in a process of its own, supervised."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from caravan.supervisor import FIRST_DELAY, MAX_DELAY, restart_delay
from core.keys import Keys
from core.settings import Settings
from tests.dev_process import ROLES, alive, caravan_dev, children_of, until
from tests.harness import caravan_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("quick_deaths", "delay"),
    [
        (0, FIRST_DELAY),
        (1, FIRST_DELAY),
        (2, 2 * FIRST_DELAY),
        (3, 4 * FIRST_DELAY),
        (20, MAX_DELAY),
        (5000, MAX_DELAY),  # a child dying quickly for two days: no OverflowError
    ],
)
def test_restarts_back_off_while_a_child_keeps_dying_quickly(quick_deaths: int, delay: float) -> None:
    assert restart_delay(quick_deaths) == delay


async def test_each_service_runs_alone_is_restarted_when_it_dies_and_dies_with_the_supervisor(
    settings: Settings, redis: Redis, keys: Keys
) -> None:
    async with caravan_dev(settings) as dev:
        await until(lambda: set(dev.roles()) == set(ROLES), 30, "the three services")
        roles = dev.roles()
        assert len(set(roles.values())) == 3 and dev.supervisor.pid not in roles.values()
        for lease in (keys.scheduler_lease, keys.idle_lease):
            await until_set(redis, lease)
        fence = int(await redis.get(keys.scheduler_fence) or 0)

        os.kill(roles["scheduler"], signal.SIGKILL)
        await until(
            lambda: dev.roles().get("scheduler", roles["scheduler"]) != roles["scheduler"],
            30,
            "a new scheduler process",
        )
        assert {role: pid for role, pid in dev.roles().items() if role != "scheduler"} == {
            role: pid for role, pid in roles.items() if role != "scheduler"
        }  # the others ran on untouched
        # the new scheduler leads once the killed one's lease has expired: a new term
        await until_set(redis, keys.scheduler_fence, above=fence)

        survivors = dev.roles().values()
        dev.supervisor.send_signal(signal.SIGKILL)
        dev.supervisor.wait()
        await until(lambda: not any(alive(pid) for pid in survivors), 10, "the services to die with the supervisor")


async def until_set(redis: Redis, key: str, *, above: int | None = None) -> None:
    """Until ``key`` exists (and holds a number above ``above``, if given)."""
    deadline = time.monotonic() + 40
    while (value := await redis.get(key)) is None or (above is not None and int(value) <= above):
        assert time.monotonic() < deadline, f"{key} is {value!r}"
        await asyncio.sleep(0.2)


def test_a_refused_configuration_stops_dev_before_anything_starts(redis_settings: Settings, tmp_path: Path) -> None:
    broken = tmp_path / "idle.hcl"
    broken.write_text("check_interval = \n")
    env = {**caravan_env(redis_settings, 1), "CARAVAN_IDLE_POLICY": str(broken)}
    done = subprocess.run([sys.executable, "-m", "caravan.cli", "dev"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr.decode()
    assert "configuration refused" in done.stderr.decode()


@pytest.mark.parametrize("command", ["gateway", "dev"])
def test_a_malformed_graphql_limit_is_a_refused_configuration(redis_settings: Settings, command: str) -> None:
    env = {**caravan_env(redis_settings, 1), "CARAVAN_GRAPHQL_MAX_COST": "lots"}
    done = subprocess.run([sys.executable, "-m", "caravan.cli", command], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr.decode()
    assert "configuration refused: CARAVAN_GRAPHQL_MAX_COST must be a whole number" in done.stderr.decode()
    assert b"Traceback" not in done.stderr


def supervising(idle: str, others: str = "import time; time.sleep(300)") -> subprocess.Popen[bytes]:
    """A real supervisor whose idle checker runs the Python code ``idle``, and its other roles ``others``."""
    script = textwrap.dedent(f"""
        import sys
        from caravan.supervisor import Supervisor
        idle, others = [sys.executable, "-c", {idle!r}], [sys.executable, "-c", {others!r}]
        sys.exit(Supervisor(lambda role: idle if role == "idle" else others, {{}}).run())
    """)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_a_child_refused_later_stops_the_others_and_dev_exits_2() -> None:
    """Each role a real process: the idle checker's is refused (exit 2) after a moment; the others would run on."""
    supervisor = supervising("import time, sys; time.sleep(0.5); sys.exit(2)")
    try:
        output, _ = supervisor.communicate(timeout=60)
        assert supervisor.returncode == 2, output.decode()
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
    leftovers = subprocess.run(["pgrep", "-g", str(supervisor.pid)], capture_output=True, text=True).stdout.split()
    assert leftovers == []  # the two that would have run on were stopped


async def test_sighup_reaches_the_idle_checker_and_sigterm_stops_everyone(tmp_path: Path) -> None:
    listening, heard = tmp_path / "listening", tmp_path / "hup"
    idle = (
        "import pathlib, signal, time\n"
        f"signal.signal(signal.SIGHUP, lambda *_: pathlib.Path({str(heard)!r}).touch())\n"
        f"pathlib.Path({str(listening)!r}).touch()\n"
        "time.sleep(300)"
    )
    with supervising(idle) as supervisor:  # its output pipe closed after
        try:
            await until(lambda: len(children_of(supervisor.pid)) == 3 and listening.exists(), 30, "three children")
            children = children_of(supervisor.pid)
            supervisor.send_signal(signal.SIGHUP)
            await until(heard.exists, 10, "the idle checker to get SIGHUP")
            assert children_of(supervisor.pid) == children  # nobody was restarted or stopped by it
            supervisor.send_signal(signal.SIGTERM)
            assert supervisor.wait(30) == 0
            assert not any(alive(pid) for pid in children)
        finally:
            if supervisor.poll() is None:
                os.killpg(supervisor.pid, signal.SIGKILL)
