"""Session subscriptions (graphql-transport-ws): live status events and live kernel logs."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from datetime import datetime
from enum import Enum

import strawberry

from core.clock import utcnow
from core.errors import InvalidInput, NotFound
from core.retry import stop_if_cancelled
from domain.access import can_access
from domain.model import Session as SessionModel
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.sessions.log_tail import checked_tail_bytes
from gateway.graphql.sessions.types import SessionStatus
from nomad_jobs.meta import TASK_NAME
from stores import events
from stores.activity import record_activity
from stores.event_hub import EventHub
from stores.sessions import SessionStore


@strawberry.enum(name="LogStream")
class LogStream(Enum):
    STDOUT = "stdout"
    STDERR = "stderr"


@strawberry.type(description="A kernel's status when its session's status changed.")
class KernelState:
    hostname: str
    status: SessionStatus


@strawberry.type(
    description="One status change of one session, or a PREPARING session's new reason (an entry of its statusHistory)."
)
class SessionEvent:
    event_id: str = strawberry.field(
        description="This event's position: pass it as `after` to resume right after it (same subscription arguments)."
    )
    session_id: strawberry.ID
    status: SessionStatus
    reason: str = strawberry.field(description="Why the status changed (the session's statusInfo): a short code.")
    detail: str | None = strawberry.field(
        description="Why, for a person (the session's statusDetail), e.g. Nomad's "
        "'Driver Failure: Failed to pull ...'; null when the code says all."
    )
    at: datetime
    kernels: list[KernelState]


def event_type_of(event: events.SessionEvent) -> SessionEvent:
    return SessionEvent(
        event_id=event.id,
        session_id=strawberry.ID(event.session_id),
        status=event.status,
        reason=event.reason,
        detail=event.detail,
        at=event.at,
        kernels=[KernelState(hostname=k.hostname, status=k.status) for k in event.kernels],
    )


async def visible_session(info: Info, session_id: str) -> SessionModel:
    viewer = info.context.viewer
    found = await info.context.sessions.get(session_id)
    if found is None or not can_access(viewer, found.owner_id, found.project):
        raise NotFound(f"no session {session_id}", field="sessionId")
    return found


async def check_kept(store: SessionStore, stream: str, after: str | None) -> None:
    if after is not None and not await events.is_kept(store.redis, stream, after):
        raise InvalidInput(
            "after is older than the events kept: subscribe without it and reread the sessions", field="after"
        )


def hub_of(info: Info) -> EventHub:
    hub = info.context.hub
    assert hub is not None, "the gateway's lifespan makes one"
    return hub


async def one_session_events(
    store: SessionStore, hub: EventHub, session: SessionModel, after: str | None
) -> AsyncGenerator[SessionEvent, None]:
    """The session's events after ``after`` (from its first without), until one is terminal."""
    stream = store.keys.session_events(session.id)
    if session.status.is_terminal:  # nothing more will come: what is there, and done
        found = await events.read_after(store.redis, stream, after or events.BEGINNING)
        if not found and after is None:
            found = [events.latest_of(session)]  # its stream has expired: its final status is all there is
        for event in found:
            yield event_type_of(event)
        return
    async for event in hub.follow(stream, after or events.BEGINNING):
        yield event_type_of(event)
        if event.status.is_terminal:
            return


@strawberry.type
class SessionSubscriptions:
    @fields.subscription(
        description="Status changes, in order, with their reasons. With `sessionId`: that session's, from its "
        "creation (or after `after`); it completes once the session is TERMINATED or CANCELLED. Without: every "
        "change of every session you own (admins too: their own; they follow others' sessions by `sessionId`), "
        "from when the connection was acknowledged (or after `after`); it never completes. `after` is the "
        "`eventId` of the last event received, to resume without gaps after a reconnect."
    )
    async def session_events(
        self, info: Info, session_id: strawberry.ID | None = None, after: str | None = None
    ) -> AsyncGenerator[SessionEvent, None]:
        viewer = info.context.viewer
        if after is not None and not events.is_cursor(after):
            raise InvalidInput("after must be an eventId this subscription delivered", field="after")
        store = info.context.sessions
        if session_id is not None:
            session = await visible_session(info, str(session_id))
            await check_kept(store, store.keys.session_events(session.id), after)
            async for event in one_session_events(store, hub_of(info), session, after):
                yield event
            return
        stream = store.keys.owner_events(viewer.id)
        await check_kept(store, stream, after)
        start = after or info.context.events_from or await events.last_id(store.redis, stream)
        async for owned in hub_of(info).follow(stream, start):
            yield event_type_of(owned)

    @fields.subscription(
        description="A kernel's stdout or stderr as text chunks as it is written, starting `tailBytes` (0 to 4 MiB) "
        "before its end (0: only what comes next). Waits for the kernel to start; completes when it has ended and all "
        "of its output was sent (at once if it never started). A connection follows at most "
        "CARAVAN_GRAPHQL_MAX_LOG_FOLLOWS (8) logs at once, a user CARAVAN_GRAPHQL_MAX_USER_LOG_FOLLOWS (16) on one "
        "gateway process, and a gateway process 64: beyond, TOO_MANY_LOG_FOLLOWS (with `limit` and `per`)."
    )
    async def kernel_logs(
        self,
        info: Info,
        session_id: strawberry.ID,
        kernel: str = "main1",
        stream: LogStream = LogStream.STDOUT,
        tail_bytes: int = 0,
    ) -> AsyncGenerator[str, None]:
        session = await visible_session(info, str(session_id))
        checked_tail_bytes(tail_bytes)
        if not any(k.hostname == kernel for k in session.kernels):
            raise NotFound(f"session {session_id} has no kernel {kernel!r}", field="kernel")
        store, follows = info.context.sessions, info.context.log_follows
        assert follows is not None, "the gateway's context has one"
        # the viewer's follows count, whoever's the session: TOO_MANY_LOG_FOLLOWS beyond any cap
        with follows.claimed(info.context.viewer.id):
            await record_activity(store.redis, store.keys, session.id, utcnow())  # watching logs is using it
            alloc_id = await allocation_of(store, hub_of(info), session.id, kernel)
            if alloc_id is None:
                return  # it ended without ever running
            async for chunk in info.context.nomad.follow_logs(alloc_id, TASK_NAME, stream.value, tail_bytes=tail_bytes):
                yield chunk


async def allocation_of(store: SessionStore, hub: EventHub, session_id: str, hostname: str) -> str | None:
    """The kernel's Nomad allocation, once it has one; None if the session ends (or goes) without one.

    Woken by the session's status events, and rechecked every second (an allocation may come without one).
    """
    async with hub.follower(store.keys.session_events(session_id)) as changes:
        while True:
            stop_if_cancelled()  # a completed follow's cancellation, lost in redis-py (core.retry), still ends it
            session = await store.get(session_id)
            if session is None:
                return None
            kernel = next((k for k in session.kernels if k.hostname == hostname), None)
            if kernel is not None and kernel.alloc_id:
                return kernel.alloc_id
            if session.status.is_terminal:
                return None
            await changes.wait(timeout=1.0)
