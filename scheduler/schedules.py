"""The schedule runner: one more task of the scheduler's leader. It pops the schedules whose due time (or trigger) has
come, decides each with ``domain.schedules`` (which due time runs, which are missed), applies the concurrency policy,
builds the run's sessions through the creation path (``domain.session_requests``, and ``stores.creation_rules``: the
creation rules and the owner's resource policies, as createSession and createSchedule admit them, checked at each run:
a violation is the run's recorded failure), creates them with the run key as their idempotency key, and settles the
runs in ``stores.schedules`` under the leader's fence.

Schedules are handled in chunks: one read of the documents, one of the run keys, each shape of run checked once, one
creation (a guarded script call, ``SessionStore.create_each``) and one settlement per chunk, so that 10,000
schedules due at once are run within seconds (``bench/schedules``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from core.clock import utcnow
from core.codec import encode
from core.errors import CaravanError, Conflict
from core.lease import Fence
from core.settings import Settings
from domain.images import CommittedImage
from domain.model import Session
from domain.schedules import (
    ConcurrencyPolicy,
    Run,
    RunOutcome,
    Schedule,
    following,
    plan_due,
    resolved_spec,
    run_key,
    run_request,
    run_session_name,
)
from domain.scheduling_config import SchedulingConfig
from domain.session_requests import CheckedRequest, CreationRules, build_sessions, check_request
from domain.templates import TemplateSpec, may_use
from domain.users import User
from stores.creation_rules import SessionCreation
from stores.images import ImageStore
from stores.schedules import ScheduleStore, Settlement
from stores.sessions import Admission, SessionStore
from stores.templates import TemplateStore
from stores.users import UserStore

log = logging.getLogger(__name__)

CHUNK = 500
"""Schedules handled per chunk (one creation, one settlement)."""
PARALLEL_CHUNKS = 4
"""Chunks handled at once (disjoint schedules: they do not conflict)."""
IDLE_WAIT = 1.0
"""Longest the runner sleeps without news (a schedule created, changed or triggered wakes it at once)."""
REPLACED = "schedule-replaced"
"""The termination reason of a REPLACE schedule's previous run."""


@dataclass
class Pending:
    """One schedule being handled in a chunk."""

    schedule: Schedule
    handled: datetime
    triggered: bool
    due: datetime | None
    """The due time to run (None: nothing runs; only the missed record and the next due time)."""
    missed: int = 0
    last_missed: datetime | None = None
    next_due: datetime | None = None
    key: str = ""
    sessions: list[Session] | None = None
    admit: Admission | None = None
    """The owner's pending limit's check, for storing ``sessions`` (None: no limit)."""
    outcome: RunOutcome | None = None
    session_ids: tuple[str, ...] = ()
    reason: str | None = None
    read: tuple[str, Schedule] | None = None
    """The stored document the schedule was read from (the settlement does not decode it again if unchanged)."""


