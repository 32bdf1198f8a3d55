"""Resource groups from a fresh read of Nomad and Redis, occupancy counted as the scheduler's pass counts it.

Admins see every group (node pools, configured groups, groups sessions were queued in) with its agents; any other user
sees the groups they may create sessions in (known groups their own and their projects' resource policies allow), each
with its capacity, occupancy, free capacity and default resources together, but not its agents.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from domain.model import Driver
from domain.slots import ResourceSlots
from domain.users import User
from gateway.graphql.context import Context
from gateway.graphql.policies.types import Agent, ResourceGroup, resources_of
from gateway.scheduling_config import scheduling_config
from nomad_jobs.agents import agents_of, healthy_drivers, mhz_per_core
from stores.known_resources import known_resource_groups
from stores.resource_policies import PolicyStore


async def resource_groups(ctx: Context) -> list[ResourceGroup]:
    viewer = ctx.viewer
    config = scheduling_config(ctx.settings.scheduler.config_path)
    every_driver = frozenset(d.value for d in Driver)
    # occupancy counted as the scheduler's pass counts it (two Nomad calls and two Redis reads)
    live = [s for s in await ctx.sessions.get_many(sorted(await ctx.sessions.live_ids())) if s is not None]
    nodes = await ctx.nomad.nodes()
    agents = agents_of(
        nodes,
        await ctx.nomad.live_allocations(),
        {s.id: s for s in live},
        ctx.settings.nomad.job_prefix,
        mhz_per_core(nodes, config.cpu_mhz_per_core),
        config.devices,
    )
    by_id = {str(node["ID"]): node for node in nodes}
    known = await known_resource_groups(ctx.sessions.redis, ctx.sessions.keys, configured=config.groups)
    if viewer.is_admin:
        names = {a.resource_group for a in agents} | known | await ctx.sessions.resource_groups()
    else:
        names = await usable_groups(ctx, viewer, known)
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
            default_resources=resources_of(config.default_resources(name)) or [],
            agents=[Agent(id=a.id, name=str(by_id[a.id].get("Name") or a.id), schedulable=a.schedulable,
                          capacity=resources_of(a.capacity) or [], occupied=resources_of(a.occupied) or [],
                          drivers=sorted(healthy_drivers(by_id[a.id]))) for a in members] if viewer.is_admin else None,
            capacity=resources_of(capacity) or [],
            occupied=resources_of(occupied) or [],
            free=resources_of({slot: max(Decimal(0), amount - occupied.amount(slot))
                               for slot, amount in capacity.items()}) or [],
        ))  # fmt: skip
    return groups


async def usable_groups(ctx: Context, viewer: User, known: Iterable[str]) -> set[str]:
    """The known groups ``viewer`` may create sessions in: their resource policy allows them, and so does the policy
    of at least one of their projects (no policy: every group)."""
    store = PolicyStore(ctx.sessions.redis, ctx.sessions.keys)
    own = await store.user(viewer.id)
    projects = await store.projects(viewer.projects)
    allowed_by_projects = [projects[p].allowed_resource_groups if p in projects else None for p in viewer.projects]

    def usable(group: str) -> bool:
        if own is not None and own.allowed_resource_groups is not None and group not in own.allowed_resource_groups:
            return False
        return any(allowed is None or group in allowed for allowed in allowed_by_projects)

    return {group for group in known if usable(group)}
