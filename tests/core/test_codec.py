"""core.codec: stored documents round-trip, read as the writer before it read them, and are written as it wrote them.

The reference is the session reader and writer before the codec (``tests/stores/stored_documents/legacy.py``):
for sessions with every field set, what the codec writes is the JSON the old writer wrote, the old reader (a
rolled-back Caravan) reads it as the same session, and the codec reads the old writer's bytes as the same session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.clock import from_iso
from core.codec import MalformedDocument, decode, encode
from domain.idle.window import MetricSeries, UtilizationWindow, WindowDoc
from domain.model import (
    ClusterMode,
    Driver,
    Kernel,
    Session,
    SessionResult,
    SessionStatus,
    SessionType,
    StatusChange,
)
from domain.presets import ResourcePreset
from domain.templates import Template, TemplateScope, TemplateSpec
from domain.users import Role, User
from tests.stores.stored_documents import legacy, values

# -- strategies: every field set ------------------------------------------------------------------------

LONE_SURROGATES = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3)
TEXT = st.one_of(
    st.text(max_size=20),  # any Unicode but surrogates
    st.text(st.characters(codec="ascii"), max_size=20),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=5), LONE_SURROGATES, st.text(max_size=5)),
)
"""Text a client may send: JSON can carry lone surrogates, which UTF-8 cannot."""
CLEAN_TEXT = st.text(max_size=20)
INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
SMALL = st.integers(min_value=0, max_value=2**31)
SECONDS = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
MOMENT = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
AMOUNTS = st.dictionaries(
    st.sampled_from(["cpu", "mem", "cuda.shares", "rocm.device"]),
    st.decimals(min_value=0, max_value=10**12, allow_nan=False).map(lambda d: format(d, "f")),
)


def kernels(text: st.SearchStrategy[str]) -> st.SearchStrategy[Kernel]:
    return st.builds(
        Kernel,
        role=st.sampled_from(["main", "sub"]),
        index=SMALL,
        hostname=text,
        image=text,
        resources=AMOUNTS,
        status=st.sampled_from(SessionStatus),
        agent=text,
        alloc_id=text,
        exit_code=INT,
        status_info=text,
        status_detail=text,
        started_at=MOMENT,
        finished_at=MOMENT,
        ports=st.tuples(text, text),
        restarts=SMALL,
        healthy=st.booleans(),
    )


def sessions(
    text: st.SearchStrategy[str] = TEXT,
    seconds: st.SearchStrategy[float] = SECONDS,
) -> st.SearchStrategy[Session]:
    """Sessions with every field set (none left None or empty)."""
    return st.builds(
        Session, id=text, name=text, owner_id=text, type=st.sampled_from(SessionType),
        driver=st.sampled_from(Driver), image=text, resources=AMOUNTS, kernels=st.lists(kernels(text), min_size=1,
        max_size=3).map(tuple), created_at=MOMENT, status=st.sampled_from(SessionStatus), status_info=text,
        status_detail=text, status_history=st.lists(st.builds(StatusChange, st.sampled_from(SessionStatus), MOMENT,
        text, text), min_size=1, max_size=4).map(tuple), resource_group=text, project=text, startup_command=text,
        environ=st.dictionaries(text, text, min_size=1, max_size=3), cluster_mode=st.sampled_from(ClusterMode),
        result=st.sampled_from(SessionResult), exit_code=INT, nomad_job_id=text, job_hcl=text, client_token=text,
        priority=st.integers(0, 100), retries=SMALL, wait_reasons=st.lists(text, min_size=1).map(tuple),
        queue_position=SMALL, starts_at=MOMENT, batch_timeout=seconds, dependencies=st.lists(text, min_size=1).map(
        tuple), designated_agent=text, preopen_ports=st.lists(st.integers(1024, 65535), min_size=1).map(tuple),
        shared_memory=text, started_at=MOMENT, service_port=st.integers(1, 65535), health_check_path=text,
        health_check_grace=seconds,
    )  # fmt: skip


# -- sessions ---------------------------------------------------------------------------------------------


@given(sessions(CLEAN_TEXT))
def test_sessions_round_trip(session: Session) -> None:
    assert decode(encode(session), Session) == session
    assert decode(encode(session).decode(), Session) == session


@given(sessions())
def test_sessions_read_and_written_as_before(session: Session) -> None:
    """Whatever the text (lone surrogates too): the same JSON as the old writer's, read by the old reader (a
    rollback) as the codec reads it, and the old writer's bytes read by the codec as the old reader read them."""
    new, old = encode(session), legacy.session_to_json(session)
    assert json.loads(new) == json.loads(old)
    assert legacy.session_from_json(new) == decode(new, Session)
    assert decode(old, Session) == legacy.session_from_json(old)


PRINTABLE = st.text(st.characters(codec="ascii", exclude_characters="\x7f"), max_size=20)
PLAIN_SECONDS = st.one_of(st.just(0.0), st.floats(min_value=0.001, max_value=1e9))
"""Floats both writers put in plain notation (below 1e-4 Python writes ``6.1e-05``, msgspec ``0.000061``)."""


