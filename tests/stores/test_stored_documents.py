"""Documents stored before ``core.codec`` read back exactly, and what it writes keeps their JSON.

The fixtures in ``stored_documents/`` are the bytes the models' ``to_json`` wrote at 1171ae4, the last commit before
the codec (``current``), and at two older commits whose documents lack the newer fields (``generate.py`` says how each
was made). Each is read as the stores read it, and compared with the values it was made from. What the codec writes
for those values is the same JSON: the same bytes for ASCII sessions, windows and idle reports, and otherwise the
same bytes once the old writer's ``\\uXXXX`` escapes and spaces are undone.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, Field, fields, replace
from decimal import Decimal
from pathlib import Path

import pytest
from redis.asyncio import Redis

from core.codec import MalformedDocument, decode, encode
from core.keys import Keys
from core.lease import Fence
from domain.apps import App, AppProtocol
from domain.autoscaling import Metric, ScalingRules
from domain.idle.columns import Entry, WindowColumns, WindowTableDoc
from domain.idle.window import MetricSeries, UtilizationWindow, WindowDoc
from domain.model import (
    ClusterMode,
    Driver,
    Kernel,
    ReplicaSpec,
    RoleSpec,
    ScalingStatus,
    Session,
    SessionStatus,
    SessionType,
    StatusChange,
)
from domain.presets import ResourcePreset
from domain.resource_policies import ProjectResourcePolicy, UserResourcePolicy
from domain.storage import Mount
from domain.templates import Template, TemplateScope, TemplateSpec
from domain.users import User
from stores import events
from stores.idle import IdleStore, ReportDoc, StoredVerdict
from stores.presets import PresetStore
from stores.resource_policies import PolicyStore
from stores.sessions import SessionStore
from stores.templates import TemplateStore
from stores.users import UserStore
from tests.stores.stored_documents import legacy, values
from tests.stores.stored_documents.values import T0, T1, T2

FIXTURES = Path(__file__).parent / "stored_documents"


def stored(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def unescaped(old: bytes) -> bytes:
    """The old writer's document as the codec writes the same JSON: compact, UTF-8 instead of escapes."""
    return json.dumps(json.loads(old), ensure_ascii=False, separators=(",", ":")).encode()


# -- today's documents: read back exactly, written the same ------------------------------------------


def test_sessions_read_back_exactly_and_are_written_byte_for_byte() -> None:
    assert decode(stored("session_full.json"), Session) == values.full_session()
    assert decode(stored("session_minimal.json"), Session) == values.minimal_session()
    assert as_then(encode(values.minimal_session())) == stored("session_minimal.json")
    assert as_then(encode(values.full_session())) == unescaped(stored("session_full.json"))
    assert b"\\u" in stored("session_full.json")  # the fixture does hold escapes, which the codec reads as text


def test_every_field_of_the_full_session_is_set() -> None:
    """Every field with a default is set to something else, in the session and in one of its kernels at least, so
    that the comparisons above cover every field's encoding."""
    session = values.full_session()
    assert defaulted(session) == set(legacy.ADDED_SINCE)
    assert defaulted(session.kernels[0]) & defaulted(session.kernels[1]) == set(KERNEL_ADDED_SINCE)


KERNEL_ADDED_SINCE = ("draining_since", "parked", "revision", "alloc_index")
"""Kernel fields added after the fixtures were written (an endpoint's replicas draining and parked, the allocation's
index)."""
ADDED_DEFAULTS = (
    b',"preferred_ports_taken":[]',
    b',"autoscaling":null,"scaling":null,"revision":0,"previous":null',
    b',"mounts":[]',
    b',"apps":[]',
    b',"draining_since":null,"parked":false,"revision":0,"alloc_index":0',
)
"""How the fields added since the fixtures were written (``legacy.ADDED_SINCE``) are encoded at their defaults: last
in their object (a session, a template's spec)."""


def as_then(encoded: bytes) -> bytes:
    """``encoded`` without the fields added since the fixtures were written, when they hold their defaults."""
    for added in ADDED_DEFAULTS:
        encoded = encoded.replace(added + b"}", b"}")
    return encoded


