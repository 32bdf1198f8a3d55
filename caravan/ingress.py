"""``caravan ingress``: HAProxy as a deployed job runs it, its gateway backend following the gateway's replicas.

HAProxy is started on ``gateway.apps.ingress_config`` with ``gateway_slots`` slots (``gw1``..``gwN``): the replicas
already serving hold the first ones, the others are in maintenance; a file of ``address:port`` lines (Nomad's
template over the gateway's service, ``caravan deploy``) is read every :data:`POLL` seconds and applied through the
runtime API, without a reload:

- a replica new in the file is probed (``GET /healthz``) until it answers, then given a free slot (address, port,
  health up, ready): no request goes to a replica that is not serving yet;
- a replica gone from the file (its allocation is stopping: Nomad deregisters it before its ``shutdown_delay``) is
  put in maintenance: no new request goes there, those in flight finish; its slot is reused last.

SIGTERM stops HAProxy softly (``SIGUSR1``: it stops listening and ends once its connections are done) and exits.

An upgrade overlaps two of them: the new allocation's HAProxy is given the old one's listening sockets (``-x``,
``caravan.stack.haproxy.start_haproxy``) during the old one's ``shutdown_delay``; it takes over the state directory
(the runtime socket's link moves to its own), and the old ``caravan ingress``, seeing the link no longer points to its
HAProxy, leaves the backend to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from caravan.stack.haproxy import Haproxy, ingress_config, start_haproxy
from caravan.stack.processes import Service
from core.keys import Keys
from core.redis import client as redis_client
from core.settings import Settings
from gateway.apps.ingress_config import GATEWAY_BACKENDS, GATEWAY_SLOT, IngressPaths
from gateway.apps.plane import inode
from gateway.apps.runtime_api import RuntimeApi, RuntimeApiError
from gateway.planes import Prefill, planes_running, prefilled
from stores.sessions import SessionStore
from stores.users import UserStore

log = logging.getLogger(__name__)

POLL = 0.2
"""Seconds between reads of the replicas' file."""
PROBE_TIMEOUT = 1.0


def read_replicas(path: Path) -> list[tuple[str, int]]:
    """The ``address:port`` lines of ``path`` (none while the template has not written it); an IP address each."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    found = []
    for line in text.split():
        host, _, port = line.rpartition(":")
        with contextlib.suppress(ValueError):
            if port.isdigit() and 0 < int(port) < 65536:
                found.append((str(ipaddress.ip_address(host)), int(port)))
    return found


async def serving(host: str, port: int) -> bool:
    """Whether the replica answers ``GET /healthz`` with 200."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(f"GET /healthz HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                await writer.drain()
                status = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return False
    return status.split(b" ")[1:2] == [b"200"]


@dataclass
class Backend:
    """Which replica holds which slot of HAProxy's gateway backend."""

    api: RuntimeApi
    slots: int
    held: dict[tuple[str, int], int] = field(default_factory=dict)
    freed: list[int] = field(default_factory=list)
    """Slots given back, oldest first (a drained slot is reused last)."""

    def __post_init__(self) -> None:
        self.freed = [slot for slot in range(1, self.slots + 1) if slot not in self.held.values()]

    async def apply(self, wanted: list[tuple[str, int]]) -> None:
        for replica in [r for r in self.held if r not in wanted]:
            slot = self.held.pop(replica)
            await self.api.run([f"set server {b}/{GATEWAY_SLOT}{slot} state maint" for b in GATEWAY_BACKENDS])
            self.freed.append(slot)
            log.info("gateway replica %s:%d out of the backend (slot %d)", *replica, slot)
        for replica in [r for r in wanted if r not in self.held]:
            if not self.freed:
                log.warning("no free gateway slot for %s:%d", *replica)
                continue
            if not await serving(*replica):
                continue  # probed again at the next poll
            slot = self.freed.pop(0)
            host, port = replica
            commands: list[str] = []
            for backend in GATEWAY_BACKENDS:
                name = f"{backend}/{GATEWAY_SLOT}{slot}"
                commands += [f"set server {name} addr {host} port {port}", f"set server {name} health up"]
                commands.append(f"set server {name} state ready")
            await self.api.run(commands)
            self.held[replica] = slot
            log.info("gateway replica %s:%d in the backend (slot %d)", host, port, slot)


