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
from typing import Any

import pytest
import strawberry
from graphql.execution.executor import Executor as CoreExecutionContext
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from domain.model import Driver, Kernel, Session, SessionType
from gateway.graphql.execution import PlainFieldsExecution, execution_for
from tests.harness import Caravan

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


# -- the same answers as graphql-core's executor ---------------------------------------------------------------


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


@strawberry.type
class Part:
    label: str
    colour: Colour | None


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
        **changes,
    }
    return Item(**fields)


def both(query: str, items: list[Any]) -> tuple[Any, Any]:
    """The result of ``query`` over ``items`` with Strawberry's execution context and with ours."""
    ITEMS[:] = items
    results = []
    for context_class in (StrawberryGraphQLCoreExecutionContext, None):
        schema = strawberry.Schema(query=Query)
        schema.execution_context_class = context_class or execution_for(schema._schema)
        result = asyncio.run(schema.execute(query))
        results.append((result.data, [(e.message, e.path) for e in result.errors or ()]))
    return results[0], results[1]


@pytest.mark.parametrize(
    "query",
    [
        "{ items { id name maybe colour at count upper } }",
        "{ items { a: name b: name name __typename ...F } } fragment F on Item { count colour }",
        "{ items { name @skip(if: true) count @include(if: false) id } }",
        "{ item(index: 1) { name at } later { upper maybe id } }",
        "{ items { part { label colour } spare { label } p: part { colour } } later { part { label } } }",
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


def test_a_middleware_extension_sees_every_field() -> None:
    """An extension resolving through middleware wraps every field; none is read past it."""
    seen: list[str] = []

    class Spy(strawberry.extensions.SchemaExtension):
        def resolve(self, _next: Any, root: Any, info: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(info.field_name)
            return _next(root, info, *args, **kwargs)

    ITEMS[:] = [item()]
    schema = strawberry.Schema(query=Query, extensions=[Spy])
    schema.execution_context_class = execution_for(schema._schema)
    assert issubclass(schema.execution_context_class, PlainFieldsExecution)
    result = asyncio.run(schema.execute("{ items { name count } }"))
    assert result.data == {"items": [{"name": "one", "count": 3}]}
    assert seen == ["items", "name", "count"]
