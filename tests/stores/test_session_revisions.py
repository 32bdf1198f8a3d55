"""Session revisions on a real Redis: every write of a live session's document gives it a new revision, a write that
changes nothing keeps it, and the revision goes when the session ends. The idle checker reads only the documents whose
revision changed (``idle.views``), so a write that kept the old revision would leave it judging a stale session."""

from __future__ import annotations

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from domain.lifecycle import transition
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from stores.sessions import SessionStore


def pending(session_id: str, name: str) -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image="python:3.12", resources={"cpu": "1"})
    return Session(
        id=session_id, name=name, owner_id="u", type=SessionType.INTERACTIVE, driver=Driver.EXEC, image="python:3.12",
        resources={"cpu": "1"}, kernels=(kernel,), created_at=utcnow(), status=SessionStatus.PENDING,
    )  # fmt: skip


async def test_each_write_gives_a_new_revision_and_the_end_drops_it(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    await store.create([pending("rev-a", "a")])
    await store.create_each([([pending("rev-b", "b")], "token-b")])
    first = await store.revisions(["rev-a", "rev-b", "rev-unknown"])
    assert first[0] and first[1] and first[0] != first[1] and first[2] is None

    await store.update("rev-a", lambda s: transition(s, SessionStatus.SCHEDULED, reason="test", at=utcnow()))
    [scheduled] = await store.revisions(["rev-a"])
    assert scheduled and scheduled != first[0]

    await store.update("rev-a", lambda s: s)  # no change: no write, the same revision
    assert await store.revisions(["rev-a"]) == [scheduled]

    await store.update("rev-a", lambda s: transition(s, SessionStatus.CANCELLED, reason="test", at=utcnow()))
    assert await store.revisions(["rev-a", "rev-b"]) == [None, first[1]]
    assert await store.revisions([]) == []
