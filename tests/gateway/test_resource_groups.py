"""``resourceGroups`` against the real Nomad dev agent: its one agent's capacity, drivers and occupancy as the
scheduler counts them, the groups only configured or once seen, creation only in known groups, each group's default
resources, and what a user sees (the groups they may use, without agents)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

from core.settings import Settings
from stores.known_resources import record_resource_groups
from tests.harness import CREATE, Caravan, running_caravan

GROUPS = """{ resourceGroups { name allowedDrivers capacity { slot amount } occupied { slot amount }
  free { slot amount } defaultResources { slot amount }
  agents { id name schedulable drivers capacity { slot amount } occupied { slot amount } } } }"""
USER_GROUPS = """{ resourceGroups { name allowedDrivers capacity { slot amount } occupied { slot amount }
  free { slot amount } defaultResources { slot amount } agents { id } } }"""


SET_USER = """mutation($user: String!, $policy: UserResourcePolicyInput!) {
  setUserResourcePolicy(userId: $user, policy: $policy) { userId } }"""
SET_PROJECT = """mutation($project: String!, $policy: ProjectResourcePolicyInput!) {
  setProjectResourcePolicy(project: $project, policy: $policy) { project } }"""
TEMPLATE = "mutation($input: CreateSessionTemplateInput!) { createSessionTemplate(input: $input) { id } }"


def amounts(resources: list[dict[str, str]]) -> dict[str, Decimal]:
    return {r["slot"]: Decimal(r["amount"]) for r in resources}


async def groups(caravan: Caravan) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in (await caravan.gql(GROUPS))["resourceGroups"]}


async def test_the_agent_shows_its_capacity_drivers_and_what_a_running_session_occupies(settings: Settings) -> None:
    async with running_caravan(settings) as caravan:  # with a scheduler: the session must run
        [agent] = (await groups(caravan))["default"]["agents"]
        assert agent["schedulable"] and agent["name"]
        assert {"exec", "raw_exec"} <= set(agent["drivers"])
        capacity, before = amounts(agent["capacity"]), amounts(agent["occupied"])
        assert capacity["cpu"] > 0 and capacity["mem"] > 0
        fields = {
            "name": "occupant",
            "type": "INTERACTIVE",
            "driver": "EXEC",
            "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "64m"}],
        }
        data = await caravan.gql(CREATE, {"input": fields})
        await caravan.wait_for(data["createSession"]["sessions"][0]["id"], "RUNNING", timeout=60)
        default = (await groups(caravan))["default"]
        [agent] = default["agents"]
        after = amounts(agent["occupied"])
        assert after["cpu"] - before.get("cpu", 0) >= Decimal("0.5")
        assert after["mem"] - before.get("mem", 0) >= 64 * 1024 * 1024
        assert amounts(default["occupied"]) == after and amounts(default["capacity"]) == capacity


async def test_configured_and_queued_groups_are_listed_without_agents(settings: Settings, tmp_path: Path) -> None:
    config = tmp_path / "scheduler.hcl"
    config.write_text('resource_group "gpu" {\n  allowed_drivers = ["docker", "exec"]\n}\n')
    configured = dataclasses.replace(settings, scheduler=dataclasses.replace(settings.scheduler, config_path=config))
    async with running_caravan(configured, scheduler=False) as caravan:
        await record_resource_groups(caravan.store.redis, caravan.store.keys, ["gone"])  # a pool whose nodes left
        fields = {"name": "queued", "type": "INTERACTIVE", "driver": "EXEC", "resourceGroup": "gpu"}
        await caravan.gql(CREATE, {"input": fields})
        found = await groups(caravan)
        assert {"default", "gpu", "gone"} <= set(found)
        for name in ("gpu", "gone"):
            assert (found[name]["agents"], found[name]["capacity"], found[name]["occupied"]) == ([], [], [])
        assert (found["gpu"]["allowedDrivers"], found["default"]["allowedDrivers"]) == (["docker", "exec"], None)


async def test_creation_in_an_unknown_group_is_refused(redis_settings: Settings, tmp_path: Path) -> None:
    """Known: default, the node pools the scheduler has seen, the groups of the scheduler's configuration."""
    config = tmp_path / "scheduler.hcl"
    config.write_text('resource_group "configured" {\n  agent_selector = "concentrated"\n}\n')
    configured = dataclasses.replace(
        redis_settings, scheduler=dataclasses.replace(redis_settings.scheduler, config_path=config)
    )
    async with running_caravan(configured, scheduler=False) as caravan:
        alice = await caravan.user("alice")

        async def create(name: str, group: str, query: str = CREATE, **more: Any) -> dict[str, Any]:
            fields = {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "resourceGroup": group, **more}
            return await caravan.post(query, {"input": fields}, token=alice)

        refused = (await create("typo", "defualt"))["errors"][0]
        assert refused["extensions"] == {"code": "INVALID_INPUT", "field": "resourceGroup"}
        assert "there is no resource group 'defualt'" in refused["message"]
        assert "known are configured, default" in refused["message"]
        template = await caravan.post(
            TEMPLATE,
            {"input": {"name": "t", "spec": {"type": "INTERACTIVE", "driver": "EXEC", "resourceGroup": "pool"}}},
            token=alice,
        )
        assert template["errors"][0]["extensions"] == {"code": "INVALID_INPUT", "field": "spec.resourceGroup"}
        assert await caravan.store.session_ids() == []
        await record_resource_groups(caravan.store.redis, caravan.store.keys, ["pool"])  # the scheduler saw it
        for name, group in (("in-default", "default"), ("in-configured", "configured"), ("in-pool", "pool")):
            assert not (await create(name, group)).get("errors")
        assert len(await caravan.store.session_ids()) == 3


