"""Redis behind Sentinel on real processes: a primary, two replicas, three Sentinels (``caravan.stack.redis_sentinel``,
1,000 ms to call a primary down). The primary is killed (kill -9) or frozen (SIGSTOP, as a partition would cut it
off) under Caravan's own store code: every acknowledged write is on the new primary, a write no replica has is never
acknowledged, the old primary acknowledges nothing after the failover, and a lease cannot start two terms with one
fencing token.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ReadOnlyError

from caravan.stack.redis_sentinel import SentinelGroup, data_node_users, start_sentinel_group
from caravan.stack.redis_server import start_redis
from core.keys import Keys
from core.lease import Lease
from core.redis import NotReplicated, client
from core.retry import TRANSIENT
from core.settings import RedisSettings, Settings
from core.transactions import transact
from domain.model import Driver, Kernel, Session, SessionType
from domain.schedules import RunOutcome
from stores.schedules import ScheduleStore
from stores.sessions import SessionStore
from tests.failover import longest_gap
from tests.scheduler.test_schedule_runner import T0 as SCHEDULE_T0
from tests.scheduler.test_schedule_runner import owned_sessions, runner_of, stored_schedule

pytestmark = [pytest.mark.redis]

KEY_PREFIXES = ("t*",)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    started = start_sentinel_group(tmp_path / "redis", secrets_dir=tmp_path / "secrets", key_prefixes=KEY_PREFIXES)
    yield started
    started.stop()


@pytest.fixture
def settings(group: SentinelGroup, tmp_path: Path) -> Settings:
    """Settings as an operator writes them for Sentinels: no primary's address, the Sentinels' instead."""
    return Settings(
        home=tmp_path,
        secrets_dir=group.secrets_dir,
        redis=RedisSettings(
            url="redis://sentinel-named-primary/0",
            prefix="t" + uuid.uuid4().hex[:10],
            sentinels=group.sentinel_addresses,
            wait_replicas=1,
        ),
    )


@pytest.fixture
async def gateway_redis(settings: Settings) -> AsyncIterator[Redis]:
    redis = client(settings.for_role("gateway").redis)
    yield redis
    await redis.aclose()


def new_session(name: str) -> Session:
    resources = {"cpu": "1", "mem": str(64 << 20)}
    kernel = Kernel(role="main", index=1, hostname="main1", image="", resources=resources)
    return Session(
        id=uuid.uuid4().hex,
        name=name,
        owner_id="admin",
        type=SessionType.BATCH,
        driver=Driver.RAW_EXEC,
        image="",
        resources=resources,
        kernels=(kernel,),
        created_at=datetime.now(UTC),
    )


async def until(condition: object, *, timeout: float = 60.0, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not (condition() if callable(condition) else condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout:.0f}s")
        await asyncio.sleep(0.05)


@contextmanager
def replicas_frozen(group: SentinelGroup) -> Iterator[None]:
    """Every replica stopped (SIGSTOP) for the block: the primary takes writes no replica reads."""
    replicas = [node for node in group.nodes if node.port != group.primary_port()]
    for node in replicas:
        os.kill(node.service.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for node in replicas:
            os.kill(node.service.pid, signal.SIGCONT)


def kill_primary(group: SentinelGroup) -> int:
    """kill -9 of the primary; its port."""
    old = group.primary_port()
    assert old is not None
    group.node(old).kill()
    return old


async def new_primary(group: SentinelGroup, old: int) -> int:
    port: list[int] = []

    def moved() -> bool:
        now = group.primary_port()
        port[:] = [now] if now and now != old else []
        return bool(port)

    await until(lambda: moved(), what="failed over")
    return port[0]


async def test_every_acknowledged_session_survives_a_kill_of_the_primary(
    group: SentinelGroup, settings: Settings, gateway_redis: Redis
) -> None:
    """Four writers create sessions through the gateway's store, the primary is killed: each writer sees outages
    (never another error) for a while, then goes on by itself; every session it was told was created is there."""
    store = SessionStore(gateway_redis, Keys(settings.redis.prefix))
    acknowledged: list[tuple[float, str]] = []
    outages: list[tuple[float, str]] = []
    stop = asyncio.Event()

    async def writer(n: int) -> None:
        for i in range(1_000_000):
            if stop.is_set():
                return
            session = new_session(f"w{n}-{i}")
            try:
                await store.create([session])
            except TRANSIENT as exc:
                outages.append((time.monotonic(), type(exc).__name__))
                await asyncio.sleep(0.05)
            else:
                acknowledged.append((time.monotonic(), session.id))

    writers = [asyncio.create_task(writer(n)) for n in range(4)]
    try:
        await until(lambda: len(acknowledged) >= 40, what="40 sessions created")
        old = group.primary_port()
        assert old is not None
        killed_at = time.monotonic()
        group.node(old).kill()
        await new_primary(group, old)
        await until(lambda: sum(t > killed_at for t, _ in acknowledged) >= 40, what="creating again after failover")
    finally:
        stop.set()
        await asyncio.gather(*writers)
    stored = await store.get_many([session_id for _, session_id in acknowledged])
    missing = [session_id for (_, session_id), found in zip(acknowledged, stored, strict=True) if found is None]
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged sessions lost"
    assert outages, "the kill was not felt: the test did not test a failover"
    window = longest_gap(t for t, _ in acknowledged if t > killed_at - 1)
    print(
        f"\nfailover: {window:.2f}s without a created session around the kill; "
        f"{len(outages)} outage errors ({', '.join(sorted({kind for _, kind in outages}))}); "
        f"{len(acknowledged)} sessions acknowledged, none lost"
    )


async def test_a_write_no_replica_has_is_never_acknowledged(
    group: SentinelGroup, settings: Settings, gateway_redis: Redis
) -> None:
    """Both replicas frozen: a session the primary alone holds is not acknowledged (NotReplicated, UNAVAILABLE at the
    gateway): its outcome is unknown to the caller (the replicas may still read it from their sockets when they wake
    up), never "created" and then lost. The primary dies, a replica takes over, and what was acknowledged is there."""
    store = SessionStore(gateway_redis, Keys(settings.redis.prefix))
    before = new_session("before")
    await store.create([before])
    with replicas_frozen(group):
        unreplicated = new_session("unreplicated")
        with pytest.raises(NotReplicated):
            await store.create([unreplicated])
        old = kill_primary(group)
    await new_primary(group, old)
    await until(await_created(store, new_session("after")), what="creating on the new primary")
    assert await store.get_many([before.id]) != [None]


async def test_a_repeated_client_token_is_not_acknowledged_before_a_replica_has_its_sessions(
    group: SentinelGroup, settings: Settings, gateway_redis: Redis
) -> None:
    """The caller's retry of a creation refused as not replicated (same ``clientToken``) finds the first call's
    sessions on the primary: it must not answer "created" while no replica has them either (bench/chaos lost two such
    sessions in a failover). Once the replicas are back, the retry answers the first call's sessions, once."""
    store = SessionStore(gateway_redis, Keys(settings.redis.prefix))
    first = new_session("retried")
    with replicas_frozen(group):
        with pytest.raises(NotReplicated):
            await store.create([first], client_token="retry-1")
        with pytest.raises(NotReplicated):  # the old code answered [first] here, from the primary alone
            await store.create([new_session("retried")], client_token="retry-1")
    again: list[object] = []  # retried while the thawed replicas are still lagging (NOREPLICAS for up to 2 s)
    await until(await_done(lambda: store.create([new_session("retried")], client_token="retry-1"), again), what="ok")
    assert [[s.id for s in made] for made in again if isinstance(made, list)] == [[first.id]]


