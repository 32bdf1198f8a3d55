"""Schedule mutations: create, update, pause, resume, delete, trigger (run now).

When written, a run's sessions are built and admitted as the scheduler's runner builds and admits them at a run
(``stores.creation_rules``: every createSession rule, the folders mounted and the owner's policies; errors naming
``spec.<field>``), so a schedule whose runs would be refused is refused; the runner checks again at every run, with
what holds then: a refusal at a run is that run's recorded failure. Only the scheduler writes runs; these write the
schedule and wake it.
"""

from __future__ import annotations

from datetime import datetime

import strawberry
from strawberry.types.unset import UNSET

from core.clock import utcnow
from core.durations import duration_input
from core.errors import CaravanError, Conflict, InvalidInput, NotFound
from domain.model import SessionType
from domain.schedules import (
    ConcurrencyPolicy,
    MissedRunPolicy,
    Timing,
    check_schedule_name,
    check_timing,
    new_schedule,
    resolved_spec,
    restarted,
    run_key,
    run_request,
    run_session_name,
)
from domain.schedules import (
    Schedule as ScheduleModel,
)
from domain.session_requests import build_sessions, named_images, session_project
from domain.templates import TemplateSpec
from domain.users import User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.schedules.queries import owned, store_of
from gateway.graphql.schedules.types import Schedule, schedule_type_of
from gateway.graphql.sessions.inputs import EnvVarInput, SessionSpecInput
from gateway.graphql.sessions.resource_input import ResourceInput
from gateway.graphql.templates.mutations import in_spec, spec_of
from gateway.graphql.templates.queries import usable

MAX_DEADLINE = 366 * 86400.0


@strawberry.input(
    description="Options over the template's at each run; left out: the template's. environ and resources are "
    "merged item by item into the template's."
)
class ScheduleOverridesInput:
    image: str | None = UNSET
    startup_command: str | None = UNSET
    environ: list[EnvVarInput] | None = UNSET
    resources: list[ResourceInput] | None = UNSET
    resource_group: str | None = UNSET
    batch_timeout: str | None = UNSET
    priority: int | None = UNSET
    preset: str | None = UNSET


@strawberry.input(
    description="A recurring schedule: exactly one of cron and interval; exactly one of spec and templateId."
)
class CreateScheduleInput:
    name: str = strawberry.field(description="4-40 characters; each run's session is named <name>-<due time UTC>.")
    cron: str | None = strawberry.field(
        default=None, description="Five fields (minute hour day-of-month month day-of-week) or @hourly, @daily, "
        "@weekly, @monthly, @yearly; read in timeZone."
    )  # fmt: skip
    interval: str | None = strawberry.field(default=None, description="A fixed interval ('30s', '1h'), at least 1s.")
    time_zone: str = strawberry.field(default="UTC", description="IANA time zone of the cron expression.")
    spec: SessionSpecInput | None = strawberry.field(default=None, description="The runs' options (type BATCH).")
    template_id: strawberry.ID | None = strawberry.field(
        default=None, description="A template you may use; read at each run, with the overrides over it."
    )
    overrides: ScheduleOverridesInput | None = None
    concurrency: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    starting_deadline: str | None = strawberry.field(
        default=None, description="A due time later than this ('5m') is recorded as missed, not run."
    )
    end_at: datetime | None = strawberry.field(default=None, description="No run after this moment.")
    max_runs: int | None = strawberry.field(default=None, description="The schedule ends after this many runs.")
    missed_runs: MissedRunPolicy = MissedRunPolicy.RUN_LATEST
    project: str | None = strawberry.field(default=None, description="One of your projects (default: your first).")


@strawberry.input(description="What to change; a changed timing counts the next due time from now.")
class UpdateScheduleInput:
    name: str | None = None
    cron: str | None = strawberry.field(default=None, description="Replaces the interval, if the schedule had one.")
    interval: str | None = strawberry.field(default=None, description="Replaces the cron expression, if any.")
    time_zone: str | None = None
    spec: SessionSpecInput | None = strawberry.field(default=None, description="Replaces the whole spec.")
    overrides: ScheduleOverridesInput | None = strawberry.field(
        default=UNSET,
        description="Replaces all the overrides of a schedule from a template (null: none, the template as it is).",
    )
    concurrency: ConcurrencyPolicy | None = None
    starting_deadline: str | None = strawberry.field(default=UNSET, description="null: none.")
    end_at: datetime | None = strawberry.field(default=UNSET, description="null: none.")
    max_runs: int | None = strawberry.field(default=UNSET, description="null: none.")
    missed_runs: MissedRunPolicy | None = None


def _interval(text: str | None) -> float | None:
    return duration_input("interval", text, minimum=1.0, maximum=366 * 86400.0)


