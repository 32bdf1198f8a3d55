"""Issue #3: kill -9 Redis, Nomad, the gateway and the scheduler as processes, restart them, and lose or double nothing.

This module starts its own Redis (append-only file) and its own non-dev single-node Nomad agent (state on disk), and
restarts them on the same ports and directories; the session-scoped ones of ``tests/conftest.py`` are never touched.
Each test checks the same things afterwards:

- every session whose ``createSession`` was acknowledged exists, and every session converges to its true state
  (BATCH: TERMINATED with the result its exit code says; INTERACTIVE: RUNNING on the same task);
- every session has exactly one Nomad job, registered once (job version 0), and one allocation;
- while a dependency is down the gateway answers ``UNAVAILABLE``, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from caravan.stack.nomad_cluster import SingleNodeNomad, start_nomad_single_node
from caravan.stack.processes import Service, free_port
from caravan.stack.redis_server import start_redis
from core.settings import NomadSettings, RedisSettings, SchedulerSettings, Settings
from domain.model import Session, SessionResult, SessionStatus
from tests.conftest import TEST_KEY_PREFIXES
from tests.harness import ADMIN_TOKEN, CREATE, KILLED_SCHEDULERS, Caravan, caravan_env, running_caravan

pytestmark = [pytest.mark.nomad, pytest.mark.redis]  # a Redis and a Nomad agent of its own, restarted

S = SessionStatus
CARAVAN = Path(sys.executable).with_name("caravan")


@dataclass
class RestartableRedis:
    """A Redis on a fixed port and directory that can be killed and started again on both."""

    directory: Path
    port: int
    log: Path
    secrets_dir: Path
    service: Service | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.service = start_redis(
            self.directory, self.port, log=self.log, secrets_dir=self.secrets_dir, key_prefixes=TEST_KEY_PREFIXES
        )

    def kill(self) -> None:
        assert self.service is not None
        self.service.process.send_signal(signal.SIGKILL)
        self.service.process.wait(10)

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()


@dataclass
class OwnStack:
    redis: RestartableRedis
    nomad: SingleNodeNomad


@pytest.fixture(scope="session")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnStack]:
    """This module's and ``test_usage``'s stack, started once: the tests are isolated by namespace, and each that kills
    its Redis or Nomad starts it again before it ends."""
    from tests.conftest import STACK

    state = tmp_path_factory.mktemp("restarts")
    redis = RestartableRedis(state / "redis", free_port(), state / "redis.log", state / "secrets")
    redis.start()
    try:
        nomad = start_nomad_single_node(
            state / "nomad",
            nomad_home=Path(STACK["CARAVAN_NOMAD_HOME"]),
            rootfs=Path(STACK["CARAVAN_ROOTFS"]),
            secrets_dir=state / "secrets",
        )
    except BaseException:
        redis.stop()
        raise
    yield OwnStack(redis, nomad)
    nomad.stop()
    redis.stop()


@pytest.fixture
def own_settings(own_stack: OwnStack, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path,
        secrets_dir=own_stack.redis.secrets_dir,
        redis=RedisSettings(url=own_stack.redis.url, prefix=namespace),
        nomad=NomadSettings(addr=own_stack.nomad.addr, job_prefix=namespace),
        scheduler=SchedulerSettings(reconcile_interval=2.0, pass_interval=0.5),
    ).for_role("admin")


def batch(name: str, command: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "BATCH",
        "driver": "RAW_EXEC",
        "startupCommand": command,
        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "32m"}],
        **fields,
    }


def exit_code_of(session: Session) -> int:
    """Sessions here are named ``<what>-<n>`` and exit with ``n % 3``."""
    return int(session.name.rsplit("-", 1)[1]) % 3


async def converged(caravan: Caravan, *, timeout: float = 120.0) -> list[Session]:
    """Every session of the namespace once none is PENDING, SCHEDULED, PREPARING or TERMINATING."""
    deadline = time.monotonic() + timeout
    while True:
        sessions = [s for s in await caravan.store.get_many(await caravan.store.session_ids()) if s is not None]
        settling = [
            s
            for s in sessions
            if s.status in (S.PENDING, S.SCHEDULED, S.PREPARING, S.TERMINATING)
            or (s.type.value == "BATCH" and s.status is S.RUNNING)
        ]
        if not settling:
            return sessions
        if time.monotonic() > deadline:
            raise AssertionError(f"not converged after {timeout}s: {[(s.id, s.status) for s in settling][:10]}")
        await asyncio.sleep(0.5)


async def assert_one_job_each(caravan: Caravan, sessions: list[Session]) -> None:
    jobs = {j["ID"] for j in await caravan.nomad.jobs(caravan.settings.nomad.job_prefix + "-")}
    assert jobs == {s.nomad_job_id for s in sessions}, "a session without its job, or a job without its session"
    for session in sessions:
        assert session.nomad_job_id is not None
        job = await caravan.nomad.job(session.nomad_job_id)
        assert job["Version"] == 0, (session.id, job["Version"])  # registered once, never re-registered
        allocations = await caravan.nomad.job_allocations(session.nomad_job_id)
        assert len(allocations) == 1, (session.id, len(allocations))


def assert_batch_results(sessions: list[Session]) -> None:
    for session in sessions:
        expected = SessionResult.SUCCESS if exit_code_of(session) == 0 else SessionResult.FAILURE
        assert (session.status, session.result, session.exit_code) == (S.TERMINATED, expected, exit_code_of(session)), (
            session.id,
            session.name,
            session.status,
            session.status_info,
        )


# -- Redis --


async def test_redis_killed_mid_stream_loses_no_acknowledged_session(
    own_stack: OwnStack, own_settings: Settings
) -> None:
    rng = random.Random(3)
    acknowledged: list[str] = []
    refused: list[str] = []
    async with running_caravan(own_settings) as caravan:

        async def submit(name: str) -> None:
            n = int(name.rsplit("-", 1)[1])
            request = {"query": CREATE, "variables": {"input": batch(name, f"exit {n % 3}")}}
            response = await caravan.http.post(
                caravan.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, json=request
            )
            assert response.status_code != 500, response.text
            body = response.json()
            if body.get("errors"):
                codes = [e.get("extensions", {}).get("code") for e in body["errors"]]
                assert set(codes) == {"UNAVAILABLE"}, body["errors"]
                refused.append(name)
            else:
                acknowledged.append(body["data"]["createSession"]["sessions"][0]["id"])

        async def stream(what: str, count: int, concurrency: int = 4) -> None:
            for start in range(0, count, concurrency):
                await asyncio.gather(*(submit(f"{what}-{n}") for n in range(start, min(start + concurrency, count))))
                await asyncio.sleep(rng.uniform(0, 0.05))

        submitting = asyncio.create_task(stream("before", 24))
        while len(acknowledged) < 10 and not submitting.done():
            await asyncio.sleep(0.01)
        own_stack.redis.kill()  # mid-stream: requests are in flight
        await submitting
        await stream("down", 4)  # Redis is down: every one is refused (and none half-made, checked below)
        assert {f"down-{n}" for n in range(4)} <= set(refused)
        await asyncio.to_thread(own_stack.redis.start)
        await stream("after", 12)

        sessions = await converged(caravan)
        assert set(acknowledged) <= {s.id for s in sessions}, "an acknowledged session was lost"
        assert not [name for name in refused if name.startswith("after-")], refused  # back at once
        assert not any(s.name.startswith("down-") for s in sessions)
        assert_batch_results(sessions)
        await assert_one_job_each(caravan, sessions)


# -- Nomad --


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
async def test_nomad_stopped_and_restarted_every_session_converges(
    own_stack: OwnStack, own_settings: Settings, stop: signal.Signals, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_caravan(own_settings) as caravan:
        interactive = [
            await create(
                caravan,
                {
                    "name": f"box-{n}",
                    "type": "INTERACTIVE",
                    "driver": "RAW_EXEC",
                    "resources": [{"slot": "cpu", "amount": "0.25"}],
                },
            )
            for n in range(2)
        ]
        batches = [
            await create(
                caravan, batch(f"batch-{n}", f"sleep 4; exit {n % 3}", resources=[{"slot": "cpu", "amount": "0.5"}])
            )
            for n in range(6)
        ]
        for session_id in interactive:
            await caravan.wait_for(session_id, "RUNNING")
        await caravan.wait_for(batches[0], "RUNNING", "TERMINATED")  # others still run or wait: 1.5 cores for 3
        allocations_before = {
            i: await caravan.nomad.job_allocations((await session_of(caravan, i)).nomad_job_id or "")
            for i in interactive
        }

        await asyncio.to_thread(own_stack.nomad.kill, stop)
        logged = len(caplog.records)
        queued_while_down = [await create(caravan, batch(f"down-{n}", f"exit {n % 3}")) for n in range(3)]
        async with asyncio.timeout(60):  # the follower's stream broke; the scheduler fails to reach Nomad meanwhile
            while not any("unreachable" in r.getMessage() for r in caplog.records[logged:]):
                await asyncio.sleep(0.1)
        await asyncio.to_thread(own_stack.nomad.restart)

        sessions = await converged(caravan)
        assert {s.id for s in sessions} == {*interactive, *batches, *queued_while_down}
        assert_batch_results([s for s in sessions if s.id not in interactive])
        for session_id in interactive:
            session = await session_of(caravan, session_id)
            assert session.status is S.RUNNING, (session.id, session.status, session.status_info)
            allocations = await caravan.nomad.job_allocations(session.nomad_job_id or "")
            # the same task, reattached by the restarted client, not a replacement
            assert [a["ID"] for a in allocations] == [a["ID"] for a in allocations_before[session_id]]
            assert allocations[0]["ClientStatus"] == "running"
        await assert_one_job_each(caravan, sessions)


HELD_ISOLATION = """#!/bin/sh
# the test's hold on the session network's set-up: the first ADD waits here (the agent is killed meanwhile)
if [ "$CNI_COMMAND" = ADD ] && [ ! -e "{release}" ]; then
  touch "{entered}"
  while [ ! -e "{release}" ]; do sleep 0.1; done