def configured_with(settings: Settings, path: Path, text: str) -> Settings:
    path.write_text(text)
    return dataclasses.replace(settings, scheduler=dataclasses.replace(settings.scheduler, config_path=path))


GROUP_DEFAULTS = """
resource_group "big" {
  default_resources = { cpu = 2, mem = "1g" }
}
resource_group "other" {
  agent_selector = "concentrated"
}
"""
BUILT_IN = {"cpu": Decimal("0.25"), "mem": Decimal(256 << 20)}


async def test_a_session_that_names_no_resources_gets_its_groups_defaults(
    redis_settings: Settings, tmp_path: Path
) -> None:
    """Built in: 0.25 cpu and 256 MiB per kernel (a 2-core machine holds eight such sessions, not two); a group of the
    scheduler's configuration may set its own, slot by slot; the request's own slots win."""
    configured = configured_with(redis_settings, tmp_path / "scheduler.hcl", GROUP_DEFAULTS)
    async with running_caravan(configured, scheduler=False) as caravan:
        alice = await caravan.user("alice")
        made = {}
        for name, group, resources in (
            ("plain", "default", []),
            ("big-one", "big", []),
            ("big-small", "big", [{"slot": "mem", "amount": "64m"}]),
        ):
            fields = {
                "name": name,
                "type": "INTERACTIVE",
                "driver": "EXEC",
                "resourceGroup": group,
                "resources": resources,
            }
            made[name] = (await caravan.gql(CREATE, {"input": fields}, token=alice))["createSession"]["sessions"][0]
        stored = {name: await caravan.store.get(s["id"]) for name, s in made.items()}
        slots = {name: {k: Decimal(v) for k, v in s.kernels[0].resources.items()} for name, s in stored.items() if s}
        assert slots == {
            "plain": BUILT_IN,
            "big-one": {"cpu": Decimal(2), "mem": Decimal(1 << 30)},
            "big-small": {"cpu": Decimal(2), "mem": Decimal(64 << 20)},
        }


async def test_a_user_sees_the_groups_they_may_use_with_capacity_and_defaults_but_no_agents(
    settings: Settings, tmp_path: Path
) -> None:
    configured = configured_with(settings, tmp_path / "scheduler.hcl", GROUP_DEFAULTS)
    async with running_caravan(configured, scheduler=False) as caravan:
        alice, bob = await caravan.user("alice"), await caravan.user("bob", projects=("lab",))
        as_admin = await groups(caravan)
        seen = {g["name"]: g for g in (await caravan.gql(USER_GROUPS, token=alice))["resourceGroups"]}
        assert set(seen) == {"default", "big", "other"}  # no policy: every known group
        for name, group in seen.items():
            assert group["agents"] is None
            assert (group["capacity"], group["occupied"]) == (as_admin[name]["capacity"], as_admin[name]["occupied"])
            capacity, occupied = amounts(group["capacity"]), amounts(group["occupied"])
            assert amounts(group["free"]) == {
                slot: max(Decimal(0), c - occupied.get(slot, 0)) for slot, c in capacity.items()
            }
        assert amounts(seen["default"]["capacity"])["cpu"] > 0 and amounts(seen["default"]["free"])["mem"] > 0
        assert amounts(seen["default"]["defaultResources"]) == amounts(seen["other"]["defaultResources"]) == BUILT_IN
        assert amounts(seen["big"]["defaultResources"]) == {"cpu": Decimal(2), "mem": Decimal(1 << 30)}
        assert as_admin["default"]["agents"] and amounts(as_admin["big"]["defaultResources"])["cpu"] == 2

        # their own policy and their projects' narrow it: bob's allows default and big, his project's big and other
        await caravan.gql(SET_USER, {"user": "bob", "policy": {"allowedResourceGroups": ["default", "big"]}})
        await caravan.gql(SET_PROJECT, {"project": "lab", "policy": {"allowedResourceGroups": ["big", "other"]}})
        assert [g["name"] for g in (await caravan.gql(USER_GROUPS, token=bob))["resourceGroups"]] == ["big"]
