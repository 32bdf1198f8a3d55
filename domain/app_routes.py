"""What the data plane (HAProxy, ``gateway.apps.ingress_config``) must know to route and admit app requests: its maps'
contents, computed from the sessions, users and tokens, and the edits that turn one content into another. Pure.

A map's key and value are single words (HAProxy's runtime API and map files split on whitespace); an entry whose
ids contain whitespace or ``|`` (never produced by Caravan's own rules) is left out: such a request is refused
(fail closed), never misrouted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from domain.apps import app_host, published_port, session_apps
from domain.model import Session, SessionStatus
from domain.users import Role, User

Maps = dict[str, dict[str, str]]
"""Map name (``hosts``, ``routes``, ``tokens``, ``roles``, ``admins``) -> key -> value."""
FIELD = "|"
"""Between the fields of one value (and of the ``admins`` key)."""
FIELD_OF_ROUTE = ":"
"""Between the fields of a route (``address:port[:starting]``: HAProxy's ``field(n,:)`` reads them)."""
SESSION_MAPS = ("hosts", "routes")
USER_MAPS = ("tokens", "roles", "admins")
_WORD = re.compile(r"^[^\s|]+$")


@dataclass(frozen=True)
class TokenEntry:
    """A live API token as the data plane sees it: the SHA-256 (hex) of its secret, its user, its expiry."""

    token_hash: str
    user_id: str
    expires_at: datetime | None


def _words(*values: str) -> bool:
    return all(_WORD.match(v) for v in values)


STARTING = "starting"
"""The third field of a route (``address:port:starting``) to an app whose session is still starting: HAProxy tries
its connect until the app listens, and answers ``APP_NOT_READY`` rather than ``UPSTREAM_UNREACHABLE`` when its tries
run out (``gateway.apps.ingress_config``)."""


def session_maps(sessions: Iterable[Session], apps_domain: str) -> Maps:
    """``hosts`` (app host -> ``owner|project|public``) for every proxied app of every live session, and ``routes``
    (app host -> ``address:port``, :func:`upstream`) for those whose port Nomad published to a live allocation."""
    hosts: dict[str, str] = {}
    routes: dict[str, str] = {}
    for session in sessions:
        if session.status.is_terminal or not _words(session.owner_id, session.project):
            continue
        for app in session_apps(session.apps, session.preopen_ports):
            if not app.proxied:
                continue
            host = app_host(app.name, session.id, apps_domain)
            hosts[host] = FIELD.join((session.owner_id, session.project, "1" if app.public else "0"))
            if (route := upstream(session, app.port)) is not None:
                routes[host] = route
    return {"hosts": hosts, "routes": routes}


def upstream(session: Session, port: int) -> str | None:
    """Where an app of ``session`` listening on ``port`` is reached: ``address:port`` of a RUNNING session's main
    kernel; ``address:port:starting`` of a PREPARING session whose main kernel's allocation is placed and starting
    (its ports are that allocation's: Nomad assigns them at placement). The route from placement on is what lets an
    app answer as soon as it listens, not after Nomad's client reports the allocation running (up to a second later:
    it sends a new allocation's updates on every fifth 200 ms tick). None: not routed (``APP_NOT_READY``)."""
    kernel = session.main_kernel
    if session.status is SessionStatus.RUNNING:
        suffix = ""
    elif session.status is SessionStatus.PREPARING and kernel.status is SessionStatus.PREPARING and kernel.alloc_id:
        suffix = FIELD_OF_ROUTE + STARTING
    else:
        return None
    published = published_port(kernel.ports, port)
    if published is None or not _words(published[0]):
        return None
    return f"{published[0]}:{published[1]}{suffix}"


def user_maps(users: Iterable[User], tokens: Iterable[TokenEntry], now: datetime) -> Maps:
    """``tokens`` (token hash -> user id) of active users' unexpired tokens, ``roles`` (superadmins) and ``admins``
    (``project|user`` of each project an ADMIN administers)."""
    active = {u.id: u for u in users if u.active and _words(u.id)}
    found = {
        t.token_hash: t.user_id
        for t in tokens
        if t.user_id in active and (t.expires_at is None or t.expires_at > now) and _words(t.token_hash)
    }
    roles = {u.id: Role.SUPERADMIN.value for u in active.values() if u.role is Role.SUPERADMIN}
    admins = {
        f"{p}{FIELD}{u.id}": "1" for u in active.values() if u.role is Role.ADMIN for p in u.projects if _words(p)
    }
    return {"tokens": found, "roles": roles, "admins": admins}


def next_expiry(tokens: Iterable[TokenEntry], now: datetime) -> datetime | None:
    """When the next of ``tokens`` expires (its entry must then go), if any does after ``now``."""
    return min((t.expires_at for t in tokens if t.expires_at is not None and t.expires_at > now), default=None)


@dataclass(frozen=True)
class Edits:
    """What turns one map's content into another: entries to add, to change, to delete."""

    add: dict[str, str]
    change: dict[str, str]
    delete: list[str]

    def __bool__(self) -> bool:
        return bool(self.add or self.change or self.delete)


def edits(current: Mapping[str, str], desired: Mapping[str, str]) -> Edits:
    return Edits(
        add={k: v for k, v in desired.items() if k not in current},
        change={k: v for k, v in desired.items() if k in current and current[k] != v},
        delete=sorted(k for k in current if k not in desired),
    )


def may_pass(maps: Maps, host: str, user: str | None, token_hash: str | None) -> bool:
    """Whether HAProxy, holding ``maps``, lets ``user`` (None: no credentials) with the token ``token_hash`` through
    to ``host``: the rule ``gateway.apps.ingress_config`` writes in HAProxy's terms, for what stays open (a
    WebSocket is admitted once; the control plane closes it when this turns false)."""
    info = maps.get("hosts", {}).get(host)
    if info is None or host not in maps.get("routes", {}):
        return False
    owner, project, public = (info.split(FIELD) + ["", "", ""])[:3]
    return public == "1" or user_passes(maps, owner, project, user, token_hash)


def user_passes(maps: Maps, owner: str, project: str, user: str | None, token_hash: str | None) -> bool:
    """Whether ``user``, with the API token ``token_hash``, may reach a private object of ``owner`` in ``project``
    by the user maps (``USER_MAPS``) HAProxy holds: its owner, a superadmin, an admin of the project."""
    if not user or not token_hash or maps.get("tokens", {}).get(token_hash) != user:
        return False
    return (
        user == owner
        or maps.get("roles", {}).get(user) == Role.SUPERADMIN.value
        or f"{project}{FIELD}{user}" in maps.get("admins", {})
    )
