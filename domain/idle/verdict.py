"""What the idle checks say about one session: a report per check, and whether (and why) to terminate it.

Precedence when several checks expire in the same sweep (first wins): ``session_lifetime`` (a hard limit
of the owner's policy, the least surprising reason to show), then ``network_timeout``, then
``utilization``, the softest judgement. This is also Backend.AI's registration order.

The records here are frozen msgspec ``Struct``s rather than frozen dataclasses: just as immutable and typed, built by
C code (several times cheaper than a dataclass, and than a ``NamedTuple``, whose constructor is Python), left out of
the cyclic garbage collector (``gc=False``: they hold no cycles), and written as JSON objects by msgspec directly,
field by field as :meth:`Verdict.to_dict` spells them. A sweep over 10,000 sessions builds about 50,000 of them and
stores a report of each (``bench/idle``).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TypedDict

import msgspec

from domain.idle.config import CheckName, ThresholdOperator


class TerminationReason(StrEnum):
    SESSION_LIFETIME = "idle-session-lifetime"
    NETWORK_TIMEOUT = "idle-timeout"
    UTILIZATION = "idle-utilization"


REASON_OF_CHECK = {
    CheckName.SESSION_LIFETIME: TerminationReason.SESSION_LIFETIME,
    CheckName.NETWORK_TIMEOUT: TerminationReason.NETWORK_TIMEOUT,
    CheckName.UTILIZATION: TerminationReason.UTILIZATION,
}
PRECEDENCE = (CheckName.SESSION_LIFETIME, CheckName.NETWORK_TIMEOUT, CheckName.UTILIZATION)


class RemainingBasis(StrEnum):
    """What a report's ``remaining`` seconds count down to."""

    LIFETIME = "lifetime"
    """The end of the maximum lifetime."""
    IDLENESS = "idleness"
    """The network idle timeout, from the last user traffic."""
    GRACE_PERIOD = "grace_period"
    """The end of the utilization grace period (no verdict before it)."""
    WINDOW = "window"
    """A full utilization window (no verdict before it), or the window's verdict itself."""


class ReadingDoc(TypedDict):
    metric: str
    average: float | None
    threshold: float


class CheckReportDoc(TypedDict):
    """A check's report as stored (plain data: enums by value)."""

    name: str
    expired: bool
    remaining: float | None
    measured_against: str | None
    note: str
    operator: str | None
    readings: list[ReadingDoc]


class VerdictDoc(TypedDict):
    """A verdict as stored in the idle checker's reports (``stores.idle``)."""

    terminate: bool
    reason: str | None
    reports: list[CheckReportDoc]


class MetricReading(msgspec.Struct, frozen=True, gc=False):
    metric: str
    average: float | None
    """Mean over the window's samples; None without samples."""
    threshold: float


class CheckReport(msgspec.Struct, frozen=True, gc=False):
    name: CheckName
    expired: bool
    remaining: float | None
    """Seconds left (0 when expired); None when this check sets no deadline for the session."""
    measured_against: RemainingBasis | None
    note: str = ""
    """Why the check does not apply, or what it is waiting for, in a few words."""
    operator: ThresholdOperator | None = None
    readings: tuple[MetricReading, ...] = ()

    def to_dict(self) -> CheckReportDoc:
        # the enums as they are: each is a str equal to its value, and written as its value (core.codec, json)
        return {
            "name": self.name,
            "expired": self.expired,
            "remaining": self.remaining,
            "measured_against": self.measured_against,
            "note": self.note,
            "operator": self.operator,
            "readings": [{"metric": r.metric, "average": r.average, "threshold": r.threshold} for r in self.readings],
        }

    @classmethod
    def from_dict(cls, doc: CheckReportDoc) -> CheckReport:
        """The inverse of :meth:`to_dict`; ``KeyError``/``ValueError`` on anything else."""
        basis, operator = doc["measured_against"], doc["operator"]
        return cls(
            name=CheckName(doc["name"]),
            expired=bool(doc["expired"]),
            remaining=None if doc["remaining"] is None else float(doc["remaining"]),
            measured_against=RemainingBasis(basis) if basis is not None else None,
            note=str(doc["note"]),
            operator=ThresholdOperator(operator) if operator is not None else None,
            readings=tuple(
                MetricReading(
                    str(r["metric"]), None if r["average"] is None else float(r["average"]), float(r["threshold"])
                )
                for r in doc["readings"]
            ),
        )


class Verdict(msgspec.Struct, frozen=True, gc=False):
    terminate: bool
    reason: TerminationReason | None
    reports: tuple[CheckReport, ...]

    @classmethod
    def of(cls, reports: Iterable[CheckReport]) -> Verdict:
        """Terminate if any report expired, with the reason of the expired check first in :data:`PRECEDENCE`."""
        reports = tuple(reports)
        expired = [report.name for report in reports if report.expired]
        first = min(expired, key=PRECEDENCE.index) if expired else None
        return cls(
            terminate=first is not None,
            reason=REASON_OF_CHECK[first] if first is not None else None,
            reports=reports,
        )

    @classmethod
    def of_ordered(cls, reports: tuple[CheckReport, ...]) -> Verdict:
        """:meth:`of` for reports already in :data:`PRECEDENCE` order (the fast path of every sweep)."""
        for report in reports:
            if report.expired:
                return cls(True, REASON_OF_CHECK[report.name], reports)
        return cls(False, None, reports)

    def to_dict(self) -> VerdictDoc:
        return {
            "terminate": self.terminate,
            "reason": self.reason,
            "reports": [report.to_dict() for report in self.reports],
        }

    @classmethod
    def from_dict(cls, doc: VerdictDoc) -> Verdict:
        reason = doc["reason"]
        return cls(
            terminate=bool(doc["terminate"]),
            reason=TerminationReason(reason) if reason is not None else None,
            reports=tuple(CheckReport.from_dict(report) for report in doc["reports"]),
        )
