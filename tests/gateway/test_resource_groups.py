"""``resourceGroups`` against the real Nomad dev agent: its one agent's capacity, drivers and occupancy as the
scheduler counts them, the groups only configured or once seen, creation only in known groups, and admins only."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from common.settings import Settings
from common.users import Role
from scheduler.known_groups import record_resource_groups
from tests.harness import CREATE, Caravan, GraphQLErrors, running_caravan

GROUPS = """{ resourceGroups { name allowedDrivers capacity { slot amount } occupied { slot amount }
  agents { id name schedulable drivers capacity { slot amount } occupied { slot amount } } } }"""


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
        fields = {"name": "occupant", "type": "INTERACTIVE", "driver": "EXEC",
                  "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "64m"}]}
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


async def test_creation_in_an_unknown_group_is_refused(settings: Settings, tmp_path: Path) -> None:
    """Known: default, the node pools the scheduler has seen, the groups of the scheduler's configuration."""
    config = tmp_path / "scheduler.hcl"
    config.write_text('resource_group "configured" {\n  agent_selector = "concentrated"\n}\n')
    configured = dataclasses.replace(settings, scheduler=dataclasses.replace(settings.scheduler, config_path=config))
    async with running_caravan(configured, scheduler=False) as caravan:
        alice = await caravan.user("alice")

        async def create(name: str, group: str, query: str = CREATE, **more: Any) -> dict[str, Any]:
            fields = {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "resourceGroup": group, **more}
            return await caravan.post(query, {"input": fields}, token=alice)

        refused = (await create("typo", "defualt"))["errors"][0]
        assert refused["extensions"] == {"code": "INVALID_INPUT", "field": "resourceGroup"}
        assert "there is no resource group 'defualt'" in refused["message"]
        assert "known are configured, default" in refused["message"]
        template = await caravan.post(TEMPLATE, {"input": {"name": "t", "spec": {"type": "INTERACTIVE", "driver": "EXEC",
                                                                                  "resourceGroup": "pool"}}}, token=alice)
        assert template["errors"][0]["extensions"] == {"code": "INVALID_INPUT", "field": "spec.resourceGroup"}
        assert await caravan.store.session_ids() == []
        await record_resource_groups(caravan.store.redis, caravan.store.keys, ["pool"])  # the scheduler saw it
        for name, group in (("in-default", "default"), ("in-configured", "configured"), ("in-pool", "pool")):
            assert not (await create(name, group)).get("errors")
        assert len(await caravan.store.session_ids()) == 3


async def test_only_admins_read_resource_groups(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(GROUPS, token=alice)
    assert refused.value.codes == ["FORBIDDEN"]
    admin = await caravan.user("ada", Role.ADMIN)
    assert "default" in {g["name"] for g in (await caravan.gql(GROUPS, token=admin))["resourceGroups"]}
