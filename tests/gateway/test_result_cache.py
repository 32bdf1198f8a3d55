"""The result cache (``gateway.graphql.result_cache``) against the real gateway and Redis.

Executions are counted with a spy around the real ``Schema.execute`` (it calls through), and Redis reads
on the real server's INFO commandstats: a cached answer runs no listing command at all.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlparse

import pytest
from graphql import parse
from redis.asyncio import Redis

from core.settings import Settings
from domain.lifecycle import transition
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from domain.users import Role, User
from gateway.graphql.http import GRAPHQL_RESPONSE, JSON
from gateway.graphql.known_operations import KnownOperations
from gateway.graphql.result_cache import Answers, cacheable_operation
from gateway.graphql.schema import CaravanSchema, schema
from stores.session_listing import SessionListing
from tests.faults import NetworkCut
from tests.gateway.conftest import GatewayWith, post
from tests.harness import Caravan, GraphQLErrors, running_caravan

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAGE = """query($first: Int) { sessions(first: $first) {
  totalCount pageInfo { hasNextPage endCursor } edges { cursor node { id name status ownerId mainKernel { hostname } } }
} }"""
ONE = "query($id: ID!) { session(id: $id) { id name status } }"


def new_session(name: str, at: datetime, *, owner: str = "admin", project: str = "default") -> Session:
    resources = {"cpu": "1", "mem": str(64 << 20)}
    kernel = Kernel(role="main", index=1, hostname="main1", image="", resources=resources)
    return Session(
        id=uuid.uuid4().hex,
        name=name,
        owner_id=owner,
        type=SessionType.BATCH,
        driver=Driver.RAW_EXEC,
        image="",
        resources=resources,
        kernels=(kernel,),
        created_at=at,
        project=project,
    )


class Executions:
    """How many operations the schema really executed, through Strawberry or as a known query (the spies call the
    real ``execute``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for owner in (CaravanSchema, KnownOperations):
            monkeypatch.setattr(owner, "execute", self.counted(owner.execute))

    def counted(self, real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await real(*args, **kwargs)

        return counted


@pytest.fixture
def executions(monkeypatch: pytest.MonkeyPatch) -> Executions:
    return Executions(monkeypatch)


async def listing_reads(redis: Redis) -> int:
    """ZRANGE and MGET calls so far on the real server: what executing a page costs (a cached answer: none)."""
    stats: dict[str, dict[str, int]] = await redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("zrange", "mget"))


def names(data: dict[str, Any]) -> list[str]:
    return [e["node"]["name"] for e in data["sessions"]["edges"]]


# -- the hit path ------------------------------------------------------------------------------------


async def test_a_repeated_page_is_answered_without_executing_or_reading_sessions(
    caravan: Caravan, redis: Redis, executions: Executions
) -> None:
    await caravan.store.create([new_session(f"s-{i}", T0 + timedelta(seconds=i)) for i in range(5)])
    first = await post(caravan, {"query": PAGE, "variables": {"first": 3}})
    reads, executed = await listing_reads(redis), executions.count
    again = [await post(caravan, {"query": PAGE, "variables": {"first": 3}}) for _ in range(3)]
    assert await listing_reads(redis) == reads and executions.count == executed
    assert all(r.status_code == 200 and r.content == first.content for r in again)
    assert names(first.json()["data"]) == ["s-4", "s-3", "s-2"]
    assert first.json()["data"]["sessions"]["edges"][0]["node"]["mainKernel"] == {"hostname": "main1"}

    # other variables are another answer; the media type follows each request, hit or not
    other = await post(caravan, {"query": PAGE, "variables": {"first": 2}})
    assert names(other.json()["data"]) == ["s-4", "s-3"] and executions.count == executed + 1
    legacy = await post(caravan, {"query": PAGE, "variables": {"first": 3}}, accept=JSON)
    assert legacy.headers["content-type"].startswith(JSON) and legacy.content == first.content
    assert first.headers["content-type"].startswith(GRAPHQL_RESPONSE)
    by_get = await caravan.http.get(
        caravan.url,
        params={"query": PAGE, "variables": '{"first": 3}'},
        headers={"authorization": "Bearer test-admin-token"},
    )
    assert by_get.content == first.content and executions.count == executed + 1


async def test_every_write_through_the_store_shows_at_once(caravan: Caravan, executions: Executions) -> None:
    [older, newer] = await caravan.store.create([new_session("older", T0), new_session("newer", T0 + timedelta(1))])
    session_query = {"query": ONE, "variables": {"id": newer.id}}
    assert names(await caravan.gql(PAGE)) == ["newer", "older"]
    assert (await caravan.gql(**session_query))["session"]["name"] == "newer"

    await caravan.store.update(newer.id, lambda s: replace(s, name="renamed"))
    assert names(await caravan.gql(PAGE)) == ["renamed", "older"]
    assert (await caravan.gql(**session_query))["session"]["name"] == "renamed"

    await caravan.store.update(older.id, lambda s: transition(s, SessionStatus.CANCELLED, reason="test", at=T0))
    statuses = [e["node"]["status"] for e in (await caravan.gql(PAGE))["sessions"]["edges"]]
    assert statuses == ["PENDING", "CANCELLED"]

    await caravan.store.create([new_session("newest", T0 + timedelta(2))])
    page = await caravan.gql(PAGE)
    assert names(page) == ["newest", "renamed", "older"] and page["sessions"]["totalCount"] == 3

    executed = executions.count
    assert names(await caravan.gql(PAGE)) == ["newest", "renamed", "older"]
    assert executions.count == executed  # and unchanged, it is served again


async def test_each_viewer_gets_the_answer_of_their_own_scope(caravan: Caravan, executions: Executions) -> None:
    await caravan.store.create([new_session("alice-1", T0, owner="alice", project="p1")])
    await caravan.store.create([new_session("bob-1", T0 + timedelta(1), owner="bob", project="p1")])
    await caravan.store.create([new_session("carol-1", T0 + timedelta(2), owner="carol", project="p2")])
    alice = await caravan.user("alice", projects=("p1",))
    bob = await caravan.user("bob", projects=("p1",))
    dave = await caravan.user("dave", Role.ADMIN, projects=("p1",))

    for _ in range(2):  # the second round would be served from the cache: still each their own
        assert names(await caravan.gql(PAGE, token=alice)) == ["alice-1"]
        assert names(await caravan.gql(PAGE, token=bob)) == ["bob-1"]
        assert names(await caravan.gql(PAGE, token=dave)) == ["bob-1", "alice-1"]  # an ADMIN of p1: its sessions
        assert names(await caravan.gql(PAGE)) == ["carol-1", "bob-1", "alice-1"]  # the superadmin: all
    executed = executions.count
    assert names(await caravan.gql(PAGE, token=alice)) == ["alice-1"] and executions.count == executed

    # the same user with another role or other projects is another scope (users are not versioned: keyed)
    await caravan.users.put(User(id="alice", name="alice", role=Role.ADMIN, projects=("p1", "p2")))
    assert names(await caravan.gql(PAGE, token=alice)) == ["carol-1", "bob-1", "alice-1"]
    await caravan.users.put(User(id="alice", name="alice", role=Role.USER, projects=("p1",)))
    assert names(await caravan.gql(PAGE, token=alice)) == ["alice-1"]

    # a session of another viewer is NOT_FOUND for bob however often alice has read it
    [alice_session] = [s for s in await caravan.store.get_many(await caravan.store.session_ids(owner_id="alice")) if s]
    assert (await caravan.gql(ONE, {"id": alice_session.id}, token=alice))["session"]["name"] == "alice-1"
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(ONE, {"id": alice_session.id}, token=bob)
    assert refused.value.codes == ["NOT_FOUND"]


# -- what is never cached --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "selection",
    [
        "owner { id name }",
        "idleChecks { checkedAt }",
        "mainKernel { logs { stdout } }",
        "kernels { logs(tailBytes: 10) { stderr } }",
    ],
)
async def test_fields_reading_other_data_are_executed_every_time(
    caravan: Caravan, redis: Redis, executions: Executions, selection: str
) -> None:
    [session] = await caravan.store.create([new_session("watched", T0)])
    query = f"query {{ sessions(first: 5) {{ edges {{ node {{ id name {selection} }} }} }} }}"
    await caravan.gql(query)
    reads, executed = await listing_reads(redis), executions.count
    await caravan.gql(query)
    assert executions.count == executed + 1 and await listing_reads(redis) > reads
    assert not cacheable_operation(schema._schema, parse(query), None)


