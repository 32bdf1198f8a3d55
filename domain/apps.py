"""A session's apps: named ports the gateway proxies, their addresses, and where their traffic goes. Pure.

An app is a port of the session's main kernel, named (``web``, ``jupyter``), with the protocol it speaks. Every
app gets an **origin of its own** on the gateway: ``http://<app>--<session id>.<apps domain>:<gateway port>/``.
One origin per app (not one path per app under the gateway's origin) because a browser isolates origins: an app
cannot read another app's storage or non-HttpOnly cookies, nor call it with the user's credentials, and it never
shares an origin with the GraphQL endpoint. ``*.localhost`` resolves to the loopback address in browsers and curl,
so ``apps.localhost`` works with no DNS set-up; an operator serving other machines points a wildcard record at the
gateway and sets ``CARAVAN_APPS_DOMAIN``.

Preopened ports count as apps too: each is an HTTP app named ``p<port>`` unless a declared app has that port.

All app origins are subdomains of one site (``apps.localhost``, or the operator's wildcard domain), so a browser sends
an app's ``SameSite=Lax`` cookie along with requests that another app's page makes: the gateway itself refuses the
cookie of a request that does not come from the app's own origin (:func:`cookie_may_pass`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum

from core.errors import InvalidInput

MAX_APPS = 16
"""Apps one session may declare."""
APP_NAME_RULE = re.compile(r"^[a-z](?:[a-z0-9-]{0,23}[a-z0-9])?$")
"""A DNS label's letters (lower case, digits, '-'), 1-25 long: with ``--`` and a session id (36) it stays a label
(63 at most)."""
SEPARATOR = "--"
"""Between the app's name and the session id in an app's host name (so an app name never contains it)."""
PREFERRED_PORTS = range(20000, 32001)
"""Where a preferred host port may be: Nomad's dynamic port range (``min_dynamic_port``-``max_dynamic_port``, its
defaults), which Nomad tracks per node and none of the platform's own listeners use: a published port is forwarded on
the node to the kernel, so one outside it could shadow a service of the node's."""
SESSION_ID_RULE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class AppProtocol(StrEnum):
    HTTP = "HTTP"
    """HTTP, and WebSockets upgraded from it."""
    WEBSOCKET = "WEBSOCKET"
    """A WebSocket server (proxied exactly like HTTP: the upgrade is HTTP)."""
    TCP = "TCP"
    """Raw TCP: published on the kernel's Nomad host port, not proxied by the gateway (no URL)."""


@dataclass(frozen=True)
class App:
    name: str
    port: int
    """The port the kernel listens on inside its network namespace (1-65535)."""
    protocol: AppProtocol = AppProtocol.HTTP
    public: bool = False
    """Reachable through the gateway with no credentials (the owner's choice, ``setAppPublic``)."""
    preferred_port: int | None = None
    """The host port the owner would like the app published on, on the main kernel's node ("try preferred port"):
    what a client reaching the node directly (a TCP app: SSH, a database) would rather keep from one session to the
    next. Granted when no allocation holds it there as the session is placed, else the app gets a dynamic host port
    like any other and the session says so (:func:`grant_preferred_ports`). Within :data:`PREFERRED_PORTS`."""

    @property
    def proxied(self) -> bool:
        return self.protocol is not AppProtocol.TCP


def checked_apps(apps: Sequence[App], *, field: str = "apps") -> tuple[App, ...]:
    """``apps`` as a session keeps them, or INVALID_INPUT naming the field: names DNS-label-like and unique, ports
    1-65535 and unique, preferred host ports in :data:`PREFERRED_PORTS` and unique, at most :data:`MAX_APPS`."""
    if len(apps) > MAX_APPS:
        raise InvalidInput(f"at most {MAX_APPS} apps", field=field)
    names: set[str] = set()
    ports: set[int] = set()
    preferred: set[int] = set()
    for i, app in enumerate(apps):
        where = f"{field}[{i}]"
        if not APP_NAME_RULE.match(app.name) or SEPARATOR in app.name:
            raise InvalidInput(
                f"app name {app.name[:40]!r} must be 1-25 lower-case letters, digits or single '-', starting with a "
                "letter and not ending with '-'",
                field=f"{where}.name",
            )
        if not 1 <= app.port <= 65535:
            raise InvalidInput(f"app port {app.port} is outside 1-65535", field=f"{where}.port")
        if app.preferred_port is not None:
            if app.preferred_port not in PREFERRED_PORTS:
                raise InvalidInput(
                    f"preferred port {app.preferred_port} is outside {PREFERRED_PORTS.start}-{PREFERRED_PORTS.stop - 1}"
                    " (Nomad's dynamic port range)",
                    field=f"{where}.preferredPort",
                )
            if app.preferred_port in preferred:
                raise InvalidInput(
                    f"preferred port {app.preferred_port} is given twice", field=f"{where}.preferredPort"
                )
            preferred.add(app.preferred_port)
        if app.name in names:
            raise InvalidInput(f"app name {app.name!r} is given twice", field=f"{where}.name")
        if app.port in ports:
            raise InvalidInput(f"app port {app.port} is given twice", field=f"{where}.port")
        names.add(app.name)
        ports.add(app.port)
    return tuple(apps)