def test_a_sessions_apps_are_read_back_exactly() -> None:
    """``apps`` came after the fixtures: its encoding is checked here, on a session that sets it."""
    apps = (App("web", 8080), App("ws", 9000, AppProtocol.WEBSOCKET, public=True))
    session = replace(values.full_session(), apps=apps)
    assert decode(encode(session), Session) == session
    assert b'"apps":[{"name":"web","port":8080,"protocol":"HTTP","public":false,"preferred_port":null}' in encode(
        session
    )
    preferring = replace(
        session, apps=(App("db", 5432, AppProtocol.TCP, preferred_port=25432),), preferred_ports_taken=("db",)
    )
    assert decode(encode(preferring), Session) == preferring


def test_a_sessions_mounts_are_read_back_exactly() -> None:
    """``mounts`` came after the fixtures: its encoding is checked here, on a session that sets it."""
    mounts = (Mount("f1", "caravan-folder-f1", "/data", True, "node-1"),)
    session = replace(values.full_session(), mounts=mounts)
    assert decode(encode(session), Session) == session
    assert b'"mounts":[{"folder_id":"f1","volume_name":"caravan-folder-f1","path":"/data","read_only":true' in (
        encode(session)
    )


def test_an_endpoints_scaling_is_read_back_exactly() -> None:
    """``autoscaling``, ``scaling``, ``revision``, ``previous`` and a replica's ``draining_since``, ``parked`` and
    ``revision`` came after the fixtures."""
    full = values.full_session()
    kernels = (replace(full.kernels[0], draining_since=T1, revision=2), replace(full.kernels[1], parked=True))
    session = replace(
        full,
        kernels=kernels,
        autoscaling=ScalingRules(min_replicas=0, max_replicas=4, metric=Metric.RPS, target=2.5),
        scaling=ScalingStatus(desired=3, reason="panic: 9.0 in flight over 6s", at=T2, panicking=True),
        revision=3,
        previous=ReplicaSpec("serve v2", {"MODEL": "v2"}, 2),
    )
    assert decode(encode(session), Session) == session
    assert b'"autoscaling":{"min_replicas":0,"max_replicas":4,"metric":"RPS","target":2.5' in encode(session)


def defaulted(value: Session | Kernel) -> set[str]:
    """The fields of ``value`` that hold their default."""

    def default(f: Field[object]) -> object:
        return f.default_factory() if f.default_factory is not MISSING else f.default

    return {f.name for f in fields(value) if default(f) is not MISSING and getattr(value, f.name) == default(f)}


def test_users_templates_presets_and_policies_read_back_exactly() -> None:
    assert decode(stored("user.json"), User) == values.user()
    assert decode(stored("template.json"), Template) == values.template()
    assert decode(stored("preset.json"), ResourcePreset) == values.preset()
    assert decode(stored("user_policy.json"), UserResourcePolicy) == values.user_policy()
    assert decode(stored("project_policy.json"), ProjectResourcePolicy) == values.project_policy()


def test_users_templates_presets_and_policies_keep_their_json() -> None:
    assert encode(values.user()) == unescaped(stored("user.json"))
    assert as_then(encode(values.template())) == unescaped(stored("template.json"))
    assert encode(values.preset()) == unescaped(stored("preset.json"))
    assert encode(values.user_policy().to_doc()) == unescaped(stored("user_policy.json"))
    assert encode(values.project_policy().to_doc()) == unescaped(stored("project_policy.json"))
    assert b'"mem": "10000000000"' in stored("user_policy.json")  # amounts in plain notation, then and now


def test_idle_reports_and_windows_read_back_exactly_and_are_written_byte_for_byte() -> None:
    report = decode(stored("idle_report.json"), ReportDoc)
    assert (report["checked_at"], values.verdict().from_dict(report)) == (T2, values.verdict())
    assert encode({"checked_at": T2, **values.verdict().to_dict()}) == stored("idle_report.json")
    assert UtilizationWindow.from_doc(decode(stored("window.json"), WindowDoc)) == values.window()
    assert encode(values.window().to_doc()) == stored("window.json")


YOUNG = UtilizationWindow(600.0, 15.0, {"cpu_util": MetricSeries((1772366430000,), (100000,))})
"""A window with one sample, stamped apart from ``values.window()``'s: a second stamp list in the table."""


