"""Recorded scheduling passes: inputs generated from seeds, outputs stored as one hash per case.

Each case is a workload from bench/scheduler's generator (seeded), spread over resource groups and given the inputs the
bench leaves out (user and project policies, dependencies, start times, designated agents, unschedulable agents), then
run for a few passes back to back the way the placer would (placements occupy their agents, retries and the round-robin
position carried over). Every pass's whole ``PassResult`` (placements in order, wait explanations, retries,
reservations, cancellations, queue positions, round-robin state) is serialised canonically and hashed.

``tests/scheduler/fixtures/pass_replay.json`` holds the hashes recorded from the pass as it was before it was made
faster; ``test_replay`` checks today's pass gives the same. Re-record (only for an intended change of decisions)::

    .venv/bin/python -m tests.scheduler.replay --record
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from decimal import Decimal
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from domain.scheduling_config import GroupConfig
from domain.slots import ResourceSlots
from scheduler.agents import concentrated
from scheduler.pass_model import (
    DependencyState,
    PassConfig,
    PassResult,
    PendingSession,
    ProjectPolicy,
    RunningSession,
    Snapshot,
    UserPolicy,
)
from scheduler.scheduling_pass import run_pass

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("fixtures") / "pass_replay.json"
STRATEGIES = ("fifo", "lifo", "drf")
SELECTORS = ("concentrated", "dispersed", "roundrobin")
HOL = {"strict": 0, "skip1": 1, "skip3": 3}
PASSES = 3


@cache
def bench_module() -> ModuleType:
    """bench/scheduler (a script without a .py suffix): its generator and loader."""
    path = ROOT / "bench" / "scheduler"
    loader = importlib.machinery.SourceFileLoader("bench_scheduler", str(path))
    spec = importlib.util.spec_from_loader("bench_scheduler", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Case:
    name: str
    pending: int
    agents: int
    seed: int
    strategy: str
    selector: str
    hol: str
    extras: bool
    """Add groups, policies, dependencies, start times, designated and unschedulable agents."""


def cases() -> Iterator[Case]:
    # every strategy x selector x head-of-line mode on a small workload with every extra, over two seeds
    for seed in (1, 2):
        for strategy in STRATEGIES:
            for selector in SELECTORS:
                for hol in HOL:
                    yield Case(
                        f"small-s{seed}-{strategy}-{selector}-{hol}", 300, 30, seed, strategy, selector, hol, True
                    )
    # the bench's own workload, plain, medium size
    for strategy in STRATEGIES:
        for selector in SELECTORS:
            for hol in ("strict", "skip1"):
                yield Case(f"medium-{strategy}-{selector}-{hol}", 3000, 300, 3, strategy, selector, hol, False)
    # a custom selector (the plugin path) and a tight cluster where almost nothing fits
    for hol in HOL:
        yield Case(f"plugin-{hol}", 300, 30, 4, "fifo", "plugin-pack", hol, True)
        yield Case(f"tight-{hol}", 2000, 20, 5, "drf", "roundrobin", hol, True)


def _extras(snapshot: Snapshot, rng: random.Random) -> Snapshot:
    groups = ("default", "gpu")
    agents = tuple(
        replace(
            agent,
            resource_group=rng.choice(groups),
            schedulable=rng.random() > 0.05,
            capacity=agent.capacity
            + (ResourceSlots({"driver:docker": Decimal(1)}) if rng.random() > 0.1 else ResourceSlots()),
        )
        for agent in snapshot.agents
    )
    designated_on = rng.sample([agent.id for agent in agents], 3)
    agents = tuple(
        replace(agent, capacity=agent.capacity + {f"designated:{agent.id}": Decimal(1_000_000)})
        if agent.id in designated_on
        else agent
        for agent in agents
    )
    ids = [session.id for session in snapshot.pending]
    pending: list[PendingSession] = []
    for session in snapshot.pending:
        fields: dict[str, Any] = {"resource_group": rng.choice(groups), "project": rng.choice([None, "p1", "p2"])}
        roll = rng.random()
        if roll < 0.05:
            fields["dependencies"] = tuple(rng.sample(ids, 2))
        elif roll < 0.08:
            fields["starts_at"] = session.created_at + timedelta(hours=rng.choice([-2, 5]))
        elif roll < 0.10:
            designated = {f"designated:{rng.choice(designated_on)}": Decimal(1)}
            fields["kernels"] = tuple(replace(k, requested=k.requested + designated) for k in session.kernels)
        if rng.random() < 0.8:
            fields["kernels"] = tuple(
                replace(k, requested=k.requested + {"driver:docker": Decimal(1)})
                for k in fields.get("kernels", session.kernels)
            )
        pending.append(replace(session, **fields))
    running = tuple(
        replace(r, resource_group=rng.choice(groups), project=rng.choice([None, "p1"])) for r in snapshot.running
    )
    users = sorted({session.user for session in pending})
    user_policies = {
        user: UserPolicy(
            rng.choice([None, 0, 3, 10]),
            rng.choice([None, {"cpu": Decimal(16)}, {"cuda.shares": Decimal(2), "mem": Decimal(64 * 1024**3)}]),
        )
        for user in rng.sample(users, len(users) // 3)
    }
    project_policies = {"p1": ProjectPolicy({"cpu": Decimal(400)}), "p2": ProjectPolicy(None)}
    dependency_states = {dep: rng.choice(list(DependencyState)) for session in pending for dep in session.dependencies}
    return Snapshot(agents, tuple(pending), running, dependency_states, user_policies, project_policies, {"default": 7})


def workload(case: Case) -> tuple[Snapshot, PassConfig]:
    bench = bench_module()
    snapshot, priority = bench.load(bench.generate(case.pending, case.agents, case.seed))
    if case.extras:
        snapshot = _extras(snapshot, random.Random(case.seed * 7919))
    group = GroupConfig(
        session_strategy=case.strategy,
        agent_selector=case.selector,
        retries_to_skip=HOL[case.hol],
        reserve_after=timedelta(hours=1),
        max_reservations=3,
        resource_priority=priority,
    )
    other = replace(group, session_strategy="fifo" if case.strategy != "fifo" else "drf", resource_priority=("cpu",))
    plugins = {"plugin-pack": concentrated.select}
    return snapshot, PassConfig(group, {"gpu": other} if case.extras else {}, plugins)


def passes(case: Case) -> Iterator[PassResult]:
    """``PASSES`` passes back to back: placed sessions occupy their agents, retries and round-robin carry over."""
    snapshot, config = workload(case)
    now = max(s.created_at for s in snapshot.pending) + timedelta(hours=2)
    for number in range(PASSES):
        result = run_pass(snapshot, config, now + timedelta(minutes=number))
        yield result
        snapshot = _apply(snapshot, result)


def _apply(snapshot: Snapshot, result: PassResult) -> Snapshot:
    agents = {agent.id: agent for agent in snapshot.agents}
    pending = {session.id: session for session in snapshot.pending}
    running = list(snapshot.running)
    for session_id, kernels in result.placements.items():
        session = pending.pop(session_id)
        for kernel in kernels:
            amount = session.kernels[kernel.kernel_index].requested
            agents[kernel.agent_id] = replace(
                agents[kernel.agent_id], occupied=agents[kernel.agent_id].occupied + amount
            )
        running.append(
            RunningSession(session.id, session.user, session.resource_group, session.requested, session.project)
        )
    for session_id in result.cancellations:
        pending.pop(session_id)
    for session_id, added in result.retry_increments.items():
        pending[session_id] = replace(pending[session_id], retries=pending[session_id].retries + added)
    return replace(
        snapshot,
        agents=tuple(agents.values()),
        pending=tuple(pending.values()),
        running=tuple(running),
        roundrobin_state=dict(result.roundrobin_state),
    )


def canonical(result: PassResult) -> dict[str, Any]:
    """Everything a pass decides, JSON-ready; placements keep their order (the order the pass placed them)."""

    def wait(w: Any) -> list[Any]:
        return [
            w.kind.value,
            w.message,
            [list(c) for c in w.failed_checks],
            str(w.shortfall),
            w.best_agent,
            w.blocked_by,
        ]

    return {
        "placements": [
            [sid, [[k.kernel_index, k.role, k.agent_id] for k in ks]] for sid, ks in result.placements.items()
        ],
        "waiting": {sid: wait(w) for sid, w in sorted(result.waiting.items())},
        "retries": dict(sorted(result.retry_increments.items())),
        "reservations": [[r.session_id, r.agent_id, str(r.held)] for r in result.reservations],
        "cancellations": {sid: [c.reason, c.message] for sid, c in sorted(result.cancellations.items())},
        "positions": dict(sorted(result.queue_positions.items())),
        "roundrobin": dict(sorted(result.roundrobin_state.items())),
    }


def digest(case: Case) -> dict[str, Any]:
    """Per pass: the sha256 of its canonical result, and how many were placed (to read a mismatch at a glance)."""
    out = []
    for result in passes(case):
        text = json.dumps(canonical(result), sort_keys=True, separators=(",", ":"))
        out.append({"sha256": hashlib.sha256(text.encode()).hexdigest(), "placed": len(result.placements)})
    return {"passes": out}


def record() -> None:
    recorded = {case.name: digest(case) for case in cases()}
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(recorded)} cases in {FIXTURE}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python -m tests.scheduler.replay --record")
    record()
