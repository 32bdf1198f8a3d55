"""GraphQL types of presets, resource policies and resource groups."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import strawberry

from domain import presets
from domain import resource_policies as policies
from gateway.graphql.sessions.types import Driver, Resource


@strawberry.type(description="A named bundle of slots a creation may name (preset) under its explicit resources.")
class ResourcePreset:
    name: str
    resources: list[Resource]
    shared_memory: str | None = strawberry.field(description="Bytes of /dev/shm; a request's own sharedMemory wins.")


@strawberry.type(description="What a user may hold and do; null fields are unlimited.")
class UserResourcePolicy:
    user_id: str
    stored: bool = strawberry.field(description="False: nobody stored one, everything is unlimited.")
    max_concurrent_sessions: int | None
    max_pending_sessions: int | None
    max_priority: int | None = strawberry.field(
        description="The highest session priority the user may ask for; null: the default (10) for a USER, 100 for "
        "admins."
    )
    total_resource_slots: list[Resource] | None = strawberry.field(
        description="What the user's running sessions may hold together; a slot not listed is unlimited."
    )
    max_session_lifetime: float | None = strawberry.field(description="Seconds a session may stay RUNNING.")
    idle_timeout: float | None = strawberry.field(description="Seconds a session may go without user traffic.")
    allowed_resource_groups: list[str] | None
    allowed_drivers: list[Driver] | None


@strawberry.type(description="What a project's sessions may hold together and do; null fields are unlimited.")
class ProjectResourcePolicy:
    project: str
    total_resource_slots: list[Resource] | None
    max_session_lifetime: float | None
    idle_timeout: float | None
    allowed_resource_groups: list[str] | None
    allowed_drivers: list[Driver] | None


@strawberry.type
class ResourcePolicies:
    users: list[UserResourcePolicy]
    projects: list[ProjectResourcePolicy]


@strawberry.type(description="A Nomad client node as the scheduler counts it.")
class Agent:
    id: str
    name: str
    schedulable: bool = strawberry.field(description="Ready, eligible and not draining.")
    capacity: list[Resource]
    occupied: list[Resource] = strawberry.field(
        description="Everything allocated on it (Caravan's or not) and Caravan placements Nomad does not show yet."
    )
    drivers: list[str] = strawberry.field(
        description="Task drivers the node has detected and reports healthy "
        "(a client's driver allow/deny list leaves the others out)."
    )


@strawberry.type(description="A set of agents (a Nomad node pool) sessions are queued and placed in.")
class ResourceGroup:
    name: str
    allowed_drivers: list[str] | None = strawberry.field(
        description="The drivers its sessions may use, when the scheduler configuration limits them (else null)."
    )
    default_resources: list[Resource] = strawberry.field(
        description="What each kernel of a session created here gets of a slot its request (and preset) leaves out "
        "(the scheduler configuration's default_resources; built in: 0.25 cpu, 256 MiB of mem). Amounts: cores for "
        "cpu, bytes for mem, a count for devices."
    )
    agents: list[Agent] | None = strawberry.field(description="Admins only (null for others): its Nomad clients.")
    capacity: list[Resource] = strawberry.field(description="Of its schedulable agents together.")
    occupied: list[Resource] = strawberry.field(
        description="On its schedulable agents together, by anyone's sessions and by what else Nomad runs there."
    )
    free: list[Resource] = strawberry.field(
        description="Capacity minus occupancy, per slot: what its agents have left together (a session's kernel must "
        "fit on one agent)."
    )


def resources_of(slots: Mapping[str, Decimal | str] | None) -> list[Resource] | None:
    if slots is None:
        return None
    return [
        Resource(slot=slot, amount=amount if isinstance(amount, str) else format(amount, "f"))
        for slot, amount in sorted(slots.items())
    ]


def preset_type_of(p: presets.ResourcePreset) -> ResourcePreset:
    return ResourcePreset(name=p.name, resources=resources_of(p.resources) or [], shared_memory=p.shared_memory)


def _drivers(names: tuple[str, ...] | None) -> list[Driver] | None:
    return None if names is None else [Driver(n) for n in names if n in Driver._value2member_map_]


def user_policy_type_of(user_id: str, p: policies.UserResourcePolicy | None) -> UserResourcePolicy:
    found = p or policies.UserResourcePolicy()
    groups = found.allowed_resource_groups
    return UserResourcePolicy(
        user_id=user_id, stored=p is not None,
        max_concurrent_sessions=found.max_concurrent_sessions, max_pending_sessions=found.max_pending_sessions,
        max_priority=found.max_priority,
        total_resource_slots=resources_of(found.total_resource_slots),
        max_session_lifetime=found.max_session_lifetime, idle_timeout=found.idle_timeout,
        allowed_resource_groups=list(groups) if groups is not None else None,
        allowed_drivers=_drivers(found.allowed_drivers),
    )  # fmt: skip


def project_policy_type_of(project: str, p: policies.ProjectResourcePolicy) -> ProjectResourcePolicy:
    return ProjectResourcePolicy(
        project=project, total_resource_slots=resources_of(p.total_resource_slots),
        max_session_lifetime=p.max_session_lifetime, idle_timeout=p.idle_timeout,
        allowed_resource_groups=list(p.allowed_resource_groups) if p.allowed_resource_groups is not None else None,
        allowed_drivers=_drivers(p.allowed_drivers),
    )  # fmt: skip