def _deadline(text: str | None) -> float | None:
    return duration_input("startingDeadline", text, minimum=1.0, maximum=MAX_DEADLINE)


def _overrides(given: ScheduleOverridesInput | None) -> tuple[TemplateSpec, tuple[str, ...]]:
    if given is None:
        return TemplateSpec(), ()
    values: dict[str, object] = {}
    for name in ("image", "startup_command", "resource_group", "batch_timeout", "priority", "preset"):
        value = getattr(given, name)
        if value is not UNSET:
            if value is None and name in ("resource_group", "priority"):
                raise InvalidInput(f"overrides.{name} cannot be null", field=f"overrides.{name}")
            values[name] = value
    for name, key, item in (("environ", "name", "value"), ("resources", "slot", "amount")):
        items = getattr(given, name)
        if items is not UNSET:
            mapping = {getattr(i, key): getattr(i, item) for i in items or []}
            if len(mapping) != len(items or []):
                raise InvalidInput(f"each of overrides.{name} may be given once", field=f"overrides.{name}")
            values[name] = mapping
    return TemplateSpec(**values), tuple(values)  # type: ignore[arg-type]


async def _checked_spec(ctx: Context, schedule: ScheduleModel, now: datetime) -> None:
    """A run's sessions built and admitted now as the runner would at the next due time, for the schedule's owner
    (errors name ``spec.<field>``); only BATCH runs."""
    template = None
    if schedule.template_id is not None:
        template = (await usable(ctx, schedule.template_id, ctx.viewer, field="templateId")).spec
    spec = resolved_spec(schedule, template)
    if spec.type is not SessionType.BATCH:
        raise InvalidInput("a schedule runs BATCH sessions: give type BATCH", field="spec.type")
    owner = await _owner(ctx, schedule)
    due = schedule.next_due or now
    request = run_request(schedule, spec, name=run_session_name(schedule, due), key=run_key(schedule.id, due))
    try:
        rules = await ctx.creation.rules(
            resource_group=spec.resource_group,
            preset=spec.preset,
            folders=[m.folder for m in spec.mounts],
            images=[reference for _, reference in named_images(request)],
            users=(owner.id,),
        )
        await ctx.creation.admit(build_sessions(request, viewer=owner, now=now, rules=rules), viewer=owner)
    except CaravanError as exc:
        raise in_spec(exc) from exc


async def _owner(ctx: Context, schedule: ScheduleModel) -> User:
    """Whom the runs are for (the runner checks them as theirs): the viewer, or the member whose schedule an admin
    changes."""
    viewer = ctx.viewer
    if schedule.owner_id == viewer.id:
        return viewer
    owner = await ctx.users.get(schedule.owner_id)
    if owner is None or not owner.active:
        raise Conflict(f"the owner {schedule.owner_id} is deactivated or gone: no run could start", field="id")
    return owner


def _retimed(before: Timing, input: UpdateScheduleInput, now: datetime) -> Timing | None:
    """The new timing, or None when the input leaves it as it is."""
    if all(v in (None, UNSET) for v in (input.cron, input.interval, input.time_zone, input.missed_runs)) and all(
        v is UNSET for v in (input.starting_deadline, input.end_at, input.max_runs)
    ):
        return None
    if input.cron is not None and input.interval is not None:
        raise InvalidInput("give at most one of cron and interval", field="cron")
    cron, interval = before.cron, before.interval
    if input.cron is not None:
        cron, interval = input.cron, None
    elif input.interval is not None:
        cron, interval = None, _interval(input.interval)
    return check_timing(
        cron=cron,
        interval=interval,
        zone=input.time_zone or before.zone,
        now=now,
        starting_deadline=before.starting_deadline
        if input.starting_deadline is UNSET
        else _deadline(input.starting_deadline),
        end_at=before.end_at if input.end_at is UNSET else input.end_at,
        max_runs=before.max_runs if input.max_runs is UNSET else input.max_runs,
        missed_runs=input.missed_runs or before.missed_runs,
        anchor=None if interval != before.interval else before.anchor,
    )


