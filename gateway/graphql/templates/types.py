"""GraphQL types of session templates."""

from __future__ import annotations

from datetime import datetime

import strawberry

from common import templates
from gateway.graphql.sessions.mutations import KernelRole
from gateway.graphql.sessions.types import ClusterMode, Driver, EnvVar, Resource, SessionType

TemplateScope = strawberry.enum(templates.TemplateScope, name="TemplateScope",
                                description="PERSONAL: its owner's; PROJECT: every member of its project may use it.")


@strawberry.type(description="The kernels of one role with their own image and slots.")
class KernelRoleSpec:
    role: KernelRole
    image: str | None
    resources: list[Resource]


@strawberry.type(description="A template's creation parameters, as written (amounts unnormalized).")
class SessionSpec:
    type: SessionType
    driver: Driver
    image: str | None
    startup_command: str | None
    environ: list[EnvVar]
    resources: list[Resource]
    resource_group: str
    cluster_size: int
    cluster_mode: ClusterMode
    preset: str | None
    kernel_roles: list[KernelRoleSpec]


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
    return SessionSpec(
        type=spec.type,
        driver=Driver(spec.driver.value),
        image=spec.image,
        startup_command=spec.startup_command,
        environ=[EnvVar(name=k, value=v) for k, v in spec.environ.items()],
        resources=[Resource(slot=k, amount=v) for k, v in spec.resources.items()],
        resource_group=spec.resource_group,
        cluster_size=spec.cluster_size,
        cluster_mode=spec.cluster_mode,
        preset=spec.preset,
        kernel_roles=[
            KernelRoleSpec(role=KernelRole(role), image=r.image,
                           resources=[Resource(slot=k, amount=v) for k, v in r.resources.items()])
            for role, r in spec.kernel_roles.items()
        ],
    )


def template_type_of(t: templates.Template) -> SessionTemplate:
    return SessionTemplate(
        id=strawberry.ID(t.id), name=t.name, owner_id=t.owner_id, project=t.project, scope=t.scope,
        spec=spec_type_of(t.spec), created_at=t.created_at, updated_at=t.updated_at,
    )
