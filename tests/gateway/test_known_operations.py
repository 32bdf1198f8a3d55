"""Known queries (``gateway.graphql.known_operations``): once a document has passed Strawberry's path, its next
requests are executed without Strawberry's view and ``Schema.execute``, and answer exactly as that path answers.

The real gateway on Redis, the result cache off (every answer executed): each request is sent three times (the first
goes Strawberry's way and notes the document, the others take the known path) and compared, status, media type and
body, with the same requests when the known path is never taken. The requests cover pages (plain, filtered by status,
type and name, a user's, an admin's over their projects), another user's session (not found), a missing and an unknown
token, a variable of the wrong type, a cost over the limit, a resolver's error, operation names and the two media
types. Spies count what each path runs (the real methods are called).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from strawberry import Schema

from domain.model import Driver, Kernel, Session, SessionType
from domain.users import Role
from gateway.graphql.http import GRAPHQL_RESPONSE, JSON
from gateway.graphql.known_operations import KnownOperations
from tests.gateway.conftest import GatewayWith, error_of, post
from tests.harness import ADMIN_TOKEN, Caravan

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAGE = (
    "{ sessions(first: 5) { totalCount pageInfo { hasNextPage endCursor } edges { cursor node { id name status "
    "type createdAt ownerId project } } } }"
)
VARIABLES_PAGE = (
    "query Page($n: Int!, $f: SessionFilter) { sessions(first: $n, filter: $f) { totalCount "
    "edges { node { name status type } } } }"
)
COSTLY = "{ sessions(first: 100) { edges { node { kernels { logs { __typename } } } } } }"
TWO_OPERATIONS = "query A { viewer { id role } } query B { sessions(first: 2) { edges { node { name } } } }"


def requests(other_id: str) -> list[tuple[dict[str, Any], str]]:
    """(body, token name) of every request compared."""
    return [
        ({"query": PAGE}, "admin"),
        ({"query": PAGE}, "user"),
        ({"query": PAGE}, "project_admin"),
        ({"query": PAGE}, "none"),  # UNAUTHENTICATED
        ({"query": PAGE}, "unknown"),  # a token no one holds: UNAUTHENTICATED
        ({"query": VARIABLES_PAGE, "variables": {"n": 3, "f": {"statuses": ["PENDING"], "type": "BATCH"}}}, "user"),
        ({"query": VARIABLES_PAGE, "variables": {"n": 4, "f": {"nameContains": "known-1"}}}, "project_admin"),
        ({"query": VARIABLES_PAGE, "variables": {"n": 4, "f": {"type": "INTERACTIVE"}}}, "admin"),
        ({"query": VARIABLES_PAGE, "variables": {"n": "four"}}, "admin"),  # a request error: variables
        ({"query": VARIABLES_PAGE, "variables": {"n": 600}}, "admin"),  # over the page limit: the resolver's error
        ({"query": COSTLY}, "admin"),  # QUERY_TOO_COSTLY
        ({"query": "query($id: ID!) { session(id: $id) { id name } }", "variables": {"id": other_id}}, "user"),
        ({"query": "query($id: ID!) { session(id: $id) { id name } }", "variables": {"id": other_id}}, "admin"),
        ({"query": TWO_OPERATIONS, "operationName": "B"}, "user"),
        ({"query": TWO_OPERATIONS, "operationName": "A"}, "user"),
        ({"query": TWO_OPERATIONS}, "user"),  # no operationName: a request error
        ({"query": "{ sessions(first: 2) { edges { node { nope } } } }"}, "admin"),  # invalid: never known
    ]


async def answers(caravan: Caravan, tokens: dict[str, str | None], other_id: str) -> list[tuple[Any, ...]]:
    found = []
    for body, token in requests(other_id):
        for accept in (GRAPHQL_RESPONSE, JSON):
            for _ in range(3):
                response = await post(caravan, body, accept=accept, token=tokens[token])
                found.append(
                    (body, token, accept, response.status_code, response.headers["content-type"], response.text)
                )
    return found


async def test_known_queries_answer_as_strawberrys_path(
    gateway_with: GatewayWith, monkeypatch: pytest.MonkeyPatch
) -> None:
    executed: list[str] = []
    strawberry_execute = Schema.execute
    known_execute = KnownOperations.execute

    async def through_strawberry(self: Schema, query: str | None, *args: Any, **kwargs: Any) -> Any:
        executed.append("strawberry")
        return await strawberry_execute(self, query, *args, **kwargs)

    async def through_known(self: KnownOperations, *args: Any) -> Any:
        executed.append("known")
        return await known_execute(self, *args)

    monkeypatch.setattr(Schema, "execute", through_strawberry)
    monkeypatch.setattr(KnownOperations, "execute", through_known)
    async with gateway_with(result_cache=0) as caravan:
        tokens: dict[str, str | None] = {
            "admin": ADMIN_TOKEN,
            "user": await caravan.user("known-user"),
            "project_admin": await caravan.user("known-padmin", Role.ADMIN, ("research",)),
            "none": None,
            "unknown": "no-such-token",
        }
        resources = {"cpu": "1", "mem": str(64 << 20)}
        kernel = Kernel(role="main", index=1, hostname="main1", image="img:1", resources=resources)
        sessions = [
            Session(
                id=uuid.uuid4().hex,
                name=f"known-{i}",
                owner_id=["known-user", "admin", "someone"][i % 3],
                project=["default", "research"][i % 2],
                type=[SessionType.BATCH, SessionType.INTERACTIVE][i % 2],
                driver=Driver.RAW_EXEC,
                image="",
                resources=resources,
                kernels=(kernel,),
                created_at=T0 + timedelta(seconds=i),
            )
            for i in range(14)
        ]
        await caravan.store.create(sessions)
        other_id = sessions[1].id  # the admin's: not the user's

        known = await answers(caravan, tokens, other_id)
        by_known = executed.count("known")
        monkeypatch.setattr(KnownOperations, "document", lambda self, data: None)  # Strawberry's path only
        executed.clear()
        ordinary = await answers(caravan, tokens, other_id)

    assert executed == ["strawberry"] * len(ordinary)
    assert known == ordinary
    # every request of a valid query took the known path (either media type, any token), but the first of each of
    # the five documents (by text and operation name); never the cost refusal, the invalid or the ambiguous document
    assert by_known == 2 * 3 * (len(requests(other_id)) - 3) - 5
    page = [text for body, token, _, _, _, text in known if body == {"query": PAGE} and token == "user"]
    assert '"totalCount":5' in page[-1] and "known-" in page[-1]
    codes = {(token, status, text.split('"code":"')[1].split('"')[0]) for _, token, _, status, _, text in known
             if '"code":"' in text}  # fmt: skip
    assert ("none", 200, "UNAUTHENTICATED") in codes and ("unknown", 200, "UNAUTHENTICATED") in codes
    assert ("user", 200, "NOT_FOUND") in codes and ("admin", 400, "QUERY_TOO_COSTLY") in codes
    assert ("admin", 400, "INVALID_INPUT") in codes  # the variable of the wrong type, with graphql-response+json


async def test_known_queries_are_counted_by_the_rate_limit(gateway_with: GatewayWith) -> None:
    async with gateway_with(result_cache=0, rate_limit=4) as caravan:
        for _ in range(4):  # the first through Strawberry's path, the others the known one
            assert (await post(caravan, PAGE)).status_code == 200
        assert error_of(await post(caravan, PAGE), 429)["code"] == "RATE_LIMITED"
