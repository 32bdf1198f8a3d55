"""Recurring schedules in Redis: the documents, the listing indexes, the due index the runner pops, and each
schedule's run history.

Exactly once per due time: a run's sessions are created with the run key as their client token
(``SessionStore.create`` / ``create_each``), which is the claim: a second creation with the key, by another scheduler
process or after a crash, finds the first one's sessions instead of making new ones. The run is then settled
(:meth:`ScheduleStore.settle`): its record appended and the schedule's next due time moved on, in one transaction
that holds only if nobody settled that due time already (the document's due time is WATCHed and compared) and only
under the runner's fence. A crash between creation and settlement leaves the due time in place; the next runner
finds the sessions by the key and settles it then. A run settled as not created (skipped, missed, refused) while its
key holds sessions (another runner created them meanwhile) is not settled: the caller looks again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.keys import Keys
from core.lease import Fence, watch_fenced
from core.replies import begin, optional_texts, ranked
from core.transactions import transact
from domain.access import can_access
from domain.schedules import Run, Schedule
from domain.users import Role, User
from stores.coalesced import Coalesced

DEFAULT_HISTORY = 20
"""Run records kept per schedule (``CARAVAN_SCHEDULE_HISTORY``)."""
TRIM_EVERY = 10
"""A history list is trimmed back to its length once every this many records (one command less per run): it may
hold up to this many more, which reads leave out."""


@dataclass(frozen=True)
class Settlement:
    """The runner's decision about one schedule, to store if the due time it handled is still the schedule's."""

    schedule_id: str
    handled: datetime
    """The due time (or trigger moment) handled: settled only while the document still holds it."""
    triggered: bool
    change: Callable[[Schedule], dict[str, Any]]
    """The fields of the schedule's new runner state, from the document as it is then (a pause meanwhile stays)."""
    records: tuple[Run, ...]
    """New history records, oldest first."""
    owner_token: tuple[str, str] | None = None
    """(owner, run key) of the run settled: one settled as not created is refused if sessions exist for the key by
    then; one settled as created, unless the key still names its sessions (``created``)."""
    created: tuple[str, ...] = ()
    """The sessions of a run settled as created. The runner creates them before it settles, in a write of its own
    that no replica confirms (``SessionStore.create_each``): a failover in between can lose them, and the settlement,
    retried on the new primary, must not name sessions that are not there (bench/chaos: a run whose session was
    never found)."""
    read: tuple[str, Schedule] | None = None
    """The stored document the runner decided from and the schedule it decodes to: if the document is still
    that text, it is not decoded again."""


