"""Reading the swept sessions: unchanged documents keep their view, and what the sweep derived from it.

Pure (no Redis): ``idle.views.ViewCache`` and ``idle.sweep.judge`` over documents encoded as Redis holds them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from core.codec import MalformedDocument, encode
from domain.idle.config import CheckName, IdlePolicyConfig, PolicyLayer
from domain.idle.facts import SessionView
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from idle.sweep import judge
from idle.views import ViewCache
from tests.domain.idle.factories import T0, at

S = SessionStatus
LIFETIME = 3600.0
CONFIG = IdlePolicyConfig(source="test", defaults=PolicyLayer(max_session_lifetime=LIFETIME))


def session(session_id: str, *, started: float = 0.0, name: str = "s") -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image="python:3.12", resources={"cpu": "1"})
    return Session(
        id=session_id, name=name, owner_id="u", type=SessionType.INTERACTIVE, driver=Driver.EXEC, image="python:3.12",
        resources={"cpu": "1"}, kernels=(kernel,), created_at=T0, status=SessionStatus.RUNNING, started_at=at(started),
    )  # fmt: skip


def text(document: Session) -> str:
    """A fresh string each time, as each read from Redis gives (equal text, another object)."""
    return encode(document).decode()


def test_an_unchanged_document_keeps_its_view_and_a_changed_one_is_read_again() -> None:
    cache = ViewCache()
    first = cache.views(["a", "b", "c"], [text(session("a")), text(session("b")), None])
    assert first[2] is None
    assert first[0] == SessionView(
        id="a", owner_id="u", type=SessionType.INTERACTIVE, resources={"cpu": "1"}, kernels=first[0].kernels,  # type: ignore[union-attr]
        created_at=T0, status=SessionStatus.RUNNING, started_at=at(0),
    )  # fmt: skip
    again = cache.views(["a", "b"], [text(session("a")), text(session("b", started=5))])
    assert again[0] is first[0]
    assert again[1] is not first[1] and again[1] is not None and again[1].started_at == at(5)


def test_with_revisions_only_the_changed_documents_are_read() -> None:
    cache = ViewCache()
    ids = ["a", "b", "c", "old"]
    revisions: list[str | None] = ["r1", "r1", "r1", None]  # "old": stored before revisions existed
    assert cache.stale(ids, revisions) == ids  # nothing seen yet
    first = cache.views(ids, [text(session(i)) for i in ids], revisions)

    revisions = ["r1", "r2", "r1", None]
    assert cache.stale(ids, revisions) == ["b", "old"]  # "b" was written; "old" has no revision: read every time
    documents = [None, text(session("b", started=5)), None, text(session("old"))]  # what was read, in order
    again = cache.views(ids, documents, revisions)
    assert again[0] is first[0] and again[2] is first[2]  # not read: their last view
    assert again[3] is first[3]  # read, and its text unchanged: its last view
    assert again[1] is not first[1] and again[1] is not None and again[1].started_at == at(5)

    assert cache.stale(["a", "d"], ["r1", "r1"]) == ["d"]
    assert cache.views(["a", "d"], [None, None], ["r1", "r1"]) == [first[0], None]  # "d" has no document
    assert cache.stale(["a", "d"], ["r1", "r1"]) == ["d"]  # nothing kept of it


def status(session_id: str, to: SessionStatus) -> str:
    return text(replace(session(session_id), status=to))


def test_the_running_sessions_follow_what_each_read_applies_as_a_full_read_finds_them() -> None:
    """A session's move into or out of RUNNING, applied from the feed, changes the running sessions a sweep judges
    (kept by the cache, not found again among every live one) exactly as a full read of the same documents does."""
    cache = ViewCache()
    ids = ["a", "b", "c", "d"]
    documents = [status("a", S.RUNNING), status("b", S.PENDING), status("c", S.RUNNING), status("d", S.RUNNING)]
    cache.views(ids, documents, ["r1"] * 4)
    assert [v.id for v in cache.live()[1]] == ["a", "c", "d"]

    # b starts, c starts terminating, d ends (TERMINATED: its revision gone with it), e is new and running
    changed = ["b", "c", "d", "e"]
    writes = [status("b", S.RUNNING), status("c", S.TERMINATING), None, status("e", S.RUNNING)]
    cache.apply(changed, ["r2", "r2", None, "r1"], writes)
    live_ids, running = cache.live()
    assert sorted(live_ids) == ["a", "b", "c", "e"] and sorted(v.id for v in running) == ["a", "b", "e"]

    full = ViewCache()
    documents = [status("a", S.RUNNING), status("b", S.RUNNING), status("c", S.TERMINATING), status("e", S.RUNNING)]
    full.views(sorted(live_ids), documents, ["r1", "r2", "r2", "r1"])
    assert {v.id: v for v in full.live()[1]} == {v.id: v for v in running}
    cache.apply(["b"], ["r3"], [status("b", S.TERMINATING)])
    assert sorted(v.id for v in cache.live()[1]) == ["a", "e"]


def test_a_session_read_again_after_a_gap_is_decoded_afresh() -> None:
    cache = ViewCache()
    [before] = cache.views(["a"], [text(session("a"))])
    cache.views(["b"], [text(session("b"))])  # "a" left the live set: forgotten
    [after] = cache.views(["a"], [text(session("a"))])
    assert after == before and after is not before


def test_a_malformed_document_is_refused_as_the_codec_refuses_it() -> None:
    with pytest.raises(MalformedDocument):
        ViewCache().views(["a"], ['{"id": 5}'])


def test_judge_reuses_what_it_derived_only_for_the_very_same_view() -> None:
    cache = ViewCache()
    now = at(LIFETIME - 60)

    def sweep(document: Session, derived: object = None) -> tuple[object, bool]:
        [view] = cache.views(["a"], [text(document)])
        assert view is not None
        result = judge(
            now=now, sessions=[view], config=CONFIG, windows={}, activity={}, samples={},
            **({"derived": derived} if derived is not None else {}),  # type: ignore[arg-type]
        )  # fmt: skip
        lifetime = next(r for r in result.verdicts["a"].reports if r.name is CheckName.SESSION_LIFETIME)
        return result.derived, lifetime.expired

    derived, expired = sweep(session("a"))
    assert not expired
    same, expired = sweep(session("a"), derived)
    assert same["a"] is derived["a"] and not expired  # type: ignore[index]
    # started an hour earlier (say, a corrected record): the new view is judged by its own start, not the kept one
    changed, expired = sweep(replace(session("a"), started_at=now - timedelta(seconds=LIFETIME)), same)
    assert changed["a"] is not same["a"] and expired  # type: ignore[index]
