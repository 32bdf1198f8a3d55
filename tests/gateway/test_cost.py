"""The cost of an operation (gateway.graphql.cost), and the refusal of one over CARAVAN_GRAPHQL_MAX_COST."""

from __future__ import annotations

from typing import Any

import pytest
from graphql import parse

from gateway.graphql.cost import LIST_SIZES, MAX_KERNELS, NOMAD_CALL, NOMAD_CALLS, SIZED_BY, operation_cost
from gateway.graphql.limits import Limits
from gateway.graphql.schema import schema
from tests.gateway.conftest import GatewayWith, error_of, post

PAGE = 100
LOGS = 2 * NOMAD_CALL
"""Kernel.logs: stdout and stderr."""


def aliases(count: int, field: str) -> str:
    return "{ " + " ".join(f"a{i}: {field}" for i in range(count)) + " }"


HEAVY = aliases(15, "sessions(first: 100) { edges { node { mainKernel { logs { stdout stderr } } } } }")
"""The fan-out of issue 10: 15 aliases × a page of 100 × kernel logs."""

COSTS: list[tuple[str, str, dict[str, Any] | None, int]] = [
    (
        "stored fields are free, the page read is 1",
        "{ sessions { edges { cursor node { id name status kernels { role resources { slot amount } } } } "
        "pageInfo { hasNextPage } } }",
        None,
        1,
    ),
    (
        "a resolver of its own costs 1, once per item of the page",
        "{ sessions(first: 10) { edges { node { owner { name } idleChecks { terminate } } } } }",
        None,
        1 + 10 * 2,
    ),
    ("no first: the largest page", "{ sessions { edges { node { owner { id } } } } }", None, 1 + PAGE),
    ("last sizes the page too", "{ sessions(last: 7) { edges { node { owner { id } } } } }", None, 1 + 7),
    (
        "a page over the limit counts as the limit",
        "{ sessions(first: 5000) { edges { node { owner { id } } } } }",
        None,
        1 + PAGE,
    ),
    ("one session's logs", '{ session(id: "s") { mainKernel { logs { stdout } } } }', None, 1 + 1 + LOGS),
    (
        "every kernel's logs: bounded by the most kernels",
        '{ session(id: "s") { kernels { logs { stdout } } } }',
        None,
        1 + MAX_KERNELS * LOGS,
    ),
    (
        "the page size from a variable",
        "query($n: Int) { sessions(first: $n) { edges { node { mainKernel { logs { stdout } } } } } }",
        {"n": 3},
        1 + 3 * (1 + LOGS),
    ),
    (
        "the page size from a variable's default",
        "query($n: Int = 4) { sessions(first: $n) { edges { node { mainKernel { logs { stdout } } } } } }",
        None,
        1 + 4 * (1 + LOGS),
    ),
    (
        "fragments count where they are spread",
        "{ sessions(first: 5) { ...Page } a: sessions(first: 2) { ...Page } } "
        "fragment Page on SessionConnection { edges { node { ...Logs } } } "
        "fragment Logs on Session { mainKernel { logs { stdout } } }",
        None,
        1 + 5 * (1 + LOGS) + 1 + 2 * (1 + LOGS),
    ),
    (
        "inline fragments count",
        "{ sessions(first: 5) { edges { node { ... on Session { mainKernel { logs { stdout } } } } } } }",
        None,
        1 + 5 * (1 + LOGS),
    ),
    (
        "@skip(if: true) leaves a field out",
        "query($s: Boolean!) { sessions(first: 5) { edges { node { "
        "mainKernel @skip(if: $s) { logs { stdout } } } } } }",
        {"s": True},
        1,
    ),
    (
        "@include(if: true) keeps it",
        "query($s: Boolean!) { sessions(first: 5) { edges { node { "
        "mainKernel @include(if: $s) { logs { stdout } } } } } }",
        {"s": True},
        1 + 5 * (1 + LOGS),
    ),
    ("the fan-out of issue 10", HEAVY, None, 15 * (1 + PAGE * (1 + LOGS))),
    ("introspection is free", "{ __typename __schema { types { name } } }", None, 0),
    ("resource groups read Nomad", "{ resourceGroups { name agents { id drivers } } }", None, 2 * NOMAD_CALL),
    (
        "destroySession: a Redis write per id, no Nomad call (the scheduler stops the jobs)",
        'mutation { destroySession(ids: ["a", "b", "c"]) { id owner { id } } }',
        None,
        3 + 3,
    ),
    (
        "destroySession: ids from a variable",
        "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }",
        {"ids": ["a"] * 7},
        7,
    ),
    (
        "restartSession: a Redis write (the scheduler restarts the kernels)",
        'mutation { restartSession(id: "s") { id } }',
        None,
        1,
    ),
    (
        "created sessions: bounded by the most one request creates",
        'mutation { createSession(input: {name: "abcd", type: BATCH}) { sessions { owner { id } } } }',
        None,
        1 + LIST_SIZES[("CreateSessionPayload", "sessions")],
    ),
]


