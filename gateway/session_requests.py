"""A createSession request checked and turned into new sessions. Pure: no I/O.

Every rule a request can break is checked here, before anything is stored, and each failure
names the offending field so the caller can fix it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from dataclasses import dataclass, field
from datetime import datetime

from datetime import timedelta

from common.clock import from_iso
from common.errors import Forbidden, InvalidInput, UnsupportedResource
from common.model import ClusterMode, Driver, Kernel, Session, SessionStatus, SessionType, StatusChange
from common.durations import parse_duration
from common.users import User
from scheduler.slots import (INTRINSIC_SLOT_TYPES, InvalidQuantityError, SlotType, UnknownSlotError, from_user_input,
                             parse_quantity)

NAME_RULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{2,62}[A-Za-z0-9_]$")
ENV_NAME_RULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
GROUP_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RESERVED_ENV_PREFIXES = ("CARAVAN_", "NOMAD_")
MAX_VALUE_BYTES = 32 * 1024
DEFAULT_RESOURCES = {"cpu": "1", "mem": "256m"}
MIN_MEM_BYTES = 16 * 1024 * 1024
MAX_CLUSTER_SIZE = 32
MAX_COUNT = 50
MAX_DEPENDENCIES = 64
MAX_PREOPEN_PORTS = 16
BATCH_ONLY = ("startsAt", "batchTimeout", "dependencies")


@dataclass(frozen=True)
class SessionRequest:
    name: str
    type: SessionType
    driver: Driver = Driver.DOCKER
    image: str | None = None
    startup_command: str | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, str] = field(default_factory=dict)
    resource_group: str = "default"
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
    priority: int = 10


def build_sessions(
    request: SessionRequest,
    *,
    viewer: User,
    now: datetime,
    known_slots: Mapping[str, SlotType] = INTRINSIC_SLOT_TYPES,
    allow_raw_exec_for_users: bool = False,
    default_image: str | None = None,
) -> list[Session]:
    if not NAME_RULE.match(request.name):
        raise InvalidInput(
            "name must be 4-64 characters: letters, digits, '_', and '.' or '-' inside", field="name"
        )
    if request.type is SessionType.SYSTEM and not viewer.is_admin:
        raise Forbidden("SYSTEM sessions are created by the platform, not by users", field="type")
    if request.type is SessionType.BATCH and not (request.startup_command or "").strip():
        raise InvalidInput("a BATCH session needs a non-empty startupCommand", field="startupCommand")
    if request.driver is Driver.RAW_EXEC and not (viewer.is_admin or allow_raw_exec_for_users):
        raise Forbidden("the raw_exec driver runs without isolation and is for admins only", field="driver")
    image = request.image or default_image
    if request.driver in (Driver.DOCKER, Driver.QEMU) and not image:
        raise InvalidInput(f"the {request.driver.value} driver needs an image", field="image")
    _check_text("startupCommand", request.startup_command or "")
    if request.client_token is not None and not 1 <= len(request.client_token) <= 128:
        raise InvalidInput("clientToken must be 1-128 characters", field="clientToken")
    if not GROUP_RULE.match(request.resource_group):
        raise InvalidInput("resourceGroup is not a valid name", field="resourceGroup")
    environ = _checked_environ(request.environ)
    slots = _checked_resources({**DEFAULT_RESOURCES, **request.resources}, known_slots)
    _check_batch_options(request)
    _check_shape(request, viewer)
    shared_memory = _checked_shared_memory(request.shared_memory, slots)
    starts_at = _checked_start(request.starts_at, now)
    timeout = _checked_duration("batchTimeout", request.batch_timeout, minimum=1)
    names = [request.name] if request.count == 1 else [f"{request.name}-{i}" for i in range(1, request.count + 1)]
    if any(len(n) > 64 for n in names):
        raise InvalidInput("name is too long for the numbered names of count sessions", field="name")
    return [
        Session(
            id=str(uuid.uuid4()),
            name=name,
            owner_id=viewer.id,
            type=request.type,
            driver=request.driver,
            image=image or "",
            resources=slots,
            kernels=kernels_of(request.cluster_size, image or "", slots),
            created_at=now,
            status=SessionStatus.PENDING,
            status_info="created",
            status_history=(StatusChange(SessionStatus.PENDING, now, "created"),),
            resource_group=request.resource_group,
            startup_command=request.startup_command,
            environ=environ,
            cluster_mode=request.cluster_mode,
            client_token=request.client_token,
            priority=request.priority,
            starts_at=starts_at,
            batch_timeout=timeout,
            dependencies=tuple(dict.fromkeys(request.dependencies)),
            designated_agent=request.designated_agent,
            preopen_ports=tuple(request.preopen_ports),
            shared_memory=shared_memory,
        )
        for name in names
    ]


def kernels_of(cluster_size: int, image: str, slots: dict[str, str]) -> tuple[Kernel, ...]:
    """``main1`` then ``sub1`` … ``sub{N-1}``: users interact with main1, which reaches the others."""
    main = Kernel(role="main", index=1, hostname="main1", image=image, resources=slots)
    subs = (Kernel(role="sub", index=i + 1, hostname=f"sub{i}", image=image, resources=slots)
            for i in range(1, cluster_size))
    return (main, *subs)


def _check_batch_options(request: SessionRequest) -> None:
    given = {"startsAt": request.starts_at, "batchTimeout": request.batch_timeout,
             "dependencies": request.dependencies}
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
    if not 0 <= request.priority <= 100:
        raise InvalidInput("priority must be between 0 and 100", field="priority")
    ports = list(request.preopen_ports)
    if len(ports) > MAX_PREOPEN_PORTS or len(set(ports)) != len(ports):
        raise InvalidInput(f"preopenPorts: at most {MAX_PREOPEN_PORTS} distinct ports", field="preopenPorts")
    for port in ports:
        if not 1024 <= port <= 65535:
            raise InvalidInput(f"preopen port {port} is outside 1024-65535", field="preopenPorts")
    if request.designated_agent is not None and not viewer.is_admin:
        raise Forbidden("only admins may designate an agent", field="designatedAgent")


def _checked_start(value: str | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    try:
        moment = from_iso(value)
    except ValueError:
        return now + timedelta(seconds=_checked_duration("startsAt", value, minimum=0) or 0)
    if moment.tzinfo is None:
        raise InvalidInput("startsAt needs a time zone (e.g. a trailing Z)", field="startsAt")
    return moment


def _checked_duration(field_name: str, value: str | None, *, minimum: float) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise InvalidInput(f"{field_name}: {exc}", field=field_name) from exc
    if seconds < minimum:
        raise InvalidInput(f"{field_name} must be at least {minimum:g}s", field=field_name)
    return seconds


def _checked_shared_memory(value: str | None, slots: dict[str, str]) -> str | None:
    if value is None:
        return None
    try:
        amount = parse_quantity("sharedMemory", value, SlotType.BYTES)
    except InvalidQuantityError as exc:
        raise InvalidInput(str(exc), field="sharedMemory") from exc
    if amount >= Decimal(slots["mem"]):
        raise InvalidInput("sharedMemory must be less than the session's mem", field="sharedMemory")
    return str(amount)


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