async def test_an_owner_renamed_shows_at_once(caravan: Caravan) -> None:
    """Users are not versioned: ``owner`` is not cached, so a changed user shows on the next read."""
    await caravan.store.create([new_session("theirs", T0, owner="erin")])
    await caravan.users.put(User(id="erin", name="Erin", role=Role.USER))
    query = "{ sessions { edges { node { owner { name } } } } }"
    assert (await caravan.gql(query))["sessions"]["edges"][0]["node"]["owner"]["name"] == "Erin"
    await caravan.users.put(User(id="erin", name="Erin B.", role=Role.USER))
    assert (await caravan.gql(query))["sessions"]["edges"][0]["node"]["owner"]["name"] == "Erin B."


async def test_mutations_are_executed_every_time(caravan: Caravan, executions: Executions) -> None:
    [session] = await caravan.store.create([new_session("before", T0)])
    rename = 'mutation($id: ID!) { renameSession(id: $id, name: "after") { id name } }'
    for _ in range(3):
        assert (await caravan.gql(rename, {"id": session.id}))["renameSession"]["name"] == "after"
    assert executions.count == 3
    assert not cacheable_operation(schema._schema, parse(rename), None)


async def test_errors_are_not_kept(caravan: Caravan, executions: Executions) -> None:
    missing = {"id": uuid.uuid4().hex}
    for _ in range(2):
        with pytest.raises(GraphQLErrors) as refused:
            await caravan.gql(ONE, missing)
        assert refused.value.codes == ["NOT_FOUND"]
        with pytest.raises(GraphQLErrors) as refused:
            await caravan.gql(PAGE, {"first": 1000})
        assert refused.value.codes == ["INVALID_INPUT"]
        with pytest.raises(GraphQLErrors) as refused:
            await caravan.gql(PAGE, token=None)
        assert refused.value.codes == ["UNAUTHENTICATED"]
    assert executions.count == 6


