"""GraphQL types of recurring schedules and their runs."""

from __future__ import annotations

from datetime import datetime

import strawberry

from domain import schedules
from domain.schedules import next_run_times
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.sessions.types import Session, session_type_of
from gateway.graphql.templates.types import SessionSpec, spec_type_of
from stores.schedules import ScheduleStore

MAX_NEXT_RUN_TIMES = 100
MAX_HISTORY = 1000

# The domain's enums are the GraphQL enums (strawberry.enum marks the class itself).
ConcurrencyPolicy = schedules.ConcurrencyPolicy
strawberry.enum(
    ConcurrencyPolicy,
    name="ConcurrencyPolicy",
    description="ALLOW: runs may overlap; FORBID: a due time while the previous run is live is skipped (recorded); "
    "REPLACE: the previous run's live sessions are ended (schedule-replaced) and the new run starts.",
)
MissedRunPolicy = schedules.MissedRunPolicy
strawberry.enum(
    MissedRunPolicy,
    name="MissedRunPolicy",
    description="After downtime, of the due times that passed only the latest may run, once: RUN_LATEST runs it "
    "unless later than startingDeadline; SKIP runs it only within startingDeadline (60 s without one). The others "
    "are one MISSED record.",
)
RunOutcome = schedules.RunOutcome
strawberry.enum(RunOutcome, name="RunOutcome", description="What became of one due time of a schedule.")


@strawberry.type(description="One record of a schedule's history.")
class ScheduleRun:
    key: str = strawberry.field(description="The run key: the idempotency key its sessions were created with.")
    due_at: datetime = strawberry.field(description="The due time (MISSED: the latest of those it stands for).")
    at: datetime = strawberry.field(description="When the runner handled it.")
    outcome: RunOutcome
    session_ids: list[strawberry.ID]
    reason: str | None = strawberry.field(description="Why it was skipped, missed or refused (the error's code).")
    missed: int = strawberry.field(description="MISSED: how many due times this record stands for.")
    triggered: bool = strawberry.field(description="Run by triggerSchedule, not at a due time.")

    @fields.field(
        description="The run's sessions as they are now (their status and result); ones deleted are left out."
    )
    async def sessions(self, info: Info) -> list[Session]:
        found = await info.context.sessions.get_many([str(i) for i in self.session_ids])
        return [session_type_of(s) for s in found if s is not None]


@strawberry.type(description="A recurring schedule: batch sessions created at its due times.")
class Schedule:
    id: strawberry.ID
    name: str
    owner_id: str
    project: str
    cron: str | None = strawberry.field(description="Five-field cron expression or shorthand, in timeZone.")
    interval: float | None = strawberry.field(description="Seconds between due times (interval schedules).")
    time_zone: str
    starting_deadline: float | None = strawberry.field(description="Seconds late a due time may still run.")
    end_at: datetime | None
    max_runs: int | None
    missed_runs: MissedRunPolicy
    concurrency: ConcurrencyPolicy
    paused: bool
    template_id: strawberry.ID | None = strawberry.field(description="The template its sessions come from, if any.")
    spec: SessionSpec | None = strawberry.field(description="Its own session options (not from a template).")
    overridden: list[str] = strawberry.field(description="The template's options its overrides replace.")
    overrides: SessionSpec | None = strawberry.field(
        description="A schedule from a template: its overrides' values (only the options named in overridden apply; "
        "environ and resources are merged into the template's). Null for a schedule with its own spec."
    )
    next_due: datetime | None = strawberry.field(description="The earliest due time not yet handled.")
    runs_started: int = strawberry.field(description="Runs whose sessions were created.")
    created_at: datetime
    updated_at: datetime
    model: strawberry.Private[schedules.Schedule]

    @fields.field(description="The next due times (at most 100; none while paused or once over).")
    def next_run_times(self, count: int = 5) -> list[datetime]:
        return next_run_times(self.model, max(0, min(count, MAX_NEXT_RUN_TIMES)))

    @fields.field(description="The latest runs, newest first (CARAVAN_SCHEDULE_HISTORY are kept).")
    async def history(self, info: Info, limit: int = 20) -> list[ScheduleRun]:
        kept = info.context.settings.scheduler.schedule_history
        store = ScheduleStore(info.context.sessions.redis, info.context.sessions.keys, history=kept)
        runs = await store.history(self.model.id, max(1, min(limit, MAX_HISTORY)))
        return [run_type_of(r) for r in runs]


def run_type_of(run: schedules.Run) -> ScheduleRun:
    return ScheduleRun(
        key=run.key,
        due_at=run.due_at,
        at=run.at,
        outcome=run.outcome,
        session_ids=[strawberry.ID(i) for i in run.session_ids],
        reason=run.reason,
        missed=run.missed,
        triggered=run.triggered,
    )


def schedule_type_of(s: schedules.Schedule) -> Schedule:
    t = s.timing
    return Schedule(
        id=strawberry.ID(s.id),
        name=s.name,
        owner_id=s.owner_id,
        project=s.project,
        cron=t.cron,
        interval=t.interval,
        time_zone=t.zone,
        starting_deadline=t.starting_deadline,
        end_at=t.end_at,
        max_runs=t.max_runs,
        missed_runs=t.missed_runs,
        concurrency=s.concurrency,
        paused=s.paused,
        template_id=strawberry.ID(s.template_id) if s.template_id else None,
        spec=spec_type_of(s.spec) if s.spec else None,
        overridden=list(s.overridden),
        overrides=spec_type_of(s.overrides) if s.template_id else None,
        next_due=None if s.paused else s.next_due,
        runs_started=s.runs_started,
        created_at=s.created_at,
        updated_at=s.updated_at,
        model=s,
    )


@strawberry.type(description="A schedule and the cursor of its place in the listing.")
class ScheduleEdge:
    cursor: str
    node: Schedule


@strawberry.type(description="A page of schedules, newest first (Relay cursor connection, forwards).")
class ScheduleConnection:
    edges: list[ScheduleEdge]
    page_info: strawberry.relay.PageInfo
    total_count: int
