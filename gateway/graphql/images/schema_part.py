"""Committed images: the type, ``sessionImages``, ``commitSession`` and ``deleteSessionImage``. The docker work runs
on the kernel's node as a short platform job the scheduler's job owner registers (``scheduler.image_owner``)."""

from __future__ import annotations

from datetime import datetime

import strawberry

from core.clock import utcnow
from core.errors import NotFound
from domain import images
from domain.images import ImageStatus, may_use_image, new_commit
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.sessions.queries import session_visible
from nomad_jobs.meta import TASK_NAME
from stores.images import ImageStore

strawberry.enum(
    ImageStatus,
    name="ImageStatus",
    description="COMMITTING: docker commit runs on the kernel's node; READY: usable as a session's image; "
    "FAILED: see statusInfo; DELETING: docker rmi runs.",
)


@strawberry.type(description="A session's docker kernel committed to a local image tag, owned by its user.")
class SessionImage:
    id: strawberry.ID
    ref: str = strawberry.field(description="The image reference to give createSession's image (docker).")
    owner_id: str
    session_id: str
    node_id: str = strawberry.field(description="The node whose Docker engine holds it.")
    status: ImageStatus
    status_info: str
    created_at: datetime


def image_type_of(i: images.CommittedImage) -> SessionImage:
    return SessionImage(
        id=strawberry.ID(i.id),
        ref=i.ref,
        owner_id=i.owner_id,
        session_id=i.session_id,
        node_id=i.node_id,
        status=i.status,
        status_info=i.status_info,
        created_at=i.created_at,
    )


def image_store(ctx: Context) -> ImageStore:
    return ImageStore(ctx.sessions.redis, ctx.sessions.keys)


@strawberry.type
class ImageQueries:
    @fields.field(description="Your committed images (admins: also their projects' members'), by reference.")
    async def session_images(self, info: Info) -> list[SessionImage]:
        found = await image_store(info.context).usable_by(info.context.viewer)
        return [image_type_of(i) for i in found]

    @fields.field(description="One committed image; NOT_FOUND when it does not exist or is not yours.")
    async def session_image(self, info: Info, id: strawberry.ID) -> SessionImage:
        found = await image_store(info.context).get(str(id))
        if found is None or not may_use_image(info.context.viewer, found):
            raise NotFound(f"no image {str(id)[:80]}", field="id")
        return image_type_of(found)


@strawberry.type
class ImageMutations:
    @fields.mutation(
        description="Commit a RUNNING docker session's main kernel to caravan/u/<owner>/<name>:<tag> on its node "
        "(caravan/x/<base32 of the owner id>/... for an id with upper-case letters; COMMITTING, then READY: see "
        "sessionImage). Only its owner, their project's admins and superadmins may use it. Other drivers: "
        "UNSUPPORTED_RESOURCE."
    )
    async def commit_session(self, info: Info, id: strawberry.ID, name: str, tag: str) -> SessionImage:
        ctx = info.context
        session = await ctx.sessions.get(str(id))
        if session is None or not session_visible(session, ctx.viewer):
            raise NotFound(f"no session {str(id)[:80]}", field="id")
        image = new_commit(session, name=name, tag=tag, task=TASK_NAME, now=utcnow())
        await image_store(ctx).ask(image)  # INVALID_INPUT if the reference is taken (by this owner: it is theirs)
        return image_type_of(image)

    @fields.mutation(
        description="Delete a committed image (docker rmi on its node); returns it DELETING. CONFLICT while it is "
        "still COMMITTING."
    )
    async def delete_session_image(self, info: Info, id: strawberry.ID) -> SessionImage:
        ctx = info.context
        found = await image_store(ctx).get(str(id))
        if found is None or not may_use_image(ctx.viewer, found):
            raise NotFound(f"no image {str(id)[:80]}", field="id")
        deleting = await image_store(ctx).ask_delete(found.id)
        if deleting is None:
            raise NotFound(f"no image {str(id)[:80]}", field="id")
        return image_type_of(deleting)
