"""Sessions in Redis: creation, reads, and validated status updates that keep every index in step.

Each write is one optimistic transaction (WATCH … MULTI/EXEC, retried on conflict), so a
session document and its indexes (live set, pending queue, name claim) never disagree. Each also increments
``Keys.sessions_version`` in its MULTI: the gateway's result cache serves a stored answer only while it is unchanged;
and names the sessions it wrote in the change feed (``stores.session_changes``), which the idle checker follows.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.collector import collector_paused
from core.errors import Conflict
from core.keys import Keys
from core.lease import Fence, watch_fenced
from core.replies import begin, optional_texts, ranked, text_set
from core.transactions import transact
from domain.model import Session, SessionResult, SessionStatus, SessionType
from domain.start_retry import start_retry_asked
from domain.termination import STOPPING, begin_termination, job_outlives
from stores import events, session_changes
from stores.changes import sessions_changed
from stores.coalesced import Coalesced, guard_failed
from stores.owner_requests import (
    WAKEUP_BACKLOG,
    OwnerRequests,
    StopMode,
    ask_to_stop,
    ask_to_submit,
    forget_submission,
)
from stores.usage import DEFAULT_RAW_RETENTION, UsageStore

LISTING_INDEXES_VERSION = "1"
"""Bump when the listing indexes change shape: the scheduler then indexes every stored session again, once."""
REINDEX_BATCH = 500
"""Sessions indexed per WATCHed transaction when the listing indexes are rebuilt."""

T = TypeVar("T")


Mutation = Callable[[Session], Session | None]
Admission = Callable[["SessionStore"], Awaitable[None]]
"""A creation-time check that raises to refuse (``stores.resource_policies.pending_admission``)."""


def revision() -> str:
    """A fresh revision token for a session document just written (64 random bits: two writes never share one)."""
    return secrets.token_hex(8)


class SessionStore:
    def __init__(self, redis: Redis, keys: Keys, *, usage_retention: float = DEFAULT_RAW_RETENTION) -> None:
        self.redis = redis
        self.keys = keys
        self.usage = UsageStore(redis, keys, raw_retention=usage_retention)
        """Usage accounting: a session's usage is recorded in the MULTI that ends it (``stores.usage``)."""
        self.requests = OwnerRequests(redis, keys)
        """The job owner's request queue (``stores.owner_requests``); a session's new state asks in its own MULTI."""

    # -- reads ----------------------------------------------------------------------------------

    async def get(self, session_id: str) -> Session | None:
        raw = await self.redis.get(self.keys.session(session_id))
        return decode(raw, Session) if raw else None

    async def get_many(self, session_ids: Sequence[str]) -> list[Session | None]:
        if not session_ids:
            return []
        return await self.get_many_as(session_ids, Session)

    async def get_many_as(self, session_ids: Sequence[str], view: type[T]) -> list[T | None]:
        """Sessions' documents read as ``view``: :class:`Session`, or a dataclass of some of its fields (same names,
        types and defaults) when a caller needs only those, such as the idle sweep's ``SessionView``."""
        if not session_ids:
            return []
        raws = await self.redis.mget([self.keys.session(i) for i in session_ids])
        with collector_paused():  # many objects, no cycles (core.collector)
            return [decode(r, view) if r else None for r in raws]

    async def documents(self, session_ids: Sequence[str]) -> list[str | None]:
        """Sessions' stored documents as they are (JSON text, None where there is none), in one round trip: for a
        reader that decodes only what changed (``idle.views.ViewCache``)."""
        if not session_ids:
            return []
        return optional_texts(await self.redis.mget([self.keys.session(i) for i in session_ids]))

    async def pending_ids(self, resource_group: str) -> list[str]:
        return ranked(await self.redis.zrange(self.keys.pending_queue(resource_group), 0, -1))

    async def resource_groups(self) -> set[str]:
        return text_set(await self.redis.smembers(self.keys.resource_groups))

    async def live_ids(self) -> set[str]:
        return text_set(await self.redis.smembers(self.keys.sessions_live))

    async def revisions(self, session_ids: Sequence[str]) -> list[str | None]:
        """Each live session's revision (``Keys.session_revisions``): a token that changes with every write of its
        document; None for a session that has none (ended, unknown, or stored before revisions existed). Read it
        before the documents: a document read after its token is at least as new as the token says."""
        if not session_ids:
            return []
        return optional_texts(await self.redis.hmget(self.keys.session_revisions, list(session_ids)))

    async def ids_to_submit(self) -> set[str]:
        return text_set(await self.redis.smembers(self.keys.work_to_submit))

    async def session_ids(self, *, owner_id: str | None = None) -> list[str]:
        """Ids newest first, of everyone or of one owner."""
        key = self.keys.sessions_of_owner(owner_id) if owner_id else self.keys.sessions_by_created
        return ranked(await self.redis.zrevrange(key, 0, -1))

    # -- creation -------------------------------------------------------------------------------

    async def create(
        self, sessions: Sequence[Session], *, client_token: str | None = None, admit: Admission | None = None
    ) -> list[Session]:
        """Store new PENDING sessions atomically; a repeated ``client_token`` returns the first call's sessions, once
        the replicas confirmed them (as a creation's own answer waits: the first call's may have been refused).

        ``admit`` (a quota check) runs under a WATCH of the owner's session index and raises to refuse: a creation
        of the same owner racing this one makes it run again, so two racing requests cannot both slip under a limit.
        """
        owner = sessions[0].owner_id
        token_key = self.keys.client_token(owner, client_token) if client_token else None
        name_keys = [self.keys.live_name(s.owner_id, s.name) for s in sessions]

        async def attempt(pipe: Pipeline) -> list[Session]:
            owner_index = self.keys.sessions_of_owner(owner) if admit else None
            watched = [k for k in (token_key, *name_keys, owner_index) if k]
            await pipe.watch(*watched)
            if token_key and (earlier := await pipe.get(token_key)):
                found = await self.get_many(decode(earlier, list[str]))
                # the first call may have been refused as not replicated (its sessions on the primary alone): the
                # token written again, as it was, makes this answer wait for the replicas as a creation does
                begin(pipe)
                pipe.set(token_key, earlier, keepttl=True)
                await pipe.execute()
                return [s for s in found if s is not None]
            if admit:
                await admit(self)
            for session, name_key in zip(sessions, name_keys, strict=True):
                if await pipe.exists(name_key):
                    raise Conflict(f"you already have a live session named {session.name!r}", field="name")
            begin(pipe)
            for session, name_key in zip(sessions, name_keys, strict=True):
                self._write_new(pipe, session, name_key)
            session_changes.record(pipe, self.keys, ids_of(sessions))
            if token_key:
                pipe.set(token_key, encode([s.id for s in sessions]))
            sessions_changed(pipe, self.keys)  # stored GraphQL answers are now out of date
            pipe.rpush(self.keys.scheduler_wakeup, "created")
            pipe.ltrim(self.keys.scheduler_wakeup, -WAKEUP_BACKLOG, -1)
            await pipe.execute()
            return list(sessions)

        return await transact(self.redis, attempt)

    async def create_each(self, batches: Sequence[tuple[Sequence[Session], str]]) -> dict[str, list[str] | Conflict]:
        """Store many creations at once, each with its own client token (a schedule runner's runs; no admission
        check: the caller creates a run whose owner has a pending limit with :meth:`create`). Per token: the session
        ids stored, the first call's ids when the token was used already, or the :class:`Conflict` of a live name
        taken (that creation is left out).

        The tokens and names are read, then every write goes to Redis as one script that first checks that the
        tokens and names it claims are still free (``Coalesced(guarded=True)``) and writes nothing if one was taken
        meanwhile: then it is all read and decided again. As a WATCHed transaction, without WATCHing a thousand
        keys."""
        tokens = [self.keys.client_token(sessions[0].owner_id, token) for sessions, token in batches]
        names = [[self.keys.live_name(s.owner_id, s.name) for s in sessions] for sessions, _ in batches]
        while True:
            earlier = await self.redis.mget(tokens)
            taken = await self.redis.mget([k for keys in names for k in keys]) if names else []
            outcome: dict[str, list[str] | Conflict] = {}
            claimed = False
            async with self.redis.pipeline(transaction=False) as pipe:
                merged = Coalesced(pipe, guarded=True)  # every write in one script, after the claims' check
                position = 0
                for (sessions, token), token_key, name_keys, before in zip(
                    batches, tokens, names, earlier, strict=True
                ):
                    claims = taken[position : position + len(name_keys)]
                    position += len(name_keys)
                    if before:
                        outcome[token] = decode(before, list[str])
                    elif any(claims):
                        name = next(s.name for s, c in zip(sessions, claims, strict=True) if c)
                        outcome[token] = Conflict(f"a live session is named {name!r}", field="name")
                    else:
                        merged.require_absent(token_key, *name_keys)
                        claimed = True
                        for session, name_key in zip(sessions, name_keys, strict=True):
                            self._write_new(merged.as_pipe(), session, name_key)
                        session_changes.record(merged, self.keys, ids_of(sessions))
                        merged.set(token_key, encode([s.id for s in sessions]))
                        outcome[token] = [s.id for s in sessions]
                if not claimed:
                    return outcome
                sessions_changed(merged, self.keys)
                merged.rpush(self.keys.scheduler_wakeup, "created")
                merged.ltrim(self.keys.scheduler_wakeup, -WAKEUP_BACKLOG, -1)
                merged.flush()
                [reply] = await pipe.execute()
            if not guard_failed(reply):
                return outcome

    async def created_with(self, tokens: Sequence[tuple[str, str]]) -> list[list[str] | None]:
        """For each (owner id, client token): the ids of the sessions created with it, or None (not used)."""
        if not tokens:
            return []
        raws = await self.redis.mget([self.keys.client_token(owner, token) for owner, token in tokens])
        return [decode(raw, list[str]) if raw else None for raw in raws]

    def _write_new(self, pipe: Redis, session: Session, name_key: str) -> None:
        created = session.created_at.timestamp()
        pipe.set(self.keys.session(session.id), encode(session))
        pipe.hset(self.keys.session_revisions, session.id, revision())
        pipe.set(name_key, session.id)
        pipe.zadd(self.keys.sessions_by_created, {session.id: created})
        pipe.zadd(self.keys.sessions_of_owner(session.owner_id), {session.id: created})
        self._index_for_listing(pipe, session)
        pipe.sadd(self.keys.sessions_live, session.id)
        pipe.zadd(self.keys.pending_queue(session.resource_group), {session.id: created})
        pipe.sadd(self.keys.resource_groups, session.resource_group)
        self._publish(pipe, session)

    async def ensure_listing_indexes(self) -> int:
        """Put every stored session in the listing indexes, once per ``LISTING_INDEXES_VERSION`` (sessions stored
        before an index existed are otherwise missing from filtered listings and quota counts); idempotent, and
        each batch is WATCHed, so sessions changing meanwhile are indexed as they are. Returns how many were read."""
        if await self.redis.get(self.keys.listing_indexes_version) == LISTING_INDEXES_VERSION:
            return 0
        ids = ranked(await self.redis.zrange(self.keys.sessions_by_created, 0, -1))
        for start in range(0, len(ids), REINDEX_BATCH):
            await transact(
                self.redis,
                partial(self._index_batch, [self.keys.session(i) for i in ids[start : start + REINDEX_BATCH]]),
            )
        await self.redis.set(self.keys.listing_indexes_version, LISTING_INDEXES_VERSION)
        return len(ids)

    async def _index_batch(self, doc_keys: list[str], pipe: Pipeline) -> None:
        await pipe.watch(*doc_keys)
        raws = await pipe.mget(doc_keys)
        begin(pipe)
        for session in (decode(raw, Session) for raw in raws if raw):
            self._index_for_listing(pipe, session)
            if session.terminated_at:
                pipe.zadd(self.keys.sessions_by_terminated, {session.id: session.terminated_at.timestamp()})
        sessions_changed(pipe, self.keys)
        await pipe.execute()

    def _index_for_listing(self, pipe: Redis, session: Session) -> None:
        """The listing's indexes of a new session (``domain.listing`` plans queries over them)."""
        pipe.zadd(self.keys.sessions_of_project(session.project), {session.id: session.created_at.timestamp()})
        pipe.sadd(self.keys.sessions_with_status(session.status.value), session.id)
        pipe.sadd(self.keys.sessions_of_type(session.type.value), session.id)
        pipe.sadd(self.keys.sessions_in_group(session.resource_group), session.id)
        pipe.hset(self.keys.session_names, session.id, session.name)

    def _reindex_for_listing(self, pipe: Redis, before: Session, after: Session) -> None:
        if after.status is not before.status:
            pipe.srem(self.keys.sessions_with_status(before.status.value), after.id)
            pipe.sadd(self.keys.sessions_with_status(after.status.value), after.id)
        if after.status.is_terminal and not before.status.is_terminal and after.terminated_at:
            pipe.zadd(self.keys.sessions_by_terminated, {after.id: after.terminated_at.timestamp()})
        if after.name != before.name:
            pipe.hset(self.keys.session_names, after.id, after.name)

    # -- updates --------------------------------------------------------------------------------

    async def update(
        self, session_id: str, mutate: Mutation, *, fence: Fence | None = None, stop_job: StopMode | None = None
    ) -> Session | None:
        """Apply ``mutate`` to the stored session atomically; returns the stored result.

        ``mutate`` is pure and may run more than once (on a conflict); returning ``None`` means
        "no change". Raises :class:`LostLease` when ``fence`` is no longer the current term. ``stop_job``: ask the
        job owner, in the same transaction, to stop (or purge) the session's job if it has one and is now stopping.
        """
        key = self.keys.session(session_id)

        async def attempt(pipe: Pipeline) -> Session | None:
            await watch_fenced(pipe, fence, key)
            raw = await pipe.get(key)
            if raw is None:
                return None
            before = decode(raw, Session)
            after = mutate(before)
            if after is None or after == before:
                return before
            name_key = self.keys.live_name(before.owner_id, before.name)
            ends = after.status.is_terminal and not before.status.is_terminal
            if ends:  # and what the idle checker measured (not WATCHed: a sweep more or less is noise)
                name_owner, used = await self.usage.name_and_utilization(pipe, name_key, session_id)
            else:
                name_owner, used = await pipe.get(name_key), {}
            new_name_key = self.keys.live_name(after.owner_id, after.name)
            if after.name != before.name and await pipe.exists(new_name_key):
                raise Conflict(f"you already have a live session named {after.name!r}", field="name")
            begin(pipe)
            if ends:
                self.usage.write_ended(pipe, after, used)
            pipe.set(key, encode(after))
            pipe.hset(self.keys.session_revisions, session_id, revision())
            session_changes.record(pipe, self.keys, [session_id])
            self._reindex(pipe, before, after, name_key if name_owner == session_id else None)
            if stop_job is not None and after.nomad_job_id and after.status in STOPPING:
                ask_to_stop(pipe, self.keys, after.id, stop_job)
            sessions_changed(pipe, self.keys)  # stored GraphQL answers are now out of date
            await pipe.execute()
            return after

        return await transact(self.redis, attempt)

    def _reindex(self, pipe: Redis, before: Session, after: Session, owned_name_key: str | None) -> None:
        if before.status is SessionStatus.PENDING and after.status is not SessionStatus.PENDING:
            pipe.zrem(self.keys.pending_queue(before.resource_group), before.id)
        if (
            after.status is SessionStatus.SCHEDULED
            and before.status is not SessionStatus.SCHEDULED
            or rescaled(before, after)
            or start_retry_asked(before, after)
        ):
            ask_to_submit(pipe, self.keys, after.id)
        if after.nomad_job_id and job_outlives(before, after):
            # ended by what Nomad reported while Nomad would restart or reschedule it (an ended request asks itself)
            ask_to_stop(pipe, self.keys, after.id, "stop")
        if after.status is SessionStatus.RUNNING and after.batch_timeout and after.started_at:
            pipe.zadd(self.keys.batch_deadlines, {after.id: after.started_at.timestamp() + after.batch_timeout})
        elif after.status is not SessionStatus.RUNNING:
            pipe.zrem(self.keys.batch_deadlines, after.id)
        if after.status.is_terminal:
            pipe.srem(self.keys.sessions_live, after.id)
            pipe.hdel(self.keys.session_revisions, after.id)
            forget_submission(pipe, self.keys, after.id)
            if owned_name_key:
                pipe.delete(owned_name_key)
        elif after.name != before.name:
            if owned_name_key:
                pipe.delete(owned_name_key)
            pipe.set(self.keys.live_name(after.owner_id, after.name), after.id)
        self._reindex_for_listing(pipe, before, after)
        if after.status is not before.status or after.status_history[-1:] != before.status_history[-1:]:
            self._publish(pipe, after)  # a status change, or a PREPARING session's new reason (lifecycle.restate)

    async def overdue_batch_sessions(self, now: float) -> list[str]:
        return ranked(await self.redis.zrangebyscore(self.keys.batch_deadlines, "-inf", now))

    # -- asking the job owner (stores.owner_requests) -----------------------------------------------------------

    async def request_termination(
        self,
        session_id: str,
        *,
        reason: str,
        at: datetime,
        forced: bool = False,
        result: SessionResult | None = None,
        detail: str | None = None,
        fence: Fence | None = None,
    ) -> Session | None:
        """End one session (``domain.termination``); its job is stopped (purged if ``forced``) by the job owner,
        asked in the same transaction. Returns the session as stored afterwards (``None`` if it does not exist)."""
        return await self.update(
            session_id,
            lambda s: begin_termination(s, reason=reason, at=at, forced=forced, result=result, detail=detail),
            fence=fence,
            stop_job="purge" if forced else "stop",
        )

    async def wake_scheduler(self, reason: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(self.keys.scheduler_wakeup, reason)
            pipe.ltrim(self.keys.scheduler_wakeup, -WAKEUP_BACKLOG, -1)
            await pipe.execute()

    # -- events ---------------------------------------------------------------------------------

    def _publish(self, pipe: Redis, session: Session) -> None:
        """Append the status change to the session's and the owner's event streams, in the caller's MULTI."""
        events.append(pipe, self.keys, session)


def rescaled(before: Session, after: Session) -> bool:
    """A live INFERENCE session whose job changed (the autoscaler added, stopped or parked replicas)."""
    return (
        after.type is SessionType.INFERENCE
        and after.job_hcl != before.job_hcl
        and before.job_hcl is not None
        and after.status in (SessionStatus.PREPARING, SessionStatus.RUNNING)
    )


def ids_of(sessions: Iterable[Session]) -> list[str]:
    return [s.id for s in sessions]
