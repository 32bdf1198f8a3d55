"""Inference endpoints' routes (domain.endpoint_routes): hosts, the pool's backends, server slots, the maps."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from domain.endpoint_routes import (
    TokenGrant,
    assign_backends,
    endpoint_host,
    endpoint_maps,
    live_endpoints,
    may_pass,
    parse_endpoint_host,
    place_servers,
    replica_started,
)
from domain.endpoint_series import STEP, EndpointPoint, due, point
from domain.model import Session, SessionStatus, SessionType
from tests.ingress import running_app


def inference(owner: str = "alice", *healthy: bool, status: SessionStatus = SessionStatus.RUNNING) -> Session:
    session = running_app(owner, 1)
    kernels = tuple(
        dataclasses.replace(session.kernels[0], index=i, hostname=f"main{i}", ports=(f"8000=127.0.0.1:{9000 + i}",),
                            healthy=h)
        for i, h in enumerate(healthy, start=1)
    )  # fmt: skip
    return session.evolve(type=SessionType.INFERENCE, service_port=8000, kernels=kernels, status=status, apps=())


def test_hosts_round_trip_and_never_overlap_app_origins() -> None:
    session_id = str(uuid.uuid4())
    host = endpoint_host(session_id, "apps.localhost")
    assert host == f"{session_id}.endpoints.apps.localhost"
    assert parse_endpoint_host(host.upper() + ":8420", "apps.localhost") == session_id
    assert parse_endpoint_host(f"web--{session_id}.apps.localhost", "apps.localhost") is None
    assert parse_endpoint_host(f"x.{session_id}.endpoints.apps.localhost", "apps.localhost") is None
    assert parse_endpoint_host("not-a-uuid.endpoints.apps.localhost", "apps.localhost") is None


def test_a_session_keeps_its_backend_and_a_freed_one_is_reused() -> None:
    assert assign_backends({}, ["a", "b"], 3) == {"a": 0, "b": 1}
    assert assign_backends({"a": 0, "b": 1}, ["b", "c", "d"], 3) == {"b": 1, "c": 0, "d": 2}
    assert assign_backends({"b": 1}, ["b", "c", "d"], 2) == {"b": 1, "c": 0}  # the pool is full: d has none
    assert assign_backends({"a": 5}, ["a"], 2) == {"a": 0}  # a pool that shrank


def test_a_replica_keeps_its_server_slot() -> None:
    placed = place_servers({}, ["h:1", "h:2"])
    assert (placed["r1"], placed["r2"], placed["r3"]) == ("h:1", "h:2", None)
    again = place_servers(placed, ["h:2", "h:3"])
    assert (again["r1"], again["r2"], again["r3"]) == ("h:3", "h:2", None)
    assert set(place_servers(again, []).values()) == {None}
    assert len([a for a in place_servers({}, [f"h:{i}" for i in range(40)]).values() if a]) == 16


def test_maps_name_only_live_endpoints_with_a_backend_and_their_tokens() -> None:
    first, second, ended = inference("alice", True), inference("bob", False), inference(status=SessionStatus.TERMINATED)
    other = running_app("carol", 2)  # an INTERACTIVE session has no endpoint
    live = live_endpoints([first, second, ended, other])
    assert set(live) == {first.id, second.id}
    backends = assign_backends({}, [first.id], 1)
    tokens = [TokenGrant("abc", first.id), TokenGrant("def", second.id), TokenGrant("bad hash", first.id)]
    maps = endpoint_maps(live, backends, {first.id}, tokens, "apps.localhost")
    host = endpoint_host(first.id, "apps.localhost")
    assert maps == {"endpoints": {host: "alice|default|1|ep0"}, "endpoint_tokens": {f"{host}|abc": "1"}}


def test_an_open_socket_passes_while_its_endpoint_token_public_flag_or_user_does() -> None:
    host = "s1.endpoints.apps.localhost"
    maps = {"endpoints": {host: "alice|p1|0|ep0"}, "endpoint_tokens": {f"{host}|h-ep": "1"}}
    users = {
        "tokens": {"h-alice": "alice", "h-bob": "bob", "h-root": "root", "h-carol": "carol"},
        "roles": {"root": "SUPERADMIN"},
        "admins": {"p1|carol": "1"},
    }
    cases = [
        (maps, None, "h-ep", True),  # an endpoint token of its own
        ({**maps, "endpoint_tokens": {}}, None, "h-ep", False),  # revoked
        (maps, "alice", "h-alice", True),  # the owner's API token
        (maps, "bob", "h-bob", False),  # another user's
        (maps, "root", "h-root", True),  # a superadmin
        (maps, "carol", "h-carol", True),  # the project's admin
        (maps, "alice", "h-gone", False),  # an API token revoked
        ({**maps, "endpoints": {host: "alice|p1|1|ep0"}}, None, None, True),  # public
        ({**maps, "endpoints": {}}, "alice", "h-alice", False),  # ended
    ]
    for held, user, token, passes in cases:
        assert may_pass(held, users, host, user, token) is passes, (user, token)


def test_a_series_point_is_the_mean_rate_over_its_step() -> None:
    assert not due(100.0, 104.9) and due(100.0, 100.0 + STEP)
    assert point(110.0, 100.0, 250, 200, 2, 3) == EndpointPoint(110.0, 5.0, 2, 3)
    assert point(110.0, 100.0, 10, 200, 1, 0).requests_per_second == 0.0  # HAProxy restarted: its counter dropped


def test_a_cold_start_is_stamped_with_the_first_routable_replicas_task_start() -> None:
    t1, t2, t3 = (datetime(2026, 11, 27, 10, 0, s, tzinfo=UTC) for s in (1, 2, 3))
    session = inference("alice", False, True, True)
    starts = (t1, t3, t2)  # main1 started first but does not pass its check: it made nothing routable
    kernels = tuple(dataclasses.replace(k, started_at=t) for k, t in zip(session.kernels, starts, strict=True))
    assert replica_started(session.evolve(kernels=kernels)) == t2.timestamp()
    assert replica_started(session) is None  # no task started yet
    assert replica_started(inference("alice", False)) is None  # nothing routable
