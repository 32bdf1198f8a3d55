"""Running the real idle service in a test, and stored sessions in a given status (real Redis, real Nomad)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from core.clock import utcnow
from core.lease import Fence
from core.redis import client as redis_client
from core.settings import Settings
from domain.lifecycle import transition
from domain.model import Driver, Session, SessionStatus, SessionType
from domain.session_requests import SessionRequest, build_sessions
from domain.users import Role, User
from idle.service import IdleService
from nomad_jobs.client import NomadClient
from stores.idle import IdleStore, StoredVerdict
from stores.sessions import SessionStore
from tests.harness import CREATE, Caravan

T = TypeVar("T")

OWNER = User(id="alice", name="alice", role=Role.USER)
NO_SUCH_ALLOC = "00000000-0000-0000-0000-000000000000"
"""An allocation id Nomad does not know: its stats and logs answer 404."""
BUSY = "while :; do :; done"
"""A startup command that keeps one core busy."""


def policy_file(directory: Path, text: str, name: str = "idle-policy.hcl") -> Path:
    path = directory / name
    path.write_text(text)
    return path


@contextlib.asynccontextmanager
async def running_idle(
    settings: Settings, policy: Path | None, *, persist_every: float = 60.0, lease_ttl: float = 10.0
) -> AsyncIterator[IdleService]:
    """An idle service on ``settings``' namespace, running in this event loop until the block ends."""
    settings = replace(
        settings,
        idle=replace(settings.idle, policy_path=policy, window_persist_interval=persist_every, lease_ttl=lease_ttl),
    ).for_role("idle")  # connects as the idle checker does
    redis = redis_client(settings.redis)
    nomad = NomadClient(settings.nomad)
    service = IdleService(settings, redis, nomad)
    task = asyncio.create_task(service.run_forever())
    try:
        yield service
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await nomad.aclose()
        await redis.aclose()


async def stored_session(
    store: SessionStore,
    *,
    type: SessionType = SessionType.INTERACTIVE,
    status: SessionStatus = SessionStatus.RUNNING,
    running_since: datetime | None = None,
    name: str = "idle-test",
    owner: User = OWNER,
    alloc_id: str = NO_SUCH_ALLOC,
) -> Session:
    """A session stored in Redis that went through the lifecycle up to ``status`` (no Nomad job behind it)."""
    command = "sleep 1" if type in (SessionType.BATCH, SessionType.INFERENCE) else None
    service_port = 8080 if type is SessionType.INFERENCE else None
    request = SessionRequest(
        name=name, type=type, driver=Driver.EXEC, startup_command=command, service_port=service_port
    )
    [session] = build_sessions(request, viewer=owner, now=utcnow())
    await store.create([session])
    since = running_since or utcnow()
    path = {
        SessionStatus.RUNNING: (SessionStatus.SCHEDULED, SessionStatus.PREPARING, SessionStatus.RUNNING),
        SessionStatus.PREPARING: (SessionStatus.SCHEDULED, SessionStatus.PREPARING),
    }[status]

    def advance(s: Session) -> Session:
        kernels = tuple(replace(k, alloc_id=alloc_id, status=status) for k in s.kernels)
        s = s.evolve(kernels=kernels, nomad_job_id=f"{store.keys.prefix}-{s.id}")
        for step in path:
            s = transition(s, step, reason=step.value.lower(), at=since)
        return s

    stored = await store.update(session.id, advance)
    assert stored is not None and stored.status is status
    return stored


def acquire_tries(service: IdleService) -> list[bool]:
    """From now on, one entry per try of ``service`` to take its lease (True: it got it). The lease's own
    ``try_acquire``, wrapped to count: the service leads and stands by as it always does."""
    tries: list[bool] = []
    try_acquire = service.lease.try_acquire

    async def counted() -> Fence | None:
        fence = await try_acquire()
        tries.append(fence is not None)
        return fence

    service.lease.try_acquire = counted  # type: ignore[method-assign]
    return tries


async def eventually(probe: Callable[[], Awaitable[T | None]], *, timeout: float, every: float = 0.1) -> T:
    """``probe``'s first truthy answer, or AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing after {timeout}s")
        await asyncio.sleep(every)


async def swept_since(
    idle_store: IdleStore, session_id: str, moment: datetime, *, timeout: float = 10.0
) -> StoredVerdict:
    """The verdict on ``session_id`` of a sweep that judged it after ``moment``, once that sweep has acted on it: when
    the next sweep has judged it too (a sweep acts on its verdicts before the next one starts)."""

    async def judged_after(when: datetime) -> StoredVerdict | None:
        found = await idle_store.verdict(session_id)
        return found if found is not None and found.checked_at > when else None

    verdict = await eventually(lambda: judged_after(moment), timeout=timeout)
    await eventually(lambda: judged_after(verdict.checked_at), timeout=timeout)
    return verdict


async def start_interactive(caravan: Caravan, name: str, command: str | None = None) -> str:
    """A RUNNING INTERACTIVE exec session through the gateway (half a core, 64 MiB); its id.

    Without ``command`` the kernel runs the job renderer's keep-alive loop: up, and idle.
    """
    resources = [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "64m"}]
    fields = {"type": "INTERACTIVE", "name": name, "driver": "EXEC", "startupCommand": command,
              "resources": resources}  # fmt: skip
    data = await caravan.gql(CREATE, {"input": fields})
    session_id = str(data["createSession"]["sessions"][0]["id"])
    await caravan.wait_for(session_id, "RUNNING", timeout=60)
    return session_id