fi
exec "{real}" "$@"
"""


async def test_nomad_killed_while_it_sets_up_a_batch_kernels_network_runs_the_command_once_back(
    own_stack: OwnStack, own_settings: Settings, tmp_path: Path
) -> None:
    """Found by bench/chaos: the agent killed while it sets up an allocation's network fails that allocation at its
    restart (``network already configured but not found in state``) before the task ever started. A batch kernel is
    never rescheduled, so the session ended ERROR although its command never ran. Now it is placed again and runs.

    The moment is held, not hoped for: the client's ``caravan-isolation`` CNI plugin (the last of the network's
    set-up) is wrapped so that its first ADD waits for the test, which kills the real agent meanwhile."""
    shim = Path(own_stack.nomad.state_dir) / "cni-bin" / "caravan-isolation"
    real = shim.with_name("caravan-isolation.real")
    entered, release = tmp_path / "entered", tmp_path / "release"
    shutil.copy2(shim, real)
    shim.write_text(HELD_ISOLATION.format(release=release, entered=entered, real=real))
    try:
        async with running_caravan(own_settings) as caravan:
            await create(caravan, {**batch("held-1", "exit 7"), "driver": "EXEC"})
            async with asyncio.timeout(180):
                while not entered.exists():
                    await asyncio.sleep(0.05)
            await asyncio.to_thread(own_stack.nomad.kill, signal.SIGKILL)
            release.touch()
            await asyncio.to_thread(own_stack.nomad.restart)
            [session] = await converged(caravan, timeout=240)
            assert (session.status, session.exit_code, session.result) == (S.TERMINATED, 7, SessionResult.FAILURE), (
                session.status,
                session.status_info,
                session.status_detail,
            )
            allocations = await caravan.nomad.job_allocations(session.nomad_job_id or "")
            broken, ran = sorted(allocations, key=lambda a: int(a["CreateIndex"]))  # one broken by the kill, one ran
            events = [e["Type"] for e in broken["TaskStates"]["kernel"]["Events"]]
            assert "Setup Failure" in events and "Started" not in events, events
            assert "Started" in [e["Type"] for e in ran["TaskStates"]["kernel"]["Events"]]
            assert [c.reason for c in session.status_history].count("start-retried") == 1
    finally:
        shutil.copy2(real, shim)
        release.touch()


async def session_of(caravan: Caravan, session_id: str) -> Session:
    session = await caravan.store.get(session_id)
    assert session is not None
    return session


async def create(caravan: Caravan, session_input: dict[str, Any]) -> str:
    data = await caravan.gql(CREATE, {"input": session_input})
    return str(data["createSession"]["sessions"][0]["id"])


# -- Caravan's own processes --


@dataclass
class CaravanProcess:
    """``caravan gateway`` or ``caravan scheduler`` as a real child process, killed and restarted at will."""

    command: str
    env: dict[str, str]
    log: Path
    process: asyncio.subprocess.Process | None = None
    kills: int = 0

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                str(CARAVAN), self.command, env=self.env, stdout=out, stderr=out, start_new_session=True
            )

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        self.kills += 1

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                await self.kill()


@contextlib.asynccontextmanager
async def caravan_processes(settings: Settings, port: int) -> AsyncIterator[tuple[CaravanProcess, CaravanProcess]]:
    env = {**caravan_env(settings, port), **KILLED_SCHEDULERS}
    gateway = CaravanProcess("gateway", env, settings.home / "gateway.log")
    scheduler = CaravanProcess("scheduler", env, settings.home / "scheduler.log")
    await gateway.start()
    await scheduler.start()
    try:
        yield gateway, scheduler
    finally:
        await gateway.stop()
        await scheduler.stop()


async def test_gateway_and_scheduler_killed_at_random_lose_and_double_nothing(own_settings: Settings) -> None:
    rng = random.Random(11)
    port = free_port()
    url = f"http://127.0.0.1:{port}/graphql"
    submissions = 60
    acknowledged: dict[int, str] = {}
    async with (
        running_caravan(own_settings, scheduler=False, serve=False) as caravan,
        caravan_processes(own_settings, port) as (gateway, scheduler),
        httpx2.AsyncClient(timeout=10) as http,
    ):

        async def submit(n: int) -> None:
            """Until acknowledged, retrying with the same client token: a retry never makes a second session."""
            session_input = batch(f"proc-{n}", f"exit {n % 3}", clientToken=f"submission-{n}")
            while True:
                try:
                    response = await http.post(
                        url,
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                        json={"query": CREATE, "variables": {"input": session_input}},
                    )
                except httpx2.TransportError:
                    await asyncio.sleep(0.2)  # the gateway is down (or was killed mid-request)
                    continue
                assert response.status_code != 500, response.text
                body = response.json()
                assert not body.get("errors"), body["errors"]
                acknowledged[n] = body["data"]["createSession"]["sessions"][0]["id"]
                return

        async def submit_all() -> None:
            for start in range(0, submissions, 4):
                await asyncio.gather(*(submit(n) for n in range(start, start + 4)))
                await asyncio.sleep(rng.uniform(0, 0.1))

        async def gateway_up() -> None:
            while True:
                with contextlib.suppress(httpx2.TransportError):
                    if (await http.get(url.replace("/graphql", "/healthz"))).status_code == 200:
                        return
                await asyncio.sleep(0.1)

        submitting = asyncio.create_task(submit_all())
        await gateway_up()
        while not submitting.done() or min(gateway.kills, scheduler.kills) < 4:
            await asyncio.sleep(rng.uniform(0.2, 1.2))  # a random moment while requests and passes are under way
            victim = rng.choice((gateway, scheduler))
            await victim.kill()
            await victim.start()
            await gateway_up()  # the next kill comes after the gateway served again, so submissions progress
        await submitting

        sessions = await converged(caravan, timeout=150)
        assert sorted(s.id for s in sessions) == sorted(acknowledged.values())  # one session per submission
        assert sorted(s.name for s in sessions) == sorted(f"proc-{n}" for n in range(submissions))
        assert_batch_results(sessions)
        await assert_one_job_each(caravan, sessions)
        print(f"{submissions} submissions survived {gateway.kills} gateway and {scheduler.kills} scheduler kills")
