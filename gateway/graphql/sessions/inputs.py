"""What creates sessions, as GraphQL inputs: the options a session template holds (``SessionSpecInput``), and
``CreateSessionInput``, which is those plus the options of one creation (``PER_CREATION``).

One class holds the shared options, so a template can express every option of ``createSession`` but the few that
only make sense once (``tests/gateway/test_templates.py`` compares the types' fields).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import strawberry
from strawberry.types.unset import UNSET

from core.errors import InvalidInput
from domain.model import DEFAULT_PRIORITY, RoleSpec
from domain.model import ClusterMode as ClusterModeModel
from domain.model import Driver as DriverModel
from gateway.graphql.folders.mounts import MountInput, mount_inputs_of, mounts_of
from gateway.graphql.sessions.apps import AppInput, app_inputs_of, apps_of
from gateway.graphql.sessions.resource_input import ResourceInput
from gateway.graphql.sessions.scaling import AutoscalingInput
from gateway.graphql.sessions.types import ClusterMode, Driver, SessionType

PER_CREATION = ("name", "client_token", "dependencies", "project", "owner", "autoscaling")
"""The createSession options a template does not hold: they name one creation (its session name, its idempotency
key, the sessions it waits for) or whom and where it is for (the user of the template decides); and an endpoint's
autoscaling rules (given at creation or set later with ``updateEndpointScaling``)."""


@strawberry.input
class EnvVarInput:
    name: str
    value: str


@strawberry.enum(name="KernelRole")
class KernelRole(Enum):
    MAIN = "main"
    SUB = "sub"


@strawberry.input(description="The kernels of one role (main1, or every sub kernel) with their own image and slots.")
class KernelRoleInput:
    role: KernelRole
    image: str | None = strawberry.field(
        default=UNSET,
        description="docker and qemu only. Default: the session's image (in overrides of a template, "
        "null clears the template's image of this role).",
    )
    resources: list[ResourceInput] = strawberry.field(
        default_factory=list, description="Slots replacing the session's for these kernels (others are kept)."
    )


@strawberry.input(
    description="The options of new sessions a session template holds: every createSession option but "
    "name, clientToken, dependencies, project and owner."
)
class SessionSpecInput:
    type: SessionType
    driver: Driver = Driver.DOCKER
    image: str | None = strawberry.field(
        default=None,
        description="docker: an allowlisted image reference; qemu: an allowlisted VM image. Default: "
        "the platform's. exec and raw_exec run no image: they refuse one (INVALID_INPUT on image).",
    )
    startup_command: str | None = None
    environ: list[EnvVarInput] = strawberry.field(default_factory=list)
    resources: list[ResourceInput] = strawberry.field(default_factory=list)
    resource_group: str = "default"
    starts_at: str | None = strawberry.field(
        default=None,
        description="BATCH: never start before this ISO 8601 moment, or this duration from now ('90s', "
        "'1h'; in a template: from each creation).",
    )
    batch_timeout: str | None = strawberry.field(
        default=None, description="BATCH: end as FAILED (task-timeout) after running this long ('30s', '2h')."
    )
    cluster_size: int = 1
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    count: int = strawberry.field(default=1, description="Create this many identical sessions (named name-1 …).")
    preopen_ports: list[int] = strawberry.field(default_factory=list)
    shared_memory: str | None = strawberry.field(
        default=None,
        description="docker only: /dev/shm size ('64m'); other drivers refuse it (a preset's shared "
        "memory applies to docker kernels only).",
    )
    designated_agent: str | None = strawberry.field(default=None, description="Admins: the Nomad node id to run on.")
    priority: int = strawberry.field(
        default=DEFAULT_PRIORITY,
        description="0-100, higher is placed first. A USER may ask for at most their resource "
        "policy's maxPriority, or the default without one; admins for any.",
    )
    preset: str | None = strawberry.field(
        default=None, description="A resource preset: its slots (and shared memory) under the explicit resources."
    )
    kernel_roles: list[KernelRoleInput] = strawberry.field(
        default_factory=list, description="Cluster sessions: a role's own image and slots (main1, the sub kernels)."
    )
    replicas: int | None = strawberry.field(
        default=None, description="INFERENCE: copies of the main kernel serving servicePort (1-16; default 1)."
    )
    service_port: int | None = strawberry.field(
        default=None,
        description="INFERENCE (required): the port each replica serves, health-checked; the replica "
        "listens on the host port given in CARAVAN_SERVICE_PORT.",
    )
    health_check_path: str | None = strawberry.field(
        default=None, description="INFERENCE: HTTP path the health check GETs (2xx is healthy); default: a TCP check."
    )
    health_check_grace: str | None = strawberry.field(
        default=None,
        description="INFERENCE: how long after a replica (re)starts failing checks are ignored "
        "('30s' by default, 1s-1h).",
    )
    apps: list[AppInput] = strawberry.field(
        default_factory=list,
        description="Named ports of the main kernel the gateway proxies, each on an origin of its own (session.apps).",
    )
    mounts: list[MountInput] = strawberry.field(
        default_factory=list,
        description="Storage folders mounted into every kernel; the session runs on their storage node.",
    )


@strawberry.input
class CreateSessionInput(SessionSpecInput):
    name: str = strawberry.field(
        description="4-64 characters: letters, digits, '_', and '.' or '-' inside; unique "
        "per owner among live sessions."
    )
    client_token: str | None = strawberry.field(
        default=None, description="Idempotency key: repeating a request with the same token returns the same session."
    )
    dependencies: list[strawberry.ID] = strawberry.field(
        default_factory=list, description="BATCH: sessions that must end TERMINATED with SUCCESS first."
    )
    project: str | None = strawberry.field(
        default=None, description="One of the owner's projects (see viewer.projects); default: their first."
    )
    owner: strawberry.ID | None = strawberry.field(
        default=None, description="SUPERADMIN: create the sessions for this user (owner and project are theirs)."
    )
    autoscaling: AutoscalingInput | None = strawberry.field(
        default=None,
        description="INFERENCE: autoscaling rules (replicas then is where it starts: default max(minReplicas, 1)).",
    )


def role_specs_of(roles: list[KernelRoleInput]) -> dict[str, RoleSpec]:
    specs = {
        r.role.value: RoleSpec(
            image=None if r.image is UNSET else r.image, resources={x.slot: x.amount for x in r.resources}
        )
        for r in roles
    }
    if len(specs) != len(roles):
        raise InvalidInput("each kernel role may be given once", field="kernelRoles")
    return specs


def options_of(input: SessionSpecInput) -> dict[str, Any]:
    """The shared options as ``stores.templates.TemplateSpec`` and ``domain.session_requests.SessionRequest`` take
    them (same names): lists as mappings (a name or slot given twice is INVALID_INPUT), enums as the model's."""
    environ = {e.name: e.value for e in input.environ}
    if len(environ) != len(input.environ):
        raise InvalidInput("each environment variable may be given once", field="environ")
    resources = {r.slot: r.amount for r in input.resources}
    if len(resources) != len(input.resources):
        raise InvalidInput("each slot may be given once", field="resources")
    return {
        "type": input.type, "driver": DriverModel(input.driver.value), "image": input.image,
        "startup_command": input.startup_command, "environ": environ, "resources": resources,
        "resource_group": input.resource_group, "starts_at": input.starts_at, "batch_timeout": input.batch_timeout,
        "cluster_size": input.cluster_size, "cluster_mode": ClusterModeModel(input.cluster_mode.value),
        "count": input.count, "preopen_ports": tuple(input.preopen_ports), "shared_memory": input.shared_memory,
        "designated_agent": input.designated_agent, "priority": input.priority, "preset": input.preset,
        "kernel_roles": role_specs_of(input.kernel_roles), "replicas": input.replicas,
        "service_port": input.service_port, "health_check_path": input.health_check_path,
        "health_check_grace": input.health_check_grace, "apps": apps_of(input.apps),
        "mounts": mounts_of(input.mounts),
    }  # fmt: skip


def input_values_of(options: dict[str, Any]) -> dict[str, Any]:
    """``options_of``'s inverse: stored options (a template's) as ``SessionSpecInput`` / ``CreateSessionInput``
    fields."""
    return {
        **options,
        "driver": Driver(options["driver"].value),
        "environ": [EnvVarInput(name=k, value=v) for k, v in options["environ"].items()],
        "resources": [ResourceInput(slot=k, amount=v) for k, v in options["resources"].items()],
        "preopen_ports": list(options["preopen_ports"]),
        "apps": app_inputs_of(options["apps"]),
        "mounts": mount_inputs_of(options["mounts"]),
        "kernel_roles": [
            KernelRoleInput(
                role=KernelRole(role),
                image=r.image,
                resources=[ResourceInput(slot=k, amount=v) for k, v in r.resources.items()],
            )
            for role, r in options["kernel_roles"].items()
        ],
    }
