"""GraphQL types of session templates."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import strawberry

from domain import templates
from gateway.graphql.folders.mounts import SessionMount, mount_specs_of
from gateway.graphql.sessions.apps import AppSpec, app_specs_of
from gateway.graphql.sessions.inputs import KernelRole
from gateway.graphql.sessions.types import ClusterMode, Driver, EnvVar, Resource, SessionType

# The domain's enums are the GraphQL enums: strawberry.enum marks the class itself (and returns it), so the
# aliases below are plain classes, usable as annotations.
TemplateScope = templates.TemplateScope
strawberry.enum(
    TemplateScope,
    name="TemplateScope",
    description="PERSONAL: its owner's; PROJECT: every member of its project may use it.",
)


@strawberry.type(description="The kernels of one role with their own image and slots.")
class KernelRoleSpec:
    role: KernelRole
    image: str | None
    resources: list[Resource]


@strawberry.type(
    description="A template's creation parameters, as written (amounts and durations unnormalized): "
    "the fields of SessionSpecInput."
)
class SessionSpec:
    type: SessionType
    driver: Driver
    image: str | None
    startup_command: str | None
    environ: list[EnvVar]
    resources: list[Resource]
    resource_group: str
    starts_at: str | None = strawberry.field(description="BATCH: an ISO 8601 moment, or a duration from each creation.")
    batch_timeout: str | None = strawberry.field(description="BATCH: a duration, as written ('2h').")
    cluster_size: int
    cluster_mode: ClusterMode
    count: int
    preopen_ports: list[int]
    shared_memory: str | None = strawberry.field(description="docker: /dev/shm size, as written ('64m').")
    designated_agent: str | None
    priority: int
    preset: str | None
    kernel_roles: list[KernelRoleSpec]
    replicas: int | None
    service_port: int | None
    health_check_path: str | None
    health_check_grace: str | None = strawberry.field(description="INFERENCE: a duration, as written ('30s').")
    apps: list[AppSpec]
    mounts: list[SessionMount]


@strawberry.type
class SessionTemplate:
    id: strawberry.ID
    name: str
    owner_id: str
    project: str
    scope: TemplateScope
    spec: SessionSpec
    created_at: datetime
    updated_at: datetime


def spec_type_of(spec: templates.TemplateSpec) -> SessionSpec:
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return SessionSpec(
        **{
            **values,
            "driver": Driver(spec.driver.value),
            "environ": [EnvVar(name=k, value=v) for k, v in spec.environ.items()],
            "resources": [Resource(slot=k, amount=v) for k, v in spec.resources.items()],
            "preopen_ports": list(spec.preopen_ports),
            "apps": app_specs_of(spec.apps),
            "mounts": mount_specs_of(spec.mounts),
            "kernel_roles": [
                KernelRoleSpec(
                    role=KernelRole(role),
                    image=r.image,
                    resources=[Resource(slot=k, amount=v) for k, v in r.resources.items()],
                )
                for role, r in spec.kernel_roles.items()
            ],
        }
    )


def template_type_of(t: templates.Template) -> SessionTemplate:
    return SessionTemplate(
        id=strawberry.ID(t.id),
        name=t.name,
        owner_id=t.owner_id,
        project=t.project,
        scope=t.scope,
        spec=spec_type_of(t.spec),
        created_at=t.created_at,
        updated_at=t.updated_at,
    )
