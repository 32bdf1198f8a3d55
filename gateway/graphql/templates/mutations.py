"""Template mutations: create, update, delete, and create sessions from one.

A template's spec is checked when it is written with the creation rules (``check_request``: everything but a
session name); a creation from it takes the template's values, then the overrides, then goes through the one
creation path of ``createSession`` (full checks, policies, quotas).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import strawberry
from strawberry.types.unset import UNSET
from strawberry.utils.str_converters import to_camel_case

from core.clock import utcnow
from core.errors import CaravanError, Forbidden, InvalidInput
from domain.access import administers
from domain.session_requests import SessionRequest, check_request, named_images
from domain.templates import Template, TemplateSpec, check_template_name, may_write, new_template
from domain.templates import TemplateScope as Scope
from domain.users import Role, User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.folders.mounts import MountInput
from gateway.graphql.sessions.apps import AppInput
from gateway.graphql.sessions.inputs import (
    CreateSessionInput,
    EnvVarInput,
    KernelRoleInput,
    SessionSpecInput,
    input_values_of,
    options_of,
)
from gateway.graphql.sessions.mutations import CreateSessionPayload, create_from_input
from gateway.graphql.sessions.resource_input import ResourceInput
from gateway.graphql.sessions.scaling import AutoscalingInput
from gateway.graphql.sessions.types import ClusterMode, Driver, SessionType, session_type_of
from gateway.graphql.templates.queries import usable
from gateway.graphql.templates.types import SessionTemplate, TemplateScope, template_type_of
from stores.templates import TemplateStore

SPEC_CHECK_NAME = "template"
"""A valid session name: a spec is checked as a creation would be, the session name aside."""
MERGED_BY_KEY = {"environ": "name", "resources": "slot", "apps": "name", "mounts": "path"}
"""Override lists merged into the template's item by item (keyed by this attribute) rather than replacing them."""


@strawberry.input
class CreateSessionTemplateInput:
    name: str
    spec: SessionSpecInput
    scope: TemplateScope = TemplateScope.PERSONAL
    project: str | None = strawberry.field(
        default=None,
        description="PROJECT templates (required): a project you administer. PERSONAL: one of yours "
        "(default: your first); its admins reach the template too.",
    )


@strawberry.input(description="What to change; the spec, when given, replaces the whole spec.")
class UpdateSessionTemplateInput:
    name: str | None = None
    spec: SessionSpecInput | None = None


@strawberry.input(
    description="Any createSession option, over the template's values. Left out: the template's value. "
    "null: cleared, as if the template did not set it (createSession's default; type cannot be "
    "cleared). Lists of environ and resources (and each kernel role's slots) are merged item by item "
    "into the template's; every other value replaces the template's."
)
class SessionOverridesInput:
    name: str
    type: SessionType | None = UNSET
    driver: Driver | None = UNSET
    image: str | None = UNSET
    startup_command: str | None = UNSET
    environ: list[EnvVarInput] | None = UNSET
    resources: list[ResourceInput] | None = UNSET
    resource_group: str | None = UNSET
    client_token: str | None = UNSET
    starts_at: str | None = UNSET
    batch_timeout: str | None = UNSET
    dependencies: list[strawberry.ID] | None = UNSET
    cluster_size: int | None = UNSET
    cluster_mode: ClusterMode | None = UNSET
    count: int | None = UNSET
    preopen_ports: list[int] | None = UNSET
    shared_memory: str | None = UNSET
    designated_agent: str | None = UNSET
    priority: int | None = UNSET
    preset: str | None = UNSET
    kernel_roles: list[KernelRoleInput] | None = UNSET
    replicas: int | None = UNSET
    service_port: int | None = UNSET
    health_check_path: str | None = UNSET
    health_check_grace: str | None = UNSET
    apps: list[AppInput] | None = UNSET
    mounts: list[MountInput] | None = UNSET
    project: str | None = UNSET
    owner: strawberry.ID | None = UNSET
    autoscaling: AutoscalingInput | None = UNSET


def spec_of(input: SessionSpecInput) -> TemplateSpec:
    try:
        return TemplateSpec(**options_of(input))
    except CaravanError as exc:
        raise in_spec(exc) from exc


async def check_spec(ctx: Context, spec: TemplateSpec, viewer: User) -> None:
    """The creation rules on ``spec`` (errors name ``spec.<field>``): a template that could never create is refused."""
    request = SessionRequest(name=SPEC_CHECK_NAME, **spec_values(spec))
    rules = await ctx.creation.rules(
        resource_group=spec.resource_group,
        preset=spec.preset,
        images=[reference for _, reference in named_images(request)],
        users=(viewer.id,),
    )
    try:
        check_request(request, viewer=viewer, now=utcnow(), rules=rules)
    except CaravanError as exc:
        raise in_spec(exc) from exc


