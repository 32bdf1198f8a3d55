"""INFERENCE options of createSession, checked without I/O: every refusal names its field, nothing half-built.

(tests/e2e/test_inference.py sends some of these through GraphQL and shows nothing is stored.)"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from core.codec import decode, encode
from core.errors import InvalidInput
from domain.autoscaling import Metric, ScalingRequest, ScalingRules
from domain.model import Driver, SessionType
from domain.session_requests import SessionRequest, build_sessions
from domain.users import Role, User

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = User(id="alice", name="alice", role=Role.USER)
GOOD: dict[str, Any] = {
    "name": "serve-it",
    "type": SessionType.INFERENCE,
    "driver": Driver.EXEC,
    "startup_command": "serve",
    "service_port": 8000,
}


RULES = ScalingRequest(min_replicas=0, max_replicas=4, target=5)


def build(**change: Any) -> list[Any]:
    return build_sessions(SessionRequest(**{**GOOD, **change}), viewer=ALICE, now=NOW)


REFUSED = [
    ("no service port", {"service_port": None}, "servicePort"),
    ("service port too low", {"service_port": 80}, "servicePort"),
    ("service port too high", {"service_port": 65536}, "servicePort"),
    ("no replicas", {"replicas": 0}, "replicas"),
    ("too many replicas", {"replicas": 17}, "replicas"),
    ("negative replicas", {"replicas": -1}, "replicas"),
    ("no startup command", {"startup_command": "  "}, "startupCommand"),
    ("cluster and replicas", {"cluster_size": 2}, "clusterSize"),
    ("relative path", {"health_check_path": "healthz"}, "healthCheckPath"),
    ("empty path", {"health_check_path": ""}, "healthCheckPath"),
    ("path with space", {"health_check_path": "/a b"}, "healthCheckPath"),
    ("path with newline", {"health_check_path": "/a\nHost: x"}, "healthCheckPath"),
    ("path with interpolation", {"health_check_path": "/${node.unique.id}"}, "healthCheckPath"),
    ("path with quote", {"health_check_path": '/"}'}, "healthCheckPath"),
    ("path too long", {"health_check_path": "/" + "a" * 1024}, "healthCheckPath"),
    ("grace garbage", {"health_check_grace": "soon"}, "healthCheckGrace"),
    ("grace too short", {"health_check_grace": "0.5s"}, "healthCheckGrace"),
    ("grace too long", {"health_check_grace": "2h"}, "healthCheckGrace"),
    *[
        (f"{field} on INTERACTIVE", {"type": SessionType.INTERACTIVE, "service_port": None, name: value}, field)
        for name, field, value in (
            ("replicas", "replicas", 1),
            ("service_port", "servicePort", 8000),
            ("health_check_path", "healthCheckPath", "/"),
            ("health_check_grace", "healthCheckGrace", "10s"),
        )
    ],
    ("service port on BATCH", {"type": SessionType.BATCH}, "servicePort"),
    (
        "autoscaling on INTERACTIVE",
        {"type": SessionType.INTERACTIVE, "service_port": None, "autoscaling": RULES},
        "autoscaling",
    ),
    ("min above max", {"autoscaling": replace(RULES, min_replicas=3, max_replicas=2)}, "minReplicas"),
    ("max above 16", {"autoscaling": replace(RULES, max_replicas=17)}, "maxReplicas"),
    ("no target", {"autoscaling": replace(RULES, target=0)}, "target"),
    ("window garbage", {"autoscaling": replace(RULES, stable_window="soon")}, "stableWindow"),
    ("panic longer than stable", {"autoscaling": replace(RULES, panic_window="2m")}, "panicWindow"),
    ("start above max", {"replicas": 5, "autoscaling": RULES}, "replicas"),
    ("start below min", {"replicas": 1, "autoscaling": replace(RULES, min_replicas=2)}, "replicas"),
]


@pytest.mark.parametrize(("change", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        build(**change)
    assert raised.value.field == field


ACCEPTED = [
    ("defaults", {}, 1, None, None),
    ("replicas", {"replicas": 16}, 16, None, None),
    ("http check", {"health_check_path": "/v1/models?ready=1&x=%20"}, 1, "/v1/models?ready=1&x=%20", None),
    ("grace", {"health_check_grace": "2m"}, 1, None, 120.0),
    ("service port preopened too", {"preopen_ports": [8000, 9000]}, 1, None, None),
]


@pytest.mark.parametrize(
    ("change", "replicas", "path", "grace"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED]
)
def test_accepted_sessions_carry_their_replicas_and_check(
    change: dict[str, Any], replicas: int, path: str | None, grace: float | None
) -> None:
    [session] = build(**change, resources={"cpu": "0.5"})
    assert [k.hostname for k in session.kernels] == [f"main{i}" for i in range(1, replicas + 1)]
    assert all(k.role == "main" and k.resources == session.resources for k in session.kernels)
    assert session.main_kernel.hostname == "main1"
    assert (session.service_port, session.health_check_path, session.health_check_grace) == (8000, path, grace)


def test_other_types_have_no_service() -> None:
    [session] = build(type=SessionType.INTERACTIVE, service_port=None)
    assert (session.service_port, [k.hostname for k in session.kernels]) == (None, ["main1"])


def test_an_inference_session_round_trips_through_json() -> None:
    [session] = build(replicas=3, health_check_path="/h", health_check_grace="5s")
    assert decode(encode(session), type(session)) == session


@pytest.mark.parametrize(("replicas", "minimum", "started"), [(None, 0, 1), (None, 2, 2), (3, 0, 3)])
def test_an_autoscaled_endpoint_starts_within_its_rules(replicas: int | None, minimum: int, started: int) -> None:
    rules = replace(RULES, min_replicas=minimum, metric=Metric.RPS, scale_to_zero_after="2m")
    [session] = build(replicas=replicas, autoscaling=rules)
    assert len(session.kernels) == started
    assert session.autoscaling == ScalingRules(
        min_replicas=minimum, max_replicas=4, metric=Metric.RPS, target=5.0, scale_to_zero_after=120.0
    )
    assert decode(encode(session), type(session)) == session
