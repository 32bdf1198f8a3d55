"""Shared test fixtures: one real Redis and one real Nomad dev agent per test session, each started on first use.

Tests are isolated by namespace (a Redis key prefix and a Nomad job prefix of their own), not by
restarting services. ``redis_settings`` (and ``redis``, ``keys``) give a test Redis alone: Nomad is not booted for it
and its Nomad address is a tripwire (``tests/no_nomad.py``); ``settings`` adds the Nomad agent. The tiers a test needs
are marked from the fixtures it uses (``tests/tiers.py``).

Both run as the stack runs them: Nomad with ACLs on, Redis with users only. The settings of a test carry the admin
credentials (Nomad's management token, Redis' admin user) for the test's own reads and writes, and the secrets
directory where each component finds its own (``Settings.for_role``): the gateway, scheduler and idle checker under
test connect with their role's token and user, so the tests prove those are sufficient.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from caravan.stack.nomad_agent import NomadAgent, cgroup_parent, start_nomad_dev
from caravan.stack.processes import Service, free_port
from caravan.stack.redis_server import start_redis
from core.keys import Keys
from core.settings import NomadSettings, RedisSettings, Settings, qemu_images_of
from gateway import web
from tests.harness import Caravan, running_caravan
from tests.module_durations import ModuleDurations
from tests.no_nomad import NoNomad
from tests.tiers import Tiers
from tests.workers import controller_setup


def _stack_env() -> dict[str, str]:
    """ops/ writes where it put Nomad, the rootfs and the image; read it when pytest runs bare."""
    path = Path(os.environ.get("CARAVAN_CACHE", Path.home() / ".cache" / "caravan")) / "stack.env"
    found = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line) if path.exists() else {}
    return {**found, **{k: v for k, v in os.environ.items() if k.startswith("CARAVAN_")}}


STACK = _stack_env()
DOCKER = STACK.get("CARAVAN_DOCKER_AVAILABLE") == "1"
DEFAULT_IMAGE = STACK.get("CARAVAN_DEFAULT_IMAGE", "")
QEMU_IMAGES = qemu_images_of(STACK)
"""VM images for the qemu driver (ops/build-vm-image); the driver is wanted only when QEMU and an image exist."""
QEMU = bool(shutil.which("qemu-system-x86_64")) and bool(QEMU_IMAGES)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
"""This process's name among the suite's workers (``ops/test`` runs ``pytest -n``): each starts its own Redis and
Nomad agent when its tests need them."""
UI = bool(shutil.which("chromium")) and bool(shutil.which("chromedriver")) and web.built()
"""The web UI's browser tests (tests/ui/) need Debian's chromium and chromium-driver and the built UI."""


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


TEST_KEY_PREFIXES = ("t*",)
"""Key prefixes the components' Redis users may reach: every test namespace (``namespace``) starts with ``t``."""


@pytest.fixture(scope="session")
def secrets_dir(state_dir: Path) -> Path:
    """The test stack's secrets: Redis passwords and the dev agent's Nomad tokens, by role."""
    return state_dir / "secrets"


@pytest.fixture(scope="session")
def redis_server(state_dir: Path, secrets_dir: Path) -> Iterator[str]:
    """The URL of the session's Redis, without credentials (``Settings.for_role`` adds them)."""
    port = free_port()
    service: Service = start_redis(
        state_dir / "redis", port, log=state_dir / "redis.log", secrets_dir=secrets_dir, key_prefixes=TEST_KEY_PREFIXES
    )
    yield f"redis://127.0.0.1:{port}/0"
    service.stop()


@pytest.fixture(scope="session")
def nomad_agent(state_dir: Path, secrets_dir: Path) -> Iterator[NomadAgent]:
    drivers = ("raw_exec", "exec") + (("docker",) if DOCKER else ()) + (("qemu",) if QEMU else ())
    started = start_nomad_dev(
        state_dir / "nomad",
        nomad_home=Path(STACK["CARAVAN_NOMAD_HOME"]),
        rootfs=Path(STACK["CARAVAN_ROOTFS"]),
        want_drivers=drivers,
        log=state_dir / "nomad.log",
        qemu_image_dirs=tuple(Path(d) for d in QEMU_IMAGES.values()),
        pause_image=STACK.get("CARAVAN_PAUSE_IMAGE"),
        secrets_dir=secrets_dir,
        cgroups=cgroup_parent(f"tests-{WORKER}"),  # the suite's workers (pytest -n) each run an agent
    )
    yield started
    started.stop()


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def no_nomad() -> Iterator[NoNomad]:
    tripwire = NoNomad()
    yield tripwire
    tripwire.close()


def namespaced_settings(redis_url: str, nomad_addr: str, secrets_dir: Path, namespace: str, home: Path) -> Settings:
    """Settings under ``namespace`` (its Redis key prefix and Nomad job prefix), with the admin's credentials."""
    return (
        Settings(
            home=home,
            secrets_dir=secrets_dir,
            redis=RedisSettings(url=redis_url, prefix=namespace),
            # a failed long-running task is restarted after 2 s, not Nomad's 15 (the tests that wait out its two
            # restarts took 30 s each); the policy is otherwise the product's (tests/nomad_jobs: the default rendered)
            nomad=NomadSettings(addr=nomad_addr, job_prefix=namespace, restart_delay=2.0),
            default_image=DEFAULT_IMAGE or None,
            qemu_images=QEMU_IMAGES,
        )
        .with_prefix(namespace)
        .for_role("admin")
    )


@pytest.fixture
def redis_settings(
    redis_server: str, secrets_dir: Path, namespace: str, tmp_path: Path, no_nomad: NoNomad
) -> Iterator[Settings]:
    """The test's settings with Redis alone (admin credentials): its Nomad address is the tripwire, which refuses
    every call (a permanent error) and fails the test at teardown if it was called."""
    yield namespaced_settings(redis_server, no_nomad.address(namespace), secrets_dir, namespace, tmp_path)
    if called := no_nomad.calls(namespace):
        pytest.fail(
            f"this test called Nomad ({', '.join(called[:3])}) but was given Redis alone (redis_settings, "
            "redis, keys): give it the settings fixture, which boots the Nomad agent",
            pytrace=False,
        )


@pytest.fixture
def settings(redis_settings: Settings, nomad_agent: NomadAgent) -> Settings:
    """The test's settings with Redis and the Nomad dev agent (admin credentials: Nomad's management token)."""
    return dataclasses.replace(
        redis_settings,
        nomad=dataclasses.replace(redis_settings.nomad, addr=nomad_agent.addr),
    ).for_role("admin")


@pytest.fixture
async def redis(redis_settings: Settings) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_settings.redis.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def keys(redis_settings: Settings) -> Keys:
    return Keys(redis_settings.redis.prefix)


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with running_caravan(settings) as running:
        yield running


def pytest_configure(config: pytest.Config) -> None:
    controller_setup(config)
    config.pluginmanager.register(Tiers(docker=DOCKER, qemu=QEMU, ui=UI), "caravan-tiers")
    config.pluginmanager.register(ModuleDurations(), "caravan-module-durations")


from tests.cluster_fixtures import nomad_cluster, on_cluster  # noqa: E402,F401  (several Nomad clients; on demand)

# the multi-host cluster (one per machine): here once, not imported by each module that uses it (pytest then made a
# fixture of it per module, and each module's start swept the one before and started another, some 20 s each)
from tests.multihost_fixtures import multihost_cluster, on_multihost  # noqa: E402,F401