def test_window_tables_read_back_exactly_and_are_written_byte_for_byte() -> None:
    """``window_table.json`` pins the tables' JSON as first written (``WindowTableDoc`` version 1, at the commit that
    introduced it): the cpu_util table of ``values.window()`` and :data:`YOUNG`."""
    windows = {values.full_session().id: values.window(), "young": YOUNG}
    tables = WindowColumns.of(windows).stored()
    assert encode(tables["600s/15s/cpu_util"]) == stored("window_table.json")
    loaded, problems = WindowColumns.from_stored([decode(stored("window_table.json"), WindowTableDoc)])
    assert problems == []
    only_cpu = {i: replace(w, series={"cpu_util": w.series["cpu_util"]}) for i, w in windows.items()}
    assert dict(loaded) == only_cpu


def test_events_read_back_exactly_and_keep_their_json() -> None:
    session = values.full_session()
    expected = replace(events.latest_of(session), id="1772366730000-0")
    assert events.decode("1772366730000-0", {"event": stored("event.json").decode()}) == expected
    assert expected.detail == "Überall ✓" and expected.at == T2 and len(expected.kernels) == 2
    assert events.event_fields(session)["event"] == unescaped(stored("event.json"))


def test_client_token_records_read_back() -> None:
    assert decode(stored("client_token_ids.json"), list[str]) == values.CLIENT_TOKEN_IDS


# -- older documents: the fields they lack take their defaults ---------------------------------------


def test_a_session_from_the_first_version_reads_with_the_newer_fields_defaulted() -> None:
    kernel = Kernel(
        role="main",
        index=1,
        hostname="main1",
        image="busybox:1",
        resources={"cpu": "1"},
        status=SessionStatus.RUNNING,
        agent="node-1",
        alloc_id="alloc-1",
        status_info="running",
    )
    assert decode(stored("session_c75d824.json"), Session) == Session(
        id="f00d",
        name="first",
        owner_id="admin",
        type=SessionType.INTERACTIVE,
        driver=Driver.DOCKER,
        image="busybox:1",
        resources={"cpu": "1"},
        kernels=(kernel,),
        created_at=T0,
        status=SessionStatus.RUNNING,
        status_info="running",
        status_history=(
            StatusChange(SessionStatus.PENDING, T0, "created"),
            StatusChange(SessionStatus.RUNNING, T1, "running"),
        ),
        environ={"A": "1"},
        nomad_job_id="caravan-f00d",
        job_hcl="job {}",
    )


def test_a_policy_and_a_template_from_before_their_newer_fields_read_with_them_defaulted() -> None:
    assert decode(stored("user_policy_bae4576.json"), UserResourcePolicy) == UserResourcePolicy(
        total_resource_slots={"cpu": Decimal("4")},
        idle_timeout=300.0,
        max_concurrent_sessions=2,
    )
    spec = TemplateSpec(
        type=SessionType.BATCH,
        driver=Driver.DOCKER,
        image="busybox:1",
        resources={"cpu": "1"},
        cluster_size=2,
        cluster_mode=ClusterMode.MULTI_NODE,
        kernel_roles={"sub": RoleSpec(None, {"cpu": "2"})},
    )
    assert decode(stored("template_bae4576.json"), Template) == Template(
        "t-1",
        "old",
        "admin",
        "default",
        TemplateScope.PERSONAL,
        spec,
        T0,
        T1,
    )


def test_a_document_missing_a_field_without_default_is_malformed() -> None:
    doc = json.loads(stored("session_minimal.json"))
    del doc["created_at"]
    with pytest.raises(MalformedDocument, match="Session.*created_at"):
        decode(json.dumps(doc), Session)


# -- through the stores, from Redis ------------------------------------------------------------------


async def test_the_stores_read_the_old_documents_from_redis(redis: Redis, keys: Keys) -> None:
    full, minimal, user = values.full_session(), values.minimal_session(), values.user()
    await redis.mset(
        {
            keys.session(full.id): stored("session_full.json"),
            keys.session(minimal.id): stored("session_minimal.json"),
            keys.session("f00d"): stored("session_c75d824.json"),
            keys.user(user.id): stored("user.json"),
            keys.template(values.template().id): stored("template.json"),
            keys.user_policy("user-001"): stored("user_policy.json"),
            keys.project_policy("research"): stored("project_policy.json"),
            keys.client_token("admin", "again"): stored("client_token_ids.json"),
            keys.idle_report(full.id): stored("idle_report.json"),
        }
    )
    await redis.hset(keys.resource_presets, "small", stored("preset.json"))
    await redis.hset(keys.idle_windows, full.id, stored("window.json"))

    sessions = SessionStore(redis, keys)
    assert await sessions.get_many([full.id, minimal.id, "missing"]) == [full, minimal, None]
    assert (await sessions.get("f00d") or minimal).kernels[0].ports == ()
    # a repeated client token answers the sessions its first creation made, from the old id list
    assert await sessions.create([replace(minimal, id="new")], client_token="again") == [full, minimal]
    assert await UserStore(redis, keys).get(user.id) == user
    assert await TemplateStore(redis, keys).get(values.template().id) == values.template()
    assert await PresetStore(redis, keys).all() == [values.preset()]
    policies = PolicyStore(redis, keys)
    assert await policies.users(["user-001"]) == {"user-001": values.user_policy()}
    assert await policies.projects(["research"]) == {"research": values.project_policy()}
    idle = IdleStore(redis, keys)
    assert await idle.verdict(full.id) == StoredVerdict(T2, values.verdict())
    assert dict(await idle.load_windows()) == {full.id: values.window()}  # saved one by one, before the tables