@given(sessions(PRINTABLE, PLAIN_SECONDS))
def test_ascii_sessions_are_written_byte_for_byte_as_before(session: Session) -> None:
    assert encode(session) == legacy.session_to_json(session).encode()


def test_a_lone_surrogate_is_escaped_as_before_and_read_back() -> None:
    session = values.minimal_session().evolve(environ={"X": "a\ud800b"})
    assert encode(session) == legacy.session_to_json(session).encode()
    assert b"\\ud800" in encode(session)
    assert decode(encode(session), Session) == session


def test_moments_with_another_offset_are_read_in_utc() -> None:
    """``core.clock.from_iso`` gives every moment it reads in UTC, so the codec writes them as the old writer did."""
    moment = from_iso("2026-05-01T14:00:00+02:00")
    assert moment.tzinfo is UTC and moment == datetime(2026, 5, 1, 12, tzinfo=UTC)
    session = values.minimal_session().evolve(starts_at=moment)
    assert encode(session) == legacy.session_to_json(session).encode()
    assert b'"starts_at":"2026-05-01T12:00:00Z"' in encode(session)


def test_a_moment_in_another_zone_is_still_the_same_moment() -> None:
    """A moment built in another zone (not read through core.clock) reads back as the same instant."""
    moment = datetime(2026, 5, 1, 14, tzinfo=timezone(timedelta(hours=2)))
    assert decode(encode(values.minimal_session().evolve(starts_at=moment)), Session).starts_at == moment


# -- the other documents ----------------------------------------------------------------------------------


@given(
    st.builds(
        User,
        id=CLEAN_TEXT,
        name=CLEAN_TEXT,
        role=st.sampled_from(Role),
        projects=st.lists(CLEAN_TEXT).map(tuple),
        active=st.booleans(),
    )
)
def test_users_round_trip(user: User) -> None:
    assert json.loads(encode(user)) == {
        "id": user.id,
        "name": user.name,
        "role": user.role.value,
        "projects": list(user.projects),
        "active": user.active,
    }
    assert decode(encode(user), User) == user


@given(st.builds(ResourcePreset, CLEAN_TEXT, AMOUNTS, st.none() | CLEAN_TEXT))
def test_presets_round_trip(preset: ResourcePreset) -> None:
    assert decode(encode(preset), ResourcePreset) == preset


@given(
    st.builds(
        TemplateSpec,
        type=st.sampled_from(SessionType),
        driver=st.sampled_from(Driver),
        environ=st.dictionaries(CLEAN_TEXT, CLEAN_TEXT),
        preopen_ports=st.lists(SMALL).map(tuple),
        count=SMALL,
        starts_at=st.none() | CLEAN_TEXT,
    ),
    MOMENT,
)
def test_templates_round_trip(spec: TemplateSpec, at: datetime) -> None:
    template = Template("t", "name", "owner", "default", TemplateScope.PERSONAL, spec, at, at + timedelta(seconds=1))
    assert decode(encode(template), Template) == template


@given(
    st.dictionaries(
        st.sampled_from(["cpu_util", "mem", "cuda_util"]),
        st.lists(st.integers(0, 100_000), min_size=1, max_size=50),
        min_size=1,
    )
)
def test_windows_round_trip(values_of: dict[str, list[int]]) -> None:
    series = {
        metric: MetricSeries(tuple(1_700_000_000_000 + 15_000 * i for i in range(len(v))), tuple(v))
        for metric, v in values_of.items()
    }
    window = UtilizationWindow(window_seconds=900.0, interval=15.0, series=series)
    assert UtilizationWindow.from_doc(decode(encode(window.to_doc()), WindowDoc)) == window


# -- the rules of the codec --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    name: str
    count: int = 1
    at: datetime | None = None


def test_a_missing_field_takes_its_default_and_an_unknown_one_is_ignored() -> None:
    assert decode('{"name": "a", "later": {"x": 1}}', Doc) == Doc("a")
    assert decode(b'{"name": "a", "at": "2026-01-01T00:00:00Z"}', Doc) == Doc("a", at=datetime(2026, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    "text, where",
    [
        ("", "Doc"),
        ("not json", "Doc"),
        ("[]", "Doc"),
        ("{}", "name"),
        ('{"name": 3}', "name"),
        ('{"name": "a", "count": "3"}', "count"),
        ('{"name": "a", "at": "yesterday"}', "at"),
        (b"\xff\xfe", "Doc"),
    ],
)
def test_a_malformed_document_is_a_value_error_naming_the_type_and_the_field(text: str | bytes, where: str) -> None:
    with pytest.raises(MalformedDocument, match=f"malformed Doc document: .*{where}|malformed {where}") as caught:
        decode(text, Doc)
    assert isinstance(caught.value, ValueError)


def test_documents_are_compact_utf8_with_enums_by_value_and_moments_in_rfc3339() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=UTC)
    assert encode(Doc("ünï ✓", 2, at)) == '{"name":"ünï ✓","count":2,"at":"2026-01-02T03:04:05.000600Z"}'.encode()
    assert encode([SessionStatus.RUNNING, (1, 2), None]) == b'["RUNNING",[1,2],null]'