async def test_a_schedule_run_is_settled_only_once_a_replica_has_its_sessions(
    group: SentinelGroup, settings: Settings, gateway_redis: Redis
) -> None:
    """A schedule runner creates a run's sessions in one script call outside any transaction (``create_each``), so
    no ``WAIT`` follows that call; the run's settlement (a transaction) comes after it on the same replication stream,
    and its ``WAIT`` covers both. Both replicas frozen: the run is not acknowledged as settled; across the failover that
    follows, the due time ends with exactly one run and its sessions, whichever prefix of the stream the new primary
    had (none: the run is made again; the sessions only: the runner finds them by its run key and settles them)."""
    keys = Keys(settings.redis.prefix)
    schedule = await stored_schedule(gateway_redis, keys)
    runner = runner_of(gateway_redis, keys, settings)
    due = SCHEDULE_T0 + timedelta(seconds=0.3)
    with replicas_frozen(group):
        with pytest.raises(NotReplicated):
            await runner.run_due(due)
        # the settlement is on the primary alone: nothing is due there, and nothing more is written or answered
        assert await runner.run_due(due) == 0
        old = kill_primary(group)
    await new_primary(group, old)
    settled: list[object] = []
    await until(await_done(lambda: runner.run_due(due), settled), what="the run settled on the new primary")
    [run] = await ScheduleStore(gateway_redis, keys).history(schedule.id)
    assert run.outcome is RunOutcome.CREATED and run.due_at == SCHEDULE_T0
    assert sorted(run.session_ids) == sorted(await owned_sessions(gateway_redis, keys))
    assert None not in await SessionStore(gateway_redis, keys).get_many(list(run.session_ids))


