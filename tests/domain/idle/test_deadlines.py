"""Session lifetime and network idleness: countdowns with an injected clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from domain.idle.arbiter import SessionFacts, evaluate
from domain.idle.facts import Activity
from domain.idle.verdict import CheckReport, RemainingBasis, TerminationReason
from domain.model import SessionType
from tests.domain.idle.factories import at, facts, outcome, policy

HOUR = 3600.0


@dataclass(frozen=True)
class Case:
    name: str
    session: SessionFacts
    now: float
    expired: bool
    remaining: float | None
    basis: RemainingBasis | None


def lifetime_report(case: Case) -> CheckReport:
    return evaluate(now=at(case.now), session=case.session, policy=policy(lifetime=HOUR)).reports[0]


LIFETIME_CASES = [
    Case("just before the limit", facts(), HOUR - 1, False, 1.0, RemainingBasis.LIFETIME),
    Case("at the limit is expired", facts(), HOUR, True, 0.0, RemainingBasis.LIFETIME),
    Case("after the limit", facts(), HOUR + 30, True, 0.0, RemainingBasis.LIFETIME),
    Case("right after start", facts(), 0, False, HOUR, RemainingBasis.LIFETIME),
    Case("activity does not extend it", facts(last_activity=HOUR), HOUR, True, 0.0, RemainingBasis.LIFETIME),
    Case("open connections do not extend it", facts(open_connections=3), HOUR, True, 0.0, RemainingBasis.LIFETIME),
    Case("INFERENCE is bounded", facts(SessionType.INFERENCE), HOUR, True, 0.0, RemainingBasis.LIFETIME),
    Case("SYSTEM is bounded", facts(SessionType.SYSTEM), HOUR, True, 0.0, RemainingBasis.LIFETIME),
    Case("BATCH uses its batch timeout", facts(SessionType.BATCH), 10 * HOUR, False, None, None),
]


@pytest.mark.parametrize("case", LIFETIME_CASES, ids=[c.name for c in LIFETIME_CASES])
def test_session_lifetime(case: Case) -> None:
    assert outcome(lifetime_report(case)) == ("session_lifetime", case.expired, case.remaining, case.basis)


def test_lifetime_counts_from_running_not_creation() -> None:
    # started_at is when the session became RUNNING; queue time before it is not charged
    verdict = evaluate(now=at(HOUR - 10), session=facts(), policy=policy(lifetime=HOUR))
    assert not verdict.terminate
    assert verdict.reports[0].remaining == 10.0


def test_no_lifetime_limit_sets_no_deadline() -> None:
    report = evaluate(now=at(1000 * HOUR), session=facts(), policy=policy()).reports[0]
    assert (report.expired, report.remaining, report.measured_against) == (False, None, None)


def network_report(case: Case) -> CheckReport:
    return evaluate(now=at(case.now), session=case.session, policy=policy(network=600)).reports[1]


NETWORK_CASES = [
    Case("no activity: counts from start, before", facts(), 599, False, 1.0, RemainingBasis.IDLENESS),
    Case("no activity: counts from start, at", facts(), 600, True, 0.0, RemainingBasis.IDLENESS),
    Case("last activity just before timeout", facts(last_activity=1000), 1599, False, 1.0, RemainingBasis.IDLENESS),
    Case("last activity at timeout", facts(last_activity=1000), 1600, True, 0.0, RemainingBasis.IDLENESS),
    Case("last activity long ago", facts(last_activity=1000), 5000, True, 0.0, RemainingBasis.IDLENESS),
    Case(
        "activity before start counts from start", facts(last_activity=-500), 300, False, 300.0, RemainingBasis.IDLENESS
    ),
    Case(
        "open connection never idle",
        facts(last_activity=0, open_connections=1),
        99 * HOUR,
        False,
        600.0,
        RemainingBasis.IDLENESS,
    ),
    Case(
        "activity stamped after now is activity now",
        facts(last_activity=1000.5),
        1000,
        False,
        600.0,
        RemainingBasis.IDLENESS,
    ),
    Case("BATCH exempt", facts(SessionType.BATCH), 99 * HOUR, False, None, None),
    Case("INFERENCE exempt", facts(SessionType.INFERENCE), 99 * HOUR, False, None, None),
    Case("SYSTEM checked", facts(SessionType.SYSTEM), 600, True, 0.0, RemainingBasis.IDLENESS),
]


@pytest.mark.parametrize("case", NETWORK_CASES, ids=[c.name for c in NETWORK_CASES])
def test_network_idleness(case: Case) -> None:
    assert outcome(network_report(case)) == ("network_timeout", case.expired, case.remaining, case.basis)


def test_network_expiry_terminates_with_idle_timeout() -> None:
    verdict = evaluate(now=at(600), session=facts(), policy=policy(network=600))
    assert (verdict.terminate, verdict.reason) == (True, TerminationReason.NETWORK_TIMEOUT)


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        evaluate(now=at(0).replace(tzinfo=None), session=facts(), policy=policy())


T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("activity", "seen_ago", "expected"),
    [
        (Activity(None, 0), 2.0, Activity(T - timedelta(seconds=2), 1)),  # seen now: connected, and activity
        (Activity(None, 0), 15.0, Activity(T - timedelta(seconds=15), 0)),  # seen long enough ago: gone since
        (Activity(T - timedelta(seconds=1), 2), 5.0, Activity(T - timedelta(seconds=1), 3)),  # later gateway traffic
        (Activity(T - timedelta(seconds=60), 0), 30.0, Activity(T - timedelta(seconds=30), 0)),  # the later wins
    ],
)
def test_a_client_the_sessions_own_server_saw(activity: Activity, seen_ago: float, expected: Activity) -> None:
    seen_at = T - timedelta(seconds=seen_ago)
    assert activity.with_client_seen(seen_at, now=T, connected_within=15.0) == expected
