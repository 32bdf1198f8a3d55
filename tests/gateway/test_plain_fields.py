"""Plain data fields (``gateway.graphql.execution``): read straight off their objects, with every answer and every
error exactly as graphql-core's own executor gives them.

The page test runs the real gateway on Redis and counts the fields graphql-core executes the ordinary way (a spy on
its ``execute_field``, the real method still called). The others run one small schema with the stock execution
context and with ours, on values the gateway's types can hold and on ones they must refuse, and compare.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, NewType

import pytest
import strawberry
from graphql.execution.executor import Executor as CoreExecutionContext
from strawberry.schema.config import StrawberryConfig
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from domain.model import Driver, Kernel, Session, SessionType
from gateway.graphql.document_cache import DocumentCache
from gateway.graphql.execution import PlainFieldsExecution, execution_for
from tests.gateway.conftest import GatewayWith
from tests.harness import ADMIN_TOKEN, Caravan

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAGE = "{ sessions(first: 20) { totalCount edges { cursor node { id name status type createdAt ownerId } } } }"


async def test_a_page_executes_its_plain_fields_without_graphql_cores_field_machinery(
    caravan: Caravan, monkeypatch: pytest.MonkeyPatch
) -> None:
    resources = {"cpu": "1", "mem": str(64 << 20)}
    kernel = Kernel(role="main", index=1, hostname="main1", image="", resources=resources)
    await caravan.store.create(
        [
            Session(
                id=uuid.uuid4().hex,
                name=f"plain-{i}",
                owner_id="admin",
                type=SessionType.BATCH,
                driver=Driver.RAW_EXEC,
                image="",
                resources=resources,
                kernels=(kernel,),
                created_at=T0 + timedelta(seconds=i),
            )
            for i in range(20)
        ]
    )
    executed: list[str] = []
    ordinary = CoreExecutionContext.execute_field

    def counted(self: CoreExecutionContext, parent_type: Any, *args: Any) -> Any:
        executed.append(parent_type.name)
        return ordinary(self, parent_type, *args)

    monkeypatch.setattr(CoreExecutionContext, "execute_field", counted)
    data = await caravan.gql(PAGE)

    edges = data["sessions"]["edges"]
    assert [e["node"]["name"] for e in edges] == [f"plain-{i}" for i in reversed(range(20))]
    assert edges[0]["node"]["status"] == "PENDING" and edges[0]["node"]["type"] == "BATCH"
    assert edges[0]["node"]["createdAt"] == (T0 + timedelta(seconds=19)).isoformat()
    assert all(e["cursor"] for e in edges) and data["sessions"]["totalCount"] == 20
    # the root field alone: the connection below it (totalCount, the list of edges, each edge's node and the 20 × 7
    # scalars and enums: cursor, id, name...) is read by one plan
    assert executed == ["Query"]


GATEWAY_DOCUMENTS = [
    (
        "{ sessions(first: 5) { totalCount pageInfo { hasNextPage hasPreviousPage startCursor endCursor } "
        "edges { cursor node { id name status type createdAt ownerId project } } } }",
        None,
    ),
    (
        "query P($n: Int!, $s: Boolean!) { sessions(first: $n, filter: {statuses: [PENDING]}) { ...C } } "
        "fragment C on SessionConnection { t: totalCount edges { c: cursor @skip(if: $s) node { __typename n: name "
        "... on Session { id status } } } }",
        {"n": 3, "s": True},
    ),
    (
        "query P($n: Int!, $s: Boolean!) { sessions(first: $n, filter: {statuses: [PENDING]}) { ...C } } "
        "fragment C on SessionConnection { t: totalCount edges { c: cursor @skip(if: $s) node { __typename n: name "
        "... on Session { id status } } } }",
        {"n": 3, "s": False},
    ),
    (
        '{ sessions(last: 4, filter: {nameContains: "cmp-1"}) { edges { node { id kernels { role hostname image } '
        "resources { slot amount } environ { name value } waitReasons dependencies statusHistory { status reason } "
        "terminatedAt exitCode startupCommand } } pageInfo { startCursor } } }",
        None,
    ),
    (
        "{ a: sessions(first: 2) { edges { node { name } } } b: sessions(first: 2, orderBy: CREATED_AT_ASC) "
        "{ edges { node { name endpointUrl } } totalCount } viewer { id role } }",
        None,
    ),
    ("{ sessions(first: 3) { edges { node { name status @include(if: false) } } } }", None),
    ("{ sessions(first: 600) { totalCount } }", None),  # over the page limit: an error of the resolver
]


async def test_the_gateway_answers_as_graphql_cores_executor(
    gateway_with: GatewayWith, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real gateway's schema, Redis, a user's and an admin's pages: every document answers the same with the
    plans (twice: the second time from plans kept) and with graphql-core's own execution (the result cache off, so
    every answer is executed)."""
    async with gateway_with(result_cache=0) as caravan:
        await compare_executions(caravan, monkeypatch)