def await_done(call: Callable[[], Awaitable[object]], results: list[object]) -> object:
    """A condition for :func:`until`: ``call`` answered (retried through the outage), its answer put in ``results``."""
    state: dict[str, object] = {}

    def done() -> bool:
        task = state.get("task")
        if isinstance(task, asyncio.Task) and task.done():
            if task.exception() is None:
                results.append(task.result())
                return True
            assert isinstance(task.exception(), TRANSIENT), task.exception()
            task = None
        if task is None:
            state["task"] = asyncio.ensure_future(call())
        return False

    return done


def await_created(store: SessionStore, session: Session) -> object:
    """A condition for :func:`until`: ``session`` created (retried through the outage)."""
    return await_done(lambda: store.create([session]), [])


async def test_the_old_primary_acknowledges_nothing_after_the_failover(
    group: SentinelGroup, settings: Settings
) -> None:
    """The primary frozen long enough for the Sentinels to promote a replica (a partition would do the same), with a
    session creation waiting in its socket: when it wakes up it still believes it is the primary and runs that creation
    first. The replica not promoted may still follow it then (the Sentinels reconfigure it next) and confirm the
    write, which the failover then discards: waiting for one replica does not cover this case, waiting for all of them
    (``CARAVAN_REDIS_WAIT_REPLICAS=2`` here) does: the promoted one no longer reads the old primary's stream."""
    old = group.primary_port()
    assert old is not None
    direct = replace(settings.redis, sentinels=(), url=f"redis://127.0.0.1:{old}/0", wait_replicas=2)  # never moves
    as_gateway = replace(settings, redis=direct).for_role("gateway")
    stuck = client(as_gateway.redis)
    store = SessionStore(stuck, Keys(settings.redis.prefix))
    await stuck.ping()  # connected before the freeze
    os.kill(group.node(old).service.pid, signal.SIGSTOP)
    session = new_session("written-to-the-old-primary")
    try:
        pending = asyncio.ensure_future(store.create([session]))
        await new_primary(group, old)
    finally:
        os.kill(group.node(old).service.pid, signal.SIGCONT)
    try:
        with pytest.raises((NotReplicated, ReadOnlyError)):
            await pending
    finally:
        await stuck.aclose()
    redis = client(settings.for_role("gateway").redis)
    try:
        found = SessionStore(redis, Keys(settings.redis.prefix))
        await until(await_created(found, new_session("on-the-new-primary")), what="creating on the new primary")
        assert await found.get_many([session.id]) == [None]
    finally:
        await redis.aclose()


async def test_a_lease_is_not_handed_out_twice_with_one_fencing_token(group: SentinelGroup, settings: Settings) -> None:
    """A scheduler takes the lease while no replica can have it: no term starts (NotReplicated). After the failover
    another takes it; had the first started its term, both would hold the same fencing token and both could write."""
    keys = Keys(settings.redis.prefix)
    first, second = (client(settings.for_role("scheduler").redis) for _ in range(2))
    try:
        ahead = Lease(first, keys.scheduler_lease, keys.scheduler_fence, ttl=2)
        term = await ahead.try_acquire()  # a term that every replica has
        assert term is not None
        await ahead.release()
        with replicas_frozen(group):
            with pytest.raises(NotReplicated):
                await ahead.try_acquire()
            old = kill_primary(group)
        await new_primary(group, old)
        behind = Lease(second, keys.scheduler_lease, keys.scheduler_fence, ttl=2)
        fences = []
        await until(await_lease(behind, fences), what="the lease taken on the new primary")
        assert fences[0].token > term.token
    finally:
        await first.aclose()
        await second.aclose()


def await_lease(lease: Lease, fences: list[object]) -> object:
    """A condition for :func:`until`: ``lease`` taken (its fence appended to ``fences``), retried through outages."""
    state: dict[str, object] = {}

    def taken() -> bool:
        task = state.get("task")
        if isinstance(task, asyncio.Task) and task.done():
            if task.exception() is None and task.result() is not None:
                fences.append(task.result())
                return True
            assert task.exception() is None or isinstance(task.exception(), TRANSIENT), task.exception()
            task = None
        if task is None:
            state["task"] = asyncio.ensure_future(lease.try_acquire())
        return False

    return taken


async def test_closing_the_client_closes_the_sentinels_connections(settings: Settings) -> None:
    """``aclose()`` closes the connections to the Sentinels too, not only the primary's: redis-py's Sentinel pool
    left them open, and they warned (ResourceWarning) at garbage collection, in whichever test ran then."""
    redis = client(settings.for_role("gateway").redis)
    await redis.ping()  # asks the Sentinels for the primary first
    sentinel_pools = [sentinel.connection_pool for sentinel in redis.connection_pool.sentinel_manager.sentinels]
    assert any(pool._available_connections for pool in sentinel_pools), "no Sentinel was asked: nothing to test"
    await redis.aclose()
    still_open = [c for pool in sentinel_pools for c in pool._available_connections if c.is_connected]
    assert not still_open, f"{len(still_open)} connections to the Sentinels left open"


