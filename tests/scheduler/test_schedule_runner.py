"""The schedule runner against real Redis, with the clock passed in: exactly one run per due time however many
runners race on it (and after a crash between creating a run and settling it), the concurrency policies, policy
violations recorded on the run, downtime handled without a burst, triggers, and a stale leader fenced off."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from core.codec import encode
from core.errors import Conflict
from core.keys import Keys
from core.lease import Fence, LostLease
from core.settings import Settings
from domain.model import Driver, Session, SessionType
from domain.resource_policies import UserResourcePolicy
from domain.schedules import (
    ConcurrencyPolicy,
    RunOutcome,
    Schedule,
    Timing,
    check_timing,
    new_schedule,
    run_request,
    run_session_name,
)
from domain.scheduling_config import load_scheduling_config
from domain.session_requests import build_sessions
from domain.storage import FolderMode, FolderStatus, MountRequest, new_folder
from domain.templates import TemplateSpec
from domain.users import Role, User
from scheduler.schedules import ScheduleRunner, _pending
from stores.folders import FolderStore
from stores.resource_policies import PolicyStore
from stores.schedules import ScheduleStore
from stores.sessions import SessionStore
from stores.users import UserStore

pytestmark = pytest.mark.redis

T0 = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC)
SPEC = TemplateSpec(type=SessionType.BATCH, driver=Driver.EXEC, startup_command="true")


def runner_of(redis: Redis, keys: Keys, settings: Settings, fence: Fence | None = None) -> ScheduleRunner:
    return ScheduleRunner(SessionStore(redis, keys), settings, load_scheduling_config(None), fence, history=20)


async def stored_schedule(
    redis: Redis,
    keys: Keys,
    *,
    name: str = "nightly",
    timing: Timing | None = None,
    concurrency: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW,
    owner: str = "alice",
) -> Schedule:
    users = UserStore(redis, keys)
    if await users.get(owner) is None:
        await users.put(User(id=owner, name=owner, role=Role.USER, projects=("default",)))
    schedule = new_schedule(
        name=name,
        owner_id=owner,
        project="default",
        timing=timing or check_timing(cron="* * * * *", interval=None, zone="UTC", now=T0 - timedelta(seconds=30)),
        concurrency=concurrency,
        now=T0 - timedelta(seconds=30),
        spec=SPEC,
    )
    assert schedule.next_due == T0
    await ScheduleStore(redis, keys).create(schedule)
    return schedule


async def owned_sessions(redis: Redis, keys: Keys, owner: str = "alice") -> list[str]:
    return await SessionStore(redis, keys).session_ids(owner_id=owner)


async def test_a_due_schedule_runs_once_and_moves_on(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    schedule = await stored_schedule(redis, keys)
    runner = runner_of(redis, keys, redis_settings)
    assert await runner.run_due(T0 - timedelta(seconds=1)) == 0
    assert await runner.run_due(T0 + timedelta(seconds=0.3)) == 1
    assert await runner.run_due(T0 + timedelta(seconds=0.6)) == 0  # settled: not due again
    [session_id] = await owned_sessions(redis, keys)
    session = await SessionStore(redis, keys).get(session_id)
    assert session is not None
    assert (session.name, session.type, session.project) == ("nightly-20261124-060000", SessionType.BATCH, "default")
    store = ScheduleStore(redis, keys)
    [run] = await store.history(schedule.id)
    assert (run.outcome, run.session_ids, run.due_at) == (RunOutcome.CREATED, (session_id,), T0)
    after = await store.get(schedule.id)
    assert after is not None
    assert (after.next_due, after.runs_started, after.last_sessions) == (T0 + timedelta(minutes=1), 1, (session_id,))


async def test_many_runners_racing_on_one_due_time_create_one_run(
    redis: Redis, keys: Keys, redis_settings: Settings
) -> None:
    schedules = [await stored_schedule(redis, keys, name=f"race-{i}") for i in range(20)]
    runners = [runner_of(redis, keys, redis_settings) for _ in range(8)]
    # 8 runners x 4 coroutines each, all at the due instant
    await asyncio.gather(*(r.run_due(T0 + timedelta(seconds=0.1)) for r in runners for _ in range(4)))
    sessions = await owned_sessions(redis, keys)
    assert len(sessions) == 20
    store = ScheduleStore(redis, keys)
    for schedule in schedules:
        history = await store.history(schedule.id)
        assert [r.outcome for r in history] == [RunOutcome.CREATED]
        assert history[0].session_ids[0] in sessions


async def test_a_crash_between_creating_and_settling_leaves_one_run(
    redis: Redis, keys: Keys, redis_settings: Settings
) -> None:
    schedule = await stored_schedule(redis, keys)
    crashed = runner_of(redis, keys, redis_settings)
    # fault: the first runner creates the run's sessions and dies before settling it
    [stored] = await crashed.schedules.documents([schedule.id])
    pending = _pending(stored, T0 + timedelta(seconds=0.1))
    assert pending is not None
    await crashed._decide([pending], T0 + timedelta(seconds=0.1))
    [created] = await owned_sessions(redis, keys)
    assert await ScheduleStore(redis, keys).history(schedule.id) == []
    # the next leader finds the due time still there, and the sessions by the run key
    assert await runner_of(redis, keys, redis_settings).run_due(T0 + timedelta(seconds=2)) == 1
    assert await owned_sessions(redis, keys) == [created]
    [run] = await ScheduleStore(redis, keys).history(schedule.id)
    assert (run.outcome, run.session_ids) == (RunOutcome.CREATED, (created,))


async def test_a_run_whose_sessions_a_failover_lost_is_created_again_not_settled_without_them(
    redis: Redis, keys: Keys, redis_settings: Settings
) -> None:
    """The runner creates a run's sessions (one script, which no replica confirms) and then settles the run (a
    transaction that waits for a replica). A failover in between loses the sessions, and the settlement, retried on the
    new primary, recorded a run naming sessions that were never found (bench/chaos). Now the settlement checks that the
    run key still names its sessions; it does not, so the run is decided again and its sessions made on the new
    primary: one run, whose sessions exist."""
    schedule = await stored_schedule(redis, keys)
    runner = runner_of(redis, keys, redis_settings)
    # fault: the first creation goes to a primary that a failover then loses (here: keys no one reads again)
    lost_primary = SessionStore(redis, Keys(f"{keys.prefix}-lost-primary"))
    created_on = []
    real_create_each = runner.sessions.create_each

    async def create_each(batches: Sequence[tuple[Sequence[Session], str]]) -> dict[str, list[str] | Conflict]:
        created_on.append("lost primary" if not created_on else "new primary")
        return await (lost_primary.create_each if len(created_on) == 1 else real_create_each)(batches)

    runner.sessions.create_each = create_each  # type: ignore[method-assign]
    assert await runner.run_due(T0 + timedelta(seconds=0.3)) == 1
    assert created_on == ["lost primary", "new primary"]
    [run] = await ScheduleStore(redis, keys).history(schedule.id)
    assert run.outcome is RunOutcome.CREATED
    assert list(run.session_ids) == await owned_sessions(redis, keys)  # the old code: the lost session's id, and []
    assert None not in await SessionStore(redis, keys).get_many(list(run.session_ids))


async def test_forbid_skips_while_the_previous_run_is_live_and_replace_ends_it(
    redis: Redis, keys: Keys, redis_settings: Settings
) -> None:
    forbid = await stored_schedule(redis, keys, name="forbid", concurrency=ConcurrencyPolicy.FORBID)
    replace = await stored_schedule(redis, keys, name="replace", concurrency=ConcurrencyPolicy.REPLACE)
    runner = runner_of(redis, keys, redis_settings)
    await runner.run_due(T0 + timedelta(seconds=0.1))
    await runner.run_due(T0 + timedelta(minutes=1, seconds=0.1))  # the first runs are still PENDING
    store, sessions = ScheduleStore(redis, keys), SessionStore(redis, keys)
    skipped, first = await store.history(forbid.id)
    assert (skipped.outcome, first.outcome) == (RunOutcome.SKIPPED, RunOutcome.CREATED)
    assert skipped.reason is not None and first.session_ids[0] in skipped.reason
    second, first = await store.history(replace.id)
    assert (second.outcome, first.outcome) == (RunOutcome.CREATED, RunOutcome.CREATED)
    ended = await sessions.get(first.session_ids[0])
    assert ended is not None and ended.status.is_terminal and ended.status_info == "schedule-replaced"
    # the FORBID run ends: the next due time runs
    await sessions.request_termination(first.session_ids[0], reason="user-requested", at=T0, forced=True)
    forbid_first = (await store.history(forbid.id))[-1].session_ids[0]
    await sessions.request_termination(forbid_first, reason="user-requested", at=T0, forced=True)
    await runner.run_due(T0 + timedelta(minutes=2, seconds=0.1))
    assert (await store.history(forbid.id))[0].outcome is RunOutcome.CREATED


async def test_a_policy_violation_is_recorded_on_the_run(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    schedule = await stored_schedule(redis, keys)
    await PolicyStore(redis, keys).put_user("alice", UserResourcePolicy(allowed_resource_groups=("gpu",)))
    await runner_of(redis, keys, redis_settings).run_due(T0 + timedelta(seconds=0.1))
    [run] = await ScheduleStore(redis, keys).history(schedule.id)
    assert run.outcome is RunOutcome.FAILED and run.session_ids == ()
    assert run.reason is not None and run.reason.startswith("FORBIDDEN") and "default" in run.reason
    assert await owned_sessions(redis, keys) == []
    after = await ScheduleStore(redis, keys).get(schedule.id)
    assert after is not None and after.next_due == T0 + timedelta(minutes=1) and after.runs_started == 0


async def test_a_pending_limit_is_checked_at_each_run(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    schedule = await stored_schedule(redis, keys)
    await PolicyStore(redis, keys).put_user("alice", UserResourcePolicy(max_pending_sessions=1))
    runner = runner_of(redis, keys, redis_settings)
    await runner.run_due(T0 + timedelta(seconds=0.1))
    await runner.run_due(T0 + timedelta(minutes=1, seconds=0.1))
    refused, created = await ScheduleStore(redis, keys).history(schedule.id)
    assert (created.outcome, refused.outcome) == (RunOutcome.CREATED, RunOutcome.FAILED)
    assert refused.reason is not None and refused.reason.startswith("QUOTA_EXCEEDED")


async def test_after_downtime_the_latest_runs_once_and_the_rest_is_one_record(
    redis: Redis, keys: Keys, redis_settings: Settings
) -> None:
    schedule = await stored_schedule(redis, keys)
    await runner_of(redis, keys, redis_settings).run_due(T0 + timedelta(hours=3, seconds=5))
    run, missed = await ScheduleStore(redis, keys).history(schedule.id)
    assert (run.outcome, run.due_at) == (RunOutcome.CREATED, T0 + timedelta(hours=3))
    assert (missed.outcome, missed.missed) == (RunOutcome.MISSED, 180)
    assert len(await owned_sessions(redis, keys)) == 1


async def test_a_trigger_runs_once_outside_the_due_times(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    schedule = await stored_schedule(redis, keys)
    store = ScheduleStore(redis, keys)
    moment = T0 - timedelta(seconds=20)
    await store.update(schedule.id, lambda s: s.evolve(trigger_at=moment))
    runner = runner_of(redis, keys, redis_settings)
    assert await runner.run_due(T0 - timedelta(seconds=19)) == 1
    assert await runner.run_due(T0 - timedelta(seconds=18)) == 0
    [run] = await store.history(schedule.id)
    assert run.triggered and run.outcome is RunOutcome.CREATED
    after = await store.get(schedule.id)
    assert after is not None and after.trigger_at is None and after.next_due == T0


async def test_a_stale_leader_cannot_settle(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    await stored_schedule(redis, keys)
    await redis.set(keys.scheduler_fence, 2)
    stale = runner_of(redis, keys, redis_settings, Fence(keys.scheduler_fence, 1))
    with pytest.raises(LostLease):
        await stale.run_due(T0 + timedelta(seconds=1))
    # what it created is the run the current leader settles, not a second one
    leader = runner_of(redis, keys, redis_settings, Fence(keys.scheduler_fence, 2))
    assert await leader.run_due(T0 + timedelta(seconds=2)) == 1
    assert len(await owned_sessions(redis, keys)) == 1


async def test_paused_schedules_leave_the_due_index(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    schedule = await stored_schedule(redis, keys)
    store = ScheduleStore(redis, keys)
    await store.update(schedule.id, lambda s: s.evolve(paused=True))
    assert await store.due(T0 + timedelta(days=1), 10) == []
    assert await runner_of(redis, keys, redis_settings).run_due(T0 + timedelta(days=1)) == 0
    assert await owned_sessions(redis, keys) == []


async def test_the_history_keeps_the_newest_records(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    schedule = await stored_schedule(redis, keys)
    runner = ScheduleRunner(SessionStore(redis, keys), redis_settings, load_scheduling_config(None), None, history=3)
    for minute in range(15):
        await runner.run_due(T0 + timedelta(minutes=minute, seconds=0.1))
    history = await ScheduleStore(redis, keys, history=3).history(schedule.id)
    assert [r.due_at for r in history] == [T0 + timedelta(minutes=m) for m in (14, 13, 12)]
    assert await redis.llen(keys.schedule_runs(schedule.id)) <= 3 + 10  # trimmed every 10 records
    stored = await ScheduleStore(redis, keys).get(schedule.id)
    assert stored is not None and (stored.recorded, stored.runs_started) == (15, 15)


async def test_a_run_mounts_the_storage_folders_of_its_spec(redis: Redis, keys: Keys, redis_settings: Settings) -> None:
    """A schedule whose spec (or template) mounts a storage folder: the run reads that folder's creation rules, so its
    session mounts it (and is pinned to the folder's node), rather than failing NOT_FOUND on mounts."""
    schedule = await stored_schedule(redis, keys)
    alice = await UserStore(redis, keys).get("alice")
    assert alice is not None
    folders = FolderStore(redis, keys)
    folder = new_folder(name="data", owner=alice, project="default", now=T0)
    await folders.create(folder, redis_settings.storage)
    ready = {"status": FolderStatus.READY, "node_id": "node-1", "volume_id": "v1"}
    await folders.settle(folder.id, lambda f: dataclasses.replace(f, **ready), None)
    spec = dataclasses.replace(SPEC, mounts=(MountRequest(folder.id, "/data", FolderMode.RW),))
    await ScheduleStore(redis, keys).update(schedule.id, lambda s: dataclasses.replace(s, spec=spec))
    assert await runner_of(redis, keys, redis_settings).run_due(T0 + timedelta(seconds=0.3)) == 1
    [run] = await ScheduleStore(redis, keys).history(schedule.id)
    assert run.outcome is RunOutcome.CREATED, run.reason
    session = await SessionStore(redis, keys).get(run.session_ids[0])
    assert session is not None and [(m.folder_id, m.path) for m in session.mounts] == [(folder.id, "/data")]


async def test_runs_checked_once_per_shape_store_the_documents_build_sessions_makes(
    redis: Redis, keys: Keys, redis_settings: Settings
) -> None:
    """The runner checks each shape of run (spec, owner) once and stamps the rest; every stored document is still
    exactly what ``build_sessions`` makes of the run's request the plain way, field by field, and the checks that
    depend on the owner still apply per owner (raw_exec: a SUPERADMIN's run is created, a user's refused)."""
    users = UserStore(redis, keys)
    await users.put(User(id="alice", name="alice", role=Role.USER, projects=("default", "lab")))
    await users.put(User(id="root", name="root", role=Role.SUPERADMIN, projects=("default",)))
    specs = [
        SPEC,
        TemplateSpec(
            type=SessionType.BATCH,
            driver=Driver.EXEC,
            startup_command="sleep 1",
            environ={"A": "1"},
            resources={"cpu": "2", "mem": "1g"},
            batch_timeout="1h",
            priority=3,
        ),  # fmt: skip
        TemplateSpec(type=SessionType.BATCH, driver=Driver.EXEC, startup_command="true", count=2, starts_at="90s"),
        TemplateSpec(type=SessionType.BATCH, driver=Driver.RAW_EXEC, startup_command="id"),
    ]
    timing = check_timing(cron="* * * * *", interval=None, zone="UTC", now=T0 - timedelta(seconds=30))
    schedules = [
        new_schedule(
            name=f"shape-{i}-{owner}-{copy}",
            owner_id=owner,
            project=project,
            timing=timing,
            concurrency=ConcurrencyPolicy.ALLOW,
            now=T0 - timedelta(seconds=30),
            spec=spec,
        )  # fmt: skip
        for i, spec in enumerate(specs)
        for owner, project in (("alice", "lab"), ("root", "default"))
        for copy in range(3)  # the same shape three times: checked once, stamped three times
    ]
    store = ScheduleStore(redis, keys)
    for schedule in schedules:
        await store.create(schedule)
    now = T0 + timedelta(seconds=0.2)
    runner = runner_of(redis, keys, redis_settings)
    assert await runner.run_due(now) == len(schedules)
    rules = await runner.creation.rules(resource_group="default", preset=None)
    sessions = SessionStore(redis, keys)
    for schedule in schedules:
        [run] = await store.history(schedule.id)
        owner = await users.get(schedule.owner_id)
        assert owner is not None and schedule.spec is not None
        request = run_request(schedule, schedule.spec, name=run_session_name(schedule, T0), key=run.key)
        if schedule.spec.driver is Driver.RAW_EXEC and owner.role is Role.USER:
            assert run.outcome is RunOutcome.FAILED
            assert run.reason is not None and run.reason.startswith("FORBIDDEN (driver)")
            continue
        assert run.outcome is RunOutcome.CREATED, run.reason
        plain = build_sessions(request, viewer=owner, now=now, rules=rules)
        stored = await sessions.get_many(run.session_ids)
        assert len(stored) == len(plain) == schedule.spec.count
        for made, kept in zip(plain, stored, strict=True):
            assert kept is not None
            expected = dataclasses.replace(made, id=kept.id)
            for f in dataclasses.fields(Session):
                assert getattr(kept, f.name) == getattr(expected, f.name), f.name
            assert await redis.get(keys.session(kept.id)) == encode(expected).decode()
