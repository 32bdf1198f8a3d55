"""``launchApp`` and ``setAppPublic``: a browser's way into an app, and the owner's switch for a public app."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import strawberry

from core.clock import utcnow
from core.errors import InvalidInput, NotFound, Unauthenticated
from domain.apps import App, app_host, app_url, session_apps
from domain.model import Session as SessionModel
from gateway.apps.ingress_config import LAUNCH_PATH
from gateway.auth import header_token
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.sessions.apps import AppLaunch, SessionApp, session_app_types
from gateway.graphql.sessions.queries import session_visible
from stores.app_access import LAUNCH_TTL, AppAccessStore


def _find(apps: Sequence[App], name: str) -> App:
    for app in apps:
        if app.name == name:
            return app
    raise NotFound(f"the session has no app {name[:40]!r}", field="app")


async def _visible_session(ctx: Context, session_id: str) -> SessionModel:
    found = await ctx.sessions.get(session_id)
    if found is None or not session_visible(found, ctx.viewer):
        raise NotFound(f"no session {session_id}", field="sessionId")
    return found


@strawberry.type
class AppMutations:
    @fields.mutation(
        description="A one-time browser address that opens an app: the gateway exchanges its code (valid a minute, "
        "single use; never your token) for an HttpOnly cookie valid on that app's origin only."
    )
    async def launch_app(self, info: Info, session_id: strawberry.ID, app: str) -> AppLaunch:
        ctx = info.context
        session = await _visible_session(ctx, str(session_id))
        found = _find(session_apps(session.apps, session.preopen_ports), app)
        if not found.proxied:
            raise InvalidInput(f"app {app!r} is TCP: the gateway does not proxy it", field="app")
        token = ctx.token or header_token(ctx.request.headers)
        if not token:
            raise Unauthenticated("launchApp needs your API token")
        gateway = ctx.settings.gateway
        store = AppAccessStore(ctx.sessions.redis, ctx.sessions.keys)
        code = await store.new_launch_code(token, app_host(found.name, session.id, gateway.apps_domain))
        base = app_url(found.name, session.id, gateway.apps_domain, ctx.settings.public_port).rstrip("/")
        return AppLaunch(url=f"{base}{LAUNCH_PATH}?code={code}", expires_at=utcnow() + timedelta(seconds=LAUNCH_TTL))

    @fields.mutation(
        description="Make an app public (its url needs no credentials: publicUrl) or private again. The owner and "
        "the project's admins only."
    )
    async def set_app_public(self, info: Info, session_id: strawberry.ID, app: str, public: bool) -> SessionApp:
        ctx = info.context
        session = await _visible_session(ctx, str(session_id))
        declared = _find(session_apps(session.apps, session.preopen_ports), app)

        changed = replace(declared, public=public)  # its preferred port kept

        def mutate(before: SessionModel) -> SessionModel:
            apps = tuple(changed if a.name == changed.name else a for a in before.apps)
            if changed not in apps:  # a preopened port's app: declared from now on
                apps = (*apps, changed)
            return before.evolve(apps=apps)

        after = await ctx.sessions.update(session.id, mutate)
        if after is None:
            raise NotFound(f"no session {session_id}", field="sessionId")
        return next(a for a in session_app_types(after) if a.name == declared.name)
