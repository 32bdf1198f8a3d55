"""Sessions committed to images (pure): ``commitSession`` snapshots a docker kernel's container into a local image
tag owned by the user, made on the node that runs the kernel by a short platform job (``nomad_jobs.commit_job``)
that the scheduler's job owner registers (``scheduler.image_owner``). Its owner (and their project's admins) list,
use and delete it; anyone else is told NOT_FOUND.

Lifecycle: COMMITTING -> READY (usable as a session's image) or FAILED (status_info says why); a delete asks for
DELETING, and the image is forgotten once ``docker rmi`` ran on its node.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from core.errors import InvalidInput, UnsupportedResource
from domain.access import can_access
from domain.model import Driver, Session, SessionStatus
from domain.users import User

IMAGE_NAME_RULE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,38}[a-z0-9])?$")
TAG_RULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
NAMESPACE = "caravan"
"""Committed images are ``caravan/u-<owner>-<name>:<tag>``: inside the default Docker image allowlist."""


class ImageStatus(StrEnum):
    COMMITTING = "COMMITTING"
    READY = "READY"
    FAILED = "FAILED"
    DELETING = "DELETING"


@dataclass(frozen=True)
class CommittedImage:
    id: str
    ref: str
    """The Docker reference sessions name as their image."""
    owner_id: str
    project: str
    session_id: str
    node_id: str
    """The node whose Docker engine holds it (sessions using it run there)."""
    container: str
    """The kernel's container (Nomad's docker driver names it ``<task>-<allocation id>``)."""
    created_at: datetime
    status: ImageStatus = ImageStatus.COMMITTING
    status_info: str = ""

    def evolve(self, **changes: Any) -> CommittedImage:
        return replace(self, **changes)


def image_ref(owner_id: str, name: str, tag: str) -> str:
    if not IMAGE_NAME_RULE.match(name):
        raise InvalidInput("an image name is 1-40 lower-case letters, digits, '.', '_', '-'", field="name")
    if not TAG_RULE.match(tag) or tag == "latest":
        raise InvalidInput("a tag is 1-64 letters, digits, '_', '.', '-' (not 'latest')", field="tag")
    owner = re.sub(r"[^a-z0-9]+", "-", owner_id.lower()).strip("-")[:40] or "user"
    return f"{NAMESPACE}/u-{owner}-{name}:{tag}"


def new_commit(session: Session, *, name: str, tag: str, task: str, now: datetime) -> CommittedImage:
    """The image ``session``'s main kernel becomes, if it can: a RUNNING docker kernel (else a clear error)."""
    if session.driver is not Driver.DOCKER:
        raise UnsupportedResource(
            f"only docker kernels can be committed; this session runs on {session.driver.value}", field="id"
        )
    kernel = session.main_kernel
    if session.status is not SessionStatus.RUNNING or kernel.alloc_id is None or kernel.agent is None:
        raise InvalidInput(f"only a RUNNING session can be committed; this one is {session.status.value}", field="id")
    return CommittedImage(
        id=str(uuid.uuid4()),
        ref=image_ref(session.owner_id, name, tag),
        owner_id=session.owner_id,
        project=session.project,
        session_id=session.id,
        node_id=kernel.agent,
        container=f"{task}-{kernel.alloc_id}",
        created_at=now,
    )


def may_use_image(viewer: User, image: CommittedImage) -> bool:
    return can_access(viewer, image.owner_id, image.project)