def spec_values(spec: TemplateSpec) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def merged_input(spec: TemplateSpec, overrides: SessionOverridesInput) -> CreateSessionInput:
    """The template's values, then the overrides given (null: cleared): what ``createSession`` would have received."""
    values = input_values_of(spec_values(spec))
    for f in dataclasses.fields(overrides):
        given = getattr(overrides, f.name)
        if given is UNSET:
            continue
        if given is None:
            if f.name == "type":
                raise InvalidInput("type cannot be cleared: give the sessions' type, or leave it out", field="type")
            values.pop(f.name, None)  # createSession's default
            continue
        if f.name in MERGED_BY_KEY:
            given = _merged(values.get(f.name, []), given, MERGED_BY_KEY[f.name])
        elif f.name == "kernel_roles":
            given = _merged_roles(values.get("kernel_roles", []), given)
        values[f.name] = given
    return CreateSessionInput(**values)


def from_template(spec: TemplateSpec, overrides: SessionOverridesInput) -> frozenset[str]:
    """The options (by their GraphQL names) whose value the template gave: set there, and not overridden."""
    return frozenset(to_camel_case(name) for name in spec.given() if getattr(overrides, name) is UNSET)


def blamed_on_template(exc: CaravanError, template: Template, given: frozenset[str]) -> CaravanError:
    """``exc`` saying so when the field it names took the template's value: override it, or clear it with null."""
    option = (exc.field or "").split(".")[0]
    if option not in given:
        return exc
    return type(exc)(
        f"{exc.message} ({option} comes from template {template.name!r}: override it, or clear it with {option}: null)",
        field=exc.field,
        **exc.details,
    )


def _merged(base: list[Any], over: list[Any], key: str) -> list[Any]:
    merged = {getattr(item, key): item for item in base}
    merged.update({getattr(item, key): item for item in over})
    return list(merged.values())


def _merged_roles(base: list[KernelRoleInput], over: list[KernelRoleInput]) -> list[KernelRoleInput]:
    merged = {r.role: r for r in base}
    for role in over:
        under = merged.get(role.role)
        merged[role.role] = (
            role
            if under is None
            else KernelRoleInput(
                role=role.role,
                image=under.image if role.image is UNSET else role.image,
                resources=_merged(under.resources, role.resources, "slot"),
            )
        )
    return list(merged.values())


def in_spec(exc: CaravanError) -> CaravanError:
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
    @fields.mutation(description="Store a session template (its spec is checked as a creation would be).")
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

    @fields.mutation(description="Rename a template or replace its spec (its owner, or its project's admins).")
    async def update_session_template(
        self, info: Info, id: strawberry.ID, input: UpdateSessionTemplateInput
    ) -> SessionTemplate:
        ctx = info.context
        viewer = ctx.viewer
        template = await usable(ctx, str(id), viewer)
        if not may_write(viewer, template):
            raise Forbidden("only the project's admins change a PROJECT template", field="id")
        if input.name is not None:
            check_template_name(input.name)
        spec = spec_of(input.spec) if input.spec is not None else template.spec
        await check_spec(ctx, spec, viewer)
        changed = template.evolve(
            name=input.name if input.name is not None else template.name, spec=spec, updated_at=utcnow()
        )
        await TemplateStore(ctx.sessions.redis, ctx.sessions.keys).put(changed)
        return template_type_of(changed)

    @fields.mutation(
        description="Delete a template (its owner, or its project's admins); sessions made from it "
        "are not touched. Returns its id."
    )
    async def delete_session_template(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        ctx = info.context
        viewer = ctx.viewer
        template = await usable(ctx, str(id), viewer)
        if not may_write(viewer, template):
            raise Forbidden("only the project's admins delete a PROJECT template", field="id")
        await TemplateStore(ctx.sessions.redis, ctx.sessions.keys).delete(template)
        return id

    @fields.mutation(
        description="Queue sessions from a template: its values, then the overrides, then every check of createSession."
    )
    async def create_session_from_template(
        self, info: Info, template_id: strawberry.ID, overrides: SessionOverridesInput
    ) -> CreateSessionPayload:
        ctx = info.context
        template = await usable(ctx, str(template_id), ctx.viewer, field="templateId")
        try:
            stored = await create_from_input(ctx, merged_input(template.spec, overrides))
        except CaravanError as exc:
            raise blamed_on_template(exc, template, from_template(template.spec, overrides)) from exc
        return CreateSessionPayload(sessions=[session_type_of(s) for s in stored])
