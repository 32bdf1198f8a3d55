"""Queries of presets (everyone), resource policies (admins: theirs to manage; users: their own) and resource
groups (admins: all, with their agents; users: those they may use)."""

from __future__ import annotations

import strawberry

from domain.access import administers, manages_user
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.policies.groups import resource_groups
from gateway.graphql.policies.types import (
    ResourceGroup,
    ResourcePolicies,
    ResourcePreset,
    preset_type_of,
    project_policy_type_of,
    user_policy_type_of,
)
from stores.presets import PresetStore
from stores.resource_policies import PolicyStore


@strawberry.type
class PolicyQueries:
    @fields.field(description="Every resource preset, by name.")
    async def resource_presets(self, info: Info) -> list[ResourcePreset]:
        ctx = info.context
        ctx.viewer  # noqa: B018  (authenticated requests only)
        return [preset_type_of(p) for p in await PresetStore(ctx.sessions.redis, ctx.sessions.keys).all()]

    @fields.field(
        description="Resource policies: a user gets their own (stored or not) and their projects'; an "
        "admin every stored one of the users and projects they administer, and their own."
    )
    async def resource_policies(self, info: Info) -> ResourcePolicies:
        ctx = info.context
        viewer = ctx.viewer
        store = PolicyStore(ctx.sessions.redis, ctx.sessions.keys)
        if viewer.is_admin:
            user_ids = {viewer.id, *await store.user_ids()}
            users = [u for u in [await ctx.users.get(i) for i in sorted(user_ids)] if u is not None]
            user_ids = {u.id for u in users if u.id == viewer.id or manages_user(viewer, u)}
            projects = {p for p in await store.project_names() if administers(viewer, p)}
        else:
            user_ids, projects = {viewer.id}, set(viewer.projects)
        user_policies = await store.users(user_ids)
        return ResourcePolicies(
            users=[user_policy_type_of(i, user_policies.get(i)) for i in sorted(user_ids)],
            projects=[
                project_policy_type_of(p, found) for p, found in sorted((await store.projects(projects)).items())
            ],
        )

    @fields.field(
        description="Resource groups with their capacity, occupancy, free capacity and default "
        "resources right now. Admins: every group (Nomad node pools, the configured ones, and those "
        "sessions were queued in) with its agents. Others: the groups they may create sessions in (their "
        "own and their projects' resource policies allow them), without agents."
    )
    async def resource_groups(self, info: Info) -> list[ResourceGroup]:
        return await resource_groups(info.context)
