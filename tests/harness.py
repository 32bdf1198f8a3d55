"""An in-process Caravan (gateway on a free port + scheduler) for one test's namespace."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import uvicorn

from caravan.services import gateway_config
from caravan.stack.processes import free_port
from core.keys import Keys
from core.redis import client as redis_client
from core.settings import NomadSettings, Settings
from domain.users import Role, User
from nomad_jobs.client import NomadClient, tls_context
from scheduler.service import Scheduler
from stores.sessions import SessionStore
from stores.users import UserStore
from tests.no_nomad import is_tripwire

log = logging.getLogger(__name__)

ADMIN_TOKEN = "test-admin-token"


class GraphQLErrors(AssertionError):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors

    @property
    def codes(self) -> list[str]:
        return [e.get("extensions", {}).get("code", "") for e in self.errors]


@dataclass
class Caravan:
    settings: Settings
    url: str
    http: httpx2.AsyncClient
    store: SessionStore
    users: UserStore
    nomad: NomadClient

    async def post(
        self, query: str, variables: dict[str, Any] | None = None, *, token: str | None = ADMIN_TOKEN
    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = await self.http.post(self.url, json={"query": query, "variables": variables or {}}, headers=headers)
        body: dict[str, Any] = response.json()
        return body

    async def gql(
        self, query: str, variables: dict[str, Any] | None = None, *, token: str | None = ADMIN_TOKEN
    ) -> dict[str, Any]:
        body = await self.post(query, variables, token=token)
        if body.get("errors"):
            raise GraphQLErrors(body["errors"])
        data: dict[str, Any] = body["data"]
        return data

    async def user(self, name: str, role: Role = Role.USER, projects: tuple[str, ...] = ("default",)) -> str:
        """A new user with a fresh token; returns the token."""
        await self.users.put(User(id=name, name=name, role=role, projects=projects))
        return await self.users.issue_token(name)

    async def wait_for(self, session_id: str, *statuses: str, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            session = await self.store.get(session_id)
            if session and session.status.value in statuses:
                return await self._with_logs_copied(session_id)
            if time.monotonic() > deadline:
                raise AssertionError(f"session {session_id} is {session and session.status} after {timeout}s")
            await asyncio.sleep(0.1)

    async def _with_logs_copied(
        self, session_id: str, patience: float = 15.0, silent_after: float = 3.0
    ) -> dict[str, Any]:
        """The session as GraphQL shows it. Nomad's docker driver copies a container's output into the task's log
        files asynchronously (docklog) and may still be copying when the task is already dead: for an ended Docker
        kernel, read until its output stayed the same for a second and is not empty (or ``patience`` runs out); empty
        output is taken as it is after ``silent_after`` seconds (a kernel that printed nothing: an interactive one
        destroyed, a quiet command; each such wait took the whole ``patience`` before, some 15 s)."""
        start = time.monotonic()
        before: dict[str, Any] | None = None
        while True:
            found: dict[str, Any] = (await self.gql(SESSION_QUERY, {"id": session_id}))["session"]
            kernel = found.get("mainKernel") or {}
            logs = kernel.get("logs")
            ended_docker = found["driver"] == "DOCKER" and kernel.get("status") in ("TERMINATED", "ERROR") and logs
            waited = time.monotonic() - start
            settled = logs == before and (any(logs.values()) or waited >= silent_after) if ended_docker else True
            if settled or waited > patience:
                return found
            before = logs
            await asyncio.sleep(1.0)


SESSION_QUERY = """
query($id: ID!) { session(id: $id) {
  id name type status statusInfo result exitCode nomadJobId jobHcl driver
  statusHistory { status at reason }
  mainKernel { hostname status exitCode agent logs { stdout stderr } }
} }
"""

CREATE = """
mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id name status } } }
"""


class PromptServer(uvicorn.Server):
    """uvicorn's server, which stops at once when asked (:meth:`stop`): its own main loop looks every 0.1 s, which
    hundreds of gateway tests each waited for."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopping = asyncio.Event()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # as uvicorn's: headers' date every 10 ticks, exit when asked
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.1)

    def stop(self) -> None:
        self.should_exit = True
        self._stopping.set()


def caravan_env(settings: Settings, port: int) -> dict[str, str]:
    """The environment of a ``caravan`` command serving ``settings``' namespace, its gateway on ``port``."""
    return {
        **os.environ,
        "CARAVAN_HOME": str(settings.home),
        "CARAVAN_SECRETS_DIR": str(settings.secrets),  # each process connects as its role
        "CARAVAN_REDIS_URL": settings.redis.url,
        "CARAVAN_REDIS_PREFIX": settings.redis.prefix,
        "CARAVAN_NOMAD_ADDR": settings.nomad.addr,
        "CARAVAN_NOMAD_JOB_PREFIX": settings.nomad.job_prefix,
        "CARAVAN_ADMIN_TOKEN": ADMIN_TOKEN,
        "CARAVAN_GATEWAY_HOST": "127.0.0.1",
        "CARAVAN_GATEWAY_PORT": str(port),
        "CARAVAN_GATEWAY_WORKERS": "1",  # started and killed often in tests: several worker processes take long
        "CARAVAN_RECONCILE_INTERVAL": "2",
    }


