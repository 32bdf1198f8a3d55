"""Sessions committed to images (pure): ``commitSession`` snapshots a docker kernel's container into a local image
tag owned by the user, made on the node that runs the kernel by a short platform job (``nomad_jobs.commit_job``)
that the scheduler's job owner registers (``scheduler.image_owner``).

Who may use one (``may_use_image``, ``domain.access``'s rule for any object): its owner, the ADMINs of its project,
SUPERADMINs. Anyone else is told NOT_FOUND, as for an image that does not exist, wherever a reference is read:
``sessionImage``, ``deleteSessionImage``, and every session image a creation names (``check_image_use``: at
createSession, a template's save and every creation from it, a schedule's creation and each of its runs). A session
made for another user (a SUPERADMIN's ``owner``) needs both to be allowed.

References are injective (``image_ref``): ``caravan/u/<owner id>/<name>:<tag>`` when the owner's id is already a
Docker path component (lower-case), else ``caravan/x/<base32 of the id>/<name>:<tag>``; names are Docker path
components, so no two (owner, name, tag) share a reference and one user's commit never replaces another's image.
Images committed before this scheme (``caravan/u-<mangled owner>-<name>:<tag>``, which collided) stay usable through
their stored record by whom it allows.

Lifecycle: COMMITTING -> READY (usable as a session's image) or FAILED (status_info says why); a delete asks for
DELETING, and the image is forgotten once ``docker rmi`` ran on its node.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from docker_image.reference import InvalidReference, Reference

from core.errors import InvalidInput, NotFound, UnsupportedResource
from domain.access import can_access
from domain.model import Driver, Session, SessionStatus
from domain.users import User

PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
"""A path component of a Docker reference (``github.com/distribution/reference``)."""
IMAGE_NAME_RULE = re.compile(rf"^(?=.{{1,40}}$){PATH_COMPONENT}$")
OWNER_AS_IS = re.compile(rf"^{PATH_COMPONENT}$")
TAG_RULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
NAMESPACE = "caravan"
"""Committed images are ``caravan/u/<owner>/<name>:<tag>`` (or ``caravan/x/...``): inside the default allowlist."""
COMMITTED = (f"{NAMESPACE}/u/", f"{NAMESPACE}/x/")
LEGACY = f"{NAMESPACE}/u-"
"""References of images committed before references were injective: resolved through their owners' records."""


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
    base_image: str = ""
    """The image the session ran: a committed image keeps its labels, so it serves the apps of that image's catalog
    entry (``domain.environments``); "" for images committed before it was kept."""

    def evolve(self, **changes: Any) -> CommittedImage:
        return replace(self, **changes)


def image_ref(owner_id: str, name: str, tag: str) -> str:
    """The reference of ``owner_id``'s image ``name``:``tag``; distinct (owner, name, tag) give distinct ones."""
    if not IMAGE_NAME_RULE.match(name):
        raise InvalidInput(
            "an image name is 1-40 lower-case letters and digits, separated by one '.' or '_', two '_', or '-'s",
            field="name",
        )
    if not TAG_RULE.match(tag) or tag == "latest":
        raise InvalidInput("a tag is 1-64 letters, digits, '_', '.', '-' (not 'latest')", field="tag")
    if OWNER_AS_IS.match(owner_id):
        return f"{COMMITTED[0]}{owner_id}/{name}:{tag}"
    encoded = base64.b32encode(owner_id.encode()).decode().lower().rstrip("=")  # [a-z2-7]+: a path component
    return f"{COMMITTED[1]}{encoded}/{name}:{tag}"


def committed_key(reference: str) -> str | None:
    """The stored ``ref`` a Docker image ``reference`` names if it is in the committed images' namespace, however it
    is written (``docker.io/`` in front); None: it names no committed image. With a digest it names none that is
    stored, and is returned as it is (found nowhere)."""
    try:
        parsed = Reference.parse_normalized_named(reference)
    except InvalidReference:
        return None
    name = str(parsed["name"]).removeprefix("docker.io/")
    if not name.startswith((*COMMITTED, LEGACY)):
        return None
    if parsed["digest"] or not parsed["tag"]:
        return reference
    return f"{name}:{parsed['tag']}"


def check_image_use(
    reference: str, found: Mapping[str, Sequence[CommittedImage]], user: User, *, field: str = "image"
) -> None:
    """Refuse a session image in the committed namespace that ``user`` may not use: NOT_FOUND (on ``field``) when
    none of the records ``found`` for it (``stores.images.ImageStore.named``) is theirs to use, exactly as for one
    that does not exist; INVALID_INPUT when theirs is not READY."""
    key = committed_key(reference)
    if key is None:
        return
    usable = [i for i in found.get(key, ()) if may_use_image(user, i)]
    if not usable:
        raise NotFound(f"there is no committed image {reference[:120]!r} you may use", field=field)
    if not any(i.status is ImageStatus.READY for i in usable):
        raise InvalidInput(f"image {key} is {usable[0].status.value}, not READY", field=field)


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
        base_image=session.image,
    )


def may_use_image(viewer: User, image: CommittedImage) -> bool:
    return can_access(viewer, image.owner_id, image.project)