class ScheduleStore:
    def __init__(self, redis: Redis, keys: Keys, *, history: int = DEFAULT_HISTORY) -> None:
        self.redis = redis
        self.keys = keys
        self.history_length = history

    # -- reads --

    async def get(self, schedule_id: str) -> Schedule | None:
        raw = await self.redis.get(self.keys.schedule(schedule_id))
        return decode(raw, Schedule) if raw else None

    async def get_many(self, schedule_ids: Sequence[str]) -> list[Schedule | None]:
        return [found[1] if found else None for found in await self.documents(schedule_ids)]

    async def documents(self, schedule_ids: Sequence[str]) -> list[tuple[str, Schedule] | None]:
        """Each schedule's stored document and what it decodes to (None where there is none), in one round trip."""
        if not schedule_ids:
            return []
        raws = optional_texts(await self.redis.mget([self.keys.schedule(i) for i in schedule_ids]))
        return [(raw, decode(raw, Schedule)) if raw else None for raw in raws]

    async def visible_ids(self, viewer: User) -> list[str]:
        """Ids of the schedules ``viewer`` sees, newest first: their own; every one for admins (then filtered by
        project with ``domain.access.can_access``)."""
        key = self.keys.schedules_of_owner(viewer.id) if viewer.role is Role.USER else self.keys.schedules
        return ranked(await self.redis.zrevrange(key, 0, -1))

    async def visible(self, viewer: User, schedule_id: str) -> Schedule | None:
        found = await self.get(schedule_id)
        return found if found is not None and can_access(viewer, found.owner_id, found.project) else None

    async def history(self, schedule_id: str, limit: int | None = None) -> list[Run]:
        """The schedule's run records, newest first."""
        end = (self.history_length if limit is None else min(limit, self.history_length)) - 1  # see TRIM_EVERY
        return [decode(raw, Run) for raw in await self.redis.lrange(self.keys.schedule_runs(schedule_id), 0, end)]

    async def due(self, now: datetime, limit: int) -> list[str]:
        """Ids of the schedules due at ``now`` (their next due time or trigger has come), the most overdue first."""
        return ranked(await self.redis.zrangebyscore(self.keys.schedules_due, "-inf", now.timestamp(), 0, limit))

    async def next_score(self) -> float | None:
        """When the earliest schedule is due (unix seconds), or None."""
        first = await self.redis.zrange(self.keys.schedules_due, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    # -- the gateway's writes --

    async def create(self, schedule: Schedule) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.schedule(schedule.id), encode(schedule))
            pipe.zadd(self.keys.schedules, {schedule.id: schedule.created_at.timestamp()})
            pipe.zadd(self.keys.schedules_of_owner(schedule.owner_id), {schedule.id: schedule.created_at.timestamp()})
            self._index_due(pipe, schedule)
            self._wake(pipe)
            await pipe.execute()

    async def update(self, schedule_id: str, mutate: Callable[[Schedule], Schedule]) -> Schedule | None:
        """Apply ``mutate`` (pure; may run again on a conflict) to the stored schedule; None if there is none."""
        key = self.keys.schedule(schedule_id)

        async def attempt(pipe: Pipeline) -> Schedule | None:
            await pipe.watch(key)
            raw = await pipe.get(key)
            if raw is None:
                return None
            after = mutate(decode(raw, Schedule))
            begin(pipe)
            pipe.set(key, encode(after))
            self._index_due(pipe, after)
            self._wake(pipe)
            await pipe.execute()
            return after

        return await transact(self.redis, attempt)

    async def delete(self, schedule: Schedule) -> None:
        """Forget the schedule and its history (the sessions it created stay)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.schedule(schedule.id), self.keys.schedule_runs(schedule.id))
            pipe.zrem(self.keys.schedules, schedule.id)
            pipe.zrem(self.keys.schedules_of_owner(schedule.owner_id), schedule.id)
            pipe.zrem(self.keys.schedules_due, schedule.id)
            await pipe.execute()

    # -- the runner's writes --

    async def settle(self, settlements: Sequence[Settlement], fence: Fence | None) -> list[str]:
        """Store the settlements whose due time is still the schedule's, in one transaction under ``fence``
        (``LostLease`` when it is stale). Returns the ids of the schedules to look at again: a run settled as not
        created whose key holds sessions by now, or one settled as created whose key no longer names its sessions."""
        doc_keys = [self.keys.schedule(s.schedule_id) for s in settlements]
        checked = [s for s in settlements if s.owner_token]
        token_keys = [self.keys.client_token(*s.owner_token) for s in checked if s.owner_token]

        async def attempt(pipe: Pipeline) -> list[str]:
            await watch_fenced(pipe, fence, *doc_keys, *token_keys)
            raws = await pipe.mget(doc_keys) if doc_keys else []
            used = await pipe.mget(token_keys) if token_keys else []
            again = {s.schedule_id for s, u in zip(checked, used, strict=True) if not _token_holds(s, u)}
            begin(pipe)
            merged = Coalesced(pipe)  # one ZADD of the due index, one MSET, one script for the histories
            for settlement, raw in zip(settlements, optional_texts(raws), strict=True):
                if raw is None or settlement.schedule_id in again:
                    continue
                read = settlement.read
                before = read[1] if read is not None and read[0] == raw else decode(raw, Schedule)
                held = before.trigger_at if settlement.triggered else before.next_due
                if held != settlement.handled:
                    self._index_due(merged.as_pipe(), before)  # settled by another runner: index only
                    continue
                after = before.evolve(**settlement.change(before), recorded=before.recorded + len(settlement.records))
                merged.set(self.keys.schedule(after.id), encode(after))
                self._index_due(merged.as_pipe(), after)
                runs_key = self.keys.schedule_runs(after.id)
                if settlement.records:
                    merged.lpush(runs_key, *(encode(r) for r in settlement.records))
                    if after.recorded > self.history_length and after.recorded // TRIM_EVERY != (
                        before.recorded // TRIM_EVERY
                    ):
                        merged.ltrim(runs_key, 0, self.history_length - 1)
            merged.flush()
            await pipe.execute()
            return sorted(again)

        return await transact(self.redis, attempt)

    async def wait_for_news(self, timeout: float) -> None:
        """Block until a schedule is created, changed or triggered, at most ``timeout`` seconds."""
        if timeout > 0:
            await self.redis.blpop([self.keys.schedules_wakeup], timeout=timeout)
        await self.redis.delete(self.keys.schedules_wakeup)

    def _index_due(self, pipe: Redis, schedule: Schedule) -> None:
        score = schedule.index_score
        if score is None:
            pipe.zrem(self.keys.schedules_due, schedule.id)
        else:
            pipe.zadd(self.keys.schedules_due, {schedule.id: score})

    def _wake(self, pipe: Redis) -> None:
        pipe.rpush(self.keys.schedules_wakeup, "changed")
        pipe.ltrim(self.keys.schedules_wakeup, -8, -1)


def _token_holds(settlement: Settlement, stored: bytes | str | None) -> bool:
    """Whether the run key's stored sessions are the settlement's: none for a run not created, its own otherwise."""
    if not settlement.created:
        return stored is None
    return stored is not None and decode(stored, list[str]) == list(settlement.created)