@pytest.mark.parametrize(("query", "variables", "cost"), [c[1:] for c in COSTS], ids=[c[0] for c in COSTS])
def test_cost(query: str, variables: dict[str, Any] | None, cost: int) -> None:
    assert operation_cost(schema._schema, parse(query), None, variables, PAGE) == cost


def test_the_named_operation_is_costed() -> None:
    document = parse('query Cheap { viewer { id } } query Dear { session(id: "s") { kernels { logs { stdout } } } }')
    assert operation_cost(schema._schema, document, "Cheap", None, PAGE) == 1
    assert operation_cost(schema._schema, document, "Dear", None, PAGE) == 1 + MAX_KERNELS * LOGS
    assert operation_cost(schema._schema, document, "Neither", None, PAGE) == 0


def test_a_fragment_cycle_is_costed_once_around() -> None:
    """Validation refuses cycles before the cost is computed; the function alone must still end."""
    document = parse(
        '{ session(id: "s") { ...A } } fragment A on Session { ...B } '
        "fragment B on Session { ...A mainKernel { logs { stdout } } }"
    )
    assert operation_cost(schema._schema, document, None, None, PAGE) == 1 + 1 + LOGS


def test_every_costed_field_is_in_the_schema() -> None:
    """The tables name fields by their schema coordinates: a rename must not silently make a field free."""
    for type_name, field in [*NOMAD_CALLS, *SIZED_BY, *LIST_SIZES]:
        assert field in schema._schema.get_type(type_name).fields, f"{type_name}.{field}"  # type: ignore[union-attr]


def test_the_default_limit_refuses_the_fan_out_and_admits_a_page_with_logs() -> None:
    limit = Limits().max_cost
    page_with_logs = (
        "{ sessions { edges { node { owner { name } idleChecks { terminate } mainKernel { logs { stdout } } } } } }"
    )
    assert operation_cost(schema._schema, parse(page_with_logs), None, None, PAGE) <= limit
    assert operation_cost(schema._schema, parse(HEAVY), None, None, PAGE) > limit


async def test_an_operation_over_the_limit_is_refused_unexecuted(gateway_with: GatewayWith) -> None:
    async with gateway_with(max_cost=100) as caravan:
        refused = await post(caravan, HEAVY)
        extensions = error_of(refused, 400)
        assert extensions == {"code": "QUERY_TOO_COSTLY", "cost": 15 * (1 + PAGE * (1 + LOGS)), "limit": 100}
        assert "data" not in refused.json()
        variables = {
            "query": "query($n: Int) { sessions(first: $n) { edges { node { mainKernel { logs { stdout } } } } } }"
        }
        assert error_of(await post(caravan, {**variables, "variables": {"n": 10}}), 400)["cost"] == 211
        within = await post(caravan, {**variables, "variables": {"n": 4}})  # 85
        assert within.status_code == 200 and within.json() == {"data": {"sessions": {"edges": []}}}
        legacy = await post(caravan, HEAVY, accept="application/json")  # the legacy media type: 200, as other limits
        assert error_of(legacy, 200)["code"] == "QUERY_TOO_COSTLY"


async def test_a_costly_mutation_is_refused_before_it_changes_anything(gateway_with: GatewayWith) -> None:
    async with gateway_with(max_cost=5) as caravan:
        created = await caravan.gql(
            'mutation { createSession(input: {name: "kept", type: BATCH, startupCommand: "true"}) { sessions { id } } }'
        )
        [session] = created["createSession"]["sessions"]
        ids = ", ".join(f'"{session["id"]}"' for _ in range(6))
        refused = await post(caravan, f"mutation {{ destroySession(ids: [{ids}]) {{ id }} }}")
        assert error_of(refused, 400) == {"code": "QUERY_TOO_COSTLY", "cost": 6, "limit": 5}
        stored = await caravan.store.get(session["id"])
        assert stored is not None and stored.status.value == "PENDING"


async def test_the_limit_is_a_positive_whole_number() -> None:
    with pytest.raises(ValueError, match="CARAVAN_GRAPHQL_MAX_COST must be positive"):
        Limits.from_env({"CARAVAN_GRAPHQL_MAX_COST": "0"})
    with pytest.raises(ValueError, match="must be below the Nomad client's 64 connections"):
        Limits.from_env({"CARAVAN_GRAPHQL_MAX_USER_NOMAD_CALLS": "64"})
    with pytest.raises(ValueError, match="must be at most"):
        Limits.from_env({"CARAVAN_GRAPHQL_MAX_NOMAD_CALLS": "20"})
