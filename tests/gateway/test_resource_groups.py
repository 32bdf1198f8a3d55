"""``resourceGroups`` against the real Nomad dev agent: its one agent's capacity, drivers and occupancy as the
scheduler counts them, the groups only configured or only queued in, and admins only."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from common.settings import Settings
from common.users import Role
from tests.harness import CREATE, Caravan, GraphQLErrors, running_caravan

GROUPS = """{ resourceGroups { name allowedDrivers capacity { slot amount } occupied { slot amount }
  agents { id name schedulable drivers capacity { slot amount } occupied { slot amount } } } }"""


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
        fields = {"name": "queued", "type": "INTERACTIVE", "driver": "EXEC", "resourceGroup": "nowhere"}
        await caravan.gql(CREATE, {"input": fields})
        found = await groups(caravan)
        assert {"default", "gpu", "nowhere"} <= set(found)
        for name in ("gpu", "nowhere"):
            assert (found[name]["agents"], found[name]["capacity"], found[name]["occupied"]) == ([], [], [])
        assert (found["gpu"]["allowedDrivers"], found["default"]["allowedDrivers"]) == (["docker", "exec"], None)


async def test_only_admins_read_resource_groups(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(GROUPS, token=alice)
    assert refused.value.codes == ["FORBIDDEN"]
    admin = await caravan.user("ada", Role.ADMIN)
    assert "default" in {g["name"] for g in (await caravan.gql(GROUPS, token=admin))["resourceGroups"]}