class ScheduleRunner:
    def __init__(
        self,
        sessions: SessionStore,
        settings: Settings,
        config: SchedulingConfig,
        fence: Fence | None,
        *,
        history: int,
    ) -> None:
        redis, keys = sessions.redis, sessions.keys
        self.sessions = sessions
        self.schedules = ScheduleStore(redis, keys, history=history)
        self.users = UserStore(redis, keys)
        self.creation = SessionCreation(sessions, settings, config)
        self.templates = TemplateStore(redis, keys)
        self.images = ImageStore(redis, keys)
        self.fence = fence

    async def run_forever(self) -> None:
        """One step of the leader's task: run what is due, then wait for the next due time or news."""
        await self.run_due(utcnow())
        first = await self.schedules.next_score()
        wait = IDLE_WAIT if first is None else min(IDLE_WAIT, max(0.0, first - utcnow().timestamp()))
        await self.schedules.wait_for_news(wait)

    async def run_due(self, now: datetime) -> int:
        """Handle every schedule due at ``now``, ``PARALLEL_CHUNKS`` chunks at a time (one builds its sessions while
        Redis stores another's); returns how many were handled."""
        handled = 0
        while ids := await self.schedules.due(now, CHUNK * PARALLEL_CHUNKS):
            chunks = [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]
            handled += sum(await asyncio.gather(*(self.run_chunk(c, now) for c in chunks)))
            if len(ids) < CHUNK * PARALLEL_CHUNKS:
                break
        return handled

    async def run_chunk(self, ids: Sequence[str], now: datetime) -> int:
        pending = [p for p in (_pending(read, now) for read in await self.schedules.documents(ids)) if p is not None]
        for attempt in range(3):
            await self._decide(pending, now)
            again = set(await self.schedules.settle([_settlement(p, now) for p in pending], self.fence))
            if not again:
                return len(pending)
            log.info("schedule runs created meanwhile by another runner, or lost, looking again (%d)", len(again))
            pending = [
                replace(p, outcome=None, sessions=None, admit=None, reason=None, session_ids=())
                for p in pending
                if p.schedule.id in again
            ]
            if attempt == 2:
                log.warning("schedules %s keep changing under the runner; next pass", sorted(again))
        return 0

    async def _decide(self, pending: list[Pending], now: datetime) -> None:
        running = [p for p in pending if p.due is not None]
        for p, earlier in zip(
            running,
            await self.sessions.created_with([(p.schedule.owner_id, p.key) for p in running]),
            strict=True,
        ):
            if earlier is not None:  # created before a crash, or by another runner: settle it
                p.outcome, p.session_ids = RunOutcome.CREATED, tuple(earlier)
        await self._apply_concurrency([p for p in running if p.outcome is None], now)
        to_create = [p for p in running if p.outcome is None]
        await self._build(to_create, now)
        await self._create([p for p in to_create if p.sessions])

    async def _apply_concurrency(self, pending: list[Pending], now: datetime) -> None:
        watched = [p for p in pending if p.schedule.concurrency is not ConcurrencyPolicy.ALLOW]
        previous = [sid for p in watched for sid in p.schedule.last_sessions]
        found = {s.id: s for s in await self.sessions.get_many(previous) if s is not None}
        for p in watched:
            live = [sid for sid in p.schedule.last_sessions if sid in found and not found[sid].status.is_terminal]
            if not live:
                continue
            if p.schedule.concurrency is ConcurrencyPolicy.FORBID:
                p.outcome, p.reason = RunOutcome.SKIPPED, f"the previous run is still live: {', '.join(live)}"
                continue
            for session_id in live:
                await self.sessions.request_termination(session_id, reason=REPLACED, at=now, fence=self.fence)

    async def _build(self, pending: list[Pending], now: datetime) -> None:
        """Each run's sessions, built and admitted as createSession does, with the owner's policies; a refusal is
        the run's outcome (FAILED, with the reason)."""
        owners = {u.id: u for u in await self.users.get_many(sorted({p.schedule.owner_id for p in pending}))}
        policies = await self.creation.policies(owners, {p.schedule.project for p in pending})
        templates = await self._templates(pending, owners)
        named = await self._committed_images(pending, templates)
        rules: dict[tuple[str, str | None, tuple[str, ...]], CreationRules] = {}
        checked: dict[tuple[bytes, str, int], CheckedRequest] = {}
        """Each shape of run checked once: (spec, owner, run key length) -> the checks' result (the rules and now
        are this call's; the name and project differ per run and build_sessions checks them)."""
        for p in (p for p in pending if p.outcome is None):  # not refused for its template already
            try:
                owner = owners.get(p.schedule.owner_id)
                if owner is None or not owner.active:
                    raise Conflict(f"the owner {p.schedule.owner_id} is deactivated or gone", field="owner")
                spec = resolved_spec(p.schedule, templates.get(p.schedule.template_id or ""))
                group = (spec.resource_group, spec.preset, tuple(sorted({m.folder for m in spec.mounts})))
                if group not in rules:
                    found = await self.creation.rules(resource_group=group[0], preset=group[1], folders=group[2])
                    rules[group] = replace(found, committed_images=named)
                assert p.due is not None
                request = run_request(
                    p.schedule, spec, name=run_session_name(p.schedule, p.due, triggered=p.triggered), key=p.key
                )
                shape = (encode(spec), owner.id, len(p.key))
                if shape not in checked:
                    checked[shape] = check_request(request, viewer=owner, now=now, rules=rules[group])
                p.sessions = build_sessions(request, viewer=owner, now=now, rules=rules[group], checked=checked[shape])
                p.admit = policies.admit(p.sessions, viewer=owner)
            except CaravanError as exc:
                p.sessions, p.admit, p.outcome, p.reason = None, None, RunOutcome.FAILED, _reason(exc)

    async def _templates(self, pending: list[Pending], owners: dict[str, User]) -> dict[str, TemplateSpec]:
        specs: dict[str, TemplateSpec] = {}
        for p in pending:
            template_id = p.schedule.template_id
            if template_id is None or template_id in specs:
                continue
            template = await self.templates.get(template_id)
            owner = owners.get(p.schedule.owner_id)
            if template is not None and owner is not None and may_use(owner, template):
                specs[template_id] = template.spec
        for p in pending:
            if p.schedule.template_id is not None and p.schedule.template_id not in specs:
                p.outcome = RunOutcome.FAILED
                p.reason = f"NOT_FOUND: the template {p.schedule.template_id} is gone or no longer the owner's"
        return specs

    async def _committed_images(
        self, pending: list[Pending], templates: dict[str, TemplateSpec]
    ) -> dict[str, list[CommittedImage]]:
        """The committed images the runs name, read once for the chunk (none: no Redis call): each run's owner must
        still be allowed its image (``domain.images.check_image_use``, in ``check_request``)."""
        references: list[str | None] = []
        for p in (p for p in pending if p.outcome is None):
            spec = resolved_spec(p.schedule, templates.get(p.schedule.template_id or ""))
            references += [spec.image, *(role.image for role in spec.kernel_roles.values())]
        owners = {p.schedule.owner_id for p in pending}
        return await self.images.named([r for r in references if r], owners)

    async def _create(self, pending: list[Pending]) -> None:
        """Store the runs' sessions, the run key as their client token: in one transaction for owners without a
        pending limit, one by one (under the limit's exact check) for the others."""
        limited = [p for p in pending if p.admit is not None]
        batch = [p for p in pending if p.admit is None]
        if batch:
            outcome = await self.sessions.create_each([(p.sessions or [], p.key) for p in batch])
            for p in batch:
                _created(p, outcome[p.key])
        for p in limited:
            assert p.sessions
            try:
                stored = await self.sessions.create(p.sessions, client_token=p.key, admit=p.admit)
                _created(p, [s.id for s in stored])
            except CaravanError as exc:
                _created(p, exc)


