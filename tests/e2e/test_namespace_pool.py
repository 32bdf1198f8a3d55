"""Pooled network namespaces wired in, on the real stack (Nomad, Docker, the CNI chain, nftables, the scheduler and a
keeper, ``nomad_jobs.namespace_keeper``): a single-kernel docker session placed while the node's pool has a free
namespace runs in it, bound to that session with its ports; with the pool empty it takes today's path; once the
session ends its namespace is deleted, never handed out again, and a fresh one takes its place. (Its isolation: the
escape probe of tests/e2e/test_isolation.py, in a pooled session.)"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from caravan.stack.nomad_agent import NomadAgent
from caravan.stack.processes import free_port
from core.replies import text_set
from node_plugins.cni_isolation import Membership, session_key
from node_plugins.namespace_pool import Client, make
from nomad_jobs.namespace_keeper import CHECK_PERIOD, LABEL, NamespaceKeeper
from tests.conftest import DEFAULT_IMAGE, STACK
from tests.e2e.test_preferred_port import APPS, page, serving
from tests.e2e.test_published_ports import DESTROY, published_elements, refused
from tests.harness import CREATE, Caravan, caravan_env
from tests.namespace_keeping import keeping

pytestmark = [pytest.mark.docker]

POOLED = re.compile(r'network_mode\s*=\s*"container:(caravan-pool-[0-9a-f]{12})"')


def pooled_in(job_hcl: str) -> str | None:
    found = POOLED.search(job_hcl)
    return found.group(1) if found else None


def exists(name: str) -> bool:
    return subprocess.run(["docker", "inspect", name], capture_output=True).returncode == 0


def kernel_hostname(alloc_id: str | None) -> str:
    """The hostname inside the docker container of the allocation ``alloc_id`` (Nomad labels its containers)."""
    found = subprocess.run(
        ["docker", "ps", "--quiet", "--filter", f"label=com.hashicorp.nomad.alloc_id={alloc_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(found) == 1, found
    done = subprocess.run(["docker", "exec", found[0], "hostname"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


async def stop_container(name: str) -> None:
    """Kill the container ``name``, as a restart of the Docker daemon does."""
    await asyncio.to_thread(subprocess.run, ["docker", "kill", name], check=True, capture_output=True)


async def free(caravan: Caravan, keeper: NamespaceKeeper) -> set[str]:
    return text_set(await caravan.store.redis.smembers(keeper.key))


async def running(caravan: Caravan, name: str) -> tuple[str, str, int]:
    """A docker session serving its name on an app port, RUNNING: its id, its job's HCL and the app's host port."""
    fields = serving(name, None, driver="DOCKER", image=DEFAULT_IMAGE)
    session_id = (await caravan.gql(CREATE, {"input": fields}))["createSession"]["sessions"][0]["id"]
    ran = await caravan.wait_for(session_id, "RUNNING", timeout=90)
    [app] = (await caravan.gql(APPS, {"id": session_id}))["session"]["apps"]
    return session_id, str(ran["jobHcl"]), int(app["hostPort"])


@pytest.fixture
async def pool_of_one(caravan: Caravan, nomad_agent: NomadAgent) -> AsyncIterator[NamespaceKeeper]:
    async with keeping(caravan, nomad_agent, 1) as keeper:
        yield keeper


async def test_a_session_runs_in_a_pooled_namespace_bound_to_it_then_deleted_and_replaced(
    caravan: Caravan, pool_of_one: NamespaceKeeper
) -> None:
    [offered] = await free(caravan, pool_of_one)
    session_id, job_hcl, port = await running(caravan, "pooled")
    assert pooled_in(job_hcl) == offered, job_hcl  # the one free namespace, claimed at placement
    assert offered not in await free(caravan, pool_of_one)  # ... and no longer offered to anyone
    assert "served by pooled" in await page(caravan, port)  # its published port leads into the pooled namespace
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.nomad_job_id
    members = Membership(pool_of_one.members.root)
    record = members.recall(offered)
    assert record is not None
    assert record.session == session_key({"NOMAD_NAMESPACE": "default", "NOMAD_JOB_ID": stored.nomad_job_id})
    assert kernel_hostname(stored.main_kernel.alloc_id) == "main1"  # the kernel's own, as outside the pool

    await caravan.gql(DESTROY, {"ids": [session_id]})
    await caravan.wait_for(session_id, "TERMINATED", timeout=90)
    for _ in range(150):  # the keeper sees the allocation end and deletes the namespace
        if not exists(offered) and members.recall(offered) is None:
            break
        await asyncio.sleep(0.2)
    assert not exists(offered) and members.recall(offered) is None
    assert f"tcp . {port} : " not in published_elements() and await refused(port)
    for _ in range(150):  # a fresh one took its place in the pool (made once the first was claimed)
        if await free(caravan, pool_of_one):
            break
        await asyncio.sleep(0.2)
    [fresh] = await free(caravan, pool_of_one)
    assert fresh != offered

    _, again, port = await running(caravan, "next")
    assert pooled_in(again) == fresh  # the next session gets the fresh one, never the one deleted
    assert "served by next" in await page(caravan, port)


async def test_a_free_namespace_whose_pause_container_stopped_is_replaced_never_handed_out(
    caravan: Caravan, pool_of_one: NamespaceKeeper
) -> None:
    """The free namespace's pause container stopped (what a restart of the Docker daemon does to every one): the
    keeper takes it back from the free set, deletes it and makes a fresh one, and the next docker session runs in the
    fresh one. Before, it stayed free, and the session given it ended ERROR ("cannot join network of a non running
    container", on a dev stack after Docker was restarted)."""
    [stopped] = await free(caravan, pool_of_one)
    await stop_container(stopped)
    deadline = time.monotonic() + CHECK_PERIOD + 30
    while (offered := await free(caravan, pool_of_one)) in ({stopped}, set()):
        assert time.monotonic() < deadline, offered
        await asyncio.sleep(0.2)
    [fresh] = offered
    assert fresh != stopped and not exists(stopped)
    _, job_hcl, port = await running(caravan, "fresh")
    assert pooled_in(job_hcl) == fresh
    assert "served by fresh" in await page(caravan, port)


async def test_with_the_pool_empty_a_session_takes_todays_path(caravan: Caravan, pool_of_one: NamespaceKeeper) -> None:
    pool_of_one.size = 0  # the keeper makes no fresh one once the first is claimed: then none is free
    _, first, port = await running(caravan, "first")
    assert pooled_in(first) is not None
    assert "served by first" in await page(caravan, port)
    assert await free(caravan, pool_of_one) == set()
    _, second, port = await running(caravan, "second")
    assert pooled_in(second) is None and re.search(r"mode\s*=\s*\"cni/caravan\"", second), second
    assert "served by second" in await page(caravan, port)


async def test_caravan_namespace_keeper_fills_the_pool_and_takes_back_its_free_ones_on_sigterm(
    caravan: Caravan, nomad_agent: NomadAgent
) -> None:
    """The keeper as ``caravan dev`` runs it (``caravan namespace-keeper``, the scheduler's credentials)."""
    assert nomad_agent.data_dir is not None
    env = caravan_env(caravan.settings, free_port()) | {
        "CARAVAN_HOME": str(nomad_agent.data_dir.parent.parent),  # <home>/nomad: where the client's network is recorded
        "CARAVAN_NAMESPACE_POOL": "2",
        "CARAVAN_PAUSE_IMAGE": STACK["CARAVAN_PAUSE_IMAGE"],
    }
    key = caravan.store.keys.namespace_pool(nomad_agent.node_id)
    keeper = await asyncio.create_subprocess_exec(sys.executable, "-m", "caravan.cli", "namespace-keeper", env=env)
    try:
        for _ in range(300):
            if await caravan.store.redis.scard(key) == 2 or keeper.returncode is not None:
                break
            await asyncio.sleep(0.1)
        offered = text_set(await caravan.store.redis.smembers(key))
        assert len(offered) == 2 and all(exists(name) for name in offered)
    finally:
        keeper.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(keeper.wait(), 60) == 0
    assert await caravan.store.redis.scard(key) == 0 and not any(exists(name) for name in offered)


@pytest.mark.parametrize(
    ("where", "image", "said"),
    [
        ("nowhere", None, "no session network recorded in"),
        (None, "caravan/pause:not-built-here", "Docker or the pause image caravan/pause:not-built-here is not here"),
    ],
)
async def test_a_keeper_that_cannot_keep_a_pool_here_waits_says_why_and_stops_cleanly(
    caravan: Caravan, nomad_agent: NomadAgent, tmp_path: Path, where: str | None, image: str | None, said: str
) -> None:
    """``caravan namespace-keeper`` on a host without a recorded session network, or without Docker or its pause
    image, waits (looking again now and then) and says why, rather than exit: deployed as a system job, an exit is
    restarted by Nomad in a loop. SIGTERM stops it cleanly. (Before, it exited at once without a network at
    ``<home>/nomad``, read no other place, and without its image tried to make a namespace every second.)"""
    assert nomad_agent.data_dir is not None
    env = caravan_env(caravan.settings, free_port()) | {
        "CARAVAN_HOME": str(nomad_agent.data_dir.parent.parent),
        "CARAVAN_NAMESPACE_POOL": "1",
        "CARAVAN_PAUSE_IMAGE": image or STACK["CARAVAN_PAUSE_IMAGE"],
        "CARAVAN_NODE_ID": nomad_agent.node_id,
    }
    if where:
        env["CARAVAN_SESSION_NETWORK_DIR"] = str(tmp_path / where)
    keeper = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "caravan.cli", "namespace-keeper", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert keeper.stderr is not None
    try:
        async with asyncio.timeout(60):
            while said not in (line := (await keeper.stderr.readline()).decode()):
                assert line, "the keeper exited without saying why it keeps no pool"
        assert "no pool kept here" in line, line
        await asyncio.sleep(1.0)
        assert keeper.returncode is None, "the keeper exited"
    finally:
        keeper.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(keeper.wait(), 60) == 0
    assert await caravan.store.redis.scard(caravan.store.keys.namespace_pool(nomad_agent.node_id)) == 0


@pytest.mark.parametrize("cleanup", ["delete_all", "release_free"])
async def test_a_namespace_being_made_when_the_keeper_stops_is_deleted_with_the_rest(
    caravan: Caravan, nomad_agent: NomadAgent, cleanup: str
) -> None:
    """The keeper makes a namespace in a thread (Docker, then the CNI chain), which goes on when the keeper's task is
    cancelled (a stop, a test's end): what it made must still be among the keeper's, so its cleanup deletes it: a
    test's (``delete_all``) and a stop's (``release_free``: SIGTERM, Nomad stopping or updating the deployed keeper
    job). Before, its pause container was left running (found after a CI run); then, on a stop, until a keeper came
    back on the node and deleted it 10 minutes later (it was never offered, so the stop did not take it back)."""
    assert nomad_agent.network is not None
    node = f"test-{uuid.uuid4().hex[:8]}"  # a label of this test's own: no other keeper's containers
    keeper = NamespaceKeeper(
        Client(nomad_agent.network.conflist(), nomad_agent.network.cni_path),
        caravan.nomad,
        caravan.store.redis,
        caravan.store.keys,
        node,
        1,
        STACK["CARAVAN_PAUSE_IMAGE"],
    )
    filling = asyncio.create_task(keeper._fill())
    await asyncio.sleep(0.05)  # the first namespace is being made (a pause container and the chain: 0.2-0.3 s)
    filling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await filling
    await getattr(keeper, cleanup)()
    await asyncio.sleep(0.5)  # a thread the old code left behind finishes its container meanwhile
    left = removed_containers(node)
    assert left == [], "a pooled namespace made as the keeper stopped was left running"


def removed_containers(node: str) -> list[str]:
    """The pause containers labelled with ``node`` that were left, removed (the machine stays clean either way)."""
    listed = ["docker", "ps", "--all", "--quiet", "--filter", f"label={LABEL}={node}"]
    left = subprocess.run(listed, capture_output=True, text=True).stdout.split()
    for container in left:
        subprocess.run(["docker", "rm", "--force", container], capture_output=True)
    return left


async def test_a_keeper_finds_its_own_namespaces_again_never_another_deployments_on_its_node(
    caravan: Caravan, nomad_agent: NomadAgent
) -> None:
    """Two deployments (key prefixes) with keepers on one node: a keeper that starts again finds the namespaces its
    deployment's keeper made, and none of the other's. Before, they were found by the node alone, so each keeper took
    the other's free namespaces for its own: deleted them as unclaimed, or after a session of its own had ended. One
    made by a keeper from before (labelled with the node alone) is still found, so an upgrade leaves none behind."""
    assert nomad_agent.network is not None
    client = Client(nomad_agent.network.conflist(), nomad_agent.network.cni_path)
    node = f"test-{uuid.uuid4().hex[:8]}"

    def keeper_of(prefix: str) -> NamespaceKeeper:
        keys = replace(caravan.store.keys, prefix=prefix)
        return NamespaceKeeper(client, caravan.nomad, caravan.store.redis, keys, node, 1, STACK["CARAVAN_PAUSE_IMAGE"])

    prefix = caravan.store.keys.prefix
    first, other, again = keeper_of(f"{prefix}-a"), keeper_of(f"{prefix}-b"), keeper_of(f"{prefix}-a")
    try:
        made = await first._make()
        await other._make()
        older = make(client, STACK["CARAVAN_PAUSE_IMAGE"], {LABEL: node})
        await again.recover()
        assert set(again.ours) == {made.name, older.name}
    finally:
        await first.delete_all()
        await other.delete_all()
        await again.delete_all()
    assert removed_containers(node) == []


async def test_a_keeper_started_again_deletes_its_free_namespaces_whose_pause_container_stopped(
    caravan: Caravan, nomad_agent: NomadAgent
) -> None:
    """A keeper that starts after the Docker daemon restarted (every pause container stopped meanwhile): the free
    namespaces it finds again are checked before any is offered; the stopped ones leave the free set and are
    deleted."""
    assert nomad_agent.network is not None
    client = Client(nomad_agent.network.conflist(), nomad_agent.network.cni_path)
    node = f"test-{uuid.uuid4().hex[:8]}"

    def keeper() -> NamespaceKeeper:
        keys = caravan.store.keys
        return NamespaceKeeper(client, caravan.nomad, caravan.store.redis, keys, node, 2, STACK["CARAVAN_PAUSE_IMAGE"])

    first, again = keeper(), keeper()
    try:
        made = [await first._make() for _ in range(2)]
        for pooled in made:
            await first._offer(pooled.name)
        await stop_container(made[0].name)
        await again.recover()
        assert await free(caravan, again) == {made[1].name} and set(again.ours) == {made[1].name}
        assert not exists(made[0].name)
    finally:
        await first.delete_all()
        await again.delete_all()
    assert removed_containers(node) == []


async def test_a_pooled_sessions_replacement_allocation_publishes_its_own_ports(
    caravan: Caravan, pool_of_one: NamespaceKeeper
) -> None:
    """An allocation of a pooled session replaced on its node (``nomad alloc stop``: Nomad places a new one of the
    same job, with other host ports) joins the same namespace, which the keeper binds again with the new ports. Before,
    a namespace was bound once: the session was RUNNING again and its app answered nothing on its new port."""
    session_id, job_hcl, first_port = await running(caravan, "replaced")
    assert pooled_in(job_hcl) is not None
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.main_kernel.alloc_id
    first = stored.main_kernel.alloc_id
    await caravan.nomad.stop_allocation(first)
    for _ in range(300):
        stored = await caravan.store.get(session_id)
        assert stored is not None
        if stored.main_kernel.alloc_id not in (None, first) and stored.status.value == "RUNNING":
            break
        await asyncio.sleep(0.2)
    assert stored.main_kernel.alloc_id != first and stored.status.value == "RUNNING", stored.status
    [app] = (await caravan.gql(APPS, {"id": session_id}))["session"]["apps"]
    port = int(app["hostPort"])
    assert "served by replaced" in await page(caravan, port)
    if port != first_port:  # the first allocation's port leads nowhere any more
        assert f"tcp . {first_port} : " not in published_elements()
