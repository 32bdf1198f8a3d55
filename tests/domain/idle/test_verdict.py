"""Which reason wins when several checks expire together, and the report's plain-data form."""

from __future__ import annotations

import json

import pytest

from domain.idle.arbiter import evaluate
from domain.idle.config import CheckName
from domain.idle.verdict import CheckReport, RemainingBasis, TerminationReason, Verdict
from tests.domain.idle.factories import at, facts, filled_window, policy, utilization

IDLE_WINDOW = filled_window({"cpu_util": 0.0}, start=0, end=3600, window=60)


@pytest.mark.parametrize(
    ("lifetime", "network", "reason"),
    [
        (3600.0, 600.0, TerminationReason.SESSION_LIFETIME),
        (None, 600.0, TerminationReason.NETWORK_TIMEOUT),
        (None, None, TerminationReason.UTILIZATION),
        (7200.0, None, TerminationReason.UTILIZATION),
    ],
    ids=["all three expire: lifetime", "network and utilization: network", "utilization alone", "lifetime not yet"],
)
def test_reason_precedence(lifetime: float | None, network: float | None, reason: TerminationReason) -> None:
    verdict = evaluate(
        now=at(3600),
        session=facts(window=IDLE_WINDOW),
        policy=policy(lifetime=lifetime, network=network, util=utilization({"cpu_util": 5})),
    )
    assert (verdict.terminate, verdict.reason) == (True, reason)
    assert [r.name for r in verdict.reports] == list(CheckName)


def test_precedence_does_not_depend_on_report_order() -> None:
    reports = [
        CheckReport(CheckName.UTILIZATION, True, 0.0, RemainingBasis.WINDOW),
        CheckReport(CheckName.NETWORK_TIMEOUT, True, 0.0, RemainingBasis.IDLENESS),
    ]
    assert Verdict.of(reports).reason is TerminationReason.NETWORK_TIMEOUT


def test_nothing_expired() -> None:
    verdict = evaluate(now=at(10), session=facts(), policy=policy(lifetime=60, network=60))
    assert (verdict.terminate, verdict.reason) == (False, None)


def test_to_dict_is_plain_data() -> None:
    verdict = evaluate(
        now=at(3600), session=facts(window=IDLE_WINDOW), policy=policy(util=utilization({"cpu_util": 5}))
    )
    assert verdict.to_dict() == {
        "terminate": True,
        "reason": "idle-utilization",
        "reports": [
            {
                "name": "session_lifetime",
                "expired": False,
                "remaining": None,
                "measured_against": None,
                "note": "no lifetime limit",
                "operator": None,
                "readings": [],
            },
            {
                "name": "network_timeout",
                "expired": False,
                "remaining": None,
                "measured_against": None,
                "note": "no network idle timeout",
                "operator": None,
                "readings": [],
            },
            {
                "name": "utilization",
                "expired": True,
                "remaining": 0.0,
                "measured_against": "window",
                "note": "below thresholds",
                "operator": "all",
                "readings": [{"metric": "cpu_util", "average": 0.0, "threshold": 5.0}],
            },
        ],
    }


def test_from_dict_inverts_to_dict() -> None:
    verdict = evaluate(
        now=at(3600),
        session=facts(window=IDLE_WINDOW),
        policy=policy(lifetime=7200, network=600, util=utilization({"cpu_util": 5})),
    )
    assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict
