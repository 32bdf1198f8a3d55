"""Session templates: a named, stored set of creation parameters, overridable at creation.

A template is PERSONAL (its owner's; like any object of theirs, their project's admins reach it too) or PROJECT
(usable by every member of its project, written by the project's admins). Who may use and write which is decided
here, purely; the spec's values are checked by the gateway with the creation rules
(``domain.session_requests.check_request``) when the template is written, and again at every creation from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from core.codec import decode, encode
from core.keys import Keys
from core.replies import text_set
from domain.templates import Template, may_use
from domain.users import Role, User

# -- storage --


class TemplateStore:
    """Template documents plus the indexes a listing needs: by owner, by project, all."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def get(self, template_id: str) -> Template | None:
        raw = await self.redis.get(self.keys.template(template_id))
        return decode(raw, Template) if raw else None

    async def put(self, template: Template) -> None:
        """Create or replace (owner and project never change, so neither do the indexes)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.template(template.id), encode(template))
            pipe.sadd(self.keys.templates, template.id)
            pipe.sadd(self.keys.templates_of_owner(template.owner_id), template.id)
            pipe.sadd(self.keys.templates_of_project(template.project), template.id)
            await pipe.execute()

    async def delete(self, template: Template) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.template(template.id))
            pipe.srem(self.keys.templates, template.id)
            pipe.srem(self.keys.templates_of_owner(template.owner_id), template.id)
            pipe.srem(self.keys.templates_of_project(template.project), template.id)
            await pipe.execute()

    async def usable_by(self, viewer: User) -> list[Template]:
        """Every template ``viewer`` may use, by name: their own, their projects' (members' too, for an ADMIN)."""
        if viewer.role is Role.SUPERADMIN:
            ids = text_set(await self.redis.smembers(self.keys.templates))
        else:
            ids = text_set(
                await self.redis.sunion(
                    [
                        self.keys.templates_of_owner(viewer.id),
                        *(self.keys.templates_of_project(p) for p in viewer.projects),
                    ]
                )
            )
        found = await self._many(sorted(ids))
        return sorted((t for t in found if may_use(viewer, t)), key=lambda t: (t.name, t.id))

    async def _many(self, ids: Iterable[str]) -> list[Template]:
        ordered = list(ids)
        if not ordered:
            return []
        raws = await self.redis.mget([self.keys.template(i) for i in ordered])
        return [decode(raw, Template) for raw in raws if raw]
