"""A createSession request checked and turned into new sessions. Pure: no I/O.

Every rule a request can break is checked here, before anything is stored, and each failure
names the offending field so the caller can fix it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from common.errors import Forbidden, InvalidInput, UnsupportedResource
from common.model import Driver, Kernel, Session, SessionStatus, SessionType, StatusChange
from common.users import User
from scheduler.slots import INTRINSIC_SLOT_TYPES, InvalidQuantityError, SlotType, UnknownSlotError, from_user_input

NAME_RULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{2,62}[A-Za-z0-9_]$")
ENV_NAME_RULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
GROUP_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RESERVED_ENV_PREFIXES = ("CARAVAN_", "NOMAD_")
MAX_VALUE_BYTES = 32 * 1024
DEFAULT_RESOURCES = {"cpu": "1", "mem": "256m"}
MIN_MEM_BYTES = 16 * 1024 * 1024


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
    session_id = str(uuid.uuid4())
    kernel = Kernel(role="main", index=1, hostname="main1", image=image or "", resources=slots)
    return [
        Session(
            id=session_id,
            name=request.name,
            owner_id=viewer.id,
            type=request.type,
            driver=request.driver,
            image=image or "",
            resources=slots,
            kernels=(kernel,),
            created_at=now,
            status=SessionStatus.PENDING,
            status_info="created",
            status_history=(StatusChange(SessionStatus.PENDING, now, "created"),),
            resource_group=request.resource_group,
            startup_command=request.startup_command,
            environ=environ,
            client_token=request.client_token,
        )
    ]


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


