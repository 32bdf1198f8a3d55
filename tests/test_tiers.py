"""The test tiers themselves: markers from fixtures, the watch that fails an unmarked test starting a service, and the
tripwire that Redis-tier tests get as Nomad's address."""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
import pytest

from core.settings import NomadSettings, Settings
from nomad_jobs.client import NomadClient, NomadRejected
from tests.no_nomad import NoNomad, is_tripwire
from tests.tiers import service_of, started_service

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

INI = """
[pytest]
asyncio_default_fixture_loop_scope = function
markers =
    redis: Redis
    docker: Docker
    qemu: QEMU
    ui: a browser
"""
CONFTEST = """
from tests.tiers import Tiers

def pytest_configure(config):
    config.pluginmanager.register(Tiers(docker=False, qemu=False, ui=False), "caravan-tiers")
"""

STARTS_REDIS = """
import pytest

from caravan.stack.processes import free_port
from caravan.stack.redis_server import start_redis


def started_and_seen(request, tmp_path):
    service = start_redis(tmp_path / "redis", free_port(), log=tmp_path / "redis.log", secrets_dir=tmp_path / "s")
    try:
        request.config.pluginmanager.get_plugin("caravan-tiers").watch.sample()  # what its thread does every 0.2 s
    finally:
        service.stop()


def test_unmarked(request, tmp_path):
    started_and_seen(request, tmp_path)


@pytest.mark.redis
def test_marked(request, tmp_path):
    started_and_seen(request, tmp_path)


def test_pure():
    pass
"""


MARKED_BY_FIXTURES = """
import pytest

@pytest.fixture
def redis_server(): ...

@pytest.fixture
def nomad_agent(): ...

@pytest.fixture
def nomad_cluster(): ...

@pytest.fixture
def settings(redis_server, nomad_agent): ...

@pytest.fixture
def on_cluster(settings, nomad_cluster): ...

def test_pure(tmp_path): ...

def test_redis(redis_server): ...

def test_nomad(settings): ...

def test_cluster(on_cluster): ...

@pytest.mark.docker
def test_docker(settings): ...

@pytest.mark.qemu
def test_qemu(): ...

@pytest.mark.ui
def test_ui(): ...
"""


def test_the_tiers_follow_from_the_fixtures_a_test_uses(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_marked=MARKED_BY_FIXTURES)
    items, _ = pytester.inline_genitems("-p", "no:cacheprovider")
    tiers = {"redis", "nomad", "cluster", "docker", "qemu", "ui", "skip"}
    found = {item.name: {m.name for m in item.iter_markers()} & tiers for item in items}
    assert found == {
        "test_pure": set(),
        "test_redis": {"redis"},
        "test_nomad": {"redis", "nomad"},
        "test_cluster": {"redis", "nomad", "cluster"},
        "test_docker": {"redis", "nomad", "docker", "skip"},  # (the inner conftest says there is no Docker)
        "test_qemu": {"qemu", "skip"},
        "test_ui": {"ui", "skip"},  # (no browser either)
    }


def test_redis_settings_reach_no_nomad(redis_settings: Settings) -> None:
    assert is_tripwire(redis_settings.nomad.addr)


def test_settings_reach_the_nomad_agent(settings: Settings) -> None:
    assert not is_tripwire(settings.nomad.addr)
    assert httpx2.get(f"{settings.nomad.addr}/v1/agent/health").status_code == 200


NOMAD = b"/root/.cache/caravan/nomad/bin/nomad"


@pytest.mark.parametrize(
    ("comm", "argv", "tier"),
    [
        (b"nomad", [NOMAD, b"agent", b"-dev", b"-config=/tmp/x/nomad.hcl"], "nomad"),  # start_nomad_dev
        (b"nomad", [NOMAD, b"agent", b"-config=/tmp/x/server.hcl"], "nomad"),  # a cluster's server or client
        (b"nomad", [NOMAD, b"logmon"], None),  # an agent's plugin process, not an agent
        (b"nomad", [NOMAD, b"job", b"run", b"-output", b"job.hcl"], None),  # the CLI
        (b"redis-server", [b"redis-server 127.0.0.1:6390"], "redis"),  # as Redis rewrites its command line
        (b"sleep", [b"sleep", b"300"], None),
        (b"", [], None),  # gone before it was read
    ],
)
def test_the_watch_knows_an_agent_and_a_redis_server(comm: bytes, argv: list[bytes], tier: str | None) -> None:
    assert service_of(comm, argv) == tier


AGENT = [NOMAD, b"agent", b"-dev", b"-config=/tmp/x/nomad.hcl"]


@pytest.mark.parametrize(
    ("comm", "argv", "parent_comm", "parent_argv", "tier"),
    [
        (b"nomad", AGENT, b"python", [b"python", b"-m", b"pytest"], "nomad"),  # an agent a test started
        (b"nomad", AGENT, b"nomad", AGENT, None),  # the agent's fork before it execs its log monitor or executor
        (b"nomad", [NOMAD, b"logmon"], b"nomad", AGENT, None),  # and after
        (b"redis-server", [b"redis-server 127.0.0.1:6390"], b"python", [b"python"], "redis"),
        (b"redis-server", [b"redis-server 127.0.0.1:6390"], b"redis-server", [b"redis-server 127.0.0.1:6390"], None),
        (b"nomad", AGENT, b"", [], "nomad"),  # its parent gone before it was read
    ],
)
def test_a_services_own_child_is_no_new_service(
    comm: bytes, argv: list[bytes], parent_comm: bytes, parent_argv: list[bytes], tier: str | None
) -> None:
    assert started_service(comm, argv, parent_comm, parent_argv) == tier


@pytest.mark.redis  # the inner run starts Redis servers (below this process, so this test must say so too)
def test_a_test_starting_redis_unmarked_fails_and_marked_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_inner=STARTS_REDIS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3, errors=1)  # the unmarked test passes, then errs at its teardown
    result.stdout.fnmatch_lines(
        ["*test_unmarked started a redis process (pid *redis-server*) but is not marked redis: mark it*"]
    )
    selected = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-m", "not redis")
    selected.assert_outcomes(passed=2, errors=1, deselected=1)  # a quick run of the pure tier still catches it


async def test_a_nomad_call_on_the_tripwire_is_refused_at_once_and_recorded() -> None:
    tripwire = NoNomad()
    client = NomadClient(NomadSettings(addr=tripwire.address("tquick"), job_prefix="tquick"))
    try:
        with pytest.raises(NomadRejected, match="no Nomad here: this test was given Redis alone"):
            await client.jobs("tquick-")
        [call] = tripwire.calls("tquick")
        assert call.startswith("GET /v1/jobs?")
        assert tripwire.calls("tother") == []
    finally:
        await client.aclose()
        tripwire.close()
