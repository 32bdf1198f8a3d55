"""Recurring schedules through the real gateway (real Redis; the runner driven in-process where a run is needed):
owner-only access, typed errors naming the field with nothing half-created, pause/resume/trigger/delete, and a run
from a template with overrides showing in the history with its session."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.clock import utcnow
from core.settings import Settings
from domain.schedules import run_key
from domain.scheduling_config import load_scheduling_config
from domain.storage import FolderStatus
from domain.users import Role
from scheduler.schedules import ScheduleRunner
from stores.folders import FolderStore
from stores.schedules import ScheduleStore
from tests.harness import Caravan, GraphQLErrors, running_caravan

SCHEDULE_FIELDS = """id name ownerId project cron interval timeZone paused concurrency missedRuns nextDue runsStarted
templateId overridden spec { type startupCommand }"""
CREATE = f"mutation($input: CreateScheduleInput!) {{ createSchedule(input: $input) {{ {SCHEDULE_FIELDS} }} }}"
UPDATE = f"""mutation($id: ID!, $input: UpdateScheduleInput!) {{
  updateSchedule(id: $id, input: $input) {{ {SCHEDULE_FIELDS} }} }}"""
ONE = f"""query($id: ID!) {{ schedule(id: $id) {{ {SCHEDULE_FIELDS} nextRunTimes(count: 3)
  history {{ outcome dueAt triggered reason sessionIds sessions {{ id name status }} }} }} }}"""
LIST = "query($after: String) { schedules(first: 2, after: $after) { totalCount edges { cursor node { id name } } " \
    "pageInfo { hasNextPage endCursor } } }"  # fmt: skip
BATCH = {"type": "BATCH", "driver": "EXEC", "startupCommand": "echo nightly"}


def nightly(**changes: Any) -> dict[str, Any]:
    return {"name": "nightly", "cron": "30 2 * * *", "timeZone": "Europe/Berlin", "spec": BATCH, **changes}


async def create(caravan: Caravan, token: str, **changes: Any) -> dict[str, Any]:
    return dict((await caravan.gql(CREATE, {"input": nightly(**changes)}, token=token))["createSchedule"])


async def refused(caravan: Caravan, query: str, variables: dict[str, Any], token: str) -> dict[str, Any]:
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(query, variables, token=token)
    [error] = failed.value.errors
    return dict(error["extensions"])


async def test_a_schedule_is_its_owners(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    admin = await caravan.user("root", role=Role.ADMIN)
    made = await create(caravan, alice)
    assert (made["ownerId"], made["project"], made["concurrency"], made["missedRuns"]) == (
        "alice", "default", "ALLOW", "RUN_LATEST",
    )  # fmt: skip
    found = (await caravan.gql(ONE, {"id": made["id"]}, token=alice))["schedule"]
    times = [datetime.fromisoformat(t) for t in found["nextRunTimes"]]
    assert len(times) == 3 and times == sorted(times)
    assert all(t.astimezone(UTC).strftime("%M") == "30" for t in times)
    assert found["history"] == []
    assert (await refused(caravan, ONE, {"id": made["id"]}, bob))["code"] == "NOT_FOUND"
    assert (await caravan.gql(ONE, {"id": made["id"]}, token=admin))["schedule"]["id"] == made["id"]
    assert (await caravan.gql(LIST, token=bob))["schedules"]["totalCount"] == 0
    for mutation in ("pauseSchedule", "resumeSchedule", "triggerSchedule", "deleteSchedule"):
        query = f"mutation($id: ID!) {{ {mutation}(id: $id) {{ id }} }}".replace(
            " { id }", "", mutation == "deleteSchedule"
        )
        assert (await refused(caravan, query, {"id": made["id"]}, bob))["code"] == "NOT_FOUND"


async def test_the_listing_pages_newest_first(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    names = [(await create(caravan, alice, name=f"job-{i}"))["name"] for i in range(3)]
    first = (await caravan.gql(LIST, token=alice))["schedules"]
    assert [e["node"]["name"] for e in first["edges"]] == names[::-1][:2]
    assert first["totalCount"] == 3 and first["pageInfo"]["hasNextPage"]
    rest = (await caravan.gql(LIST, {"after": first["pageInfo"]["endCursor"]}, token=alice))["schedules"]
    assert [e["node"]["name"] for e in rest["edges"]] == [names[0]] and not rest["pageInfo"]["hasNextPage"]
    assert (await refused(caravan, LIST, {"after": "bm9wZQ"}, alice))["field"] == "after"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cron": "61 2 * * *"}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"cron": None}, "cron"),  # neither cron nor interval
        ({"interval": "1h"}, "cron"),  # both
        ({"cron": None, "interval": "0.5s"}, "interval"),
        ({"cron": None, "interval": "soon"}, "interval"),
        ({"timeZone": "Europe/Atlantis"}, "timeZone"),
        ({"name": "x"}, "name"),
        ({"spec": {**BATCH, "type": "INTERACTIVE"}}, "spec.type"),
        ({"spec": {**BATCH, "startupCommand": ""}}, "spec.startupCommand"),
        ({"spec": {**BATCH, "environ": [{"name": "CARAVAN_X", "value": "1"}]}}, "spec.environ.CARAVAN_X"),
        ({"spec": None}, "spec"),  # neither spec nor template
        ({"templateId": "t-1"}, "spec"),  # both
        ({"startingDeadline": "0s"}, "startingDeadline"),
        ({"maxRuns": 0}, "maxRuns"),
        ({"endAt": "2020-01-01T00:00:00Z"}, "endAt"),
        ({"project": "elsewhere"}, "project"),
    ],
)
async def test_bad_input_names_the_field_and_creates_nothing(
    caravan: Caravan, changes: dict[str, Any], field: str
) -> None:
    alice = await caravan.user("alice")
    error = await refused(caravan, CREATE, {"input": nightly(**changes)}, alice)
    assert error["field"] == field, error
    assert error["code"] in ("INVALID_INPUT", "FORBIDDEN")
    assert (await caravan.gql(LIST, token=alice))["schedules"]["totalCount"] == 0


async def test_pause_resume_update_trigger_delete(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    made = await create(caravan, alice)
    pause = "mutation($id: ID!) { pauseSchedule(id: $id) { paused nextDue nextRunTimes } }"
    assert (await caravan.gql(pause, {"id": made["id"]}, token=alice))["pauseSchedule"] == {
        "paused": True, "nextDue": None, "nextRunTimes": [],
    }  # fmt: skip
    store = ScheduleStore(caravan.store.redis, caravan.store.keys)
    assert await store.due(utcnow() + timedelta(days=3), 10) == []
    resume = "mutation($id: ID!) { resumeSchedule(id: $id) { paused nextDue } }"
    resumed = (await caravan.gql(resume, {"id": made["id"]}, token=alice))["resumeSchedule"]
    assert resumed["paused"] is False and resumed["nextDue"] == made["nextDue"]
    changed = (
        await caravan.gql(
            UPDATE, {"id": made["id"], "input": {"interval": "90s", "concurrency": "FORBID"}}, token=alice
        )
    )["updateSchedule"]
    assert (changed["cron"], changed["interval"], changed["concurrency"]) == (None, 90.0, "FORBID")
    bad = await refused(caravan, UPDATE, {"id": made["id"], "input": {"timeZone": "Nowhere/Else"}}, alice)
    assert bad["field"] == "timeZone"
    trigger = "mutation($id: ID!) { triggerSchedule(id: $id) { id } }"
    await caravan.gql(trigger, {"id": made["id"]}, token=alice)
    stored = await store.get(made["id"])
    assert stored is not None and stored.trigger_at is not None
    assert made["id"] in await store.due(utcnow(), 10)
    assert (await caravan.gql("mutation($id: ID!) { deleteSchedule(id: $id) }", {"id": made["id"]}, token=alice)) == {
        "deleteSchedule": made["id"]
    }
    assert (await refused(caravan, ONE, {"id": made["id"]}, alice))["code"] == "NOT_FOUND"
    assert await store.due(utcnow() + timedelta(days=3), 10) == []


async def test_a_run_from_a_template_with_overrides_shows_in_the_history(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    create_template = "mutation($input: CreateSessionTemplateInput!) { createSessionTemplate(input: $input) { id } }"
    template = (
        await caravan.gql(
            create_template,
            {"input": {"name": "etl", "spec": {**BATCH, "environ": [{"name": "A", "value": "1"}]}}},
            token=alice,
        )
    )["createSessionTemplate"]
    overrides = {"startupCommand": "echo overridden", "environ": [{"name": "B", "value": "2"}]}
    made = await create(caravan, alice, spec=None, templateId=template["id"], overrides=overrides, cron="* * * * *")
    assert (made["templateId"], made["spec"], made["overridden"]) == (
        template["id"],
        None,
        ["startup_command", "environ"],
    )
    runner = ScheduleRunner(caravan.store, caravan.settings, load_scheduling_config(None), None, history=20)
    due = datetime.fromisoformat(made["nextDue"])
    assert await runner.run_due(due + timedelta(seconds=0.2)) == 1
    [run] = (await caravan.gql(ONE, {"id": made["id"]}, token=alice))["schedule"]["history"]
    assert run["outcome"] == "CREATED" and run["triggered"] is False
    [session] = run["sessions"]
    assert session["status"] == "PENDING" and session["name"].startswith("nightly-")
    stored = await caravan.store.get(session["id"])
    assert stored is not None and stored.startup_command == "echo overridden"
    assert stored.environ["A"] == "1" and stored.environ["B"] == "2"
    # the overrides replaced as a whole (the startup command is the template's again), and checked as at creation
    changed = {"id": made["id"], "input": {"overrides": {"environ": [{"name": "C", "value": "3"}]}}}
    assert (await caravan.gql(UPDATE, changed, token=alice))["updateSchedule"]["overridden"] == ["environ"]
    bad = {"id": made["id"], "input": {"overrides": {"resources": [{"slot": "cpu", "amount": "lots"}]}}}
    assert (await refused(caravan, UPDATE, bad, alice))["field"].startswith("spec.resources")
    assert await runner.run_due(due + timedelta(minutes=1, seconds=0.2)) == 1
    newer, _ = (await caravan.gql(ONE, {"id": made["id"]}, token=alice))["schedule"]["history"]
    [again] = newer["sessions"]
    stored = await caravan.store.get(again["id"])
    assert stored is not None and stored.startup_command == "echo nightly"
    assert (stored.environ.get("A"), stored.environ.get("B"), stored.environ.get("C")) == ("1", None, "3")
    cleared = {"id": made["id"], "input": {"overrides": None}}
    assert (await caravan.gql(UPDATE, cleared, token=alice))["updateSchedule"]["overridden"] == []
    with_spec = await create(caravan, alice, name="plain")
    refusal = await refused(caravan, UPDATE, {"id": with_spec["id"], "input": {"overrides": {"priority": 3}}}, alice)
    assert (refusal["code"], refusal["field"]) == ("INVALID_INPUT", "overrides")
    # the template gone: the next run is a recorded failure, not a silent drop
    await caravan.gql("mutation($id: ID!) { deleteSessionTemplate(id: $id) }", {"id": template["id"]}, token=alice)
    assert await runner.run_due(due + timedelta(minutes=2, seconds=0.2)) == 1
    failed, *_ = (await caravan.gql(ONE, {"id": made["id"]}, token=alice))["schedule"]["history"]
    assert failed["outcome"] == "FAILED" and "template" in failed["reason"]


async def test_a_users_own_session_cannot_take_a_future_runs_key(caravan: Caravan) -> None:
    """Runs are stored under their run key as client token; createSession may not use that prefix, or a user's own
    session could stand in for (pre-empt) a schedule's future run."""
    alice = await caravan.user("alice")
    made = await create(caravan, alice, cron="* * * * *")
    key = run_key(made["id"], datetime.fromisoformat(made["nextDue"]))
    session = {"name": "squatter", "type": "BATCH", "startupCommand": "true", "clientToken": key}
    create_session = "mutation($i: CreateSessionInput!) { createSession(input: $i) { sessions { id } } }"
    with pytest.raises(GraphQLErrors) as error:
        await caravan.gql(create_session, {"i": session}, token=alice)
    [problem] = error.value.errors
    assert (problem["extensions"]["code"], problem["extensions"].get("field")) == ("INVALID_INPUT", "clientToken")


