"""Effective policy = built-in ⊕ defaults ⊕ resource group ⊕ user policy, key by key."""

from __future__ import annotations

import pytest

from domain.idle.config import EffectivePolicy, ThresholdOperator, UtilizationPolicy
from domain.idle.policy_file import parse_policy

LAYERED = """
check_interval = "30s"
defaults {
  max_session_lifetime = "1d"
  network_idle_timeout = "1h"
  utilization {
    grace_period = "5m"
    window       = "10m"
    thresholds {
      cpu_util  = 2
      mem       = 10
      cuda_util = 1
    }
  }
}
resource_group "gpu" {
  network_idle_timeout = "20m"
  utilization {
    operator = "any"
    thresholds {
      cuda_util = 5
      mem       = null
    }
  }
}
user_policy "research" {
  max_session_lifetime = "7d"
  network_idle_timeout = "2h"
  utilization {
    thresholds { cpu_util = 0.5 }
  }
}
user_policy "no-limits" {
  max_session_lifetime = 0
  network_idle_timeout = "0s"
}
"""


def util(operator: ThresholdOperator, **thresholds: float) -> UtilizationPolicy:
    return UtilizationPolicy(grace_period=300.0, window=600.0, operator=operator, thresholds=thresholds)


ALL, ANY = ThresholdOperator.ALL, ThresholdOperator.ANY
CASES = [
    (
        "defaults only",
        "default",
        None,
        EffectivePolicy(30.0, 86400.0, 3600.0, util(ALL, cpu_util=2, mem=10, cuda_util=1)),
    ),
    (
        "unknown names fall back to defaults",
        "nope",
        "nope",
        EffectivePolicy(30.0, 86400.0, 3600.0, util(ALL, cpu_util=2, mem=10, cuda_util=1)),
    ),
    (
        "group overrides defaults; null drops a metric",
        "gpu",
        None,
        EffectivePolicy(30.0, 86400.0, 1200.0, util(ANY, cpu_util=2, cuda_util=5)),
    ),
    (
        "user policy alone",
        "default",
        "research",
        EffectivePolicy(30.0, 604800.0, 7200.0, util(ALL, cpu_util=0.5, mem=10, cuda_util=1)),
    ),
    (
        "user policy wins over the group",
        "gpu",
        "research",
        EffectivePolicy(30.0, 604800.0, 7200.0, util(ANY, cpu_util=0.5, cuda_util=5)),
    ),
    (
        "zero turns limits off",
        "gpu",
        "no-limits",
        EffectivePolicy(30.0, None, None, util(ANY, cpu_util=2, cuda_util=5)),
    ),
]


@pytest.mark.parametrize(("name", "group", "user", "expected"), CASES, ids=[c[0] for c in CASES])
def test_precedence(name: str, group: str, user: str | None, expected: EffectivePolicy) -> None:
    effective = parse_policy(LAYERED).effective(resource_group=group, user_policy=user)
    assert effective == expected


def test_checks_left_out_of_enabled_are_off_for_everyone() -> None:
    config = parse_policy('enabled = ["network_timeout"]\n' + LAYERED)
    effective = config.effective(resource_group="gpu", user_policy="research")
    assert (effective.max_session_lifetime, effective.network_idle_timeout, effective.utilization) == (
        None,
        7200.0,
        None,
    )


def test_effective_policy_is_memoized() -> None:
    config = parse_policy(LAYERED)
    first = config.effective(resource_group="gpu", user_policy=None)
    assert config.effective(resource_group="gpu", user_policy=None) is first
