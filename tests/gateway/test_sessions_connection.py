"""The ``sessions`` connection against the real gateway and Redis: paging, filters, orders, limits, visibility,
and the Redis commands a page costs.

Sessions are seeded through ``SessionStore`` (with chosen creation times, owners and projects); what the
API returns is compared with the same listing worked out in Python over the seeded sessions.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from domain.lifecycle import transition
from domain.listing import NAME_SCAN_BATCH
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from domain.users import Role, User
from tests.gateway.conftest import GatewayWith
from tests.harness import Caravan, GraphQLErrors

S = SessionStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)

PAGE = """
query($first: Int, $after: String, $last: Int, $before: String, $filter: SessionFilter, $order: SessionOrder!) {
  sessions(first: $first, after: $after, last: $last, before: $before, filter: $filter, orderBy: $order) {
    totalCount
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    edges { cursor node { id name } }
  }
}
"""


def new_session(
    name: str,
    at: datetime,
    *,
    owner: str = "admin",
    project: str = "default",
    type: SessionType = SessionType.BATCH,
    group: str = "default",
) -> Session:
    resources = {"cpu": "1", "mem": str(64 << 20)}
    kernel = Kernel(role="main", index=1, hostname="main1", image="", resources=resources)
    return Session(
        id=uuid.uuid4().hex,
        name=name,
        owner_id=owner,
        type=type,
        driver=Driver.RAW_EXEC,
        image="",
        resources=resources,
        kernels=(kernel,),
        created_at=at,
        project=project,
        resource_group=group,
    )


async def seed(caravan: Caravan, sessions: Iterable[Session]) -> list[Session]:
    stored = []
    for _, same_owner in itertools.groupby(sorted(sessions, key=lambda s: s.owner_id), key=lambda s: s.owner_id):
        stored += await caravan.store.create(list(same_owner))
    return stored


async def end(caravan: Caravan, session: Session, status: SessionStatus, at: datetime) -> Session:
    path = (
        [S.CANCELLED]
        if status is S.CANCELLED
        else [S.SCHEDULED, S.RUNNING, status][: 3 if status is not S.RUNNING else 2]
    )
    after = None
    for step in path:
        after = await caravan.store.update(session.id, lambda s, step=step: transition(s, step, reason="test", at=at))
    assert after is not None and after.status is status
    return after


async def page(
    caravan: Caravan, *, token: str | None = None, order: str = "CREATED_AT_DESC", **arguments: Any
) -> dict[str, Any]:
    variables = {"order": order, **arguments}
    kwargs = {"token": token} if token else {}
    connection: dict[str, Any] = (await caravan.gql(PAGE, variables, **kwargs))["sessions"]
    return connection


def ids(connection: dict[str, Any]) -> list[str]:
    return [e["node"]["id"] for e in connection["edges"]]


def newest_first(sessions: Iterable[Session]) -> list[str]:
    return [s.id for s in sorted(sessions, key=lambda s: (s.created_at.timestamp(), s.id), reverse=True)]


async def walk(
    caravan: Caravan, size: int, *, backward: bool = False, between: Callable[[], Any] | None = None, **arguments: Any
) -> list[str]:
    """Every id, page by page (forwards with first/after or backwards with last/before)."""
    seen: list[str] = []
    cursor = None
    while True:
        if backward:
            connection = await page(caravan, last=size, before=cursor, **arguments)
            seen = ids(connection) + seen
            more, cursor = connection["pageInfo"]["hasPreviousPage"], connection["pageInfo"]["startCursor"]
        else:
            connection = await page(caravan, first=size, after=cursor, **arguments)
            seen += ids(connection)
            more, cursor = connection["pageInfo"]["hasNextPage"], connection["pageInfo"]["endCursor"]
        assert len(connection["edges"]) <= size
        if not more:
            return seen
        if between is not None:
            await between()


# -- paging -------------------------------------------------------------------------------------------


async def test_pages_forwards_and_backwards_with_stable_cursors_while_sessions_are_created(caravan: Caravan) -> None:
    # three sessions share one creation time (as sessions created together do): ties are ordered by id
    spread = [new_session(f"spread-{i}", T0 + timedelta(minutes=i)) for i in range(7)]
    tied = [new_session(f"tied-{i}", T0 + timedelta(minutes=3, seconds=30)) for i in range(3)]
    seeded = await seed(caravan, spread + tied)
    expected = newest_first(seeded)

    first = await page(caravan, first=4)
    assert ids(first) == expected[:4] and first["totalCount"] == 10
    assert first["pageInfo"]["hasNextPage"] and not first["pageInfo"]["hasPreviousPage"]
    assert first["pageInfo"]["startCursor"] == first["edges"][0]["cursor"]

    created: list[Session] = []

    async def create_newer() -> None:  # newer than everything: before the first page in this order
        created.extend(
            await seed(caravan, [new_session(f"new-{len(created)}", T0 + timedelta(days=1, seconds=len(created)))])
        )

    assert await walk(caravan, 3, between=create_newer) == expected
    assert await walk(caravan, 3, backward=True, between=create_newer) == newest_first(seeded + created)

    # oldest first, the new ones come last, and a walk that goes on while they are made reaches them
    oldest_first = newest_first(seeded + created)[::-1]
    before_walk = len(created)
    walked = await walk(caravan, 4, order="CREATED_AT_ASC", between=create_newer)
    assert walked == oldest_first + [s.id for s in created[before_walk:]]

    # a page between two cursors, and the cursors of a page are its edges'
    everything = newest_first(seeded + created)
    full = await page(caravan, first=len(everything))
    cursors = [e["cursor"] for e in full["edges"]]
    middle = await page(caravan, first=10, after=cursors[1], before=cursors[6])
    assert ids(middle) == everything[2:6] and not middle["pageInfo"]["hasNextPage"]
    backward_middle = await page(caravan, last=2, after=cursors[1], before=cursors[6])
    assert ids(backward_middle) == everything[4:6] and backward_middle["pageInfo"]["hasPreviousPage"]
    assert full["totalCount"] == len(everything) and not full["pageInfo"]["hasNextPage"]


async def test_more_ties_than_one_read_holds_page_through_in_order(caravan: Caravan) -> None:
    """30 sessions created together: past a cursor deep in them, the first read (with its documents) holds only ties
    before the cursor, so more is read (and the documents past the first read are read by an MGET)."""
    tied = [new_session(f"tie-{i:02d}", T0 + timedelta(minutes=5)) for i in range(30)]
    spread = [new_session(f"spread-{i}", T0 + timedelta(minutes=i * 3)) for i in range(4)]
    seeded = await seed(caravan, tied + spread)
    expected = newest_first(seeded)
    for size in (3, 7):
        assert await walk(caravan, size) == expected
        assert await walk(caravan, size, backward=True) == expected
        assert await walk(caravan, size, order="CREATED_AT_ASC") == expected[::-1]
    names = {s.id: s.name for s in seeded}
    deep = await page(caravan, first=30)
    past_ties = await page(caravan, first=3, after=deep["edges"][-1]["cursor"])
    assert [e["node"]["name"] for e in past_ties["edges"]] == [names[i] for i in expected[30:33]]

    # an admin's page merges their own index and their project's: ties in both, and sessions in both
    await caravan.users.put(User(id="tie-admin", name="tie-admin", role=Role.ADMIN, projects=("research",)))
    admin = await caravan.users.issue_token("tie-admin")
    theirs = [
        new_session(
            f"mine-{i:02d}", T0 + timedelta(minutes=5), owner="tie-admin", project=["default", "research"][i % 2]
        )
        for i in range(12)
    ] + [new_session(f"proj-{i:02d}", T0 + timedelta(minutes=5), owner="other", project="research") for i in range(12)]
    visible = newest_first(await seed(caravan, theirs))
    for size in (3, 7):
        assert await walk(caravan, size, token=admin) == visible
        assert await walk(caravan, size, backward=True, token=admin) == visible


async def test_first_zero_and_an_empty_listing(caravan: Caravan) -> None:
    empty = await page(caravan, first=5)
    assert empty["edges"] == [] and empty["totalCount"] == 0
    assert empty["pageInfo"] == {"hasNextPage": False, "hasPreviousPage": False, "startCursor": None, "endCursor": None}
    await seed(caravan, [new_session("only-one", T0)])
    zero = await page(caravan, first=0)
    assert zero["edges"] == [] and zero["totalCount"] == 1 and zero["pageInfo"]["hasNextPage"]


# -- filters and orders ---------------------------------------------------------------------------------


@pytest.fixture
async def varied(caravan: Caravan) -> list[Session]:
    """Sessions of several owners, projects, types, groups and statuses; some ended at known times."""
    sessions = []
    for i in range(24):
        sessions.append(
            new_session(
                f"{['train', 'eval', 'Notebook'][i % 3]}-{i:02d}",
                T0 + timedelta(minutes=i),
                owner=["alice", "bob", "carol"][i % 3],
                project=["p1", "p2"][i % 2],
                type=[SessionType.BATCH, SessionType.INTERACTIVE, SessionType.INFERENCE, SessionType.BATCH][i % 4],
                group=["default", "gpu"][(i // 2) % 2],
            )
        )
    stored = await seed(caravan, sessions)
    by_id = {s.id: s for s in stored}
    for i, session in enumerate(stored[:12]):
        status = [S.CANCELLED, S.TERMINATED, S.RUNNING, S.PENDING][i % 4]
        if status is S.RUNNING:
            by_id[session.id] = await end(caravan, session, S.RUNNING, T0 + timedelta(hours=1))
        elif status is not S.PENDING:
            by_id[session.id] = await end(caravan, session, status, T0 + timedelta(hours=2, minutes=-i))
    return list(by_id.values())


def matching(sessions: list[Session], **conditions: Callable[[Session], bool]) -> list[Session]:
    return [s for s in sessions if all(check(s) for check in conditions.values())]


FILTERS: list[tuple[str, dict[str, Any], Callable[[Session], bool]]] = [
    ("statuses", {"statuses": ["CANCELLED", "RUNNING"]}, lambda s: s.status in (S.CANCELLED, S.RUNNING)),
    ("statuses-one", {"statuses": ["PENDING"]}, lambda s: s.status is S.PENDING),
    ("type", {"type": "INTERACTIVE"}, lambda s: s.type is SessionType.INTERACTIVE),
    ("nameContains", {"nameContains": "NOTEbook"}, lambda s: "notebook" in s.name.casefold()),
    ("owner", {"owner": "bob"}, lambda s: s.owner_id == "bob"),
    ("project", {"project": "p2"}, lambda s: s.project == "p2"),
    ("resourceGroup", {"resourceGroup": "gpu"}, lambda s: s.resource_group == "gpu"),
    (
        "createdAfter",
        {"createdAfter": (T0 + timedelta(minutes=10)).isoformat()},
        lambda s: s.created_at > T0 + timedelta(minutes=10),
    ),
    (
        "createdBefore",
        {"createdBefore": (T0 + timedelta(minutes=5)).isoformat()},
        lambda s: s.created_at < T0 + timedelta(minutes=5),
    ),
    (
        "terminatedAfter",
        {"terminatedAfter": (T0 + timedelta(hours=1, minutes=55)).isoformat()},
        lambda s: s.terminated_at is not None and s.terminated_at > T0 + timedelta(hours=1, minutes=55),
    ),
    (
        "terminatedBefore",
        {"terminatedBefore": (T0 + timedelta(hours=1, minutes=55)).isoformat()},
        lambda s: s.terminated_at is not None and s.terminated_at < T0 + timedelta(hours=1, minutes=55),
    ),
    (
        "combined",
        {"owner": "alice", "project": "p1", "statuses": ["PENDING", "CANCELLED"], "nameContains": "train"},
        lambda s: (
            s.owner_id == "alice" and s.project == "p1" and s.status in (S.PENDING, S.CANCELLED) and "train" in s.name
        ),
    ),
    ("no-match", {"owner": "nobody"}, lambda s: False),
]


async def test_each_filter(caravan: Caravan, varied: list[Session]) -> None:
    for name, given, check in FILTERS:
        expected = newest_first(s for s in varied if check(s))
        connection = await page(caravan, first=100, filter=given)
        assert ids(connection) == expected, name
        assert connection["totalCount"] == len(expected), name
        assert await walk(caravan, 2, filter=given) == expected, name  # and page by page


async def test_each_order(caravan: Caravan, varied: list[Session]) -> None:
    created = sorted(varied, key=lambda s: (s.created_at.timestamp(), s.id))
    ended = sorted((s for s in varied if s.terminated_at), key=lambda s: (s.terminated_at.timestamp(), s.id))  # type: ignore[union-attr]
    assert len(ended) == 6
    cases = {
        "CREATED_AT_ASC": created,
        "CREATED_AT_DESC": created[::-1],
        "TERMINATED_AT_ASC": ended,
        "TERMINATED_AT_DESC": ended[::-1],
    }
    for order, expected in cases.items():
        assert await walk(caravan, 5, order=order) == [s.id for s in expected], order
        assert await walk(caravan, 4, order=order, backward=True) == [s.id for s in expected], order
        assert (await page(caravan, first=1, order=order))["totalCount"] == len(expected), order
    # the terminated order with a filter on the other time, and the other way round
    after = T0 + timedelta(minutes=3)
    narrowed = await page(
        caravan, first=50, order="TERMINATED_AT_ASC", filter={"createdAfter": after.isoformat(), "owner": "alice"}
    )
    assert ids(narrowed) == [s.id for s in ended if s.created_at > after and s.owner_id == "alice"]


async def test_status_filters_follow_status_changes(caravan: Caravan) -> None:
    [session] = await seed(caravan, [new_session("moving", T0)])
    pending = {"statuses": ["PENDING"]}
    assert ids(await page(caravan, filter=pending)) == [session.id]
    await end(caravan, session, S.TERMINATED, T0 + timedelta(hours=1))
    assert ids(await page(caravan, filter=pending)) == []
    assert ids(await page(caravan, filter={"statuses": ["TERMINATED"]})) == [session.id]
    assert ids(await page(caravan, order="TERMINATED_AT_DESC")) == [session.id]


async def test_name_filter_scans_in_batches_across_pages(caravan: Caravan) -> None:
    count = NAME_SCAN_BATCH * 2 + 40
    sessions = [
        new_session(f"{'needle' if i % 97 == 0 else 'hay'}-{i:04d}", T0 + timedelta(seconds=i)) for i in range(count)
    ]
    await seed(caravan, sessions)
    expected = newest_first(s for s in sessions if "needle" in s.name)
    assert len(expected) == 6
    assert await walk(caravan, 4, filter={"nameContains": "needle"}) == expected
    assert (await page(caravan, first=1, filter={"nameContains": "eedl"}))["totalCount"] == 6


# -- limits and bad arguments ---------------------------------------------------------------------------


async def test_page_size_limit_and_bad_arguments(gateway_with: GatewayWith) -> None:
    async with gateway_with(max_page=5) as caravan:
        await seed(caravan, [new_session(f"s-{i}", T0 + timedelta(minutes=i)) for i in range(8)])
        assert len((await page(caravan, first=5))["edges"]) == 5
        default = await page(caravan)
        assert len(default["edges"]) == 5 and default["pageInfo"]["hasNextPage"]  # the default page obeys the limit
        other_order_cursor = (await page(caravan, first=1, order="CREATED_AT_ASC"))["pageInfo"]["endCursor"]
        cases: list[tuple[dict[str, Any], str]] = [
            ({"first": 6}, "first"),
            ({"last": 6}, "last"),
            ({"first": -1}, "first"),
            ({"first": 2, "last": 2}, "last"),
            ({"first": 2, "after": "not a cursor"}, "after"),
            ({"last": 2, "before": "bm90fGF8Yg=="}, "before"),
            ({"first": 2, "after": other_order_cursor}, "after"),
            ({"filter": {"createdAfter": "2026-01-01T00:00:00"}}, "filter.createdAfter"),
            ({"filter": {"statuses": []}}, "filter.statuses"),
            ({"filter": {"nameContains": "x" * 300}}, "filter.nameContains"),
        ]
        for arguments, field in cases:
            with pytest.raises(GraphQLErrors) as raised:
                await page(caravan, **arguments)
            assert raised.value.codes == ["INVALID_INPUT"], arguments
            assert raised.value.errors[0]["extensions"]["field"] == field, arguments


# -- who sees what -----------------------------------------------------------------------------------------


async def test_users_see_their_own_and_admins_also_their_projects(caravan: Caravan) -> None:
    sessions = await seed(
        caravan,
        [
            new_session("alice-p1", T0, owner="alice", project="p1"),
            new_session("bob-p1", T0 + timedelta(minutes=1), owner="bob", project="p1"),
            new_session("carol-p2", T0 + timedelta(minutes=2), owner="carol", project="p2"),
            new_session("dave-p3", T0 + timedelta(minutes=3), owner="dave", project="p3"),
            new_session("dave-p2", T0 + timedelta(minutes=4), owner="dave", project="p2"),
        ],
    )
    by_name = {s.name: s.id for s in sessions}
    alice = await caravan.user("alice")
    await caravan.users.put(User(id="dave", name="dave", role=Role.ADMIN, projects=("p1", "p3")))
    dave = await caravan.users.issue_token("dave")

    assert ids(await page(caravan, token=alice)) == [by_name["alice-p1"]]
    assert ids(await page(caravan, token=alice, filter={"project": "p1"})) == [by_name["alice-p1"]]
    assert ids(await page(caravan, token=alice, filter={"owner": "bob"})) == []
    assert (await page(caravan, token=alice, filter={"owner": "bob"}))["totalCount"] == 0

    # dave: his own (in any project) and everything in p1 and p3, merged in order
    admin_sees = ["dave-p2", "dave-p3", "bob-p1", "alice-p1"]
    assert ids(await page(caravan, token=dave)) == [by_name[n] for n in admin_sees]
    assert (await page(caravan, token=dave, first=1))["totalCount"] == 4
    assert await walk(caravan, 1, token=dave) == [by_name[n] for n in admin_sees]
    assert ids(await page(caravan, token=dave, filter={"owner": "carol"})) == []
    assert ids(await page(caravan, token=dave, filter={"project": "p2"})) == [by_name["dave-p2"]]
    assert len(ids(await page(caravan))) == 5  # the superadmin sees all


async def test_an_admins_count_over_overlapping_indexes_builds_no_union(caravan: Caravan, redis: Redis) -> None:
    """An admin's listing merges their own index with their projects' (which hold some of their own too); its
    totalCount is the size of the union, counted without storing the union of every session in Redis each time."""
    sessions = [
        new_session(f"{owner}-{project}-{i}", T0 + timedelta(seconds=10 * n + i), owner=owner, project=project)
        for n, (owner, project) in enumerate(
            [("erin", "p1"), ("erin", "p2"), ("erin", "p9"), ("frank", "p1"), ("gus", "p2"), ("gus", "p3")]
        )
        for i in range(3)
    ]
    await seed(caravan, sessions)
    await caravan.users.put(User(id="erin", name="erin", role=Role.ADMIN, projects=("p1", "p2", "p3")))
    erin = await caravan.users.issue_token("erin")
    stats_before = await redis.info("commandstats")

    def calls(stats: dict[str, Any], command: str) -> int:
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    first = await page(caravan, token=erin, first=2)
    after_first = await redis.info("commandstats")
    # her own index meets each project's; projects share no session (nor do owners): no other intersection counted
    assert calls(after_first, "zintercard") - calls(stats_before, "zintercard") == 3
    everything = await walk(caravan, 4, token=erin)

    assert first["totalCount"] == len(everything) == 18  # every session but none: erin's p9 ones are her own
    assert sorted(everything) == sorted(s.id for s in sessions)
    assert (await page(caravan, token=erin, filter={"createdAfter": (T0 + timedelta(seconds=35)).isoformat()}))[
        "totalCount"
    ] == 6  # with a time bound: the union's count in that range
    stats = await redis.info("commandstats")
    assert calls(stats, "zunionstore") - calls(stats_before, "zunionstore") == 1, "only the time-bounded count does"


# -- cost ------------------------------------------------------------------------------------------------------


async def commands_run(redis: Redis) -> int:
    stats: dict[str, dict[str, int]] = await redis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if not k.endswith("_info"))


async def test_a_page_reads_its_indexes_and_documents_in_one_round_trip(
    gateway_with: GatewayWith, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round trips to Redis per page, counted as the commands (or pipelines) the gateway's connections send (a spy
    on the real method): the token check with the rate limit's count, then one read of the range, the count and
    the documents for a page over one index (a superadmin's, a user's) or several (an admin's own and project
    indexes, their count beside it); a filter adds the scratch set's building and deleting (the result cache off:
    every page executed)."""
    async with gateway_with(result_cache=0) as caravan:
        await count_round_trips(caravan, redis, monkeypatch)