async def test_a_write_racing_an_execution_is_not_kept(
    caravan: Caravan, executions: Executions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename lands through the store right after the page's sessions were read, before the answer is stored."""
    [session] = await caravan.store.create([new_session("old-name", T0)])
    real_page = SessionListing.page
    raced = asyncio.Event()

    async def page_then_rename(listing: SessionListing[Any], *args: Any, **kwargs: Any) -> Any:
        read = await real_page(listing, *args, **kwargs)
        if not raced.is_set():
            raced.set()
            await caravan.store.update(session.id, lambda s: replace(s, name="new-name"))
        return read

    monkeypatch.setattr(SessionListing, "page", page_then_rename)
    assert names(await caravan.gql(PAGE)) == ["old-name"]  # read before the write: a correct answer, not kept
    assert names(await caravan.gql(PAGE)) == ["new-name"]
    executed = executions.count
    assert names(await caravan.gql(PAGE)) == ["new-name"] and executions.count == executed  # this one was kept
    assert executions.count == 2


async def test_misses_arriving_together_execute_once(caravan: Caravan, executions: Executions) -> None:
    stored = await caravan.store.create([new_session(f"s-{i}", T0 + timedelta(seconds=i)) for i in range(20)])
    newest = stored[-1]
    for name in ("s-19", "v1", "v2"):  # each round after a write: every request misses at once
        if name != newest.name:
            await caravan.store.update(newest.id, lambda s, name=name: replace(s, name=name))
        executed = executions.count
        answers = await asyncio.gather(*(post(caravan, {"query": PAGE}) for _ in range(12)))
        assert len({a.content for a in answers}) == 1 and names(answers[0].json()["data"])[0] == name
        assert executions.count == executed + 1


async def test_turned_off_every_request_executes_and_answers_the_same(
    caravan: Caravan, gateway_with: GatewayWith, executions: Executions
) -> None:
    await caravan.store.create([new_session(f"s-{i}", T0 + timedelta(seconds=i)) for i in range(3)])
    cached = [await post(caravan, {"query": PAGE, "variables": {"first": 2}}) for _ in range(2)]
    assert executions.count == 1
    async with gateway_with(result_cache=0) as uncached:
        for _ in range(3):
            answer = await post(uncached, {"query": PAGE, "variables": {"first": 2}})
            assert answer.content == cached[0].content == cached[1].content
        assert executions.count == 4


async def test_without_a_rate_limit_the_version_is_read_on_its_own(
    gateway_with: GatewayWith, executions: Executions
) -> None:
    async with gateway_with(rate_limit=0) as caravan:
        [session] = await caravan.store.create([new_session("one", T0)])
        for _ in range(3):
            assert names(await caravan.gql(PAGE)) == ["one"]
        assert executions.count == 1
        await caravan.store.update(session.id, lambda s: replace(s, name="two"))
        assert names(await caravan.gql(PAGE)) == ["two"]


async def test_without_redis_nothing_stored_is_served(redis_settings: Settings) -> None:
    """Neither the token nor the version can be checked: the answer is UNAVAILABLE, not the last page."""
    async with NetworkCut(urlparse(redis_settings.redis.url).port or 6379) as cut:
        url = redis_settings.redis.url
        through_cut = url.replace(f":{urlparse(url).port}/", f":{cut.port}/")  # same user
        behind_cut = replace(redis_settings, redis=replace(redis_settings.redis, url=through_cut))
        async with running_caravan(behind_cut, scheduler=False) as caravan:
            await caravan.store.create([new_session("kept", T0)])
            for _ in range(2):
                assert names(await caravan.gql(PAGE)) == ["kept"]
            cut.set_cut(True)
            with pytest.raises(GraphQLErrors) as refused:
                await caravan.gql(PAGE)
            assert refused.value.codes == ["UNAVAILABLE"]
            cut.set_cut(False)
            assert names(await caravan.gql(PAGE)) == ["kept"]


# -- the decision and the bounds, pure -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "operation", "expected"),
    [
        ("{ sessions { totalCount edges { cursor node { id name status } } pageInfo { hasNextPage } } }", None, True),
        ("query($id: ID!) { session(id: $id) { __typename id kernels { hostname resources { slot } } } }", None, True),
        ('{ a: sessions(first: 1) { edges { node { id } } } b: session(id: "x") { name } }', None, True),
        ("{ sessions { edges { node { ...F } } } } fragment F on Session { id mainKernel { status } }", None, True),
        ("{ sessions { edges { node { ... on Session { id } } } } }", None, True),
        ("query($all: Boolean!) { sessions { edges { node { id name @include(if: $all) } } } }", None, True),
        ("query A { sessions { totalCount } } mutation B { destroySession(ids: []) { id } }", "A", True),
        ("query A { sessions { totalCount } } mutation B { destroySession(ids: []) { id } }", "B", False),
        ("query A { sessions { totalCount } } query C { viewer { id } }", None, False),  # which one: left to execution
        ("{ viewer { id } }", None, False),
        ("{ sessions { totalCount } viewer { id } }", None, False),
        ("{ __schema { types { name } } }", None, False),
        ("{ sessions { edges { node { ...F } } } } fragment F on Session { owner { name } }", None, False),
        ("{ sessions { edges { node { ...F } } } } fragment F on Session { ...F }", None, False),  # a cycle
        ("{ sessions { edges { node { idleChecks { checkedAt } } } } }", None, False),
        ("{ sessions { noSuchField } }", None, False),
        ("subscription { sessionEvents { status } }", None, False),
        ('mutation { renameSession(id: "x", name: "y") { id } }', None, False),
    ],
)
def test_which_operations_may_be_cached(document: str, operation: str | None, expected: bool) -> None:
    assert cacheable_operation(schema._schema, parse(document), operation) is expected


def test_answers_are_bounded_in_entries_and_bytes() -> None:
    def key(i: int) -> Any:
        return (f"q{i}", None, "{}", "u", "USER", ("default",))

    answers = Answers(max_entries=3, max_bytes=100)
    for i in range(4):
        answers.put(key(i), "1", b"x" * 10)
    assert len(answers) == 3 and answers.get(key(0), "1") is None and answers.get(key(1), "1") == b"x" * 10
    assert answers.get(key(1), "2") is None  # another version: not an answer
    answers.put(key(4), "1", b"y" * 80)  # 10 + 10 + 80 after dropping the least recently used (key 2)
    assert answers.get(key(2), "1") is None and answers.get(key(1), "1") is not None and answers.bytes == 100
    answers.put(key(5), "1", b"z" * 101)  # larger than everything: not kept, nothing dropped for it
    assert answers.get(key(5), "1") is None and len(answers) == 3
