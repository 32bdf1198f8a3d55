"""The environment catalog (``domain.environments``): ``environments`` for everyone (the launcher's picker, with the
viewer's committed images as ``customized``), ``registerEnvironment`` and ``retireEnvironment`` for SUPERADMINs (the
catalog is global, like presets). Registration reads the image's labels from the gateway host's Docker engine
(``docker image inspect``): on this stack the engine that runs the sessions; elsewhere, build or pull the image there
before registering it."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import strawberry

from core.clock import utcnow
from core.errors import Forbidden, NotFound, Unavailable
from domain.docker_images import check_docker_image
from domain.environments import CUSTOMIZED, EnvironmentImage, environment_of
from domain.images import ImageStatus
from domain.users import Role, User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.sessions.apps import AppSpec, app_specs_of
from gateway.graphql.sessions.types import Resource
from stores.environments import EnvironmentStore
from stores.images import ImageStore

INSPECT_TIMEOUT = 20.0


@strawberry.type(description="One version of an environment: an image and what its labels declare.")
class EnvironmentVersion:
    tag: str
    image: str = strawberry.field(description="The reference to give createSession's image (docker driver).")
    apps: list[AppSpec] = strawberry.field(description="The apps a session of it gets when it declares none.")
    startup_command: str | None = strawberry.field(description="A session's startupCommand when it gives none.")
    min_resources: list[Resource] = strawberry.field(description="Less is refused (INVALID_INPUT on resources).")
    default_resources: list[Resource] = strawberry.field(description="What a session leaves out, before presets.")
    retired: bool = strawberry.field(description="Retired: listed to admins only; new sessions may not use it.")
    registered_at: datetime | None


@strawberry.type(description="A named environment and its versions, newest registration first.")
class Environment:
    name: str
    title: str
    description: str
    customized: bool = strawberry.field(description="Your committed images (commitSession), not the catalog's.")
    versions: list[EnvironmentVersion]


def version_of(e: EnvironmentImage) -> EnvironmentVersion:
    return EnvironmentVersion(
        tag=e.tag,
        image=e.image,
        apps=app_specs_of(e.apps),
        startup_command=e.startup_command,
        min_resources=[Resource(slot=k, amount=v) for k, v in e.min_resources.items()],
        default_resources=[Resource(slot=k, amount=v) for k, v in e.default_resources.items()],
        retired=e.retired,
        registered_at=e.registered_at,
    )


def catalog_of(entries: list[EnvironmentImage]) -> list[Environment]:
    by_name: dict[str, list[EnvironmentImage]] = {}
    for entry in entries:
        by_name.setdefault(entry.name, []).append(entry)
    found = []
    for name, versions in sorted(by_name.items()):
        versions.sort(key=lambda e: (e.registered_at.timestamp() if e.registered_at else 0.0, e.tag), reverse=True)
        newest = versions[0]
        found.append(
            Environment(
                name=name,
                title=newest.title or name,
                description=newest.description,
                customized=False,
                versions=[version_of(v) for v in versions],
            )
        )
    return found


def store_of(ctx: Context) -> EnvironmentStore:
    return EnvironmentStore(ctx.sessions.redis, ctx.sessions.keys)


def _superadmin(viewer: User) -> None:
    if viewer.role is not Role.SUPERADMIN:
        raise Forbidden("the environment catalog is global: only a SUPERADMIN registers or retires environments")


async def image_labels(image: str) -> dict[str, str]:
    """The labels of ``image`` in the gateway host's Docker engine; NOT_FOUND (on ``image``) when the engine does not
    have it, UNAVAILABLE when there is no engine to ask."""
    try:
        process = await asyncio.create_subprocess_exec(
            "docker",
            "image",
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            "--",
            image,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(INSPECT_TIMEOUT):
            out, err = await process.communicate()
    except (OSError, TimeoutError) as exc:
        raise Unavailable(f"the Docker engine cannot be asked for {image}'s labels: {exc}") from exc
    if process.returncode != 0:
        message = err.decode(errors="replace").strip()
        if "No such image" in message or "no such image" in message.lower():
            raise NotFound(
                f"the Docker engine has no image {image}: build it (ops/build-env-images) or load it first",
                field="image",
            )
        raise Unavailable(f"the Docker engine did not answer for {image}: {message[:200]}")
    labels = json.loads(out or b"null") or {}
    return {str(k): str(v) for k, v in labels.items()}


@strawberry.type
class EnvironmentQueries:
    @fields.field(
        description="The environments you may launch, each with its versions (tags); your committed images are the "
        "environment 'customized'. Admins may ask for retired versions too."
    )
    async def environments(self, info: Info, include_retired: bool = False) -> list[Environment]:
        ctx = info.context
        show_retired = include_retired and ctx.viewer.role is Role.SUPERADMIN
        catalog = await store_of(ctx).all()
        found = catalog_of([e for e in catalog.values() if show_retired or not e.retired])
        committed = [
            i
            for i in await ImageStore(ctx.sessions.redis, ctx.sessions.keys).usable_by(ctx.viewer)
            if i.status is ImageStatus.READY
        ]
        if committed:
            versions = []
            for image in committed:  # each as the catalog entry of the image its session ran (its labels came along)
                base = catalog.get(image.base_image) or EnvironmentImage(image=image.ref, name=CUSTOMIZED, tag="")
                tag = image.ref.rsplit(":", 1)[-1]
                version = version_of(
                    base.evolve(image=image.ref, tag=tag, retired=False, registered_at=image.created_at)
                )
                versions.append(version)
            found.append(
                Environment(
                    name=CUSTOMIZED,
                    title="Customized",
                    description="Images committed from sessions (commitSession)",
                    customized=True,
                    versions=versions,
                )
            )
        return found


@strawberry.type
class EnvironmentMutations:
    @fields.mutation(
        description="SUPERADMIN: add a docker image to the catalog, its apps, startup command and resources read from "
        "its labels (ai.caravan.apps, ...); name overrides its ai.caravan.environment label. INVALID_INPUT for a "
        "reference that is not pinned Docker grammar or labels that do not read, NOT_FOUND when the engine lacks "
        "the image, CONFLICT when it is registered already; a retired image comes back with its labels read again."
    )
    async def register_environment(self, info: Info, image: str, name: str | None = None) -> EnvironmentVersion:
        ctx = info.context
        _superadmin(ctx.viewer)
        check_docker_image(image, ("*",))  # Docker's grammar and a fixed tag; any namespace an admin trusts
        entry = environment_of(image, await image_labels(image), now=utcnow(), name=name)
        return version_of(await store_of(ctx).register(entry))

    @fields.mutation(
        description="SUPERADMIN: retire (retired: true) a catalog image: no longer listed, new sessions naming it "
        "are refused (INVALID_INPUT on image); running sessions go on. retired: false brings it back. NOT_FOUND "
        "when it is not in the catalog."
    )
    async def retire_environment(self, info: Info, image: str, retired: bool = True) -> EnvironmentVersion:
        ctx = info.context
        _superadmin(ctx.viewer)
        return version_of(await store_of(ctx).set_retired(image, retired))
