"""Running Caravan's services: each in its own process (``caravan dev`` supervises the three on one machine)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import uvicorn
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.applications import Starlette

from caravan.stack.session_network import SessionNetwork, recorded_network
from caravan.supervisor import ROLES, Supervisor, die_with_parent
from core.keys import Keys
from core.lease import Lease
from core.redis import connect
from core.retry import stop_if_cancelled
from core.settings import Settings, load_settings
from domain.scheduling_config import load_scheduling_config
from gateway.app import create_app
from gateway.http_server import GatewayHttpProtocol
from idle.reload import PolicySource, reload_on_sighup
from idle.service import IdleService
from node_plugins.namespace_pool import Client
from nomad_jobs.client import NomadClient
from nomad_jobs.namespace_keeper import NETWORK_META, NamespaceKeeper
from scheduler.config import pass_config
from scheduler.service import Scheduler
from stores.users import bootstrap_admin_token

log = logging.getLogger(__name__)


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # not a line per Nomad call


SHUTDOWN_GRACE = 5
"""Seconds the gateway's open requests, streams (SSE subscriptions, log follows) and WebSockets get to end when it
stops; then uvicorn cancels them. Under the supervisor's ``STOP_GRACE``, so a stop never waits for a client."""


def serve_gateway(settings: Settings) -> None:
    """``caravan gateway``: in this process, or as ``settings.gateway.workers`` uvicorn worker processes sharing the
    port (GraphQL execution is CPU-bound Python: one process uses one core). Workers build the app from the same
    ``CARAVAN_*`` environment these settings were read from."""
    if settings.gateway.workers <= 1:
        # uvicorn's own run: its event loop (uvloop when installed), as each of several workers gets
        uvicorn.Server(gateway_config(settings)).run()
        return
    bootstrap_admin_token(settings.gateway.admin_token, settings.home)  # generated here once, not raced by workers
    uvicorn.run(
        "caravan.services:gateway_worker_app",
        factory=True,
        workers=settings.gateway.workers,
        **server_options(settings),
    )


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the gateway, however it is served (one process, workers, the tests' harness).

    ``X-Forwarded-For``/``-Proto`` are believed only from ``CARAVAN_TRUSTED_PROXIES`` (uvicorn's own default trusts
    them from any local client, which could then pick the address the anonymous rate limit counts); with none set,
    uvicorn does not read them at all."""
    proxies = list(settings.gateway.trusted_proxies)
    return {
        "host": settings.gateway.host,
        "port": settings.gateway.port,
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
        "http": GatewayHttpProtocol,
        "timeout_graceful_shutdown": SHUTDOWN_GRACE,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or [],
    }


def gateway_worker_app() -> Starlette:
    """The app as each worker process of ``caravan gateway`` builds it (a uvicorn factory), settings from ``CARAVAN_*``.

    The worker dies with its supervisor, even a SIGKILLed one (Linux ``PR_SET_PDEATHSIG``): no orphan goes on
    serving the port, just as a killed single-process gateway serves nothing."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:
        die_with_parent(parent.pid)
    return create_app(load_settings())


def gateway_config(settings: Settings) -> uvicorn.Config:
    """The single-process gateway's server: ``loop="auto"`` (uvloop when installed, asyncio's loop otherwise)."""
    return uvicorn.Config(create_app(settings), **server_options(settings))


async def run_scheduler(settings: Settings) -> None:
    settings = settings.for_role("scheduler")
    redis = await connect(settings.redis, give_up_after=float("inf"))
    nomad = NomadClient(settings.nomad)
    try:
        scheduler = Scheduler(settings, redis, nomad)
        async with serve_health(settings, redis, scheduler.lease):
            await until_sigterm(scheduler.run_forever())
    finally:
        await nomad.aclose()
        await redis.aclose()


async def run_idle(settings: Settings, policy: PolicySource | None = None) -> None:
    devices = load_scheduling_config(settings.scheduler.config_path).devices  # a broken file stops us here
    policy = policy or PolicySource(settings.idle.policy_path, devices)  # and so does a broken policy
    settings = settings.for_role("idle")
    redis = await connect(settings.redis, give_up_after=float("inf"))
    nomad = NomadClient(settings.nomad)
    try:
        service = IdleService(settings, redis, nomad, policy=policy)
        with reload_on_sighup(service.request_reload):
            async with serve_health(settings, redis, service.lease):
                await until_sigterm(service.run_forever())
    finally:
        await nomad.aclose()
        await redis.aclose()


def keeps_namespaces(settings: Settings) -> bool:
    """Whether ``caravan dev`` runs a namespace keeper: a pool asked for, as root, beside a client with a session
    network and the stack's pause image."""
    return (
        settings.namespace_pool > 0
        and os.geteuid() == 0
        and bool(settings.pause_image)
        and recorded_network(settings.home / "nomad") is not None
    )


KEEPER_RECHECK = 30.0
"""Seconds between a keeper's looks at a host where it cannot keep a pool yet (no session network recorded, no
Docker or pause image, no node naming it): it waits there, logged, rather than exit (Nomad would restart it in a loop:
it runs as a system job)."""
KEEPER_RETRY = 5.0
"""Seconds before a keeper that failed (Docker or Redis refusing its first look) starts again."""


async def run_namespace_keeper(settings: Settings) -> None:
    """``caravan namespace-keeper``: the keeper of its host's pooled network namespaces
    (``nomad_jobs.namespace_keeper``), with the scheduler's credentials (it reads its node's allocations and writes the
    pool's set). It serves the node it runs on (``CARAVAN_NODE_ID``, else the node whose meta names its session
    network's directory); until it can (:func:`keeper_host`), it waits, saying why. On SIGTERM it deletes its free
    namespaces."""
    settings = settings.for_role("scheduler")
    redis = await connect(settings.redis, give_up_after=float("inf"))
    nomad = NomadClient(settings.nomad)
    kept: list[NamespaceKeeper] = []
    try:
        await until_sigterm(keep_namespaces(settings, redis, nomad, kept))
    finally:
        try:
            for keeper in kept:
                await keeper.release_free()
        finally:
            await nomad.aclose()
            await redis.aclose()


async def keep_namespaces(settings: Settings, redis: Redis, nomad: NomadClient, kept: list[NamespaceKeeper]) -> None:
    said = ""
    while isinstance(found := await keeper_host(settings, nomad), str):
        if found != said:
            log.warning("namespace-keeper: %s: no pool kept here (looking again every %.0f s)", found, KEEPER_RECHECK)
            said = found
        await asyncio.sleep(KEEPER_RECHECK)
    node_id, network = found
    keeper = NamespaceKeeper(
        Client(network.conflist(), network.cni_path),
        nomad,
        redis,
        Keys(settings.redis.prefix),
        node_id,
        settings.namespace_pool,
        str(settings.pause_image),
    )
    kept.append(keeper)
    log.info(
        "namespace-keeper: %d namespaces kept for node %s (session network %s, bridge %s)",
        settings.namespace_pool,
        node_id,
        network.client_dir,
        network.bridge,
    )
    while True:
        try:
            await keeper.run_forever()
        except Exception as exc:  # Docker or Redis refusing its first look: logged, started again, never a restart loop
            stop_if_cancelled(exc)
            log.error("namespace-keeper: stopped by %r; starting again in %.0f s", exc, KEEPER_RETRY)
            await asyncio.sleep(KEEPER_RETRY)


async def keeper_host(settings: Settings, nomad: NomadClient) -> tuple[str, SessionNetwork] | str:
    """The node a keeper serves and its session network; or why it cannot keep a pool here."""
    if settings.namespace_pool <= 0 or not settings.pause_image:
        return "CARAVAN_NAMESPACE_POOL is 0 or CARAVAN_PAUSE_IMAGE is unset"
    directory = (settings.session_network_dir or settings.home / "nomad").resolve()
    try:
        network = recorded_network(directory)
    except (OSError, ValueError, TypeError) as exc:
        return f"the session network recorded in {directory} is not readable ({exc!r})"
    if network is None:
        return f"no session network recorded in {directory}"
    inspect = ["docker", "image", "inspect", "--format", "{{.Id}}", "--", settings.pause_image]
    try:
        image = await asyncio.to_thread(subprocess.run, inspect, capture_output=True, text=True)
        missing = image.stderr.strip()[:200] if image.returncode != 0 else ""
    except OSError as exc:  # no docker command at all
        missing = repr(exc)
    if missing:
        return f"Docker or the pause image {settings.pause_image} is not here ({missing})"
    if settings.node_id:
        return settings.node_id, network
    try:
        nodes = [await nomad.node(str(n["ID"])) for n in await nomad.nodes() if n.get("Status") == "ready"]
    except Exception as exc:  # Nomad unreachable: looked at again later
        return f"Nomad's nodes not read ({exc!r})"
    named = [str(n["ID"]) for n in nodes if same_path((n.get("Meta") or {}).get(NETWORK_META), directory)]
    if len(named) != 1:
        return f"{len(named)} ready Nomad nodes have the meta {NETWORK_META} = {directory} (one wanted)"
    return named[0], network


def same_path(named: object, directory: Path) -> bool:
    return isinstance(named, str) and bool(named) and Path(named).resolve() == directory


async def until_sigterm(service: Coroutine[Any, Any, None]) -> None:
    """Run ``service`` until it ends or SIGTERM comes; then cancel it, so that its ``finally`` runs (a leader releases
    its lease there: its follower takes over at once instead of after the lease's TTL)."""
    task = asyncio.ensure_future(service)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


@contextlib.asynccontextmanager
async def serve_health(settings: Settings, redis: Redis, lease: Lease) -> AsyncIterator[None]:
    """With ``CARAVAN_HEALTH_PORT``: answer any HTTP request there with 200 and ``{"leading": <bool>}`` (whether this
    process leads a term and still holds its lease, read from Redis; ``null`` while Redis cannot say): Nomad's check of
    a deployed scheduler or idle checker (``caravan deploy``), and how to see which replica leads. A lease of its own
    in Redis is not enough: a standby's refused attempt may leave one there (bench/chaos paused such a standby,
    named leader by its health, while nobody led)."""
    if settings.health_port is None:
        yield
        return

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(2):
                await reader.readuntil(b"\r\n\r\n")
                try:
                    leading: bool | None = lease.term is not None and await redis.get(lease.key) in (
                        lease.holder,
                        lease.holder.encode(),
                    )
                except RedisError:
                    leading = None
            body = json.dumps({"leading": leading}).encode()
            writer.write(
                b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, settings.gateway.host, settings.health_port)
    try:
        yield
    finally:
        server.close()


def run_dev(settings: Settings) -> int:
    """``caravan dev``: the gateway (one worker), the scheduler and the idle checker as processes of their own, each
    ``caravan <role>`` with this process's environment, supervised by :class:`caravan.supervisor.Supervisor`. Their
    configuration files are read here first: a refused one stops us before anything starts."""
    config = load_scheduling_config(settings.scheduler.config_path)
    pass_config(config)
    PolicySource(settings.idle.policy_path, config.devices)
    env = {**os.environ, "CARAVAN_GATEWAY_WORKERS": "1"}
    roles = (*ROLES, "namespace-keeper") if keeps_namespaces(settings) else ROLES
    return Supervisor(lambda role: [sys.executable, "-m", "caravan.cli", role], env, roles).run()