async def test_concurrent_discoveries_keep_every_sentinel_client(group: SentinelGroup, settings: Settings) -> None:
    """Discoveries of the primary at once (a failover's reconnecting commands) that all pass over the first Sentinel
    (in a failover it names no good primary) and are answered by the second: redis-py moved the second to the front
    once per discovery, by a stale index after the first, so the first Sentinel's client fell out of the list, and
    ``aclose`` (which closes the clients on the list) left its connections open: they warned at garbage collection in
    a later test (three connections to one port, after tests/e2e/test_redis_failover.py)."""
    redis = client(settings.for_role("gateway").redis)
    manager = redis.connection_pool.sentinels
    made = list(manager.sentinels)
    with group.sentinel_admin(group.sentinels[0].port) as first:
        first.sentinel_remove(group.master_name)  # the first Sentinel answers, naming no primary
    try:
        answers = await asyncio.gather(*(manager.discover_master(group.master_name) for _ in range(4)))
        assert len(set(answers)) == 1, answers
        assert sorted(map(id, manager.sentinels)) == sorted(map(id, made)), "a Sentinel client fell out of the list"
        assert made[0].connection_pool._available_connections, "the first Sentinel was not asked: nothing to test"
    finally:
        await redis.aclose()
    still_open = [c for sentinel in made for c in sentinel.connection_pool._available_connections if c.is_connected]
    assert not still_open, f"{len(still_open)} connections to the Sentinels left open"


async def test_a_new_primary_leaves_the_sentinel_connections_in_use_open(gateway_redis: Redis) -> None:
    """When the Sentinels name a new primary, redis-py drops the pool's idle connections (``disconnect`` with
    ``inuse_connections=False``). That closed the Sentinel clients' connections too, under the tasks asking a Sentinel
    on them at that moment: bench/chaos saw them fail with ``AttributeError`` / ``RuntimeError`` (not connection
    errors), which the gateway answered with an untyped 500. Here a Sentinel connection held as a discovery holds it."""
    await gateway_redis.ping()
    pool = gateway_redis.connection_pool
    sentinel = pool.sentinels.sentinels[0]
    held = await sentinel.connection_pool.get_connection()
    try:
        assert held.is_connected
        await pool.disconnect(inuse_connections=False)  # what redis-py does when the primary changes
        assert held.is_connected
        await held.send_command("PING")
        assert await held.read_response() in ("PONG", b"PONG", True)
    finally:
        await sentinel.connection_pool.release(held)
    assert await gateway_redis.ping()


def restart_as_replica(group: SentinelGroup, old: int, primary: int) -> None:
    """The killed node started again on its port, following ``primary`` (as bench/chaos brings a killed one back)."""
    node = group.node(old)
    argv = [str(a) for a in node.service.process.args]  # type: ignore[union-attr]
    kept = argv[argv.index("--masteruser") :]
    kept = kept[: kept.index("--replicaof")] if "--replicaof" in kept else kept
    index = group.nodes.index(node)
    state_dir = Path(argv[argv.index("--dir") + 1])
    node.service = start_redis(
        state_dir,
        old,
        log=state_dir.parent / f"redis-{index}.log",
        secrets_dir=group.secrets_dir,
        key_prefixes=KEY_PREFIXES,
        extra_users=data_node_users(group.secrets_dir),
        extra_args=[*kept, "--replicaof", "127.0.0.1", str(primary)],
        name=f"redis-{index}",
    )


async def test_a_transaction_cut_by_a_failover_goes_to_the_new_primary(
    group: SentinelGroup, gateway_redis: Redis, settings: Settings
) -> None:
    """A WATCHed transaction whose primary is killed and comes back at once as a replica (same port) is written on the
    new primary. Found by bench/chaos: redis-py (8.1) reconnected the broken connection to the same address to send
    ``UNWATCH`` (not asking the Sentinels), handed it back to the pool connected to the replica, and each new attempt
    there read ``READONLY`` and started again at once: a gateway spun on it at start, never ready, until killed."""
    key = f"{settings.redis.prefix}:transaction"
    await gateway_redis.set(key, "before")  # the pool's connection, to the primary
    old = group.primary_port()
    assert old is not None
    attempts = 0

    async def attempt(pipe: Pipeline) -> None:
        nonlocal attempts
        attempts += 1
        assert attempts <= 5, f"{attempts} attempts: spinning on the demoted primary"
        await pipe.watch(key)
        if attempts == 1:  # FAULT: the primary killed under the transaction, back at once as a replica
            kill_primary(group)
            new = await new_primary(group, old)
            restart_as_replica(group, old, new)
            await until(lambda: group.admin(old).role()[0] == "slave", what="the old primary following the new one")
        pipe.multi()
        pipe.set(key, "after")
        await pipe.execute()

    await transact(gateway_redis, attempt)
    assert await gateway_redis.get(key) == "after"