@strawberry.type
class ScheduleMutations:
    @fields.mutation(description="Create a recurring schedule of BATCH sessions; its runs are your sessions.")
    async def create_schedule(self, info: Info, input: CreateScheduleInput) -> Schedule:
        ctx = info.context
        viewer, now = ctx.viewer, utcnow()
        check_schedule_name(input.name)
        if (input.spec is None) == (input.template_id is None):
            raise InvalidInput("give exactly one of spec and templateId", field="spec")
        if input.overrides is not None and input.template_id is None:
            raise InvalidInput("overrides go with templateId", field="overrides")
        timing = check_timing(
            cron=input.cron,
            interval=_interval(input.interval),
            zone=input.time_zone,
            now=now,
            starting_deadline=_deadline(input.starting_deadline),
            end_at=input.end_at,
            max_runs=input.max_runs,
            missed_runs=input.missed_runs,
        )
        overrides, overridden = _overrides(input.overrides)
        schedule = new_schedule(
            name=input.name,
            owner_id=viewer.id,
            project=session_project(input.project, owner=viewer, viewer=viewer),
            timing=timing,
            concurrency=input.concurrency,
            now=now,
            spec=spec_of(input.spec) if input.spec is not None else None,
            template_id=str(input.template_id) if input.template_id is not None else None,
            overrides=overrides,
            overridden=overridden,
        )
        await _checked_spec(ctx, schedule, now)
        if schedule.next_due is None:
            raise InvalidInput("this schedule has no due time before its end", field="endAt")
        await store_of(ctx).create(schedule)
        return schedule_type_of(schedule)

    @fields.mutation(description="Change a schedule; a changed timing counts its next due time from now.")
    async def update_schedule(self, info: Info, id: strawberry.ID, input: UpdateScheduleInput) -> Schedule:
        ctx = info.context
        before, now = await owned(ctx, str(id), ctx.viewer), utcnow()
        if input.name is not None:
            check_schedule_name(input.name)
        timing = _retimed(before.timing, input, now)
        if input.spec is not None and before.template_id is not None:
            raise InvalidInput("this schedule's sessions come from a template: its spec cannot be set", field="spec")
        if input.overrides is not UNSET and before.template_id is None:
            raise InvalidInput("overrides go with a schedule from a template; change its spec", field="overrides")
        overrides, overridden = (
            _overrides(input.overrides) if input.overrides is not UNSET else (before.overrides, before.overridden)
        )
        changed = before.evolve(
            name=input.name or before.name,
            spec=spec_of(input.spec) if input.spec is not None else before.spec,
            overrides=overrides,
            overridden=overridden,
            concurrency=input.concurrency or before.concurrency,
            updated_at=now,
        )
        await _checked_spec(ctx, changed, now)

        def apply(current: ScheduleModel) -> ScheduleModel:
            after = current.evolve(
                name=changed.name,
                spec=changed.spec,
                overrides=changed.overrides,
                overridden=changed.overridden,
                concurrency=changed.concurrency,
                updated_at=now,
            )
            return restarted(after.evolve(timing=timing), now) if timing is not None else after

        after = await store_of(ctx).update(before.id, apply)
        return schedule_type_of(await _exists(after, str(id)))

    @fields.mutation(description="Pause a schedule: no run until it is resumed.")
    async def pause_schedule(self, info: Info, id: strawberry.ID) -> Schedule:
        ctx = info.context
        schedule = await owned(ctx, str(id), ctx.viewer)
        now = utcnow()
        after = await store_of(ctx).update(schedule.id, lambda s: s.evolve(paused=True, updated_at=now))
        return schedule_type_of(await _exists(after, str(id)))

    @fields.mutation(description="Resume a paused schedule; the due times that passed while paused are not run.")
    async def resume_schedule(self, info: Info, id: strawberry.ID) -> Schedule:
        ctx = info.context
        schedule = await owned(ctx, str(id), ctx.viewer)
        now = utcnow()

        def resumed(s: ScheduleModel) -> ScheduleModel:
            return restarted(s.evolve(paused=False, updated_at=now), now) if s.paused else s

        after = await store_of(ctx).update(schedule.id, resumed)
        return schedule_type_of(await _exists(after, str(id)))

    @fields.mutation(description="Delete a schedule and its history; the sessions it created stay. Returns its id.")
    async def delete_schedule(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        ctx = info.context
        await store_of(ctx).delete(await owned(ctx, str(id), ctx.viewer))
        return id

    @fields.mutation(
        description="Run a schedule once now, outside its due times (also while paused), under its concurrency "
        "policy; the run shows in its history within a second or so."
    )
    async def trigger_schedule(self, info: Info, id: strawberry.ID) -> Schedule:
        ctx = info.context
        schedule = await owned(ctx, str(id), ctx.viewer)
        max_runs = schedule.timing.max_runs
        if max_runs is not None and schedule.runs_started >= max_runs:
            raise Conflict(f"the schedule has run its {max_runs} runs", field="id")
        now = utcnow()
        after = await store_of(ctx).update(schedule.id, lambda s: s.evolve(trigger_at=s.trigger_at or now))
        return schedule_type_of(await _exists(after, str(id)))


async def _exists(schedule: ScheduleModel | None, schedule_id: str) -> ScheduleModel:
    if schedule is None:  # deleted meanwhile
        raise NotFound(f"no schedule {schedule_id[:64]}", field="id")
    return schedule
