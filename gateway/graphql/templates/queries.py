"""Template queries: what the viewer may use."""

from __future__ import annotations

import strawberry

from core.errors import NotFound
from domain.templates import Template, may_use
from domain.users import User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.templates.types import SessionTemplate, template_type_of
from stores.templates import TemplateStore


async def usable(ctx: Context, template_id: str, viewer: User, field: str = "id") -> Template:
    """The template, when ``viewer`` may use it; NOT_FOUND (on ``field``) when it does not exist or is not theirs."""
    found = await TemplateStore(ctx.sessions.redis, ctx.sessions.keys).get(template_id)
    if found is None or not may_use(viewer, found):
        raise NotFound(f"no session template {template_id}", field=field)
    return found


@strawberry.type
class TemplateQueries:
    @fields.field(
        description="The session templates you may use: yours, your projects' (admins: also their "
        "members' personal ones), by name."
    )
    async def session_templates(self, info: Info) -> list[SessionTemplate]:
        ctx = info.context
        found = await TemplateStore(ctx.sessions.redis, ctx.sessions.keys).usable_by(ctx.viewer)
        return [template_type_of(t) for t in found]

    @fields.field(description="One session template; NOT_FOUND when it does not exist or you may not use it.")
    async def session_template(self, info: Info, id: strawberry.ID) -> SessionTemplate:
        return template_type_of(await usable(info.context, str(id), info.context.viewer))
