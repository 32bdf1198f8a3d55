"""GraphQL types of idle reports and idle policies."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

import strawberry

from domain.idle import config, verdict
from domain.idle.network import NETWORK_METRICS
from stores.idle import StoredVerdict

# The domain's enums are the GraphQL enums: strawberry.enum marks the class itself (and returns it), so the
# aliases below are plain classes, usable as annotations.
IdleCheckName = config.CheckName
strawberry.enum(IdleCheckName, name="IdleCheckName")
IdleThresholdOperator = config.ThresholdOperator
strawberry.enum(IdleThresholdOperator, name="IdleThresholdOperator")
IdleRemainingBasis = verdict.RemainingBasis
strawberry.enum(
    IdleRemainingBasis,
    name="IdleRemainingBasis",
    description="What an idle check's remaining time counts down to.",
)


@strawberry.type(description="One utilization metric: its average over the window against its threshold, in percent.")
class UtilizationReading:
    metric: str
    average: float | None = strawberry.field(description="Mean over the window's samples; null before any sample.")
    threshold: float


@strawberry.type
class IdleCheck:
    name: IdleCheckName
    expired: bool
    remaining: float | None = strawberry.field(
        description="Seconds left as of checkedAt (0 once expired); null when this check sets no deadline."
    )
    measured_against: IdleRemainingBasis | None
    note: str = strawberry.field(description="Why the check does not apply, or what it is waiting for.")
    operator: IdleThresholdOperator | None = strawberry.field(
        description="Utilization: ALL = idle when every metric is below its threshold, ANY = when one is."
    )
    utilization: list[UtilizationReading]


@strawberry.type(description="The idle checker's last verdict on a session.")
class IdleChecks:
    checked_at: datetime
    terminate: bool = strawberry.field(description="Whether that sweep found the session idle.")
    reason: str | None = strawberry.field(description="The termination reason (idle-timeout …) when it did.")
    checks: list[IdleCheck]


@strawberry.type
class UtilizationThreshold:
    metric: str
    threshold: float = strawberry.field(description="Percent of what the session was allocated.")


@strawberry.type
class UtilizationPolicy:
    grace_period: float
    window: float
    operator: IdleThresholdOperator
    thresholds: list[UtilizationThreshold] = strawberry.field(
        description="Only the metrics judged for this session (device metrics need the device)."
    )


@strawberry.type(description="The idle policy a session is judged by; durations in seconds, null = that check is off.")
class EffectiveIdlePolicy:
    source: str = strawberry.field(description="The policy file in force, or 'built-in'.")
    check_interval: float
    max_session_lifetime: float | None = strawberry.field(description="Counted from when the session became RUNNING.")
    network_idle_timeout: float | None
    utilization: UtilizationPolicy | None
    exempt_from: list[IdleCheckName] = strawberry.field(description="Checks this session's type is exempt from.")


def idle_checks_type(stored: StoredVerdict) -> IdleChecks:
    return IdleChecks(
        checked_at=stored.checked_at,
        terminate=stored.verdict.terminate,
        reason=stored.verdict.reason.value if stored.verdict.reason else None,
        checks=[
            IdleCheck(
                name=report.name,
                expired=report.expired,
                remaining=report.remaining,
                measured_against=report.measured_against,
                note=report.note,
                operator=report.operator,
                utilization=[
                    UtilizationReading(metric=r.metric, average=r.average, threshold=r.threshold)
                    for r in report.readings
                ],
            )
            for report in stored.verdict.reports
        ],
    )


@strawberry.enum(description="What a metric's value counts.")
class MetricUnit(Enum):
    PERCENT = "PERCENT"
    """Percent of what the kernel was allocated (CPU, memory, an accelerator)."""
    BYTES_PER_SECOND = "BYTES_PER_SECOND"
    """Network I/O (net_rx received, net_tx sent), never judged by a threshold."""


@strawberry.type(description="One metric's value in a utilization point.")
class MetricValue:
    metric: str
    value: float = strawberry.field(description="In its unit.")
    unit: MetricUnit
    percent: float | None = strawberry.field(
        description="The value, when it is a percent of what the kernel was allocated; null for network I/O."
    )

    @classmethod
    def of(cls, metric: str, value: float) -> MetricValue:
        if metric in NETWORK_METRICS:
            return cls(metric=metric, value=value, unit=MetricUnit.BYTES_PER_SECOND, percent=None)
        return cls(metric=metric, value=value, unit=MetricUnit.PERCENT, percent=value)


@strawberry.type(description="A kernel's utilization over some sweeps: one sweep's sample, or the mean of older ones.")
class UtilizationPoint:
    at: datetime = strawberry.field(description="The first sweep it covers.")
    until: datetime = strawberry.field(description="The last sweep it covers (= at for one sweep).")
    sweeps: int = strawberry.field(description="How many sweeps it averages (older points are coarser).")
    values: list[MetricValue]


@strawberry.type(description="A kernel's utilization over the session's life, with the idle thresholds judged.")
class UtilizationSeries:
    kernel: str | None = strawberry.field(description="The kernel's hostname; null when none was sampled yet.")
    kernels: list[str] = strawberry.field(description="Every kernel with samples (hostnames).")
    points: list[UtilizationPoint] = strawberry.field(description="Oldest first; at most a few hundred.")
    thresholds: list[UtilizationThreshold] = strawberry.field(
        description="What the utilization check judged at the newest point (below all/any: idle); empty when unchecked."
    )