async def compare_executions(caravan: Caravan, monkeypatch: pytest.MonkeyPatch) -> None:
    resources = {"cpu": "1", "mem": str(64 << 20)}
    kernel = Kernel(role="main", index=1, hostname="main1", image="img:1", resources=resources)
    user = await caravan.user("cmp-user")
    sessions = [
        Session(
            id=uuid.uuid4().hex,
            name=f"cmp-{i}",
            owner_id="cmp-user" if i % 3 else "admin",
            type=[SessionType.BATCH, SessionType.INTERACTIVE][i % 2],
            driver=Driver.RAW_EXEC,
            image="",
            resources=resources,
            kernels=(kernel,),
            created_at=T0 + timedelta(seconds=i),
            startup_command="true" if i % 2 else None,
            environ={"A": str(i)},
        )
        for i in range(12)
    ]
    await caravan.store.create(sessions)
    answers: list[list[Any]] = []
    for stock in (False, True):
        if stock:
            monkeypatch.setattr(
                PlainFieldsExecution, "execute_fields", StrawberryGraphQLCoreExecutionContext.execute_fields
            )
        answers.append(
            [
                await caravan.post(query, variables, token=token)
                for query, variables in GATEWAY_DOCUMENTS
                for token in (ADMIN_TOKEN, user)
                for _ in range(1 if stock else 2)
            ]
        )
    ours, stock_answers = answers[0][::2], answers[1]
    assert answers[0][1::2] == ours
    assert ours == stock_answers
    first = ours[0]["data"]["sessions"]
    assert first["totalCount"] == 12 and len(first["edges"]) == 5
    users = ours[1]["data"]["sessions"]  # the user's own sessions only
    assert users["totalCount"] == 8 and {e["node"]["ownerId"] for e in users["edges"]} == {"cmp-user"}
    assert ours[-1]["errors"][0]["extensions"]["code"] == "INVALID_INPUT"


# -- the same answers as graphql-core's executor ---------------------------------------------------------------


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


@strawberry.type
class Part:
    label: str
    colour: Colour | None


Odd = NewType("Odd", str)
ODD = strawberry.scalar(
    name="Odd",
    serialize=lambda value: None if value == "none" else value,  # a scalar refusing a value by answering null
    parse_value=str,
)
CONFIG = StrawberryConfig(scalar_map={Odd: ODD})


@strawberry.interface
class Named:
    title: str


@strawberry.type
class Badge(Named):
    shine: int


@strawberry.type
class Item:
    part: Part
    spare: Part | None
    id: strawberry.ID
    name: str
    maybe: str | None
    colour: Colour
    at: datetime
    count: int
    parts: list[Part]
    maybe_parts: list[Part | None] | None
    tags: list[str]
    maybe_tags: list[str | None] | None
    colours: list[Colour]
    grid: list[list[int]]
    badge: Named
    odd: Odd | None

    @strawberry.field
    def upper(self) -> str:
        return self.name.upper()


@strawberry.type
class Query:
    @strawberry.field
    def items(self) -> list[Item]:
        return ITEMS

    @strawberry.field
    def item(self, index: int) -> Item | None:
        return ITEMS[index]

    @strawberry.field
    async def later(self) -> Item:
        await asyncio.sleep(0)
        return ITEMS[0]


ITEMS: list[Any] = []


def item(**changes: Any) -> Any:
    fields: dict[str, Any] = {
        "part": Part(label="p", colour=Colour.BLUE),
        "spare": None,
        "id": strawberry.ID("i1"),
        "name": "one",
        "maybe": None,
        "colour": Colour.RED,
        "at": T0,
        "count": 3,
        "parts": [Part(label="a", colour=Colour.RED), Part(label="b", colour=None)],
        "maybe_parts": [None, Part(label="c", colour=Colour.BLUE)],
        "tags": ["x", "y"],
        "maybe_tags": ["x", None],
        "colours": [Colour.RED, Colour.BLUE],
        "grid": [[1, 2], [3]],
        "badge": Badge(title="t", shine=2),
        "odd": "fine",
        **changes,
    }
    return Item(**fields)