async def count_round_trips(caravan: Caravan, redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    user = await caravan.user("trips-user")
    await caravan.users.put(User(id="trips-admin", name="trips-admin", role=Role.ADMIN, projects=("research",)))
    admin = await caravan.users.issue_token("trips-admin")
    await seed(
        caravan,
        [
            new_session(f"s-{i:02d}", T0 + timedelta(seconds=i), owner=["admin", "trips-user"][i % 2], project=p)
            for i, p in enumerate(["default", "research"] * 10)
        ],
    )
    sent = 0
    real_send = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        nonlocal sent
        sent += 1
        await real_send(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)

    async def round_trips(token: str | None, **arguments: Any) -> int:
        nonlocal sent
        await page(caravan, token=token, first=5, **arguments)  # the scripts loaded, the document known
        sent = 0
        connection = await page(caravan, token=token, first=5, **arguments)
        assert connection["edges"] and connection["totalCount"]
        return sent

    assert await round_trips(None) == 2  # the bootstrap superadmin: every session
    assert await round_trips(user) == 2  # their own index
    assert await round_trips(None, filter={"type": "BATCH", "statuses": ["PENDING"]}) == 4
    assert await round_trips(admin) == 2  # their own and the project's indexes
    for token in (admin, None):  # the script gone (flushed, or a new primary): loaded again, the page as before
        expected = await page(caravan, token=token, first=5)
        await redis.script_flush()
        assert await page(caravan, token=token, first=5) == expected


async def test_a_page_costs_the_same_redis_commands_whatever_its_size(caravan: Caravan, redis: Redis) -> None:
    """Counted on the real Redis (INFO commandstats): owner and idleChecks are batched per page, not per session."""
    await seed(caravan, [new_session(f"s-{i:03d}", T0 + timedelta(seconds=i)) for i in range(60)])
    query = """query($first: Int!) { sessions(first: $first) {
      totalCount edges { node { id name owner { id name } idleChecks { checkedAt } mainKernel { hostname } } }
    } }"""
    costs = {}
    for size in (5, 50, 5, 50):
        before = await commands_run(redis)
        data = await caravan.gql(query, {"first": size})
        costs[size] = await commands_run(redis) - before
        assert len(data["sessions"]["edges"]) == size
        assert data["sessions"]["edges"][0]["node"]["owner"] == {"id": "admin", "name": "admin"}
    assert costs[5] == costs[50], costs
    # token script (EVALSHA+GET+HMGET), rate limit with the result cache's version (MULTI INCRBY EXPIRE GET EXEC),
    # the listing's script (EVALSHA+ZCOUNT+ZRANGE+MGET), MGETs of the owners and idle checks
    assert costs[50] <= 13, costs
