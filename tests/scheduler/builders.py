"""Tiny builders so test tables read like the scenario they describe."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from domain.agents import Agent
from domain.scheduling_config import GroupConfig
from domain.slots import ResourceSlots
from scheduler.pass_model import ClusterMode, PassConfig, PassResult, PendingSession, Snapshot
from scheduler.scheduling_pass import run_pass

T0 = datetime(2025, 1, 1, tzinfo=UTC)
GROUP = "g"


def slots(amounts: dict[str, object] | None = None, **by_name: object) -> ResourceSlots:
    return ResourceSlots.of({**(amounts or {}), **by_name})  # type: ignore[arg-type]


def agent(
    agent_id: str,
    capacity: dict[str, object],
    occupied: dict[str, object] | None = None,
    *,
    group: str = GROUP,
    schedulable: bool = True,
) -> Agent:
    return Agent(agent_id, group, slots(capacity), slots(occupied or {}), schedulable)


def session(
    session_id: str,
    requested: dict[str, object],
    *,
    user: str = "u",
    at: int = 0,
    group: str = GROUP,
    size: int = 1,
    mode: ClusterMode = ClusterMode.SINGLE_NODE,
    **fields: object,
) -> PendingSession:
    """``at``: seconds after T0 (the age order)."""
    return PendingSession.single(
        session_id,
        user,
        group,
        T0 + timedelta(seconds=at),
        slots(requested),
        cluster_size=size,
        cluster_mode=mode,
        **fields,
    )


def config(**fields: object) -> PassConfig:
    plugins = fields.pop("plugin_selectors", {})
    return PassConfig(GroupConfig(**fields), plugin_selectors=plugins)  # type: ignore[arg-type]


def run(
    agents: list[Agent],
    pending: list[PendingSession],
    *,
    now: datetime = T0 + timedelta(hours=1),
    **config_fields: object,
) -> PassResult:
    snapshot_fields = {k: config_fields.pop(k) for k in list(config_fields) if k in _SNAPSHOT_FIELDS}
    return run_pass(Snapshot(tuple(agents), tuple(pending), **snapshot_fields), config(**config_fields), now)


_SNAPSHOT_FIELDS = {"running", "dependency_states", "user_policies", "project_policies", "roundrobin_state"}


def placed_on(result: PassResult) -> dict[str, str]:
    """Session id -> agent of its first kernel."""
    return {sid: kernels[0].agent_id for sid, kernels in result.placements.items()}
