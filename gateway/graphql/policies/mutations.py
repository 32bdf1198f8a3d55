"""Admin mutations of resource presets and of user and project resource policies.

Presets are global (every user's sessions and templates name them): only a SUPERADMIN writes them. A user's policy
by those who manage the user (``domain.access.manages_user``: nobody but a SUPERADMIN sets their own); a project's
by its admins. A user or project out of the viewer's reach is
NOT_FOUND; a USER calling any of these is FORBIDDEN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import strawberry

from core.durations import duration_input
from core.errors import Conflict, Forbidden, InvalidInput, NotFound, UnsupportedResource
from domain.access import administers, can_see_user, manages_user
from domain.model import MAX_PRIORITY
from domain.presets import ResourcePreset, check_preset_name
from domain.resource_policies import ProjectResourcePolicy, UserResourcePolicy
from domain.session_requests import GROUP_RULE, checked_preset_slots
from domain.slots import InvalidQuantityError, SlotType, UnknownSlotError, from_user_input, parse_quantity
from domain.users import Role, User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.policies.types import (
    ProjectResourcePolicy as ProjectPolicyType,
)
from gateway.graphql.policies.types import (
    ResourcePreset as PresetType,
)
from gateway.graphql.policies.types import (
    UserResourcePolicy as UserPolicyType,
)
from gateway.graphql.policies.types import (
    preset_type_of,
    project_policy_type_of,
    user_policy_type_of,
)
from gateway.graphql.sessions.resource_input import ResourceInput
from gateway.graphql.sessions.types import Driver
from stores.known_resources import known_slot_types
from stores.presets import PresetStore
from stores.resource_policies import PolicyStore

MAX_ALLOWED_GROUPS = 64


@strawberry.input
class ResourcePresetInput:
    name: str
    resources: list[ResourceInput]
    shared_memory: str | None = strawberry.field(default=None, description="/dev/shm size ('64m').")


@strawberry.input(description="A project's limits; a field left null is unlimited.")
class ProjectResourcePolicyInput:
    total_resource_slots: list[ResourceInput] | None = strawberry.field(
        default=None, description="What the sessions may hold together; a slot not listed is unlimited."
    )
    max_session_lifetime: str | None = strawberry.field(default=None, description="'8h', '3600' (seconds) …")
    idle_timeout: str | None = strawberry.field(default=None, description="Without user traffic this long, reclaimed.")
    allowed_resource_groups: list[str] | None = None
    allowed_drivers: list[Driver] | None = None


@strawberry.input(description="A user's limits; a field left null is unlimited.")
class UserResourcePolicyInput(ProjectResourcePolicyInput):
    max_concurrent_sessions: int | None = None
    max_pending_sessions: int | None = None
    max_priority: int | None = strawberry.field(
        default=None, description="The highest session priority (0-100) a USER may ask for; null: the default (10)."
    )


# -- inputs checked (pure) --


def preset_of(input: ResourcePresetInput, known: Mapping[str, SlotType]) -> ResourcePreset:
    check_preset_name(input.name)
    raw = {r.slot: r.amount for r in input.resources}
    if len(raw) != len(input.resources):
        raise InvalidInput("each slot may be given once", field="resources")
    slots = checked_preset_slots(raw, known)
    shared_memory = None
    if input.shared_memory is not None:
        try:
            shared_memory = format(parse_quantity("sharedMemory", input.shared_memory, SlotType.BYTES), "f")
        except InvalidQuantityError as exc:
            raise InvalidInput(str(exc), field="sharedMemory") from exc
    return ResourcePreset(input.name, slots, shared_memory)


def common_fields(input: ProjectResourcePolicyInput, known: Mapping[str, SlotType]) -> dict[str, Any]:
    return {
        "total_resource_slots": _slot_limits(input.total_resource_slots, known),
        "max_session_lifetime": duration_input("maxSessionLifetime", input.max_session_lifetime, minimum=1),
        "idle_timeout": duration_input("idleTimeout", input.idle_timeout, minimum=1),
        "allowed_resource_groups": _groups(input.allowed_resource_groups),
        "allowed_drivers": None if input.allowed_drivers is None else [d.value for d in input.allowed_drivers],
    }


def user_policy_of(input: UserResourcePolicyInput, known: Mapping[str, SlotType]) -> UserResourcePolicy:
    for name, value in (
        ("maxConcurrentSessions", input.max_concurrent_sessions),
        ("maxPendingSessions", input.max_pending_sessions),
    ):
        if value is not None and value < 0:
            raise InvalidInput(f"{name} must be 0 or more (null: unlimited)", field=name)
    if input.max_priority is not None and not 0 <= input.max_priority <= MAX_PRIORITY:
        raise InvalidInput(f"maxPriority must be between 0 and {MAX_PRIORITY} (null: the default)", field="maxPriority")
    return UserResourcePolicy(
        **common_fields(input, known),
        max_concurrent_sessions=input.max_concurrent_sessions,
        max_pending_sessions=input.max_pending_sessions,
        max_priority=input.max_priority,
    )


def _slot_limits(given: list[ResourceInput] | None, known: Mapping[str, SlotType]) -> dict[str, str] | None:
    if given is None:
        return None
    raw = {r.slot: r.amount for r in given}
    if len(raw) != len(given):
        raise InvalidInput("each slot may be given once", field="totalResourceSlots")
    try:
        return from_user_input(raw, known).to_json()
    except UnknownSlotError as exc:
        raise UnsupportedResource(str(exc), field=f"totalResourceSlots.{exc.slot}") from exc
    except InvalidQuantityError as exc:
        raise InvalidInput(str(exc), field=f"totalResourceSlots.{exc.slot}") from exc


def _groups(names: list[str] | None) -> list[str] | None:
    if names is None:
        return None
    if len(names) > MAX_ALLOWED_GROUPS or not all(GROUP_RULE.match(n) for n in names):
        raise InvalidInput(
            f"allowedResourceGroups: at most {MAX_ALLOWED_GROUPS} valid resource group names",
            field="allowedResourceGroups",
        )
    return names


# -- who may --


def _admin(viewer: User) -> None:
    if not viewer.is_admin:
        raise Forbidden("only administrators manage resource policies")


def _superadmin(viewer: User) -> None:
    if viewer.role is not Role.SUPERADMIN:
        raise Forbidden("resource presets are global: only a SUPERADMIN creates, changes or deletes them")


async def _managed_user(ctx: Context, viewer: User, user_id: str) -> None:
    _admin(viewer)
    target = await ctx.users.get(user_id)
    if target is None or not can_see_user(viewer, target):
        raise NotFound(f"no user {user_id}", field="userId")
    if not manages_user(viewer, target):
        raise Forbidden(f"you do not manage user {user_id}'s policy", field="userId")


def _administered(viewer: User, project: str) -> None:
    _admin(viewer)
    if not administers(viewer, project):
        raise NotFound(f"no project {project[:80]!r} you administer", field="project")


async def _known(ctx: Context) -> dict[str, SlotType]:
    return await known_slot_types(ctx.sessions.redis, ctx.sessions.keys)


@strawberry.type
class PolicyMutations:
    @fields.mutation(description="SUPERADMIN: a new resource preset (CONFLICT when the name is taken).")
    async def create_resource_preset(self, info: Info, input: ResourcePresetInput) -> PresetType:
        ctx = info.context
        _superadmin(ctx.viewer)
        preset = preset_of(input, await _known(ctx))
        if not await PresetStore(ctx.sessions.redis, ctx.sessions.keys).put(preset, create=True):
            raise Conflict(f"a preset named {input.name!r} exists", field="name")
        return preset_type_of(preset)

    @fields.mutation(description="SUPERADMIN: replace a preset's slots and shared memory.")
    async def update_resource_preset(self, info: Info, input: ResourcePresetInput) -> PresetType:
        ctx = info.context
        _superadmin(ctx.viewer)
        preset = preset_of(input, await _known(ctx))
        if not await PresetStore(ctx.sessions.redis, ctx.sessions.keys).put(preset, create=False):
            raise NotFound(f"no preset named {input.name!r}", field="name")
        return preset_type_of(preset)

    @fields.mutation(description="SUPERADMIN: delete a preset; templates naming it then fail at creation.")
    async def delete_resource_preset(self, info: Info, name: str) -> bool:
        ctx = info.context
        _superadmin(ctx.viewer)
        if not await PresetStore(ctx.sessions.redis, ctx.sessions.keys).delete(name):
            raise NotFound(f"no preset named {name[:80]!r}", field="name")
        return True

    @fields.mutation(description="Admins: replace a user's resource policy (null fields: unlimited).")
    async def set_user_resource_policy(
        self, info: Info, user_id: str, policy: UserResourcePolicyInput
    ) -> UserPolicyType:
        ctx = info.context
        await _managed_user(ctx, ctx.viewer, user_id)
        checked = user_policy_of(policy, await _known(ctx))
        await PolicyStore(ctx.sessions.redis, ctx.sessions.keys).put_user(user_id, checked)
        return user_policy_type_of(user_id, checked)

    @fields.mutation(
        description="Admins: remove a user's resource policy (they become unlimited). False when there was none."
    )
    async def delete_user_resource_policy(self, info: Info, user_id: str) -> bool:
        ctx = info.context
        await _managed_user(ctx, ctx.viewer, user_id)
        return await PolicyStore(ctx.sessions.redis, ctx.sessions.keys).delete_user(user_id)

    @fields.mutation(description="Admins of the project: replace its resource policy (null fields: unlimited).")
    async def set_project_resource_policy(
        self, info: Info, project: str, policy: ProjectResourcePolicyInput
    ) -> ProjectPolicyType:
        ctx = info.context
        _administered(ctx.viewer, project)
        checked = ProjectResourcePolicy(**common_fields(policy, await _known(ctx)))
        await PolicyStore(ctx.sessions.redis, ctx.sessions.keys).put_project(project, checked)
        return project_policy_type_of(project, checked)

    @fields.mutation(description="Admins of the project: remove its resource policy. False when there was none.")
    async def delete_project_resource_policy(self, info: Info, project: str) -> bool:
        ctx = info.context
        _administered(ctx.viewer, project)
        return await PolicyStore(ctx.sessions.redis, ctx.sessions.keys).delete_project(project)