def _pending(read: tuple[str, Schedule] | None, now: datetime) -> Pending | None:
    if read is None:
        return None
    schedule = read[1]
    if schedule.trigger_at is not None and schedule.trigger_at <= now:
        due = schedule.trigger_at
        return Pending(schedule, due, True, due, key=run_key(schedule.id, due, triggered=True), read=read)
    plan = plan_due(schedule, now)
    if plan is None:  # paused or changed since it was indexed: the settlement puts its index right
        return Pending(schedule, schedule.next_due or now, False, None, next_due=schedule.next_due, read=read)
    key = run_key(schedule.id, plan.run_due) if plan.run_due else ""
    return Pending(schedule, schedule.next_due or now, False, plan.run_due, plan.missed, plan.last_missed,
                   plan.next_due, key, read=read)  # fmt: skip


def _created(p: Pending, result: list[str] | CaravanError) -> None:
    if isinstance(result, CaravanError):
        p.outcome, p.reason, p.sessions = RunOutcome.FAILED, _reason(result), None
    else:
        p.outcome, p.session_ids = RunOutcome.CREATED, tuple(result)


def _reason(exc: CaravanError) -> str:
    field = f" ({exc.field})" if getattr(exc, "field", None) else ""
    return f"{exc.code}{field}: {exc}"


def _settlement(p: Pending, now: datetime) -> Settlement:
    records: list[Run] = []
    if p.missed and p.last_missed is not None:
        records.append(
            Run(
                key=run_key(p.schedule.id, p.last_missed),
                due_at=p.last_missed,
                at=now,
                outcome=RunOutcome.MISSED,
                missed=p.missed,
                reason=f"{p.missed} due time(s) passed without a run (downtime, or later than the starting deadline)",
            )
        )
    if p.due is not None and p.outcome is not None:
        records.append(Run(p.key, p.due, now, p.outcome, p.session_ids, p.reason, triggered=p.triggered))
    created = p.outcome is RunOutcome.CREATED
    triggered, ids = p.triggered, p.session_ids

    def change(before: Schedule) -> dict[str, Any]:
        runs = before.runs_started + (1 if created else 0)
        after: dict[str, Any] = {"runs_started": runs, "last_sessions": ids if created else before.last_sessions}
        if triggered:
            over = before.timing.max_runs is not None and runs >= before.timing.max_runs
            return after | {"trigger_at": None, "next_due": None if over else before.next_due}
        if before.paused or (p.due is None and not p.missed):  # nothing was due: only the index is put right
            return after
        return after | {"next_due": following(before.timing, now, runs)}

    token = (p.schedule.owner_id, p.key) if p.due is not None else None
    return Settlement(
        p.schedule.id, p.handled, triggered, change, tuple(records), token, ids if created else (), p.read
    )


async def run_once(runner: ScheduleRunner, now: datetime | None = None) -> int:
    """Run what is due now (tests and the benchmark drive the runner with it)."""
    return await runner.run_due(now or utcnow())
