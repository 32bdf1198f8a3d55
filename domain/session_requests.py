"""A createSession request checked and turned into new sessions. Pure: no I/O.

Every rule a request can break is checked here, before anything is stored, and each failure
names the offending field so the caller can fix it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from types import MappingProxyType

from core.clock import from_iso
from core.durations import duration_input
from core.errors import CaravanError, Forbidden, InvalidInput, UnsupportedResource
from core.settings import Settings
from domain import vm
from domain.apps import App, checked_apps
from domain.autoscaling import ScalingRequest
from domain.docker_images import check_docker_image
from domain.endpoint_scaling import ReplicaUpdate
from domain.environments import EnvironmentImage, allowed_patterns, check_minimum, check_not_retired
from domain.images import CommittedImage, check_image_use
from domain.inference import replicas_of
from domain.inference_options import ServiceOptions, checked_service_options
from domain.model import (
    DEFAULT_GROUP,
    DEFAULT_PRIORITY,
    KERNEL_ROLES,
    MAX_PRIORITY,
    ClusterMode,
    Driver,
    Kernel,
    RoleSpec,
    Session,
    SessionStatus,
    SessionType,
    StatusChange,
)
from domain.presets import ResourcePreset
from domain.scheduling_config import DEFAULT_RESOURCES, MIN_MEM_BYTES
from domain.slots import (
    INTRINSIC_SLOT_TYPES,
    InvalidQuantityError,
    SlotType,
    UnknownSlotError,
    from_user_input,
    parse_quantity,
)
from domain.storage import Folder, MountRequest, check_mounts, resolve_mounts
from domain.user_requests import NAME_RULE as PROJECT_RULE
from domain.users import Role, User

NAME_RULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{2,62}[A-Za-z0-9_]$")
ENV_NAME_RULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
GROUP_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RESERVED_ENV_PREFIXES = ("CARAVAN_", "NOMAD_")
MAX_VALUE_BYTES = 32 * 1024
MAX_CLUSTER_SIZE = 32
MAX_COUNT = 50
MAX_DEPENDENCIES = 64
MAX_PREOPEN_PORTS = 16
RUN_TOKEN_PREFIX = "schedule:"
"""Client tokens a schedule's runs are stored with (``domain.schedules.run_key``): a user's own createSession may not
use one, or it could take the place of a future run."""
BATCH_ONLY = ("startsAt", "batchTimeout", "dependencies")
IMAGE_DRIVERS = (Driver.DOCKER, Driver.QEMU)
"""The drivers that run an image; exec and raw_exec run none, and refuse one (``image``, a kernel role's)."""


@dataclass(frozen=True)
class CreationRules:
    """What the platform's configuration says about new sessions; the gateway reads it for each creation."""

    known_slots: Mapping[str, SlotType] = field(default_factory=lambda: INTRINSIC_SLOT_TYPES)
    """Slots some agent has offered: a request for another is UNSUPPORTED_RESOURCE."""
    default_image: str | None = None
    docker_images: Sequence[str] = Settings.docker_images
    """The operator's Docker image allowlist (glob patterns, ``domain.docker_images``)."""
    presets: Mapping[str, ResourcePreset] = field(default_factory=dict)
    """At least the preset the request names (the caller reads it); a preset not in it is unknown."""
    qemu_images: Mapping[str, str] = field(default_factory=dict)
    """The operator's VM image allowlist: name -> image directory."""
    allowed_drivers: frozenset[str] = frozenset(d.value for d in Driver)
    """The drivers the request's resource group allows."""
    known_groups: frozenset[str] = frozenset({DEFAULT_GROUP})
    """Resource groups sessions may be created in (``stores.known_resources``): node pools seen, configured groups."""
    default_resources: Mapping[str, str] = field(default_factory=lambda: DEFAULT_RESOURCES)
    """What each kernel gets of a slot the request (and its preset) leaves out: the request's resource group's
    ``default_resources`` in the scheduler configuration."""
    folders: Mapping[str, Folder] = field(default_factory=dict)
    """At least the storage folders the request mounts (the caller reads them); a folder not in it is NOT_FOUND."""
    full_folders: frozenset[str] = frozenset()
    """Those of ``folders`` whose owner or project is at its bytes quota: mounted RO only (``resolve_mounts``)."""
    platform: bool = False
    """The platform's own request (``domain.sftp``): the only one that may create a SYSTEM session."""
    committed_images: Mapping[str, Sequence[CommittedImage]] = field(default_factory=dict)
    """The records of the committed images the request names (``named_images``), by ref (``stores.images``): a
    committed image none of whose records the user may use is NOT_FOUND (``domain.images.check_image_use``)."""
    environments: Mapping[str, EnvironmentImage] = field(default_factory=dict)
    """The environment catalog by image reference (``domain.environments``): its images are allowed (its retired ones
    refused), and a session of one gets its apps, startup command and default resources when it leaves them out."""


@dataclass(frozen=True)
class SessionRequest:
    name: str
    type: SessionType
    driver: Driver = Driver.DOCKER
    image: str | None = None
    startup_command: str | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, str] = field(default_factory=dict)
    resource_group: str = DEFAULT_GROUP
    client_token: str | None = None
    starts_at: str | None = None
    """ISO 8601 moment, or a duration from now such as ``"90s"`` or ``"1h"``."""
    batch_timeout: str | None = None
    dependencies: Sequence[str] = ()
    cluster_size: int = 1
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    count: int = 1
    preopen_ports: Sequence[int] = ()
    shared_memory: str | None = None
    designated_agent: str | None = None
    priority: int = DEFAULT_PRIORITY
    preset: str | None = None
    """A resource preset's name: its slots (and shared memory) under the explicit ones."""
    kernel_roles: Mapping[str, RoleSpec] = field(default_factory=dict)
    """Role (``main``, ``sub``) -> its own image and slots over the session's."""
    project: str | None = None
    """One of the owner's projects; None: their first."""
    replicas: int | None = None
    """INFERENCE only (domain.inference_options): replicas of the main kernel; None: 1."""
    service_port: int | None = None
    health_check_path: str | None = None
    health_check_grace: str | None = None
    autoscaling: ScalingRequest | None = None
    """INFERENCE only: the endpoint's autoscaling rules (``domain.autoscaling``); None: ``replicas`` for good."""
    apps: Sequence[App] = ()
    """Named ports the gateway proxies (``domain.apps``)."""
    mounts: Sequence[MountRequest] = ()
    """Storage folders mounted into every kernel (``domain.storage``)."""


