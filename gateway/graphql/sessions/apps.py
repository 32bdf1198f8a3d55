"""GraphQL of a session's apps (``domain.apps``): the input that declares them, how sessions and templates show
them (``launchApp`` and ``setAppPublic`` are in ``app_mutations``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import strawberry

from domain.apps import App, AppProtocol, app_url, published_port, session_apps
from domain.model import Session as SessionModel
from gateway.graphql import fields
from gateway.graphql.context import Info

# The domain's enum is the GraphQL enum: strawberry.enum marks the class itself (and returns it).
strawberry.enum(
    AppProtocol,
    name="AppProtocol",
    description="HTTP (and WebSockets upgraded from it) and WEBSOCKET are proxied; TCP is published, not proxied.",
)


@strawberry.input(description="A named port of the main kernel that the gateway proxies (an app).")
class AppInput:
    name: str = strawberry.field(
        description="1-25 lower-case letters, digits or single '-', starting with a letter: part of the app's host."
    )
    port: int = strawberry.field(description="The port the kernel listens on (1-65535).")
    protocol: AppProtocol = strawberry.field(
        default=AppProtocol.HTTP,
        description="HTTP (and WebSockets upgraded from it), WEBSOCKET, or TCP (published, not proxied: no url).",
    )
    public: bool = strawberry.field(default=False, description="Reachable through the gateway without credentials.")
    preferred_port: int | None = strawberry.field(
        default=None,
        description="Try a preferred port: the host port to publish the app on, on the main kernel's node (for "
        "clients reaching the node directly, e.g. a TCP app), within 20000-32000 (Nomad's dynamic port range). "
        "If another allocation holds it there when the session is placed, the app gets another (dynamic) port and "
        "the app's preferredPortTaken says so.",
    )


@strawberry.type(description="An app as a template holds it.")
class AppSpec:
    name: str
    port: int
    protocol: AppProtocol
    public: bool
    preferred_port: int | None = None


@strawberry.type(
    description="A named port of the session's main kernel, proxied by the gateway on an origin of its own."
)
class SessionApp:
    name: str
    port: int
    protocol: AppProtocol
    public: bool
    session_id: strawberry.Private[str]
    preferred_port: int | None = strawberry.field(default=None, description="The host port asked for, if any.")
    preferred_port_taken: bool = strawberry.field(
        default=False,
        description="The preferred port was held by another allocation on the node when the session was placed: "
        "the app got another one (hostPort).",
    )
    host_port: int | None = strawberry.field(
        default=None,
        description="The host port the app is published on, on the main kernel's node (the preferred one when "
        "granted); null until Nomad allocated it.",
    )

    @fields.field(
        description="The app's address through the gateway (needs your token as a bearer, or the cookie of "
        "launchApp); null for TCP apps, which are not proxied."
    )
    def url(self, info: Info) -> str | None:
        return self._address(info)

    @fields.field(description="The url, when the owner made the app public (no credentials needed); else null.")
    def public_url(self, info: Info) -> str | None:
        return self._address(info) if self.public else None

    def _address(self, info: Info) -> str | None:
        """The app's gateway address, or None for a TCP app (not proxied)."""
        if self.protocol is AppProtocol.TCP:
            return None
        settings = info.context.settings
        return app_url(self.name, self.session_id, settings.gateway.apps_domain, settings.public_port)


@strawberry.type
class AppLaunch:
    url: str = strawberry.field(
        description="Open this in a browser: single use, it sets the app's cookie and redirects to the app."
    )
    expires_at: datetime = strawberry.field(description="The url is refused after this moment.")


def apps_of(inputs: Iterable[AppInput]) -> tuple[App, ...]:
    return tuple(App(a.name, a.port, a.protocol, a.public, a.preferred_port) for a in inputs)


def app_inputs_of(apps: Iterable[App]) -> list[AppInput]:
    return [
        AppInput(name=a.name, port=a.port, protocol=a.protocol, public=a.public, preferred_port=a.preferred_port)
        for a in apps
    ]


def app_specs_of(apps: Iterable[App]) -> list[AppSpec]:
    return [
        AppSpec(name=a.name, port=a.port, protocol=a.protocol, public=a.public, preferred_port=a.preferred_port)
        for a in apps
    ]


def session_app_types(session: SessionModel) -> list[SessionApp]:
    ports = session.main_kernel.ports if session.kernels else ()
    return [
        SessionApp(
            name=a.name,
            port=a.port,
            protocol=a.protocol,
            public=a.public,
            session_id=session.id,
            preferred_port=a.preferred_port,
            preferred_port_taken=a.name in session.preferred_ports_taken,
            host_port=published[1] if (published := published_port(ports, a.port)) else None,
        )
        for a in session_apps(session.apps, session.preopen_ports)
    ]