def session_apps(apps: Iterable[App], preopen_ports: Iterable[int]) -> tuple[App, ...]:
    """The declared apps, then one HTTP app ``p<port>`` per preopened port no declared app has."""
    declared = tuple(apps)
    taken = {a.port for a in declared}
    names = {a.name for a in declared}
    extra = tuple(App(f"p{p}", p) for p in preopen_ports if p not in taken and f"p{p}" not in names)
    return declared + extra


def grant_preferred_ports(apps: Iterable[App], in_use: Set[int]) -> tuple[dict[int, int], tuple[str, ...]]:
    """Which apps get their preferred host port on the node the main kernel is placed on, where ``in_use`` are the
    host ports held there: (container port -> granted host port, the names of the apps whose preferred port was
    taken, which get a dynamic one)."""
    granted: dict[int, int] = {}
    taken: list[str] = []
    for app in apps:
        if app.preferred_port is None:
            continue
        if app.preferred_port in in_use:
            taken.append(app.name)
        else:
            granted[app.port] = app.preferred_port
    return granted, tuple(taken)


def app_host(app: str, session_id: str, domain: str) -> str:
    """The host name of an app's origin (without the port)."""
    return f"{app}{SEPARATOR}{session_id}.{domain}"


def app_url(app: str, session_id: str, domain: str, gateway_port: int, scheme: str = "http") -> str:
    return f"{scheme}://{app_host(app, session_id, domain)}:{gateway_port}/"


def parse_app_host(host: str, domain: str) -> tuple[str, str] | None:
    """``(app, session id)`` of a ``Host`` header (port and case ignored), or None when it names no app origin of
    ``domain``."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower().rstrip(".")
    suffix = "." + domain.lower().strip(".")
    if not name.endswith(suffix):
        return None
    label = name[: -len(suffix)]
    app, sep, session_id = label.partition(SEPARATOR)
    if not sep or not APP_NAME_RULE.match(app) or not SESSION_ID_RULE.match(session_id):
        return None
    return app, session_id


def published_port(kernel_ports: Iterable[str], port: int) -> tuple[str, int] | None:
    """Where the kernel's ``port`` is reached from the gateway: the Nomad host address and port in
    ``Kernel.ports`` (``port=host:hostPort``), or None while Nomad has not allocated it."""
    for entry in kernel_ports:
        container, _, address = entry.partition("=")
        if container == str(port):
            host, _, host_port = address.rpartition(":")
            if host and host_port.isdigit():
                return host, int(host_port)
    return None


SAFE_METHODS = frozenset({"GET", "HEAD"})
"""Methods a browser may send without an ``Origin`` header (every other method, and every WebSocket, carries one)."""


def cookie_may_pass(
    *,
    host: str,
    method: str,
    websocket: bool,
    origin: str | None,
    fetch_site: str | None,
    fetch_mode: str | None,
    fetch_dest: str | None,
) -> bool:
    """Whether a request to the app at ``host`` (its ``Host`` header: name and port as the browser wrote them) may
    be authenticated by the app's cookie, judged from what the browser says of where the request comes from: its
    ``Origin`` and ``Sec-Fetch-Site``/``-Mode``/``-Dest`` headers (None: not sent). A page cannot set or change
    these headers; a request refused here is refused whatever cookie it carries. In order:

    1. An ``Origin`` other than ``null`` must name this host and port (the scheme is not compared: behind a TLS
       ingress the gateway may see plain HTTP). ``null`` (a sandboxed frame, or a page whose referrer policy hides
       its origin) decides nothing alone.
    2. With ``Sec-Fetch-Site`` (browsers send it to https and ``*.localhost`` origins): ``same-origin`` (the app's own
       pages) and ``none`` (typed address, bookmark) pass; ``same-site``/``cross-site`` only as a top-level
       navigation (``GET``, mode ``navigate``, destination ``document``: a link or a redirect to the app, as
       ``SameSite=Lax`` allows), never a frame, a subresource (``<img>``, ``<script>``, ``fetch``), a form POST or a
       WebSocket.
    3. Without it (an older browser, or plain http to another host), a WebSocket or a method other than GET/HEAD
       must have passed 1 with an ``Origin`` (browsers always send one then); a GET or HEAD without ``Origin`` passes
       (nothing tells it apart from a navigation: serve apps over https so browsers send ``Sec-Fetch-Site``).
    """
    if origin is not None and origin != "null" and not _same_host(origin, host):
        return False
    if fetch_site is not None:
        if fetch_site in ("same-origin", "none"):
            return True
        return (
            fetch_site in ("same-site", "cross-site")
            and not websocket
            and method == "GET"
            and fetch_mode == "navigate"
            and fetch_dest == "document"
        )
    if websocket or method not in SAFE_METHODS:
        return origin is not None and origin != "null"
    return True


def _same_host(origin: str, host: str) -> bool:
    """``origin`` (``scheme://host[:port]``) names ``host`` (a ``Host`` header), case aside."""
    scheme, sep, rest = origin.partition("://")
    return bool(sep and host) and scheme.lower() in ("http", "https") and rest.lower() == host.lower()