def check_users_client_token(token: str | None) -> None:
    """A clientToken a user sends (``createSession``) may not be one of a schedule's run keys: the runs alone use
    :data:`RUN_TOKEN_PREFIX` (``build_sessions`` itself takes them, for the schedule runner)."""
    if token is not None and token.startswith(RUN_TOKEN_PREFIX):
        raise InvalidInput(
            f"clientToken: the prefix {RUN_TOKEN_PREFIX!r} is reserved for schedules' runs", field="clientToken"
        )


def build_sessions(
    request: SessionRequest,
    *,
    viewer: User,
    now: datetime,
    rules: CreationRules = CreationRules(),
    owner: User | None = None,
    checked: CheckedRequest | None = None,
) -> list[Session]:
    """``owner``: whom the sessions are for, if not ``viewer`` (a SUPERADMIN acting for them; the caller checks).
    ``checked``: what :func:`check_request` returned for this request (same ``viewer``, ``now`` and ``rules``), or
    for one that differs only in what it leaves to this function (name, project, a client token as long): the
    schedule runner checks each shape of run once."""
    owner = owner or viewer
    request = with_environment(request, rules)
    if not NAME_RULE.match(request.name):
        raise InvalidInput("name must be 4-64 characters: letters, digits, '_', and '.' or '-' inside", field="name")
    if checked is None:
        checked = check_request(request, viewer=viewer, now=now, rules=rules)
    project = session_project(request.project, owner=owner, viewer=viewer)
    if owner.id != viewer.id:  # a session for another user runs their image: they must be allowed it too
        _check_committed(request, rules, owner)
    mounts = resolve_mounts(list(request.mounts), dict(rules.folders), owner, full=rules.full_folders)
    designated = request.designated_agent
    if mounts:  # a node-local folder: the session runs on its storage node (the scheduler's designated agent)
        if designated is not None and designated != mounts[0].node_id:
            raise InvalidInput("the mounted folders live on another node than designatedAgent", field="mounts")
        designated = mounts[0].node_id
    names = [request.name] if request.count == 1 else [f"{request.name}-{i}" for i in range(1, request.count + 1)]
    if any(len(n) > 64 for n in names):
        raise InvalidInput("name is too long for the numbered names of count sessions", field="name")
    return [
        Session(
            id=str(uuid.uuid4()),
            name=name,
            owner_id=owner.id,
            project=project,
            type=request.type,
            driver=request.driver,
            image=checked.image,
            resources=checked.slots,
            kernels=checked.kernels,
            created_at=now,
            status=SessionStatus.PENDING,
            status_info="created",
            status_history=(StatusChange(SessionStatus.PENDING, now, "created"),),
            resource_group=request.resource_group,
            startup_command=request.startup_command,
            environ=checked.environ,
            cluster_mode=request.cluster_mode,
            client_token=request.client_token,
            priority=request.priority,
            starts_at=checked.starts_at,
            batch_timeout=checked.batch_timeout,
            dependencies=tuple(dict.fromkeys(request.dependencies)),
            designated_agent=designated,
            preopen_ports=tuple(request.preopen_ports),
            shared_memory=checked.shared_memory,
            service_port=checked.service.port if checked.service else None,
            health_check_path=checked.service.health_check_path if checked.service else None,
            health_check_grace=checked.service.health_check_grace if checked.service else None,
            autoscaling=checked.service.autoscaling if checked.service else None,
            apps=checked_apps(request.apps),
            mounts=mounts,
        )
        for name in names
    ]


