"""A HAProxy of the test's own (``caravan.stack.haproxy``) in front of a test's gateway: its own free port, its own
state directory (maps, runtime socket), so that parallel tests never share routes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from caravan.stack.haproxy import ingress_config, start_haproxy
from caravan.stack.processes import Service, free_port
from core.settings import Settings
from domain.apps import App
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from gateway.apps.ingress_config import IngressPaths
from gateway.apps.runtime_api import RuntimeApi, RuntimeApiError
from tests.harness import Caravan, running_caravan


@dataclass
class Ingress:
    settings: Settings
    paths: IngressPaths
    port: int
    gateway_port: int
    service: Service

    @property
    def api(self) -> RuntimeApi:
        return RuntimeApi(self.paths.socket)

    def start(self) -> None:
        """(Re)start HAProxy on its files, fresh: empty maps."""
        self.service = start_haproxy(
            ingress_config(self.settings, self.port, self.gateway_port), self.paths.state_dir, log=self.log
        )

    @property
    def log(self) -> Path:
        return self.paths.state_dir / "haproxy.log"

    async def built(self, timeout: float = 60.0, *, after: str | None = None) -> str:
        """The control plane's mark, once HAProxy holds a complete build (another than ``after``)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            with contextlib.suppress(RuntimeApiError):
                generation = (await self.api.show_map(self.paths.map("meta"))).get("generation")
                if generation and generation != after:
                    return generation
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("the control plane did not build HAProxy")
            await asyncio.sleep(0.02)


def with_ingress(settings: Settings, state_dir: Path, port: int) -> Settings:
    return dataclasses.replace(
        settings, gateway=dataclasses.replace(settings.gateway, ingress_port=port, ingress_dir=state_dir)
    )


@contextlib.contextmanager
def haproxy_for(settings: Settings) -> Iterator[Ingress]:
    """A HAProxy of its own (port, state directory) in front of a gateway yet to start on ``ingress.gateway_port``
    with ``ingress.settings``."""
    state_dir = Path(tempfile.mkdtemp(prefix="cvh-", dir="/tmp"))  # a unix socket path has at most 107 bytes
    port, gateway_port = free_port(), free_port()
    settings = with_ingress(settings, state_dir, port)
    ingress = Ingress(settings, IngressPaths(state_dir), port, gateway_port, None)  # type: ignore[arg-type]
    ingress.start()
    try:
        yield ingress
    finally:
        ingress.service.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def gateway_behind(ingress: Ingress, **harness: Any) -> AsyncIterator[Caravan]:
    """A gateway (and scheduler: ``harness`` as ``running_caravan`` takes it) behind ``ingress``; yields once HAProxy
    holds a build of its control plane."""
    async with running_caravan(ingress.settings, port=ingress.gateway_port, **harness) as caravan:
        await ingress.built()
        # GraphQL too through HAProxy, the stack's one ingress, as every client of the stack reaches it
        yield dataclasses.replace(caravan, url=f"http://127.0.0.1:{ingress.port}/graphql")


@contextlib.asynccontextmanager
async def caravan_behind_haproxy(settings: Settings, **harness: Any) -> AsyncIterator[tuple[Caravan, Ingress]]:
    """A gateway (and scheduler: ``harness`` as ``running_caravan`` takes it) behind a HAProxy of their own; yields
    once HAProxy holds its first build."""
    with haproxy_for(settings) as ingress:
        async with gateway_behind(ingress, **harness) as caravan:
            yield caravan, ingress


def running_app(owner: str, port: int, *, public: bool = False) -> Session:
    """A RUNNING session of ``owner`` whose app ``web`` (port 8080) Nomad published on 127.0.0.1:``port``."""
    resources = {"cpu": "1", "mem": str(64 << 20)}
    kernel = Kernel(
        role="main",
        index=1,
        hostname="main1",
        image="",
        resources=resources,
        status=SessionStatus.RUNNING,
        ports=(f"8080=127.0.0.1:{port}",),
    )
    return Session(
        id=str(uuid.uuid4()),
        name="app-" + uuid.uuid4().hex[:8],
        owner_id=owner,
        type=SessionType.INTERACTIVE,
        driver=Driver.RAW_EXEC,
        image="",
        resources=resources,
        kernels=(kernel,),
        created_at=datetime.now(UTC),
        status=SessionStatus.RUNNING,
        apps=(App("web", 8080, public=public),),
    )
