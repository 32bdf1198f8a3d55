"""What HAProxy's maps hold (domain/app_routes.py): computed from sessions, users and tokens; edits between two
contents; who an open WebSocket still lets through. Pure."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from domain.app_routes import TokenEntry, edits, may_pass, next_expiry, session_maps, user_maps
from domain.apps import App, AppProtocol
from domain.model import SessionStatus
from domain.users import Role, User
from tests.ingress import running_app

NOW = datetime(2026, 11, 27, tzinfo=UTC)
DOMAIN = "apps.localhost"


def test_hosts_for_live_sessions_routes_for_running_ones() -> None:
    running = running_app("alice", 31000, public=True)
    pending = dataclasses.replace(running_app("bob", 31001), status=SessionStatus.PENDING)
    ended = dataclasses.replace(running_app("carol", 31002), status=SessionStatus.TERMINATED)
    tcp = dataclasses.replace(running_app("dave", 31003), apps=(App("raw", 8080, AppProtocol.TCP),))
    odd = dataclasses.replace(running_app("eve has spaces", 31004))
    maps = session_maps([running, pending, ended, tcp, odd], DOMAIN)
    host = f"web--{running.id}.{DOMAIN}"
    assert maps["hosts"] == {host: "alice|default|1", f"web--{pending.id}.{DOMAIN}": "bob|default|0"}
    assert maps["routes"] == {host: "127.0.0.1:31000"}  # a PENDING session has a host (404 vs 503) but no route


def test_a_starting_session_is_routed_once_its_allocation_is_placed_and_marked_starting() -> None:
    """From Nomad's placement on (its allocation's ports are known): HAProxy tries the app's connect until it listens,
    rather than answering ``APP_NOT_READY`` until Nomad's client reports the allocation running."""
    session = running_app("alice", 31000)
    placed = dataclasses.replace(session.main_kernel, status=SessionStatus.PREPARING, alloc_id="alloc-1")
    starting = dataclasses.replace(session, status=SessionStatus.PREPARING, kernels=(placed,))
    host = f"web--{session.id}.{DOMAIN}"
    assert session_maps([starting], DOMAIN)["routes"] == {host: "127.0.0.1:31000:starting"}
    # not placed yet, or its allocation already ended (a start retry's old one): no route, whatever ports it kept
    unplaced = dataclasses.replace(starting, kernels=(dataclasses.replace(placed, alloc_id=None),))
    ended = dataclasses.replace(starting, kernels=(dataclasses.replace(placed, status=SessionStatus.ERROR),))
    stopping = dataclasses.replace(starting, status=SessionStatus.TERMINATING)
    assert session_maps([unplaced, ended, stopping], DOMAIN)["routes"] == {}


def test_tokens_of_active_users_only_and_unexpired() -> None:
    users = [
        User(id="alice", name="alice", role=Role.USER),
        User(id="bob", name="bob", role=Role.USER, active=False),
        User(id="root", name="root", role=Role.SUPERADMIN),
        User(id="ann", name="ann", role=Role.ADMIN, projects=("p1", "p2")),
    ]
    tokens = [
        TokenEntry("a" * 64, "alice", None),
        TokenEntry("b" * 64, "bob", None),
        TokenEntry("c" * 64, "alice", NOW - timedelta(seconds=1)),
        TokenEntry("d" * 64, "alice", NOW + timedelta(hours=1)),
        TokenEntry("e" * 64, "ghost", None),
    ]
    maps = user_maps(users, tokens, NOW)
    assert maps["tokens"] == {"a" * 64: "alice", "d" * 64: "alice"}
    assert maps["roles"] == {"root": "SUPERADMIN"}
    assert maps["admins"] == {"p1|ann": "1", "p2|ann": "1"}
    assert next_expiry(tokens, NOW) == NOW + timedelta(hours=1)


def test_edits_turn_one_content_into_the_other() -> None:
    change = edits({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "9", "d": "4"})
    assert (change.add, change.change, change.delete) == ({"d": "4"}, {"b": "9"}, ["c"])
    assert not edits({"a": "1"}, {"a": "1"})


def test_who_an_open_websocket_still_lets_through() -> None:
    maps = {
        "hosts": {"h": "alice|p1|0", "pub": "bob|p1|1", "gone": "alice|p1|0"},
        "routes": {"h": "127.0.0.1:1", "pub": "127.0.0.1:2"},
        "tokens": {"ta": "alice", "tb": "bob", "tr": "root", "tn": "ann"},
        "roles": {"root": "SUPERADMIN"},
        "admins": {"p1|ann": "1"},
    }
    assert may_pass(maps, "h", "alice", "ta")
    assert not may_pass(maps, "h", "alice", "tx")  # its token revoked
    assert not may_pass(maps, "h", "alice", "tb")  # a token of another user
    assert not may_pass(maps, "h", "bob", "tb")
    assert may_pass(maps, "h", "root", "tr") and may_pass(maps, "h", "ann", "tn")
    assert may_pass(maps, "pub", None, None)  # public: anyone, until it is private again
    assert not may_pass(maps, "gone", "alice", "ta")  # no route: the session ended
    assert not may_pass(maps, "nowhere", "alice", "ta")