def session_project(requested: str | None, *, owner: User, viewer: User) -> str:
    """The project new sessions of ``owner`` go to: ``requested``, one of the owner's (any, for a SUPERADMIN's own
    sessions), else the owner's first."""
    if requested is None:
        return owner.projects[0]
    if owner.role is Role.SUPERADMIN and requested not in owner.projects:
        if not PROJECT_RULE.match(requested):  # a SUPERADMIN acts in any project, but only a well-formed one
            raise InvalidInput(f"project {requested[:80]!r} is not a valid project name", field="project")
        return requested
    if requested not in owner.projects:
        if owner.id == viewer.id:
            raise Forbidden(f"you are not a member of project {requested[:80]!r}", field="project")
        raise InvalidInput(f"user {owner.id} is not a member of project {requested[:80]!r}", field="project")
    return requested


@dataclass(frozen=True)
class CheckedRequest:
    """A request's values once every rule but the session name's passed: what its sessions are built from."""

    image: str
    slots: dict[str, str]
    """The session's slots per kernel (defaults, then the preset's, then the explicit ones), normalized."""
    kernels: tuple[Kernel, ...]
    environ: dict[str, str]
    shared_memory: str | None
    starts_at: datetime | None
    batch_timeout: float | None
    service: ServiceOptions | None = None
    """INFERENCE: replicas (already the kernels), service port and health check; None for other types."""


