"""Template mutations: create, update, delete, and create sessions from one.

A template's spec is checked when it is written with the creation rules (``check_request``: everything but a
session name); a creation from it takes the template's values, then the overrides, then goes through the one
creation path of ``createSession`` (full checks, policies, quotas).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import strawberry

from common.access import administers
from common.clock import utcnow
from common.errors import CaravanError, Forbidden, InvalidInput
from common.model import ClusterMode as ClusterModeModel
from common.model import Driver as DriverModel
from common.templates import TemplateScope as Scope
from common.templates import TemplateSpec, TemplateStore, check_template_name, may_write, new_template
from common.users import Role, User
from gateway.graphql.context import Context, Info
from gateway.graphql.sessions.mutations import (CreateSessionInput, CreateSessionPayload, EnvVarInput, KernelRole,
                                                KernelRoleInput, ResourceInput, create_from_input, role_specs_of)
from gateway.graphql.sessions.types import ClusterMode, Driver, SessionType, session_type_of
from gateway.graphql.sessions.creation import creation_rules
from gateway.graphql.templates.queries import usable
from gateway.graphql.templates.types import SessionTemplate, TemplateScope, template_type_of
from gateway.session_requests import SessionRequest, check_request

SPEC_CHECK_NAME = "template"
"""A valid session name: a spec is checked as a creation would be, the session name aside."""
MERGED_BY_KEY = {"environ": "name", "resources": "slot"}
"""Override lists merged into the template's item by item (keyed by this attribute) rather than replacing them."""


@strawberry.input(description="A template's creation parameters: those of createSession a template may hold.")
class SessionSpecInput:
    type: SessionType
    driver: Driver = Driver.DOCKER
    image: str | None = None
    startup_command: str | None = None
    environ: list[EnvVarInput] = strawberry.field(default_factory=list)
    resources: list[ResourceInput] = strawberry.field(default_factory=list)
    resource_group: str = "default"
    cluster_size: int = 1
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    preset: str | None = None
    kernel_roles: list[KernelRoleInput] = strawberry.field(default_factory=list)


@strawberry.input
class CreateSessionTemplateInput:
    name: str
    spec: SessionSpecInput
    scope: TemplateScope = TemplateScope.PERSONAL
    project: str | None = strawberry.field(
        default=None, description="PROJECT templates (required): a project you administer. PERSONAL: one of yours "
        "(default: your first); its admins reach the template too.")


@strawberry.input(description="What to change; the spec, when given, replaces the whole spec.")
class UpdateSessionTemplateInput:
    name: str | None = None
    spec: SessionSpecInput | None = None


@strawberry.input(description="Any createSession option, over the template's values: lists of environ and "
                  "resources (and each kernel role's) are merged item by item, everything else replaced.")
class SessionOverridesInput:
    name: str
    type: SessionType | None = None
    driver: Driver | None = None
    image: str | None = None
    startup_command: str | None = None
    environ: list[EnvVarInput] | None = None
    resources: list[ResourceInput] | None = None
    resource_group: str | None = None
    client_token: str | None = None
    starts_at: str | None = None
    batch_timeout: str | None = None
    dependencies: list[strawberry.ID] | None = None
    cluster_size: int | None = None
    cluster_mode: ClusterMode | None = None
    count: int | None = None
    preopen_ports: list[int] | None = None
    shared_memory: str | None = None
    designated_agent: str | None = None
    priority: int | None = None
    preset: str | None = None
    kernel_roles: list[KernelRoleInput] | None = None
    replicas: int | None = None
    service_port: int | None = None
    health_check_path: str | None = None
    health_check_grace: str | None = None
    project: str | None = None
    owner: strawberry.ID | None = None


def spec_of(input: SessionSpecInput) -> TemplateSpec:
    environ = {e.name: e.value for e in input.environ}
    if len(environ) != len(input.environ):
        raise InvalidInput("each environment variable may be given once", field="spec.environ")
    resources = {r.slot: r.amount for r in input.resources}
    if len(resources) != len(input.resources):
        raise InvalidInput("each slot may be given once", field="spec.resources")
    try:
        roles = role_specs_of(input.kernel_roles)
    except CaravanError as exc:
        raise _in_spec(exc) from exc
    return TemplateSpec(
        type=input.type, driver=DriverModel(input.driver.value), image=input.image,
        startup_command=input.startup_command, environ=environ, resources=resources,
        resource_group=input.resource_group, cluster_size=input.cluster_size,
        cluster_mode=ClusterModeModel(input.cluster_mode.value), preset=input.preset, kernel_roles=roles,
    )  # fmt: skip


async def check_spec(ctx: Context, spec: TemplateSpec, viewer: User) -> None:
    """The creation rules on ``spec`` (errors name ``spec.<field>``): a template that could never create is refused."""
    request = SessionRequest(
        name=SPEC_CHECK_NAME, type=spec.type, driver=spec.driver, image=spec.image,
        startup_command=spec.startup_command, environ=spec.environ, resources=spec.resources,
        resource_group=spec.resource_group, cluster_size=spec.cluster_size, cluster_mode=spec.cluster_mode,
        preset=spec.preset, kernel_roles=spec.kernel_roles,
    )  # fmt: skip
    rules = await creation_rules(ctx, resource_group=spec.resource_group, preset=spec.preset)
    try:
        check_request(request, viewer=viewer, now=utcnow(), rules=rules)
    except CaravanError as exc:
        raise _in_spec(exc) from exc