CREATE_SESSION = "mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }"
CREATE_FOLDER = "mutation($name: String!) { createFolder(input: {name: $name}) { id } }"
SHARE_FOLDER = "mutation($input: FolderShareInput!) { shareFolder(input: $input) { id } }"
SET_POLICY = """mutation($user: String!, $policy: UserResourcePolicyInput!) {
  setUserResourcePolicy(userId: $user, policy: $policy) { userId } }"""
CREATE_TEMPLATE = "mutation($input: CreateSessionTemplateInput!) { createSessionTemplate(input: $input) { id } }"


async def folder(caravan: Caravan, token: str, name: str, *, ready: bool = True) -> str:
    """A folder of the user's; no scheduler here: made READY on "node-a" as the job owner would."""
    folder_id = str((await caravan.gql(CREATE_FOLDER, {"name": name}, token=token))["createFolder"]["id"])
    if ready:
        made = {"status": FolderStatus.READY, "node_id": "node-a", "volume_id": "v", "host_path": "/x"}
        store = FolderStore(caravan.store.redis, caravan.store.keys)
        assert await store.settle(folder_id, lambda f: f.evolve(**made), None) is not None
    return folder_id


async def test_a_schedule_is_refused_what_createsession_refuses_its_runs(caravan: Caravan) -> None:
    """createSchedule and updateSchedule build and admit a run's sessions as the runner does at each run, through
    createSession's admission: a folder the owner cannot see (or mounts RW through an RO share, or that is not
    READY), a priority above theirs, a driver their policy leaves out are refused with createSession's code and field
    (under ``spec.``), and nothing is written. (Before, such a schedule was stored, and every run of it failed.)"""
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    admin = await caravan.user("ada", Role.ADMIN)
    bobs, shared = await folder(caravan, bob, "bobs"), await folder(caravan, bob, "shared")
    await caravan.gql(SHARE_FOLDER, {"input": {"folder": shared, "user": "alice", "mode": "RO"}}, token=bob)
    creating, mine = await folder(caravan, alice, "creating", ready=False), await folder(caravan, alice, "mine")
    made = await create(caravan, alice, name="fine", cron="* * * * *")

    async def refusals(changes: dict[str, Any], updated_by: str = alice) -> list[tuple[str, str]]:
        """createSession's refusal of a session with ``changes``, and createSchedule's and updateSchedule's."""
        spec = {**BATCH, **changes}
        direct = await refused(caravan, CREATE_SESSION, {"input": {"name": "direct", **spec}}, alice)
        scheduled = await refused(caravan, CREATE, {"input": nightly(name="refused", spec=spec)}, alice)
        updated = await refused(caravan, UPDATE, {"id": made["id"], "input": {"spec": spec}}, updated_by)
        return [(e["code"], e["field"]) for e in (direct, scheduled, updated)]

    def mount(folder_id: str, mode: str = "RO") -> dict[str, Any]:
        return {"mounts": [{"folder": folder_id, "path": "/data", "mode": mode}]}

    for changes, (code, field) in (
        (mount(bobs), ("NOT_FOUND", "mounts.0.folder")),  # not shared with alice: as if it did not exist
        (mount("no-such-folder"), ("NOT_FOUND", "mounts.0.folder")),
        (mount(shared, "RW"), ("FORBIDDEN", "mounts.0.mode")),
        (mount(creating), ("INVALID_INPUT", "mounts.0.folder")),
        ({"priority": 11}, ("FORBIDDEN", "priority")),  # without a policy, at most the default
    ):
        assert await refusals(changes) == [(code, field), (code, f"spec.{field}"), (code, f"spec.{field}")], changes
    await caravan.gql(SET_POLICY, {"user": "alice", "policy": {"maxPriority": 20}}, token=admin)
    assert await refusals({"priority": 21}) == [("FORBIDDEN", "priority"), *[("FORBIDDEN", "spec.priority")] * 2]
    # the owner's limit, whoever changes it: an admin of the project cannot give alice's runs a priority she may not
    assert (await refusals({"priority": 21}, updated_by=admin))[2] == ("FORBIDDEN", "spec.priority")
    await caravan.gql(SET_POLICY, {"user": "alice", "policy": {"allowedDrivers": ["DOCKER"]}}, token=admin)
    assert await refusals({}) == [("FORBIDDEN", "driver"), *[("FORBIDDEN", "spec.driver")] * 2]
    await caravan.gql(SET_POLICY, {"user": "alice", "policy": {"maxPriority": 20}}, token=admin)
    # from a template: what it mounts, and the overrides, are the runs' too
    unseen = {**BATCH, **mount(bobs)}  # a template's spec is checked without its folders (whoever uses it mounts)
    template = (await caravan.gql(CREATE_TEMPLATE, {"input": {"name": "unseen", "spec": unseen}}, token=alice))[
        "createSessionTemplate"
    ]["id"]
    from_template = nightly(name="templated", spec=None, templateId=template)
    assert (await refused(caravan, CREATE, {"input": from_template}, alice))["field"] == "spec.mounts.0.folder"
    plain = (await caravan.gql(CREATE_TEMPLATE, {"input": {"name": "plain", "spec": BATCH}}, token=alice))[
        "createSessionTemplate"
    ]["id"]
    over = {**from_template, "templateId": plain, "overrides": {"priority": 21}}
    assert await refused(caravan, CREATE, {"input": over}, alice) == {"code": "FORBIDDEN", "field": "spec.priority"}
    listed = (await caravan.gql(LIST, token=alice))["schedules"]
    assert listed["totalCount"] == 1 and listed["edges"][0]["node"]["name"] == "fine"
    stored = await ScheduleStore(caravan.store.redis, caravan.store.keys).get(made["id"])
    assert stored is not None and stored.spec is not None and stored.spec.priority == 10 and not stored.spec.mounts
    # what the owner may do is taken, and its runs are created
    good = {**BATCH, **mount(mine, "RW"), "priority": 20}
    changed = (await caravan.gql(UPDATE, {"id": made["id"], "input": {"spec": good}}, token=alice))["updateSchedule"]
    runner = ScheduleRunner(caravan.store, caravan.settings, load_scheduling_config(None), None, history=20)
    assert await runner.run_due(datetime.fromisoformat(changed["nextDue"]) + timedelta(seconds=0.2)) == 1
    [run] = (await caravan.gql(ONE, {"id": made["id"]}, token=alice))["schedule"]["history"]
    assert run["outcome"] == "CREATED", run
    session = await caravan.store.get(run["sessionIds"][0])
    assert session is not None and session.priority == 20 and [m.folder_id for m in session.mounts] == [mine]


async def test_the_history_shows_as_many_runs_as_are_kept(redis_settings: Settings) -> None:
    """``CARAVAN_SCHEDULE_HISTORY`` over the default 20: ``history(limit)`` shows that many (found by bench/chaos: the
    gateway read the runs with the default, so it showed 20 of the 1,000 kept)."""
    kept = 30
    scheduler = dataclasses.replace(redis_settings.scheduler, schedule_history=kept)
    async with running_caravan(dataclasses.replace(redis_settings, scheduler=scheduler), scheduler=False) as caravan:
        alice = await caravan.user("alice")
        made = await create(caravan, alice, cron="* * * * *")
        runner = ScheduleRunner(caravan.store, caravan.settings, load_scheduling_config(None), None, history=kept)
        due = datetime.fromisoformat(made["nextDue"])
        for minute in range(25):
            await runner.run_due(due + timedelta(minutes=minute, seconds=0.2))
        query = "query($id: ID!) { schedule(id: $id) { runsStarted history(limit: 100) { dueAt } } }"
        found = (await caravan.gql(query, {"id": made["id"]}, token=alice))["schedule"]
        assert len(found["history"]) == 25, (found["runsStarted"], len(found["history"]))
