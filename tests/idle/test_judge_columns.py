"""``idle.sweep.judge`` (windows as columns, verdicts from their readings) against the plain per-session path, the
oracle: each window fed by ``record_sample``, each verdict ``evaluate(session_facts(...))``, sweep after sweep; the
same oracle on the windows the columns hand back; and each verdict's stored report (``stores.idle.report_document``)
as the dicts of ``Verdict.to_dict`` were written. Pure (no Redis).

Each case is a list of sweeps; a sweep names the policy in force and, per session, its kernels' slots and its sample
(a session not named is no longer RUNNING)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from core.codec import decode, encode
from domain.idle.arbiter import evaluate
from domain.idle.config import EffectivePolicy, IdlePolicyConfig
from domain.idle.facts import Activity, SessionView, checked_metrics, policy_for, session_facts
from domain.idle.policy_file import parse_policy
from domain.idle.verdict import Verdict
from domain.idle.window import UtilizationWindow, record_sample
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from idle.sweep import judge
from stores.idle import ReportDoc, report_document
from tests.domain.idle.factories import T0, at

POLICY = """
check_interval = "15s"
defaults {
  max_session_lifetime = "1h"
  network_idle_timeout = "20m"
  utilization {
    grace_period = "30s"
    window = "1m"
    operator = "all"
    thresholds {
      cpu_util = 2
      mem = null
      sim_util = 10
      cuda_util = 5
    }
  }
}
resource_group "any" {
  utilization {
    operator = "any"
    thresholds { mem = 50 }
  }
}
"""
LONGER = POLICY.replace('window = "1m"', 'window = "2m"')
NO_CPU = POLICY.replace("cpu_util = 2\n", "cpu_util = null\n")
CONFIGS = {name: parse_policy(text) for name, text in {"base": POLICY, "longer": LONGER, "no_cpu": NO_CPU}.items()}

CPU = {"cpu": "2", "mem": "1073741824"}
SIM = {**CPU, "sim.shares": "0.5"}
CUDA = {**CPU, "cuda.shares": "1"}

Sweep = tuple[str, dict[str, tuple[tuple[Mapping[str, str], ...], Mapping[str, float]]]]
"""(the policy in force, session id -> (each kernel's slots, its sample))."""


def session(session_id: str, kernels: tuple[Mapping[str, str], ...]) -> Session:
    group = "any" if session_id.startswith("any") else "default"
    kind = SessionType.BATCH if session_id.startswith("batch") else SessionType.INTERACTIVE
    return Session(
        id=session_id, name=session_id, owner_id="u", type=kind, driver=Driver.EXEC, image="python:3.12",
        resources=dict(kernels[0]),
        kernels=tuple(
            Kernel(role="main" if i == 0 else "sub", index=i + 1, hostname=f"k{i}", image="python:3.12",
                   resources=dict(slots), alloc_id=f"{session_id}-{i}")
            for i, slots in enumerate(kernels)
        ),
        created_at=T0, status=SessionStatus.RUNNING, started_at=at(0), resource_group=group,
    )  # fmt: skip


ACTIVITY = {"s1": Activity(at(10), 0), "s2": Activity(None, 1), "any1": Activity(at(1300), 0)}


def reference(
    now_s: float, config: IdlePolicyConfig, sessions: list[Session], windows: dict[str, UtilizationWindow],
    samples: Mapping[str, Mapping[str, float]],
) -> tuple[dict[str, Verdict], dict[str, UtilizationWindow]]:  # fmt: skip
    """The oracle: each session's window fed by ``record_sample``, its verdict ``evaluate``'s."""
    now, verdicts, kept = at(now_s), {}, {}
    for s in sessions:
        policy: EffectivePolicy = policy_for(config, s)
        checked = checked_metrics(s, policy)
        window = None
        if checked and policy.utilization is not None:
            window = kept[s.id] = record_sample(
                windows.get(s.id), ts=now.timestamp(), sample=samples.get(s.id, {}),
                window_seconds=policy.utilization.window, interval=policy.check_interval, metrics=checked,
            )  # fmt: skip
        verdicts[s.id] = evaluate(now=now, session=session_facts(s, ACTIVITY.get(s.id), window), policy=policy)
    return verdicts, kept


def judged_on(
    now_s: float, config: IdlePolicyConfig, sessions: list[Session], windows: Mapping[str, UtilizationWindow]
) -> dict[str, Verdict]:
    """The oracle's verdicts on the windows judge kept (each built back from the columns)."""
    verdicts = {}
    for s in sessions:
        policy = policy_for(config, s)
        window = windows[s.id] if checked_metrics(s, policy) else None
        verdicts[s.id] = evaluate(now=at(now_s), session=session_facts(s, ACTIVITY.get(s.id), window), policy=policy)
    return verdicts


def run(sweeps: list[Sweep], *, start: float = 0.0, every: float = 15.0) -> None:
    windows: Mapping[str, UtilizationWindow] = {}
    plain_windows: dict[str, UtilizationWindow] = {}
    derived: Mapping[str, Any] = {}
    batch = None
    for n, (config_name, state) in enumerate(sweeps):
        config, now_s = CONFIGS[config_name], start + n * every
        sessions = [session(i, kernels) for i, (kernels, _) in state.items()]
        views = [SessionView(**{f: getattr(s, f) for f in SessionView.__dataclass_fields__}) for s in sessions]
        samples = {i: sample for i, (_, sample) in state.items()}
        swept = judge(now=at(now_s), sessions=views, config=config, windows=windows, activity=ACTIVITY,
                      samples=samples, derived=derived, batch=batch)  # fmt: skip
        expected, plain_windows = reference(now_s, config, sessions, plain_windows, samples)
        assert swept.verdicts == expected, f"sweep {n}"
        stamp = encode(at(now_s))
        for verdict in swept.verdicts.values():  # the stored report: as the dicts were written, and read back
            stored = report_document(stamp, verdict)
            assert stored == encode({"checked_at": at(now_s), **verdict.to_dict()})
            assert Verdict.from_dict(decode(stored, ReportDoc)) == verdict
        assert dict(swept.windows) == plain_windows, f"sweep {n}"
        assert judged_on(now_s, config, sessions, swept.windows) == expected, f"sweep {n}, the columns' windows"
        windows, derived, batch = swept.windows, swept.derived, swept.batch


def steady(sessions: dict[str, Any], count: int, policy: str = "base") -> list[Sweep]:
    return [(policy, sessions) for _ in range(count)]


CASES: dict[str, list[Sweep]] = {
    "mixed sessions over grace, filling, full windows, lifetime": steady(
        {
            "s1": ((CPU,), {"cpu_util": 1.0, "mem": 10.0}),
            "s2": ((CPU,), {"cpu_util": 3.0}),
            "s3": ((SIM,), {"cpu_util": 1.0, "sim_util": 5.0, "sim_mem": 80.0}),
            "s4": ((CUDA,), {"cpu_util": 1.0, "cuda_util": 50.0}),
            "batch1": ((CPU,), {"cpu_util": 0.5}),
            "any1": ((CPU,), {"cpu_util": 90.0, "mem": 10.0}),
            "any2": ((CPU,), {"cpu_util": 90.0, "mem": 60.0}),
        },
        8,
    ),
    "thresholds exactly at the boundary are not below": steady(
        {"s1": ((CPU,), {"cpu_util": 2.0}), "s3": ((SIM,), {"cpu_util": 1.0, "sim_util": 10.0})}, 7
    ),
    "empty windows: no stats at all, then some": [
        *steady({"s1": ((CPU,), {})}, 4),
        *steady({"s1": ((CPU,), {"cpu_util": 1.0})}, 6),
    ],
    "gaps: a device missing a reading now and then": [
        ("base", {"s3": ((SIM,), {"cpu_util": 1.0, "sim_util": 1.0} if n % 3 else {"cpu_util": 1.0})})
        for n in range(10)
    ],
    "a session appearing, disappearing and coming back": [
        (
            "base",
            {"s1": ((CPU,), {"cpu_util": 1.0})} | ({"s2": ((CPU,), {"cpu_util": 0.5})} if n in (1, 2, 5, 6) else {}),
        )
        for n in range(9)
    ],  # fmt: skip
    "a kernel added with a device: a new metric checked": [
        *steady({"s1": ((CPU,), {"cpu_util": 1.0})}, 4),
        *steady({"s1": ((CPU, SIM), {"cpu_util": 1.0, "sim_util": 4.0})}, 6),
    ],
    "policy change mid-window: a longer window, then a metric no longer checked, then back": [
        *steady({"s1": ((CPU,), {"cpu_util": 1.0}), "s3": ((SIM,), {"cpu_util": 1.0, "sim_util": 2.0})}, 5),
        *steady({"s1": ((CPU,), {"cpu_util": 1.0}), "s3": ((SIM,), {"cpu_util": 1.0, "sim_util": 2.0})}, 3, "longer"),
        *steady({"s1": ((CPU,), {"cpu_util": 1.0}), "s3": ((SIM,), {"cpu_util": 1.0, "sim_util": 2.0})}, 4, "no_cpu"),
        *steady({"s1": ((CPU,), {"cpu_util": 1.0}), "s3": ((SIM,), {"cpu_util": 1.0, "sim_util": 2.0})}, 4),
    ],
}


@pytest.mark.parametrize("sweeps", CASES.values(), ids=list(CASES))
def test_judge_gives_the_plain_paths_verdicts_and_windows(sweeps: list[Sweep]) -> None:
    run(sweeps)


def test_judge_near_the_lifetime_and_network_deadlines() -> None:
    """Sweeps around the hour of lifetime and the 20 minutes without traffic, jittered."""
    run(steady({"s1": ((CPU,), {"cpu_util": 50.0}), "any1": ((CPU,), {"cpu_util": 50.0})}, 6), start=3600 - 45)
    run(steady({"s1": ((CPU,), {"cpu_util": 50.0})}, 6), start=10 + 1200 - 30, every=7.5)


def test_judge_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        judge(now=at(0).replace(tzinfo=None), sessions=[], config=CONFIGS["base"], windows={}, activity={}, samples={})
    assert judge(now=at(0) + timedelta(0), sessions=[], config=CONFIGS["base"], windows={}, activity={}, samples={})