def check_request(
    request: SessionRequest,
    *,
    viewer: User,
    now: datetime,
    rules: CreationRules = CreationRules(),
) -> CheckedRequest:
    """Every rule of a creation but the session name's: also how a template's spec is checked when it is written."""
    known_slots, allowed_drivers, qemu_images = rules.known_slots, rules.allowed_drivers, rules.qemu_images
    request = with_environment(request, rules)
    if request.type is SessionType.SYSTEM and not rules.platform:
        raise Forbidden("SYSTEM sessions are created by the platform (requestSftp), not by users", field="type")
    if request.type is SessionType.BATCH and not (request.startup_command or "").strip():
        raise InvalidInput("a BATCH session needs a non-empty startupCommand", field="startupCommand")
    if request.driver is Driver.RAW_EXEC and viewer.role is not Role.SUPERADMIN:
        raise Forbidden(
            "the raw_exec driver runs as root on the host without isolation: only a SUPERADMIN may use it",
            field="driver",
        )
    if request.driver.value not in allowed_drivers:
        raise Forbidden(
            f"resource group {request.resource_group!r} allows only the drivers "
            f"{', '.join(sorted(allowed_drivers)) or 'none'}",
            field="driver",
        )
    image = _checked_image(request, rules)
    _check_text("startupCommand", request.startup_command or "")
    if request.client_token is not None and not 1 <= len(request.client_token) <= 128:
        raise InvalidInput("clientToken must be 1-128 characters", field="clientToken")
    if not GROUP_RULE.match(request.resource_group):
        raise InvalidInput("resourceGroup is not a valid name", field="resourceGroup")
    if request.resource_group not in rules.known_groups:
        known = sorted(rules.known_groups)
        listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        raise InvalidInput(
            f"there is no resource group {request.resource_group!r} (no node pool of that name has "
            f"a client, and the scheduler's configuration names none): known are {listed}",
            field="resourceGroup",
        )
    environ = _checked_environ(request.environ)
    preset = _preset(request.preset, rules.presets)
    environment = environment_for(image, request.driver, rules)
    slots = _checked_resources(
        {
            **rules.default_resources,
            **(environment.default_resources if environment else {}),
            **(preset.resources if preset else {}),
            **request.resources,
        },
        known_slots,
    )
    if environment is not None:
        check_minimum(environment, slots, known_slots)
    _check_batch_options(request)
    _check_shape(request, viewer)
    service = checked_service_options(
        request.type,
        replicas=request.replicas,
        service_port=request.service_port,
        health_check_path=request.health_check_path,
        health_check_grace=request.health_check_grace,
        cluster_size=request.cluster_size,
        startup_command=request.startup_command,
        autoscaling=request.autoscaling,
    )
    kernels = kernels_of(
        request.cluster_size,
        image,
        slots,
        _checked_roles(request.kernel_roles, request.driver, image, slots, known_slots, rules),
    )
    if service is not None:
        kernels = replicas_of(kernels[0], service.replicas)  # INFERENCE: each replica is a kernel (domain.inference)
    if request.driver is Driver.QEMU:
        _check_vm(request, kernels, environ, qemu_images)
    _check_committed(request, rules, viewer)
    shared_memory = _checked_shared_memory(request, preset, kernels)
    starts_at = _checked_start(request.starts_at, now)
    timeout = duration_input("batchTimeout", request.batch_timeout, minimum=1)
    return CheckedRequest(image, slots, kernels, environ, shared_memory, starts_at, timeout, service)


def _checked_image(request: SessionRequest, rules: CreationRules) -> str:
    """The image the kernels run: the request's, else the driver's default; "" for the drivers that run none (exec,
    raw_exec), which refuse one rather than ignore it."""
    if request.driver not in IMAGE_DRIVERS:
        if request.image:
            raise InvalidInput(
                f"the {request.driver.value} driver runs no image (its kernels run in the Nomad client's "
                "chroot, or on the host for raw_exec): image is for the docker and qemu drivers",
                field="image",
            )
        return ""
    image = request.image or (_only(rules.qemu_images) if request.driver is Driver.QEMU else rules.default_image)
    if not image:
        raise InvalidInput(f"the {request.driver.value} driver needs an image", field="image")
    if request.driver is Driver.DOCKER:
        check_catalog_image(image, rules)
    return image


def check_catalog_image(reference: str, rules: CreationRules, *, field: str = "image") -> None:
    """A docker image a session may run: not a retired catalog image, and Docker's grammar, pinned, in the catalog
    or matching the operator's patterns (``domain.docker_images``)."""
    check_not_retired(reference, rules.environments, field=field)
    check_docker_image(reference, allowed_patterns(rules.docker_images, rules.environments), field=field)


def environment_for(image: str, driver: Driver, rules: CreationRules) -> EnvironmentImage | None:
    """The catalog entry a docker session of ``image`` runs: the image's own (in use), or, for a committed image, the
    one of the image its session ran (its labels came along); None for any other image."""
    if driver is not Driver.DOCKER:
        return None
    entry = rules.environments.get(image)
    if entry is not None:
        return None if entry.retired else entry
    bases = sorted({record.base_image for record in rules.committed_images.get(image, ()) if record.base_image})
    return next((rules.environments[base] for base in bases if base in rules.environments), None)


def with_environment(request: SessionRequest, rules: CreationRules) -> SessionRequest:
    """``request`` with what its catalog image declares where it leaves them out: the apps and the startup command
    (default resources are merged in :func:`check_request`). Unchanged for an image outside the catalog."""
    entry = environment_for(request.image or rules.default_image or "", request.driver, rules)
    if entry is None:
        return request
    return replace(
        request,
        apps=request.apps or entry.apps,
        startup_command=request.startup_command or entry.startup_command,
    )