def both(query: str, items: list[Any], variables: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """The result of ``query`` over ``items`` with Strawberry's execution context and with ours (ours twice, on one
    schema: the second time with the plans the first kept, documents being cached as in the gateway)."""
    ITEMS[:] = items
    results = []
    for context_class in (StrawberryGraphQLCoreExecutionContext, None):
        schema = strawberry.Schema(query=Query, types=[Badge], config=CONFIG, extensions=[DocumentCache])
        schema.execution_context_class = context_class or execution_for(schema._schema)
        for _ in range(1 if context_class else 2):
            result = asyncio.run(schema.execute(query, variable_values=variables))
            results.append((result.data, [(e.message, e.path) for e in result.errors or ()]))
    stock, ours, again = results
    assert again == ours
    return stock, ours


@pytest.mark.parametrize(
    "query",
    [
        "{ items { id name maybe colour at count upper } }",
        "{ items { a: name b: name name __typename ...F } } fragment F on Item { count colour }",
        "{ items { name @skip(if: true) count @include(if: false) id } }",
        "{ item(index: 1) { name at } later { upper maybe id } }",
        "{ items { part { label colour } spare { label } p: part { colour } } later { part { label } } }",
        "{ items { parts { label colour } maybeParts { label } tags maybeTags colours grid badge { title } } }",
        "{ items { ...L } } fragment L on Item { p: parts { ... on Part { label } } parts { colour } tags t: tags }",
        "{ items { parts { label } parts { colour __typename } __typename badge { __typename ... on Badge { shine } }"
        " } }",
        "{ items { part { ... on Part { label } ... on Part { colour label } } maybeParts { ...P } } }"
        " fragment P on Part { c: colour l: label }",
        "{ items { id } later { parts { label } } items2: items { name parts { label } } }",
    ],
)
def test_answers_are_graphql_cores(query: str) -> None:
    second = item(id=strawberry.ID("i2"), name="two", maybe="m", colour=Colour.BLUE, spare=Part(label="s", colour=None))
    stock, ours = both(query, [item(), second])
    assert ours == stock
    assert stock[0] is not None and not stock[1]
    assert list(ours[0]) == list(stock[0])  # the answer's keys in the selection's order


@pytest.mark.parametrize(
    "broken",
    [
        {"name": None},  # null for a non-null field: the error, and the null going up to the nullable parent
        {"colour": "green"},  # not a value of the enum
        {"count": "three"},  # not an Int
        {"at": "yesterday"},  # not a datetime
        {"count": 2**40},  # out of Int's range
        {"part": None},  # a non-null object missing
        {"part": Part(label=None, colour=None)},  # ... or with a non-null field null: the null goes up past it
        {"spare": Part(label=None, colour="green")},  # a nullable object with two errors: it is null
    ],
)
def test_errors_are_graphql_cores(broken: dict[str, Any]) -> None:
    for query in (
        "{ items { id name colour at count part { label colour } spare { label colour } } }",
        "{ item(index: 1) { name colour at count upper part { label } spare { colour label } } }",
        "{ later { name } item(index: 1) { count at colour name spare { label colour } part { colour label } } }",
    ):
        stock, ours = both(query, [item(), item(**broken)])
        assert ours == stock
        assert stock[1], "the broken value is refused"


@pytest.mark.parametrize(
    "broken",
    [
        {"parts": [Part(label="a", colour=None), None]},  # a null item of a list of non-null items
        {"parts": None},  # a non-null list missing
        {"parts": [Part(label=None, colour=None)]},  # an item's non-null field null
        {"maybe_parts": [Part(label="p", colour="green")]},  # an error inside a nullable item: the item is null
        {"tags": [None]},
        {"tags": "ab"},  # not a list (a string is not one for GraphQL)
        {"tags": 3},
        {"colours": [Colour.RED, "green"]},
        {"maybe_tags": [None, ValueError("an error as a value")]},
        {"part": Part(label="p", colour=ValueError("an error as a value"))},
        {"odd": "none"},
        {"odd": ValueError("an error as a value")},  # Odd would pass it on as it is
    ],
)
def test_errors_in_lists_are_graphql_cores(broken: dict[str, Any]) -> None:
    for query in (
        "{ items { parts { label colour } maybeParts { colour label } tags maybeTags colours part { colour } odd } }",
        "{ later { name } item(index: 1) { tags maybeTags colours parts { label } maybeParts { label colour } "
        "part { label colour } odd } }",
        "{ items { ...F } } fragment F on Item { t: tags c: colours p: parts { l: label } ps: maybeParts { label "
        "colour } maybeTags part { colour } o: odd }",
    ):
        stock, ours = both(query, [item(), item(**broken)])
        assert ours == stock
        assert stock[1], "the broken value is refused"


@pytest.mark.parametrize(
    "unusual",
    [
        {"tags": ("a", "b")},  # a tuple: a list to graphql-core, not to a plan
        {"parts": (Part(label="t", colour=None),)},
        {"maybe_tags": [None, 3]},  # an Int where a String is wanted: coerced to "3"
        {"maybe_parts": None, "maybe_tags": None, "spare": None, "maybe": None},
        {"colours": []},
    ],
)
def test_unusual_values_answer_as_graphql_cores(unusual: dict[str, Any]) -> None:
    stock, ours = both(
        "{ items { tags maybeTags colours parts { label } maybeParts { label } spare { label } } }",
        [
            item(),
            item(**unusual),
        ],
    )
    assert ours == stock
    assert not stock[1]


@pytest.mark.parametrize(
    ("query", "variables"),
    [
        (
            DIRECTED := "query Q($on: Boolean!) { items { parts @include(if: $on) { label } tags @skip(if: $on) } }",
            {"on": True},
        ),
        (DIRECTED, {"on": False}),
        ("query Q($i: Int!) { item(index: $i) { name parts { label } } }", {"i": 0}),
        ("query Q($i: Int!) { item(index: $i) { name parts { label } } }", {"i": 1}),
        (
            "query Q($on: Boolean!) { items { ...F @include(if: $on) id } } fragment F on Item { name tags }",
            {"on": False},
        ),
        (DEEP := "query Q($on: Boolean!) { items { part { label @skip(if: $on) colour } } }", {"on": True}),
        (DEEP, {"on": False}),
    ],
)
def test_variables_and_directives_answer_as_graphql_cores(query: str, variables: dict[str, Any]) -> None:
    second = item(name="two", parts=[Part(label="z", colour=None)])
    stock, ours = both(query, [item(), second], variables)
    assert ours == stock
    assert stock[0] is not None and not stock[1]


def test_a_document_with_directives_is_planned_again_for_other_variables() -> None:
    """One schema, one cached document, its variables changing what @include and @skip select: each answer is
    graphql-core's (a plan kept from the first would select the first's fields)."""
    ITEMS[:] = [item()]
    schema = strawberry.Schema(query=Query, types=[Badge], config=CONFIG, extensions=[DocumentCache])
    schema.execution_context_class = execution_for(schema._schema)
    answers = [
        asyncio.run(schema.execute(document, variable_values={"on": on})).data
        for document in (DIRECTED, DEEP)
        for on in (True, False, True, False)
    ]
    with_parts = {"items": [{"parts": [{"label": "a"}, {"label": "b"}]}]}
    with_tags = {"items": [{"tags": ["x", "y"]}]}
    # the same fields of an item either way, a part's fields not: a plan kept by the items' fields alone would not do
    without_label, with_label = (
        {"items": [{"part": {"colour": "BLUE"}}]},
        {"items": [{"part": {"label": "p", "colour": "BLUE"}}]},
    )
    assert answers == [
        with_parts,
        with_tags,
        with_parts,
        with_tags,
        without_label,
        with_label,
        without_label,
        with_label,
    ]


def test_a_middleware_extension_sees_every_field() -> None:
    """An extension resolving through middleware wraps every field; none is read past it."""
    seen: list[str] = []

    class Spy(strawberry.extensions.SchemaExtension):
        def resolve(self, _next: Any, root: Any, info: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(info.field_name)
            return _next(root, info, *args, **kwargs)

    ITEMS[:] = [item()]
    schema = strawberry.Schema(query=Query, types=[Badge], config=CONFIG, extensions=[Spy])
    schema.execution_context_class = execution_for(schema._schema)
    assert issubclass(schema.execution_context_class, PlainFieldsExecution)
    result = asyncio.run(schema.execute("{ items { name count } }"))
    assert result.data == {"items": [{"name": "one", "count": 3}]}
    assert seen == ["items", "name", "count"]