async def test_the_window_tables_replace_the_windows_saved_one_by_one(redis: Redis, keys: Keys) -> None:
    """A checker upgraded from saving each window as a document resumes from those, and its first save replaces them
    with the tables, which the next leader reads (a session that ended meanwhile is gone from them)."""
    idle, full = IdleStore(redis, keys), values.full_session()
    await redis.hset(keys.idle_windows, mapping={full.id: stored("window.json"), "ended": stored("window.json")})
    windows = await idle.load_windows()
    assert dict(windows) == {full.id: values.window(), "ended": values.window()}
    at = 1772366445.0  # the sweep after the window's last sample
    windows.record(at, [Entry(full.id, (600.0, 15.0), ("cpu_util", "mem"), {"cpu_util": 5.0, "mem": 50.0})])
    fence = Fence(key=keys.idle_fence, token=3)
    await redis.set(keys.idle_fence, 3)
    await idle.save_sweep(fence, checked_at=T2, verdicts={}, ttl=30, windows=windows)
    assert not await redis.exists(keys.idle_windows)
    assert await redis.hlen(keys.idle_window_tables) == 3  # cpu_util, mem, and cuda_util kept until it is stale
    again = await idle.load_windows()
    assert dict(again) == dict(windows)
    assert again[full.id].series["cpu_util"].values == (1500, 0, 250, 5000)


@pytest.mark.parametrize(
    "broken",
    [
        {"v": 2},
        {"interval": 0.0},
        {"metric": ""},
        {"stamps": [[1772366400000, 15000, 0]]},
        {"stamps": [[1772366400000, 15000, -1]]},
        {"stamps": [[-5, 15000, 15000]]},
        {"stamps": [[1772366400000, 15000, 15000], []]},
        {"stamps": [[2**63, 1, 1]]},
        {"stamp_list": [0, 2]},
        {"stamp_list": [0]},
        {"sessions": ["a", "a"]},
        {"values": "3AUAAAAAAAAAAAAAAAAAAPoAAAAAAAAA"},  # three numbers for four stamps
        {"values": "3AUAAAAAAAAAAAAAAAAAAPoAAAAAAAAAAAAAAAAAAEAB"},  # four numbers and a byte
        {"values": "not base64!"},
        {"values": [1500, 0, 250, 100000]},
    ],
    ids=lambda broken: ",".join(broken),
)
async def test_a_malformed_window_table_starts_its_series_afresh(
    redis: Redis, keys: Keys, broken: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    good = json.loads(stored("window_table.json"))
    bad = {**good, "metric": "mem", **broken}
    await redis.hset(keys.idle_window_tables, mapping={"cpu": json.dumps(good), "mem": json.dumps(bad)})
    windows = await IdleStore(redis, keys).load_windows()
    assert set(windows) == {values.full_session().id, "young"}
    assert all(set(window.series) == {"cpu_util"} for window in windows.values())
    assert "starting them afresh" in caplog.text


async def test_a_session_in_tables_of_two_shapes_keeps_one(redis: Redis, keys: Keys) -> None:
    good = json.loads(stored("window_table.json"))
    other = {**good, "metric": "mem", "window_seconds": 300.0}
    await redis.hset(keys.idle_window_tables, mapping={"a": json.dumps(good), "b": json.dumps(other)})
    windows = await IdleStore(redis, keys).load_windows()
    kept = {(w.window_seconds, tuple(w.series)) for w in windows.values()}
    assert kept in ({(600.0, ("cpu_util",))}, {(300.0, ("mem",))})  # whichever table Redis answered first