async def run_ingress(
    settings: Settings, replicas_file: Path, slots: int, health_port: int | None = None, *, keep_maps: bool = False
) -> None:
    """HAProxy and its gateway backend until SIGTERM; with ``keep_maps``, HAProxy's control planes too
    (``gateway.planes``, as the gateway's Redis user): the gateways then run on any client."""
    if settings.gateway.ingress_port is None:
        raise ValueError("CARAVAN_INGRESS_PORT: the port HAProxy listens on")
    # the replicas already serving are in the configuration: a new HAProxy (an upgrade overlapping the old one on the
    # port) answers GraphQL from its first connection, not 503 until the first poll
    initial = tuple([r for r in read_replicas(replicas_file) if await serving(*r)][:slots])
    config = dataclasses.replace(
        ingress_config(settings, settings.gateway.ingress_port, 0),
        gateway_slots=slots,
        gateway_initial=initial,
        health_port=health_port,
    )
    state = settings.ingress_dir
    async with contextlib.AsyncExitStack() as stack:
        keeper = await stack.enter_async_context(MapKeeper.connected(settings)) if keep_maps else None
        prefill = await keeper.prefilled() if keeper else None
        if prefill:
            config = dataclasses.replace(config, endpoint_servers=prefill.endpoint_servers)
        maps = prefill.maps if prefill else None
        haproxy = await asyncio.to_thread(start_haproxy, config, state, log=state / "haproxy.log", maps=maps)
        stack.push_async_callback(soft_stop, haproxy)
        runtime = IngressPaths(state).socket
        ours = haproxy.runtime.stat().st_ino
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        held = {replica: slot for slot, replica in enumerate(initial, 1)}
        backend = Backend(RuntimeApi(haproxy.runtime), slots, held)
        if keeper:
            await stack.enter_async_context(keeper.running())
        await follow_replicas(backend, replicas_file, (runtime, ours), haproxy, stop)


async def soft_stop(haproxy: Haproxy) -> None:
    """SIGUSR1: HAProxy stops listening and ends once its connections are done (10 s at most, then killed)."""
    if haproxy.alive():
        haproxy.process.send_signal(signal.SIGUSR1)
        try:
            await asyncio.to_thread(haproxy.process.wait, 10)
        except Exception:
            haproxy.stop()


async def follow_replicas(
    backend: Backend, replicas_file: Path, socket: tuple[Path, int], haproxy: Service, stop: asyncio.Event
) -> None:
    """Apply the replicas' file to the backend every :data:`POLL` seconds, while this HAProxy runs and owns the
    state directory (``socket``: the runtime socket's path and this HAProxy's inode of it; another inode: the next
    HAProxy took the directory over, its ingress decides)."""
    runtime, ours = socket
    while not stop.is_set() and haproxy.alive():
        try:
            if inode(runtime) == ours:
                await backend.apply(read_replicas(replicas_file))
        except RuntimeApiError as failed:
            log.warning("HAProxy's runtime API: %s", failed)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(POLL):
                await stop.wait()


@dataclass
class MapKeeper:
    """HAProxy's control planes in this process (``--keep-maps``), with the gateway's Redis user."""

    settings: Settings
    redis: Redis
    sessions: SessionStore
    users: UserStore

    @classmethod
    @contextlib.asynccontextmanager
    async def connected(cls, settings: Settings) -> AsyncIterator[MapKeeper]:
        redis = redis_client(settings.for_role("gateway").redis)
        keys = Keys(settings.redis.prefix)
        sessions = SessionStore(redis, keys, usage_retention=settings.usage_raw_retention)
        users = UserStore(redis, keys, max_tokens=settings.gateway.max_tokens_per_user)
        try:
            yield cls(settings, redis, sessions, users)
        finally:
            await redis.aclose()

    async def prefilled(self) -> Prefill:
        return await prefilled(self.settings, self.redis, self.sessions, self.users)

    def running(self) -> contextlib.AbstractAsyncContextManager[object]:
        return planes_running(self.settings, self.redis, self.sessions, self.users)
