"""Run passes back to back the way the caller would: apply placements, persist retries, finish work, repeat."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from domain.agents import Agent
from domain.slots import ResourceSlots
from scheduler.pass_model import PassConfig, PendingSession, RunningSession, Snapshot
from scheduler.scheduling_pass import run_pass
from tests.scheduler.builders import T0


def simulate(
    agents: list[Agent],
    pending: list[PendingSession],
    config: PassConfig,
    *,
    runs_for: int,
    max_passes: int,
    step: timedelta = timedelta(minutes=1),
) -> dict[str, int]:
    """Session id -> pass number it was placed in. A placed session occupies its agents for ``runs_for`` passes."""
    by_id = {a.id: a for a in agents}
    waiting = {s.id: s for s in pending}
    finishing: list[tuple[int, str, ResourceSlots, PendingSession]] = []  # (pass to release at, agent, slots, session)
    placed_at: dict[str, int] = {}
    roundrobin: dict[str, int] = {}
    for number in range(max_passes):
        for _release_at, agent_id, amount, _ in [f for f in finishing if f[0] == number]:
            agent = by_id[agent_id]
            by_id[agent_id] = replace(agent, occupied=agent.occupied - amount)
        finishing = [f for f in finishing if f[0] > number]
        if not waiting:
            break
        running = tuple(RunningSession(s.id, s.user, s.resource_group, s.requested) for *_, s in finishing)
        snapshot = Snapshot(tuple(by_id.values()), tuple(waiting.values()), running, roundrobin_state=roundrobin)
        result = run_pass(snapshot, config, T0 + timedelta(hours=1) + number * step)
        roundrobin = dict(result.roundrobin_state)
        for session_id, kernels in result.placements.items():
            session = waiting.pop(session_id)
            placed_at[session_id] = number
            for kernel in kernels:
                amount = session.kernels[kernel.kernel_index].requested
                agent = by_id[kernel.agent_id]
                assert (agent.occupied + amount).fits_in(agent.capacity), f"{kernel.agent_id} over-committed"
                by_id[kernel.agent_id] = replace(agent, occupied=agent.occupied + amount)
                finishing.append((number + runs_for, kernel.agent_id, amount, session))
        for session_id, increment in result.retry_increments.items():
            waiting[session_id] = replace(waiting[session_id], retries=waiting[session_id].retries + increment)
    return placed_at
