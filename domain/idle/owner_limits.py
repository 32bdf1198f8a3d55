"""The owners' resource policies in the idle checks (pure; ``stores.resource_policies.PolicyStore.limits_of`` reads
them).

A user or project resource policy may set ``max_session_lifetime`` and ``idle_timeout``
(``stores.resource_policies``). The idle checker judges a session by the strictest of its idle policy (the file's, per
resource group) and those: a policy can shorten a check's deadline, or set one the file leaves off, never lengthen one.
A check the file turns off for everyone (not in ``enabled``) stays off: the operator's switch wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from domain.idle.config import CheckName, EffectivePolicy
from domain.resource_policies import SessionLimits


def tightened(policy: EffectivePolicy, limits: SessionLimits | None, enabled: Iterable[CheckName]) -> EffectivePolicy:
    """``policy`` with the owner's limits where they are stricter (pure)."""
    if limits is None:
        return policy
    on = frozenset(enabled)
    lifetime = _stricter(policy.max_session_lifetime, limits.max_session_lifetime, CheckName.SESSION_LIFETIME in on)
    network = _stricter(policy.network_idle_timeout, limits.idle_timeout, CheckName.NETWORK_TIMEOUT in on)
    if (lifetime, network) == (policy.max_session_lifetime, policy.network_idle_timeout):
        return policy
    return replace(policy, max_session_lifetime=lifetime, network_idle_timeout=network)


def _stricter(seconds: float | None, limit: float | None, enabled: bool) -> float | None:
    if limit is None or not enabled:
        return seconds
    return limit if seconds is None else min(seconds, limit)
