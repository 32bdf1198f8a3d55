"""Resource groups from a fresh read of Nomad and Redis, occupancy counted as the scheduler's pass counts it."""

from __future__ import annotations

from common.model import Driver
from gateway.graphql.context import Context
from gateway.graphql.policies.types import Agent, ResourceGroup, resources_of
from gateway.scheduling_config import scheduling_config
from scheduler.known_groups import known_resource_groups
from scheduler.slots import ResourceSlots
from scheduler.snapshot import current_agents, healthy_drivers


async def resource_groups(ctx: Context) -> list[ResourceGroup]:
    config = scheduling_config(ctx.settings.scheduler.config_path)
    every_driver = frozenset(d.value for d in Driver)
    nodes, agents = await current_agents(ctx.sessions, ctx.nomad, config, ctx.settings.nomad.job_prefix)
    by_id = {str(node["ID"]): node for node in nodes}
    known = await known_resource_groups(ctx.sessions.redis, ctx.sessions.keys, configured=config.core.groups)
    names = {a.resource_group for a in agents} | known | await ctx.sessions.resource_groups()
    groups = []
    for name in sorted(names):
        members = [a for a in agents if a.resource_group == name]
        capacity, occupied = ResourceSlots(), ResourceSlots()
        for agent in members:
            if agent.schedulable:
                capacity, occupied = capacity + agent.capacity, occupied + agent.occupied
        allowed = config.drivers_allowed(name)
        groups.append(ResourceGroup(
            name=name,
            allowed_drivers=sorted(allowed) if allowed != every_driver else None,
            agents=[Agent(id=a.id, name=str(by_id[a.id].get("Name") or a.id), schedulable=a.schedulable,
                          capacity=resources_of(a.capacity) or [], occupied=resources_of(a.occupied) or [],
                          drivers=sorted(healthy_drivers(by_id[a.id]))) for a in members],
            capacity=resources_of(capacity) or [],
            occupied=resources_of(occupied) or [],
        ))  # fmt: skip
    return groups
