"""Inference endpoints as the data plane (HAProxy) routes them: one stable host per INFERENCE session, the backend of
HAProxy's pool it has, the replicas in that backend's server slots, who may pass. Pure: no I/O.

- **The host.** ``<session id>.endpoints.<apps domain>`` (``endpoint_host``): host-based like the apps' origins, on
  the same port, under a label of its own (``endpoints``) so that no app origin (``<app>--<session id>.<apps
  domain>``) is ever one, and the other way round.
- **Backends.** HAProxy cannot add a backend at run time, so its configuration declares a pool of them
  (``ep0`` … ``ep<N-1>``, ``CARAVAN_ENDPOINT_BACKENDS``), each with :data:`domain.inference.MAX_REPLICAS` server
  slots (``r1`` …) in maintenance and the activator as a backup server. Each live INFERENCE session holds one
  backend (``assign_backends``: a session keeps the one it has; a freed one is reused); its routable replicas
  (``domain.inference.endpoints_of``, the one predicate of which replicas get traffic) fill its slots
  (``place_servers``: a replica keeps its slot, so its connections and counters stay), the rest in maintenance.
- **Who passes.** ``endpoints`` map: host -> ``owner|project|public|backend``; ``endpoint_tokens`` map:
  ``host|<SHA-256 of a token>`` -> 1 for each live endpoint token. A private endpoint lets through an endpoint token
  of its own, or the API token of a user who may see the session (owner, project admin, superadmin: as the apps);
  a public one anyone. A session with no backend (pool exhausted) is absent: nobody passes (fail closed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from domain.app_routes import FIELD, Maps, user_passes
from domain.apps import SESSION_ID_RULE
from domain.inference import MAX_REPLICAS, endpoints_of, is_inference, takes_traffic
from domain.model import Session

LABEL = "endpoints"
"""The label between an endpoint's session id and the apps' domain."""
ENDPOINT_MAPS = ("endpoints", "endpoint_tokens")
BACKEND_PREFIX = "ep"
SERVER_PREFIX = "r"
SERVER_SLOTS = MAX_REPLICAS
_WORD = re.compile(r"^[^\s|]+$")


def endpoint_host(session_id: str, apps_domain: str) -> str:
    return f"{session_id}.{LABEL}.{apps_domain.strip('.').lower()}"


def endpoint_url(session_id: str, apps_domain: str, port: int, scheme: str = "http") -> str:
    return f"{scheme}://{endpoint_host(session_id, apps_domain)}:{port}/"


def parse_endpoint_host(host: str, apps_domain: str) -> str | None:
    """The session id a ``Host`` header names as an endpoint (port and case ignored), or None."""
    name = (host.rsplit(":", 1)[0] if not host.endswith("]") else host).lower().rstrip(".")
    suffix = f".{LABEL}.{apps_domain.strip('.').lower()}"
    if not name.endswith(suffix):
        return None
    session_id = name[: -len(suffix)]
    return session_id if SESSION_ID_RULE.match(session_id) else None


def host_pattern(apps_domain: str) -> str:
    """A regular expression of the endpoint host names ``parse_endpoint_host`` accepts (lower case, no port)."""
    return SESSION_ID_RULE.pattern.strip("^$") + re.escape(f".{LABEL}.{apps_domain.strip('.').lower()}")


def backend_name(slot: int) -> str:
    return f"{BACKEND_PREFIX}{slot}"


def server_names() -> tuple[str, ...]:
    return tuple(f"{SERVER_PREFIX}{i}" for i in range(1, SERVER_SLOTS + 1))


def live_endpoints(sessions: Iterable[Session]) -> dict[str, Session]:
    """Session id -> session, of every live INFERENCE session whose ids fit in a map (one word, no ``|``)."""
    return {
        s.id: s
        for s in sessions
        if is_inference(s) and not s.status.is_terminal and all(_WORD.match(v) for v in (s.id, s.owner_id, s.project))
    }


def assign_backends(current: Mapping[str, int], wanted: Iterable[str], pool: int) -> dict[str, int]:
    """Session id -> backend slot (0 … ``pool``-1) for each of ``wanted``: one it holds in ``current`` stays; the
    others take the free slots in order (the oldest request first: ``wanted``'s order); beyond ``pool``, none."""
    wanted = list(wanted)
    keep = {s: b for s, b in current.items() if s in wanted and 0 <= b < pool}
    free = iter(sorted(set(range(pool)) - set(keep.values())))
    for session_id in wanted:
        if session_id not in keep:
            slot = next(free, None)
            if slot is None:
                break
            keep[session_id] = slot
    return keep


def place_servers(current: Mapping[str, str | None], replicas: Iterable[str]) -> dict[str, str | None]:
    """Server slot name -> ``host:port`` (None: in maintenance) for one backend: a replica already in a slot keeps it,
    the new ones take the free slots in order; at most :data:`SERVER_SLOTS`."""
    wanted = list(dict.fromkeys(replicas))
    placed: dict[str, str | None] = {name: None for name in server_names()}
    for name, held in current.items():
        if name in placed and held in wanted and held not in placed.values():
            placed[name] = held
    free = [name for name in server_names() if placed[name] is None]
    for address in wanted:
        if address not in placed.values():
            if not free:
                break
            placed[free.pop(0)] = address
    return placed


@dataclass(frozen=True)
class TokenGrant:
    """A live endpoint token as the data plane sees it: the SHA-256 (hex) of its secret and its endpoint."""

    token_hash: str
    session_id: str


def endpoint_maps(
    endpoints: Mapping[str, Session],
    backends: Mapping[str, int],
    public: Iterable[str],
    tokens: Iterable[TokenGrant],
    apps_domain: str,
) -> Maps:
    """``endpoints`` (host -> ``owner|project|public|backend``) of every live endpoint that has a backend, and
    ``endpoint_tokens`` (``host|token hash`` -> 1) of the live tokens of those endpoints."""
    public = set(public)
    hosts = {}
    for session_id, slot in backends.items():
        session = endpoints.get(session_id)
        if session is None:
            continue
        flag = "1" if session_id in public else "0"
        hosts[endpoint_host(session_id, apps_domain)] = FIELD.join(
            (session.owner_id, session.project, flag, backend_name(slot))
        )
    granted = {
        f"{endpoint_host(t.session_id, apps_domain)}{FIELD}{t.token_hash}": "1"
        for t in tokens
        if t.session_id in backends and t.session_id in endpoints and _WORD.match(t.token_hash)
    }
    return {"endpoints": hosts, "endpoint_tokens": granted}


def routable(session: Session) -> tuple[str, ...]:
    """The replicas that may get traffic: ``domain.inference.endpoints_of``, the one predicate."""
    return endpoints_of(session)


def replica_started(session: Session) -> float | None:
    """When the first replica that takes traffic started its task (unix seconds; None: none has): for a cold start,
    the moment its allocation was placed and running, between the request's arrival and the replica's check passing."""
    started = [k.started_at.timestamp() for k in session.kernels if takes_traffic(k) and k.started_at is not None]
    return min(started, default=None)


def may_pass(maps: Maps, users: Maps, host: str, user: str | None, token_hash: str | None) -> bool:
    """Whether HAProxy, holding the endpoint maps ``maps`` and the apps' user maps ``users``, lets a request with the
    token ``token_hash`` (of ``user``, None: not an API token) through to the endpoint ``host``: the rule of
    ``gateway.endpoints.ingress``, for what stays open (a WebSocket is admitted once; the endpoint control plane
    closes it when this turns false)."""
    info = maps.get("endpoints", {}).get(host)
    if info is None:
        return False
    owner, project, public = (info.split(FIELD) + ["", "", ""])[:3]
    if public == "1" or (token_hash and f"{host}{FIELD}{token_hash}" in maps.get("endpoint_tokens", {})):
        return True
    return user_passes(users, owner, project, user, token_hash)