def template_values(spec: TemplateSpec) -> dict[str, Any]:
    """The template's values as ``CreateSessionInput`` fields."""
    return {
        "type": spec.type, "driver": Driver(spec.driver.value), "image": spec.image,
        "startup_command": spec.startup_command,
        "environ": [EnvVarInput(name=k, value=v) for k, v in spec.environ.items()],
        "resources": [ResourceInput(slot=k, amount=v) for k, v in spec.resources.items()],
        "resource_group": spec.resource_group, "cluster_size": spec.cluster_size, "cluster_mode": spec.cluster_mode,
        "preset": spec.preset,
        "kernel_roles": [
            KernelRoleInput(role=KernelRole(role), image=r.image,
                            resources=[ResourceInput(slot=k, amount=v) for k, v in r.resources.items()])
            for role, r in spec.kernel_roles.items()
        ],
    }  # fmt: skip


def merged_input(spec: TemplateSpec, overrides: SessionOverridesInput) -> CreateSessionInput:
    """The template's values, then the overrides given (not null): what ``createSession`` would have received."""
    values = template_values(spec)
    for f in dataclasses.fields(overrides):
        given = getattr(overrides, f.name)
        if given is None:
            continue
        if f.name in MERGED_BY_KEY:
            given = _merged(values.get(f.name, []), given, MERGED_BY_KEY[f.name])
        elif f.name == "kernel_roles":
            given = _merged_roles(values["kernel_roles"], given)
        values[f.name] = given
    return CreateSessionInput(**values)


def _merged(base: list[Any], over: list[Any], key: str) -> list[Any]:
    merged = {getattr(item, key): item for item in base}
    merged.update({getattr(item, key): item for item in over})
    return list(merged.values())


def _merged_roles(base: list[KernelRoleInput], over: list[KernelRoleInput]) -> list[KernelRoleInput]:
    merged = {r.role: r for r in base}
    for role in over:
        under = merged.get(role.role)
        merged[role.role] = role if under is None else KernelRoleInput(
            role=role.role, image=role.image if role.image is not None else under.image,
            resources=_merged(under.resources, role.resources, "slot"))
    return list(merged.values())


def _in_spec(exc: CaravanError) -> CaravanError:
    return type(exc)(exc.message, field=f"spec.{exc.field}" if exc.field else "spec")


def _place(viewer: User, scope: Scope, project: str | None) -> str:
    """The project a new template of ``viewer`` goes to, if they may write one there."""
    if scope is Scope.PROJECT:
        if project is None:
            raise InvalidInput("a PROJECT template needs its project", field="project")
        if not administers(viewer, project):
            raise Forbidden(f"only an admin of project {project[:80]!r} writes its templates", field="project")
        return project
    if project is None:
        return viewer.projects[0]
    if project not in viewer.projects and viewer.role is not Role.SUPERADMIN:
        raise Forbidden(f"you are not a member of project {project[:80]!r}", field="project")
    return project


@strawberry.type
class TemplateMutations:
    @strawberry.mutation(description="Store a session template (its spec is checked as a creation would be).")
    async def create_session_template(self, info: Info, input: CreateSessionTemplateInput) -> SessionTemplate:
        ctx = info.context
        viewer = ctx.viewer
        check_template_name(input.name)
        scope = Scope(input.scope.value)
        project = _place(viewer, scope, input.project)
        spec = spec_of(input.spec)
        await check_spec(ctx, spec, viewer)
        template = new_template(name=input.name, owner=viewer, project=project, scope=scope, spec=spec, now=utcnow())
        await TemplateStore(ctx.sessions.redis, ctx.sessions.keys).put(template)
        return template_type_of(template)

    @strawberry.mutation(description="Rename a template or replace its spec (its owner, or its project's admins).")
    async def update_session_template(self, info: Info, id: strawberry.ID,
                                      input: UpdateSessionTemplateInput) -> SessionTemplate:
        ctx = info.context
        viewer = ctx.viewer
        template = await usable(ctx, str(id), viewer)
        if not may_write(viewer, template):
            raise Forbidden("only the project's admins change a PROJECT template", field="id")
        if input.name is not None:
            check_template_name(input.name)
        spec = spec_of(input.spec) if input.spec is not None else template.spec
        await check_spec(ctx, spec, viewer)
        changed = template.evolve(name=input.name if input.name is not None else template.name, spec=spec,
                                  updated_at=utcnow())
        await TemplateStore(ctx.sessions.redis, ctx.sessions.keys).put(changed)
        return template_type_of(changed)

    @strawberry.mutation(description="Delete a template (its owner, or its project's admins); sessions made from it "
                         "are not touched. Returns its id.")
    async def delete_session_template(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        ctx = info.context
        viewer = ctx.viewer
        template = await usable(ctx, str(id), viewer)
        if not may_write(viewer, template):
            raise Forbidden("only the project's admins delete a PROJECT template", field="id")
        await TemplateStore(ctx.sessions.redis, ctx.sessions.keys).delete(template)
        return id

    @strawberry.mutation(description="Queue sessions from a template: its values, then the overrides, then every "
                         "check of createSession.")
    async def create_session_from_template(self, info: Info, template_id: strawberry.ID,
                                           overrides: SessionOverridesInput) -> CreateSessionPayload:
        ctx = info.context
        template = await usable(ctx, str(template_id), ctx.viewer, field="templateId")
        stored = await create_from_input(ctx, merged_input(template.spec, overrides))
        return CreateSessionPayload(sessions=[session_type_of(s) for s in stored])
