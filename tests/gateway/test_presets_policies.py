"""Resource presets and resource policies through the real gateway (real Redis; no scheduler): who may write
them, their checks, and their enforcement at creation (allowed groups and drivers, an exact pending limit)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import pytest

from domain.resource_policies import UserResourcePolicy
from domain.users import Role
from stores.known_resources import record_resource_groups
from stores.resource_policies import PolicyStore
from tests.harness import CREATE, Caravan, GraphQLErrors

PRESET_FIELDS = "name sharedMemory resources { slot amount }"
CREATE_PRESET = (
    f"mutation($input: ResourcePresetInput!) {{ createResourcePreset(input: $input) {{ {PRESET_FIELDS} }} }}"
)
UPDATE_PRESET = (
    f"mutation($input: ResourcePresetInput!) {{ updateResourcePreset(input: $input) {{ {PRESET_FIELDS} }} }}"
)
DELETE_PRESET = "mutation($name: String!) { deleteResourcePreset(name: $name) }"
PRESETS = f"{{ resourcePresets {{ {PRESET_FIELDS} }} }}"
POLICY_FIELDS = (
    """maxSessionLifetime idleTimeout allowedResourceGroups allowedDrivers totalResourceSlots { slot amount }"""
)
SET_USER = f"""mutation($user: String!, $policy: UserResourcePolicyInput!) {{
  setUserResourcePolicy(userId: $user, policy: $policy) {{ userId stored maxConcurrentSessions maxPendingSessions
  {POLICY_FIELDS} }} }}"""
DELETE_USER = "mutation($user: String!) { deleteUserResourcePolicy(userId: $user) }"
SET_PROJECT = f"""mutation($project: String!, $policy: ProjectResourcePolicyInput!) {{
  setProjectResourcePolicy(project: $project, policy: $policy) {{ project {POLICY_FIELDS} }} }}"""
DELETE_PROJECT = "mutation($project: String!) { deleteProjectResourcePolicy(project: $project) }"
POLICIES = f"""{{ resourcePolicies {{ users {{ userId stored maxPendingSessions {POLICY_FIELDS} }}
  projects {{ project {POLICY_FIELDS} }} }} }}"""
CREATE_TEMPLATE = (
    """mutation { createSessionTemplate(input: {name: "t", spec: {type: INTERACTIVE, driver: EXEC}}) { id } }"""
)
FROM_TEMPLATE = """mutation($id: ID!, $overrides: SessionOverridesInput!) {
  createSessionFromTemplate(templateId: $id, overrides: $overrides) { sessions { id } } }"""
MIB = 1024 * 1024


def exec_session(name: str, **fields: Any) -> dict[str, Any]:
    return {"input": {"name": name, "type": "INTERACTIVE", "driver": "EXEC", **fields}}


async def refused(caravan: Caravan, query: str, variables: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    with pytest.raises(GraphQLErrors) as failed:
        if token is None:
            await caravan.gql(query, variables)
        else:
            await caravan.gql(query, variables, token=token)
    [error] = failed.value.errors
    return {"code": error["extensions"]["code"], "field": error["extensions"].get("field")}


async def test_presets_are_written_by_superadmins_and_listed_for_everyone(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    admin = await caravan.user("ada", Role.ADMIN)  # a project's admin: presets are global, not theirs to change
    small = {"name": "small", "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "128m"}]}
    created = (await caravan.gql(CREATE_PRESET, {"input": small}))["createResourcePreset"]
    assert created == {
        "name": "small",
        "sharedMemory": None,
        "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": str(128 * MIB)}],
    }
    assert (await caravan.gql(PRESETS, token=alice))["resourcePresets"] == [created]
    for query, variables in (
        (CREATE_PRESET, {"input": {**small, "name": "mine"}}),
        (UPDATE_PRESET, {"input": small}),
        (DELETE_PRESET, {"name": "small"}),
    ):
        for token in (alice, admin):
            assert await refused(caravan, query, variables, token) == {"code": "FORBIDDEN", "field": None}
    bad = [
        ({**small, "name": "-x"}, "INVALID_INPUT", "name"),
        ({**small, "resources": [{"slot": "mem", "amount": "1k"}]}, "INVALID_INPUT", "resources.mem"),
        ({**small, "resources": [{"slot": "cpu", "amount": "0"}]}, "INVALID_INPUT", "resources.cpu"),
        ({**small, "resources": [{"slot": "cpu", "amount": "1"}, {"slot": "cpu", "amount": "2"}]}, "INVALID_INPUT",
         "resources"),
        (
            {**small, "resources": [{"slot": "warp.drive", "amount": "1"}]},
            "UNSUPPORTED_RESOURCE",
            "resources.warp.drive",
        ),
        ({**small, "sharedMemory": "a lot"}, "INVALID_INPUT", "sharedMemory"),
        (small, "CONFLICT", "name"),
    ]  # fmt: skip
    for preset, code, field in bad:
        assert await refused(caravan, CREATE_PRESET, {"input": preset}) == {"code": code, "field": field}, preset
    assert await refused(caravan, UPDATE_PRESET, {"input": {**small, "name": "nope"}}) == {
        "code": "NOT_FOUND",
        "field": "name",
    }
    bigger = {**small, "resources": [{"slot": "cpu", "amount": "2"}], "sharedMemory": "16m"}
    updated = (await caravan.gql(UPDATE_PRESET, {"input": bigger}))["updateResourcePreset"]
    assert updated == {"name": "small", "sharedMemory": str(16 * MIB), "resources": [{"slot": "cpu", "amount": "2"}]}
    assert (await caravan.gql(DELETE_PRESET, {"name": "small"}))["deleteResourcePreset"] is True
    assert (await caravan.gql(PRESETS, token=alice))["resourcePresets"] == []


async def test_a_creation_naming_a_preset_takes_its_slots_under_the_explicit_ones(caravan: Caravan) -> None:
    preset = {
        "name": "medium",
        "sharedMemory": "32m",
        "resources": [{"slot": "cpu", "amount": "2"}, {"slot": "mem", "amount": "512m"}],
    }
    await caravan.gql(CREATE_PRESET, {"input": preset})
    alice = await caravan.user("alice")
    data = await caravan.gql(
        CREATE,
        exec_session(
            "preset-run",
            preset="medium",
            driver="DOCKER",
            image="caravan/busybox:1",
            resources=[{"slot": "mem", "amount": "256m"}],
        ),
        token=alice,
    )
    session = await caravan.store.get(data["createSession"]["sessions"][0]["id"])
    assert session is not None
    assert {k: Decimal(v) for k, v in session.resources.items()} == {"cpu": 2, "mem": 256 * MIB}
    assert session.shared_memory == str(32 * MIB)
    data = await caravan.gql(CREATE, exec_session("preset-exec", preset="medium"), token=alice)
    session = await caravan.store.get(data["createSession"]["sessions"][0]["id"])
    assert session is not None and session.shared_memory is None  # only docker sizes /dev/shm
    assert await refused(caravan, CREATE, exec_session("no-preset", preset="huge"), alice) == {
        "code": "INVALID_INPUT",
        "field": "preset",
    }


async def test_policies_are_set_by_those_who_manage_the_user_or_administer_the_project(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    await caravan.user("pete", projects=("physics",))
    admin = await caravan.user("ada", Role.ADMIN)
    policy = {
        "maxPendingSessions": 2,
        "maxSessionLifetime": "1h",
        "idleTimeout": "90s",
        "allowedResourceGroups": ["default", "gpu"],
        "allowedDrivers": ["EXEC", "DOCKER"],
        "totalResourceSlots": [{"slot": "cpu", "amount": "4"}, {"slot": "mem", "amount": "8g"}],
    }
    stored = (await caravan.gql(SET_USER, {"user": "alice", "policy": policy}, token=admin))["setUserResourcePolicy"]
    assert stored == {
        "userId": "alice",
        "stored": True,
        "maxConcurrentSessions": None,
        "maxPendingSessions": 2,
        "maxSessionLifetime": 3600.0,
        "idleTimeout": 90.0,
        "allowedResourceGroups": ["default", "gpu"],
        "allowedDrivers": ["DOCKER", "EXEC"],
        "totalResourceSlots": [{"slot": "cpu", "amount": "4"}, {"slot": "mem", "amount": str(8 * 1024 * MIB)}],
    }
    mine = (await caravan.gql(POLICIES, token=alice))["resourcePolicies"]
    assert [u["userId"] for u in mine["users"]] == ["alice"] and mine["users"][0]["maxPendingSessions"] == 2
    project = await caravan.gql(SET_PROJECT, {"project": "default", "policy": {"idleTimeout": "1m"}}, token=admin)
    assert project["setProjectResourcePolicy"]["idleTimeout"] == 60.0
    seen = (await caravan.gql(POLICIES, token=admin))["resourcePolicies"]
    assert [u["userId"] for u in seen["users"]] == ["ada", "alice"]  # its own (unset) and alice's; not pete's
    assert [p["project"] for p in seen["projects"]] == ["default"]
    assert (await caravan.gql(POLICIES, token=alice))["resourcePolicies"]["projects"][0]["idleTimeout"] == 60.0
    refusals = [
        (SET_USER, {"user": "alice", "policy": {}}, alice, "FORBIDDEN", None),
        (SET_USER, {"user": "pete", "policy": {}}, admin, "NOT_FOUND", "userId"),
        (SET_USER, {"user": "nobody", "policy": {}}, admin, "NOT_FOUND", "userId"),
        (SET_USER, {"user": "ada", "policy": {}}, admin, "FORBIDDEN", "userId"),  # nobody raises their own limits
        (SET_PROJECT, {"project": "physics", "policy": {}}, admin, "NOT_FOUND", "project"),
        (SET_PROJECT, {"project": "default", "policy": {}}, alice, "FORBIDDEN", None),
        (DELETE_USER, {"user": "alice"}, alice, "FORBIDDEN", None),
        (DELETE_PROJECT, {"project": "physics"}, admin, "NOT_FOUND", "project"),
        (SET_USER, {"user": "alice", "policy": {"maxSessionLifetime": "soon"}}, admin, "INVALID_INPUT",
         "maxSessionLifetime"),
        (SET_USER, {"user": "alice", "policy": {"idleTimeout": "0s"}}, admin, "INVALID_INPUT", "idleTimeout"),
        (SET_USER, {"user": "alice", "policy": {"maxPendingSessions": -1}}, admin, "INVALID_INPUT",
         "maxPendingSessions"),
        (SET_USER, {"user": "alice", "policy": {"allowedResourceGroups": ["bad group"]}}, admin, "INVALID_INPUT",
         "allowedResourceGroups"),
        (SET_PROJECT, {"project": "default", "policy": {"totalResourceSlots": [{"slot": "mem", "amount": "-1"}]}},
         admin, "INVALID_INPUT", "totalResourceSlots.mem"),
        (SET_PROJECT, {"project": "default", "policy": {"totalResourceSlots": [{"slot": "warp.drive", "amount": "1"}]}},
         admin, "UNSUPPORTED_RESOURCE", "totalResourceSlots.warp.drive"),
    ]  # fmt: skip
    for query, variables, token, code, field in refusals:
        assert await refused(caravan, query, variables, token) == {"code": code, "field": field}, variables
    assert (await caravan.gql(DELETE_USER, {"user": "alice"}, token=admin))["deleteUserResourcePolicy"] is True
    assert (await caravan.gql(DELETE_USER, {"user": "alice"}, token=admin))["deleteUserResourcePolicy"] is False
    assert (await caravan.gql(POLICIES, token=alice))["resourcePolicies"]["users"][0]["stored"] is False


async def test_creation_is_refused_outside_the_allowed_groups_and_drivers(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    await caravan.gql(
        SET_USER, {"user": "alice", "policy": {"allowedResourceGroups": ["default"], "allowedDrivers": ["EXEC"]}}
    )
    await record_resource_groups(caravan.store.redis, caravan.store.keys, ["gpu"])  # known, but not alice's
    cases = [
        (exec_session("in-gpu", resourceGroup="gpu"), "resourceGroup"),
        (exec_session("in-docker", driver="DOCKER", image="caravan/busybox:1"), "driver"),
    ]
    for variables, field in cases:
        assert await refused(caravan, CREATE, variables, alice) == {"code": "FORBIDDEN", "field": field}
    await caravan.gql(CREATE, exec_session("allowed"), token=alice)
    await caravan.gql(SET_PROJECT, {"project": "default", "policy": {"allowedDrivers": ["DOCKER"]}})
    assert await refused(caravan, CREATE, exec_session("project-says-no"), alice) == {
        "code": "FORBIDDEN",
        "field": "driver",
    }
    assert len(await caravan.store.session_ids(owner_id="alice")) == 1


async def test_a_users_priority_is_bounded_by_their_policy(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    admin = await caravan.user("ada", Role.ADMIN)
    template = (await caravan.gql(CREATE_TEMPLATE, token=alice))["createSessionTemplate"]["id"]

    async def outcome(token: str, priority: int, name: str) -> dict[str, Any]:
        body = await caravan.post(CREATE, exec_session(name, priority=priority), token=token)
        return body["errors"][0]["extensions"] if body.get("errors") else {"ok": priority}

    # without a policy a USER may lower their priority, not raise it above the default (10)
    assert [await outcome(alice, p, f"no-policy-{p}") for p in (0, 10)] == [{"ok": 0}, {"ok": 10}]
    assert await outcome(alice, 11, "too-high") == {"code": "FORBIDDEN", "field": "priority"}
    body = await caravan.post(
        FROM_TEMPLATE, {"id": template, "overrides": {"name": "via-template", "priority": 11}}, token=alice
    )  # a template is no way around it
    assert body["errors"][0]["extensions"] == {"code": "FORBIDDEN", "field": "priority"}
    assert "at most the default, 10" in body["errors"][0]["message"]
    await caravan.gql(SET_USER, {"user": "alice", "policy": {"maxPriority": 50}}, token=admin)
    assert await outcome(alice, 50, "policy-50") == {"ok": 50}
    body = await caravan.post(CREATE, exec_session("policy-51", priority=51), token=alice)
    assert body["errors"][0]["extensions"] == {"code": "FORBIDDEN", "field": "priority"}
    assert "at most 50, the maxPriority of your resource policy" in body["errors"][0]["message"]
    # admins are bounded by the global range only
    assert await outcome(admin, 100, "admin-100") == {"ok": 100}
    assert await outcome(admin, 101, "admin-101") == {"code": "INVALID_INPUT", "field": "priority"}
    assert await refused(caravan, SET_USER, {"user": "alice", "policy": {"maxPriority": 101}}, admin) == {
        "code": "INVALID_INPUT",
        "field": "maxPriority",
    }
    priorities = sorted(
        s.priority
        for s in await caravan.store.get_many(await caravan.store.session_ids(owner_id="alice"))
        if s is not None
    )
    assert priorities == [0, 10, 50]


async def test_the_pending_limit_holds_under_racing_creations(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    await caravan.gql(SET_USER, {"user": "alice", "policy": {"maxPendingSessions": 3}})

    async def create(i: int) -> str:
        body = await caravan.post(CREATE, exec_session(f"racer-{i}"), token=alice)
        return "ok" if not body.get("errors") else body["errors"][0]["extensions"]["code"]

    outcomes = await asyncio.gather(*(create(i) for i in range(12)))
    assert sorted(outcomes) == ["QUOTA_EXCEEDED"] * 9 + ["ok"] * 3
    assert len(await caravan.store.session_ids(owner_id="alice")) == 3
    body = await caravan.post(CREATE, exec_session("batch", count=2), token=alice)
    assert body["errors"][0]["extensions"] == {"code": "QUOTA_EXCEEDED", "field": "count"}


async def test_policies_stored_before_the_new_fields_read_as_unlimited(caravan: Caravan) -> None:
    store = PolicyStore(caravan.store.redis, caravan.store.keys)
    old = {"max_concurrent_sessions": 2, "max_pending_sessions": None, "total_resource_slots": {"cpu": "4"}}
    await caravan.store.redis.set(caravan.store.keys.user_policy("old"), json.dumps(old))
    found = await store.user("old")
    assert found == UserResourcePolicy(max_concurrent_sessions=2, total_resource_slots={"cpu": "4"})
    assert (found.max_session_lifetime, found.idle_timeout, found.allowed_drivers) == (None, None, None)


ENDPOINT_SCALING = """mutation($id: ID!, $rules: AutoscalingInput) {
  updateEndpointScaling(id: $id, autoscaling: $rules) { desiredReplicas rules { minReplicas maxReplicas } } }"""


def endpoint(name: str, **rules: Any) -> dict[str, Any]:
    return exec_session(
        name,
        type="INFERENCE",
        startupCommand="serve",
        servicePort=8000,
        resources=[{"slot": "cpu", "amount": "0.5"}],
        autoscaling={"minReplicas": 0, "target": 4, **rules},
    )


async def test_an_endpoints_most_replicas_must_fit_its_owners_policy(caravan: Caravan) -> None:
    """Rules whose maxReplicas the owner's total slots could never hold are refused, at creation and on update;
    nothing is stored or changed by a refusal."""
    alice = await caravan.user("alice")
    await caravan.gql(SET_USER, {"user": "alice", "policy": {"totalResourceSlots": [{"slot": "cpu", "amount": "2"}]}})
    assert await refused(caravan, CREATE, endpoint("too-many", maxReplicas=5), alice) == {
        "code": "FORBIDDEN",
        "field": "maxReplicas",
    }
    assert await caravan.store.session_ids(owner_id="alice") == []
    created = await caravan.gql(CREATE, endpoint("fits", maxReplicas=4), token=alice)
    session_id = created["createSession"]["sessions"][0]["id"]
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.autoscaling is not None and stored.autoscaling.max_replicas == 4
    too_many = {"minReplicas": 1, "maxReplicas": 6, "target": 4}
    assert await refused(caravan, ENDPOINT_SCALING, {"id": session_id, "rules": too_many}, alice) == {
        "code": "FORBIDDEN",
        "field": "maxReplicas",
    }
    assert (await caravan.store.get(session_id)) == stored
    bad = {"minReplicas": 1, "maxReplicas": 2, "target": 4, "scaleDownDelay": "later"}
    assert await refused(caravan, ENDPOINT_SCALING, {"id": session_id, "rules": bad}, alice) == {
        "code": "INVALID_INPUT",
        "field": "scaleDownDelay",
    }
    fits = {"minReplicas": 1, "maxReplicas": 2, "target": 4}
    changed = await caravan.gql(ENDPOINT_SCALING, {"id": session_id, "rules": fits}, token=alice)
    assert changed["updateEndpointScaling"]["rules"] == {"minReplicas": 1, "maxReplicas": 2}
    cleared = await caravan.gql(ENDPOINT_SCALING, {"id": session_id, "rules": None}, token=alice)
    assert cleared["updateEndpointScaling"]["rules"] is None