def named_images(request: SessionRequest) -> list[tuple[str, str]]:
    """The docker images ``request`` names, each with its field: those a caller looks up as committed images
    (``CreationRules.committed_images``)."""
    if request.driver is not Driver.DOCKER:
        return []
    named = [("image", request.image)] if request.image else []
    return named + [(f"kernelRoles.{r}.image", s.image) for r, s in request.kernel_roles.items() if s.image]


def _check_committed(request: SessionRequest, rules: CreationRules, user: User) -> None:
    for field_name, reference in named_images(request):
        check_image_use(reference, rules.committed_images, user, field=field_name)


def kernels_of(
    cluster_size: int,
    image: str,
    slots: dict[str, str],
    roles: Mapping[str, tuple[str, dict[str, str]]] = MappingProxyType({}),
) -> tuple[Kernel, ...]:
    """``main1`` then ``sub1`` … ``sub{N-1}``: users interact with main1, which reaches the others.

    ``roles`` gives a role (``main``, ``sub``) its own (image, slots); other kernels get the session's."""
    main_image, main_slots = roles.get("main", (image, slots))
    sub_image, sub_slots = roles.get("sub", (image, slots))
    main = Kernel(role="main", index=1, hostname="main1", image=main_image, resources=main_slots)
    subs = (
        Kernel(role="sub", index=i + 1, hostname=f"sub{i}", image=sub_image, resources=dict(sub_slots))
        for i in range(1, cluster_size)
    )
    return (main, *subs)


def _preset(name: str | None, presets: Mapping[str, ResourcePreset]) -> ResourcePreset | None:
    if name is None:
        return None
    if name not in presets:
        raise InvalidInput(f"there is no resource preset named {name[:80]!r}", field="preset")
    return presets[name]


def _checked_roles(
    roles: Mapping[str, RoleSpec],
    driver: Driver,
    image: str,
    slots: dict[str, str],
    known: Mapping[str, SlotType],
    rules: CreationRules,
) -> dict[str, tuple[str, dict[str, str]]]:
    """Per role: its image (the session's when it names none) and its slots (the session's, then its own)."""
    checked = {}
    for role, spec in roles.items():
        if role not in KERNEL_ROLES:
            raise InvalidInput(f"kernel role {role!r} is not one of {', '.join(KERNEL_ROLES)}", field="kernelRoles")
        if spec.image is not None:
            _check_text(f"kernelRoles.{role}.image", spec.image)
            if not spec.image.strip():
                raise InvalidInput("a kernel role's image cannot be empty", field=f"kernelRoles.{role}.image")
            if driver not in IMAGE_DRIVERS:
                raise InvalidInput(
                    f"the {driver.value} driver runs no image: a role cannot name one",
                    field=f"kernelRoles.{role}.image",
                )
            if driver is Driver.DOCKER:
                check_catalog_image(spec.image, rules, field=f"kernelRoles.{role}.image")
        try:
            role_slots = _checked_resources({**slots, **spec.resources}, known)
        except CaravanError as exc:
            raise type(exc)(exc.message, field=f"kernelRoles.{role}.{exc.field}") from exc
        checked[role] = (spec.image or image, role_slots)
    return checked


def _check_batch_options(request: SessionRequest) -> None:
    given = {"startsAt": request.starts_at, "batchTimeout": request.batch_timeout, "dependencies": request.dependencies}
    if request.type is not SessionType.BATCH:
        for field_name in BATCH_ONLY:
            if given[field_name]:
                raise InvalidInput(f"{field_name} is only for BATCH sessions", field=field_name)
    if len(request.dependencies) > MAX_DEPENDENCIES:
        raise InvalidInput(f"at most {MAX_DEPENDENCIES} dependencies", field="dependencies")