KILLED_SCHEDULERS = {"CARAVAN_SCHEDULER_LEASE_TTL": "4"}
"""The environment of a scheduler process a test kills (SIGKILL): the next one leads once the dead one's lease ran out,
4 s on, not the default 10 s (renewed every third of it, it still outlives a late renewal by seconds)."""


TEARDOWN_LIMIT = 30.0
"""Seconds the gateway and scheduler of :func:`running_caravan` get to stop (the gateway's open streams get
``SHUTDOWN_GRACE`` of them); past it the teardown fails naming the tasks still waiting, and what they wait on."""


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where ``task`` waits: its coroutine and every coroutine or generator it awaits, innermost last (a task's own
    stack shows only its outermost frame)."""
    where, inner = [], task.get_coro()
    while inner is not None:
        frame = getattr(inner, "cr_frame", None) or getattr(inner, "ag_frame", None) or getattr(inner, "gi_frame", None)
        if frame is not None:
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        inner = (
            getattr(inner, "cr_await", None) or getattr(inner, "ag_await", None) or getattr(inner, "gi_yieldfrom", None)
        )
    return where


async def stopped(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for ``tasks`` (already asked to stop) to end; a task that ignores its stop fails the test with every
    pending task's stack, rather than hanging it until pytest-timeout says nothing useful."""
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=TEARDOWN_LIMIT)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s ended with %r", task.get_name(), task.exception())
    if not pending:
        return
    stacks = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            print(f"{task!r} awaits:", *awaiting(task), sep="\n  ", file=stacks)
    for task in pending:
        task.cancel()
    raise AssertionError(
        f"{len(pending)} of the harness's tasks did not stop within {TEARDOWN_LIMIT} s; every pending task:\n"
        + stacks.getvalue()
    )


@contextlib.asynccontextmanager
async def running_caravan(
    settings: Settings,
    *,
    scheduler: bool = True,
    serve: bool = True,
    scheduler_nomad: Callable[[NomadSettings], NomadClient] = NomadClient,
    port: int | None = None,
) -> AsyncIterator[Caravan]:
    """A gateway (``serve``, on ``port`` or a free one) and a scheduler (``scheduler``, its Nomad client made by
    ``scheduler_nomad``: a fault injector may stand in) for ``settings``' namespace."""
    port = port or free_port()
    settings = dataclasses.replace(
        settings, gateway=dataclasses.replace(settings.gateway, host="127.0.0.1", port=port, admin_token=ADMIN_TOKEN)
    )
    server = PromptServer(gateway_config(settings))  # as `caravan gateway` serves it
    redis = redis_client(settings.redis)  # the test's own, with the settings' (admin) credentials
    nomad = NomadClient(settings.nomad)
    keys = Keys(settings.redis.prefix)
    as_scheduler = settings.for_role("scheduler")  # the component under test connects as its role
    scheduler_redis, scheduler_client = redis_client(as_scheduler.redis), scheduler_nomad(as_scheduler.nomad)
    tasks = [asyncio.create_task(server.serve())] if serve else []
    if scheduler:
        tasks.append(asyncio.create_task(Scheduler(as_scheduler, scheduler_redis, scheduler_client).run_forever()))
    while serve and not server.started:
        await asyncio.sleep(0.02)
    async with httpx2.AsyncClient(timeout=30, verify=tls_context()) as http:
        try:
            yield Caravan(
                settings,
                f"http://127.0.0.1:{port}/graphql",
                http,
                SessionStore(redis, keys),
                UserStore(redis, keys),
                nomad,
            )
        finally:
            server.stop()
            for task in tasks[1 if serve else 0 :]:
                task.cancel()
            if scheduler:  # a pass waiting for news (up to its interval) may have lost its cancellation (see
                # core.retry.stop_if_cancelled): news ends the wait, and its loop then stops (no news: the interval)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1):
                        await SessionStore(redis, keys).wake_scheduler("stopping")
            await stopped(tasks)
            if serve and not is_tripwire(settings.nomad.addr):  # a Redis-tier test's gateway reached no Nomad
                with contextlib.suppress(Exception):
                    for job in await nomad.jobs(settings.nomad.job_prefix + "-"):
                        await nomad.deregister(job["ID"], purge=True)
            await nomad.aclose()
            await redis.aclose()
            await scheduler_client.aclose()
            await scheduler_redis.aclose()
