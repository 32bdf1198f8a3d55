"""The idle policy as data: layers from the policy file, and the effective policy of one session.

Precedence: ``built-in defaults ⊕ defaults {} ⊕ resource_group "<rg>" {} ⊕ user_policy "<name>" {}``, the later
layer winning key by key; ``thresholds`` merge metric by metric. The user's policy comes last because it is
the most specific: an operator grants a person (say, a research group) a longer lifetime without
creating a resource group for them. A layer leaves a key it does not mention to the layers below it; a
duration of 0 turns that check off; a threshold of ``null`` stops that metric from being checked.

Checks not listed in ``enabled`` are off for every session whatever the layers say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType


class CheckName(StrEnum):
    SESSION_LIFETIME = "session_lifetime"
    NETWORK_TIMEOUT = "network_timeout"
    UTILIZATION = "utilization"


class ThresholdOperator(StrEnum):
    ALL = "all"
    """Idle only when every checked metric is below its threshold."""
    ANY = "any"
    """Idle when at least one checked metric is below its threshold."""


@dataclass(frozen=True)
class PolicyLayer:
    """One block of the policy file. ``None`` (and a metric absent from ``thresholds``) means "inherit"."""

    max_session_lifetime: float | None = None
    """Seconds from RUNNING; 0 = no limit."""
    network_idle_timeout: float | None = None
    """Seconds without user traffic; 0 = never."""
    grace_period: float | None = None
    """Seconds from RUNNING during which the utilization check never terminates."""
    window: float | None = None
    """Seconds of samples averaged by the utilization check."""
    operator: ThresholdOperator | None = None
    thresholds: Mapping[str, float | None] = field(default_factory=dict)
    """Metric -> percent; ``None`` = not checked."""

    def over(self, below: PolicyLayer) -> PolicyLayer:
        """This layer on top of ``below``."""
        merged = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "thresholds"}
        for name, value in merged.items():
            if value is None:
                merged[name] = getattr(below, name)
        return PolicyLayer(**merged, thresholds={**below.thresholds, **self.thresholds})


BUILTIN_DEFAULTS = PolicyLayer(
    max_session_lifetime=0.0,
    network_idle_timeout=0.0,
    grace_period=0.0,
    window=600.0,
    operator=ThresholdOperator.ALL,
)
"""What a file that says nothing means: no check ever terminates anything."""

DEFAULT_CHECK_INTERVAL = 15.0


@dataclass(frozen=True, slots=True)
class UtilizationPolicy:
    grace_period: float
    window: float
    operator: ThresholdOperator
    thresholds: Mapping[str, float]
    """Only the checked metrics, sorted by name (reports list them in this order)."""
    checked_by_devices: dict[frozenset[str], Mapping[str, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Requested device prefixes -> the thresholds judged for them (``domain.idle.arbiter.checked_thresholds``
    memoizes here: every sweep asks for every session, and sessions share a handful of device sets)."""


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The policy one session is judged by; ``None`` means that check is off for it."""

    check_interval: float
    max_session_lifetime: float | None
    network_idle_timeout: float | None
    utilization: UtilizationPolicy | None


@dataclass(frozen=True)
class IdlePolicyConfig:
    """A whole policy file, validated."""

    source: str
    check_interval: float = DEFAULT_CHECK_INTERVAL
    enabled: frozenset[CheckName] = frozenset(CheckName)
    defaults: PolicyLayer = BUILTIN_DEFAULTS
    resource_groups: Mapping[str, PolicyLayer] = field(default_factory=dict)
    user_policies: Mapping[str, PolicyLayer] = field(default_factory=dict)
    _cache: dict[tuple[str, str | None], EffectivePolicy] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def effective(self, *, resource_group: str, user_policy: str | None) -> EffectivePolicy:
        """The policy of a session in ``resource_group`` whose owner has ``user_policy`` (memoized)."""
        key = (resource_group, user_policy)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._resolve(resource_group, user_policy)
        return cached

    def _resolve(self, resource_group: str, user_policy: str | None) -> EffectivePolicy:
        layer = self.defaults.over(BUILTIN_DEFAULTS)
        overrides = (
            self.resource_groups.get(resource_group),
            self.user_policies.get(user_policy) if user_policy is not None else None,
        )
        for override in overrides:
            if override is not None:
                layer = override.over(layer)
        # every field is set: BUILTIN_DEFAULTS sets them all and a layer only replaces with non-None values
        assert layer.grace_period is not None and layer.window is not None and layer.operator is not None
        utilization = UtilizationPolicy(
            grace_period=layer.grace_period,
            window=layer.window,
            operator=layer.operator,
            thresholds=MappingProxyType({m: t for m, t in sorted(layer.thresholds.items()) if t is not None}),
        )
        return EffectivePolicy(
            check_interval=self.check_interval,
            max_session_lifetime=self._limit(CheckName.SESSION_LIFETIME, layer.max_session_lifetime),
            network_idle_timeout=self._limit(CheckName.NETWORK_TIMEOUT, layer.network_idle_timeout),
            utilization=utilization if CheckName.UTILIZATION in self.enabled else None,
        )

    def _limit(self, check: CheckName, seconds: float | None) -> float | None:
        return seconds if check in self.enabled and seconds else None