def _check_shape(request: SessionRequest, viewer: User) -> None:
    if not 1 <= request.cluster_size <= MAX_CLUSTER_SIZE:
        raise InvalidInput(f"clusterSize must be between 1 and {MAX_CLUSTER_SIZE}", field="clusterSize")
    if not 1 <= request.count <= MAX_COUNT:
        raise InvalidInput(f"count must be between 1 and {MAX_COUNT}", field="count")
    if not 0 <= request.priority <= MAX_PRIORITY:
        raise InvalidInput(f"priority must be between 0 and {MAX_PRIORITY}", field="priority")
    ports = list(request.preopen_ports)
    if len(ports) > MAX_PREOPEN_PORTS or len(set(ports)) != len(ports):
        raise InvalidInput(f"preopenPorts: at most {MAX_PREOPEN_PORTS} distinct ports", field="preopenPorts")
    for port in ports:
        if not 1024 <= port <= 65535:
            raise InvalidInput(f"preopen port {port} is outside 1024-65535", field="preopenPorts")
    checked_apps(request.apps)
    if request.type is SessionType.INFERENCE and any(app.preferred_port is not None for app in request.apps):
        raise InvalidInput(
            "an INFERENCE endpoint's replicas cannot share one host port: no preferred port", field="apps"
        )
    check_mounts(list(request.mounts))
    if request.designated_agent is not None and not viewer.is_admin:
        raise Forbidden("only admins may designate an agent", field="designatedAgent")


def _checked_start(value: str | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    try:
        moment = from_iso(value)
    except ValueError:
        return now + timedelta(seconds=duration_input("startsAt", value) or 0)
    if moment.tzinfo is None:
        raise InvalidInput("startsAt needs a time zone (e.g. a trailing Z)", field="startsAt")
    return moment


def _checked_shared_memory(
    request: SessionRequest, preset: ResourcePreset | None, kernels: Sequence[Kernel]
) -> str | None:
    """/dev/shm of docker kernels: the request's, else its preset's. Other drivers refuse it when asked, and a
    preset's does not apply to them (no driver but docker sizes /dev/shm)."""
    if request.driver is not Driver.DOCKER:
        if request.shared_memory:
            raise InvalidInput(
                f"only docker kernels get a /dev/shm of a set size: the {request.driver.value} driver "
                "cannot honour sharedMemory",
                field="sharedMemory",
            )
        return None
    value = request.shared_memory or (preset.shared_memory if preset else None)
    if not value:
        return None
    try:
        amount = parse_quantity("sharedMemory", value, SlotType.BYTES)
    except InvalidQuantityError as exc:
        raise InvalidInput(str(exc), field="sharedMemory") from exc
    if any(amount >= Decimal(kernel.resources["mem"]) for kernel in kernels):
        raise InvalidInput("sharedMemory must be less than the mem of every kernel", field="sharedMemory")
    return str(amount)


def checked_replica_update(
    session: Session,
    template: Kernel,
    *,
    startup_command: str | None,
    environ: Mapping[str, str] | None,
    image: str | None,
    resources: Mapping[str, str] | None,
    rules: CreationRules,
    users: Sequence[User],
) -> ReplicaUpdate:
    """What a live inference endpoint's next revision runs (``updateEndpoint``), each given field checked as
    createSession checks it, the others kept from ``session`` and its replica ``template``
    (``domain.endpoint_scaling.replica_template``): the image against the driver, the allowlist and catalog and the
    committed images ``users`` (who asks, and the owner) may use; the slots (those given over the template's) against
    the known slots, the image's environment minimum and the session's /dev/shm. The owner's resource policy is the
    caller's to check (``stores.creation_rules.Policies.admit_replicas``)."""
    if (startup_command, environ, image, resources) == (None, None, None, None):
        raise InvalidInput("nothing to update: give startupCommand, environ, image or resources", field="input")
    command = session.startup_command if startup_command is None else startup_command
    if not (command or "").strip():
        raise InvalidInput(
            "an INFERENCE session needs a startupCommand: the server its replicas run", field="startupCommand"
        )
    _check_text("startupCommand", command or "")
    new_image = template.image if image is None else _checked_update_image(session.driver, image, rules, users)
    slots = dict(template.resources)
    if resources is not None:
        slots = _checked_resources({**template.resources, **resources}, rules.known_slots)
    environment = environment_for(new_image, session.driver, rules)
    if environment is not None and (image is not None or resources is not None):
        check_minimum(environment, slots, rules.known_slots)
    if session.shared_memory is not None and Decimal(slots.get("mem", "0")) <= Decimal(session.shared_memory):
        raise InvalidInput("mem must be more than the session's sharedMemory", field="resources.mem")
    return ReplicaUpdate(
        startup_command=command,
        environ=dict(session.environ) if environ is None else _checked_environ(environ),
        image=new_image,
        resources=slots,
    )


def _checked_update_image(driver: Driver, image: str, rules: CreationRules, users: Sequence[User]) -> str:
    if driver not in IMAGE_DRIVERS:
        raise InvalidInput(
            f"the {driver.value} driver runs no image: an endpoint of it cannot change its image", field="image"
        )
    _check_text("image", image)
    if not image.strip():
        raise InvalidInput("image cannot be empty", field="image")
    if driver is Driver.DOCKER:
        check_catalog_image(image, rules)
    for user in users:
        check_image_use(image, rules.committed_images, user)
    return image


def _check_text(field_name: str, value: str) -> None:
    if "\x00" in value:
        raise InvalidInput(f"{field_name} cannot contain NUL characters", field=field_name)
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise InvalidInput(f"{field_name} is longer than {MAX_VALUE_BYTES} bytes", field=field_name)


def _checked_environ(environ: Mapping[str, str]) -> dict[str, str]:
    for name, value in environ.items():
        path = f"environ.{name}"
        if not ENV_NAME_RULE.match(name):
            raise InvalidInput(f"environment variable name {name!r} is not valid", field="environ")
        if name.startswith(RESERVED_ENV_PREFIXES):
            raise InvalidInput(f"environment variable {name} uses a reserved prefix", field=path)
        _check_text(path, value)
    return dict(environ)


def checked_preset_slots(raw: Mapping[str, str], known: Mapping[str, SlotType]) -> dict[str, str]:
    """A resource preset's slots, normalized, refused (on ``resources.<slot>``) as a request giving them would be."""
    checked = _checked_resources({**DEFAULT_RESOURCES, **raw}, known)
    return {slot: amount for slot, amount in checked.items() if slot in raw}


def _checked_resources(raw: Mapping[str, str], known: Mapping[str, SlotType]) -> dict[str, str]:
    try:
        slots = from_user_input(raw, known)
    except UnknownSlotError as exc:
        raise UnsupportedResource(str(exc), field=f"resources.{exc.slot}") from exc
    except InvalidQuantityError as exc:
        raise InvalidInput(str(exc), field=f"resources.{exc.slot}") from exc
    if slots.amount("cpu") <= 0:
        raise InvalidInput("cpu must be more than 0", field="resources.cpu")
    if slots.amount("mem") < MIN_MEM_BYTES:
        raise InvalidInput("mem must be at least 16m", field="resources.mem")
    return slots.to_json()


def _only(images: Mapping[str, str]) -> str | None:
    """The VM image a qemu session gets when it names none: the allowlist's, when it holds exactly one."""
    return next(iter(images)) if len(images) == 1 else None


def _check_vm(
    request: SessionRequest, kernels: Sequence[Kernel], environ: Mapping[str, str], images: Mapping[str, str]
) -> None:
    """The qemu driver: allowlisted images, the memory Nomad's driver needs, what a VM's fw_cfg carries."""
    for kernel in kernels:
        where = f"kernelRoles.{kernel.role}." if kernel.role in request.kernel_roles else ""
        if kernel.image not in images:
            allowed = ", ".join(sorted(images)) or "none"
            raise InvalidInput(
                f"{kernel.image!r} is not an allowlisted VM image (allowed: {allowed})", field=f"{where}image"
            )
        if Decimal(kernel.resources["mem"]) < vm.MIN_MEMORY_MIB * 1024 * 1024:
            raise InvalidInput(f"a VM needs at least {vm.MIN_MEMORY_MIB}m of mem", field=f"{where}resources.mem")
    if request.preopen_ports:
        raise InvalidInput("qemu VMs have no network: preopenPorts are not supported", field="preopenPorts")
    if request.apps:
        raise InvalidInput("qemu VMs have no network: apps are not supported", field="apps")
    if request.mounts:
        raise InvalidInput("qemu VMs cannot mount storage folders", field="mounts")
    if request.type is SessionType.INFERENCE:
        raise InvalidInput("INFERENCE sessions serve on a network, which qemu VMs do not have", field="driver")
    try:
        vm.environ_item(environ, limit=vm.USER_ENVIRON_BYTES)
    except vm.PayloadTooLarge as exc:
        raise InvalidInput(str(exc), field="environ") from exc
