"""Subscriptions over graphql-transport-ws against the real gateway and Redis (no scheduler: the tests move
sessions through their statuses with the store, as the scheduler would)."""

from __future__ import annotations

import contextlib
from typing import Any

from core.clock import utcnow
from domain.lifecycle import transition
from domain.model import SessionStatus
from tests.gateway.conftest import GatewayWith, post
from tests.gateway.conftest import error_of as error_of_response
from tests.harness import ADMIN_TOKEN, CREATE, Caravan
from tests.ws_client import GraphQLSocket, authenticated_socket, graphql_socket

S = SessionStatus

EVENTS = """subscription($id: ID, $after: String) {
  sessionEvents(sessionId: $id, after: $after) { eventId sessionId status reason at kernels { hostname status } }
}"""

LOGS = """subscription($id: ID!, $kernel: String!, $tail: Int!) {
  kernelLogs(sessionId: $id, kernel: $kernel, tailBytes: $tail)
}"""


async def create(caravan: Caravan, token: str, name: str) -> str:
    data = await caravan.gql(
        CREATE, {"input": {"name": name, "type": "BATCH", "driver": "EXEC", "startupCommand": "exit 0"}}, token=token
    )
    return str(data["createSession"]["sessions"][0]["id"])


async def move(caravan: Caravan, session_id: str, status: SessionStatus, reason: str) -> None:
    """Change a session's status as the scheduler does: through the store's validated update."""
    await caravan.store.update(session_id, lambda s: transition(s, status, reason=reason, at=utcnow()))


async def take(socket: GraphQLSocket, operation_id: str, count: int) -> list[dict[str, Any]]:
    """The next ``count`` events of a subscription."""
    events = []
    for _ in range(count):
        message = await socket.message_of(operation_id)
        assert message["type"] == "next" and "errors" not in message["payload"], message
        assert message["payload"].get("data"), message
        events.append(message["payload"]["data"]["sessionEvents"])
    return events


def statuses(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["status"], e["reason"]) for e in events]


async def error_of(socket: GraphQLSocket, operation_id: str) -> dict[str, Any]:
    """The extensions of the one error an operation ends with (in a ``next``, then ``complete``)."""
    message = await socket.message_of(operation_id)
    assert message["type"] == "next", message
    [error] = message["payload"]["errors"]
    assert (await socket.message_of(operation_id))["type"] == "complete"
    extensions: dict[str, Any] = error["extensions"]
    return extensions


# -- the connection -------------------------------------------------------------------------------


async def test_missing_token_closes_with_4403(caravan: Caravan) -> None:
    async with graphql_socket(caravan.url) as socket:
        await socket.send({"type": "connection_init"})
        assert await socket.closed_with() == 4403


async def test_unknown_token_closes_with_4403(caravan: Caravan) -> None:
    async with graphql_socket(caravan.url) as socket:
        await socket.send({"type": "connection_init", "payload": {"authorization": "Bearer not-a-token"}})
        assert await socket.closed_with() == 4403


async def test_unknown_token_in_the_upgrade_header_closes_with_4403(caravan: Caravan) -> None:
    async with graphql_socket(caravan.url, headers={"Authorization": "Bearer not-a-token"}) as socket:
        await socket.send({"type": "connection_init"})
        assert await socket.closed_with() == 4403


async def test_token_in_the_upgrade_header_is_accepted_and_queries_run(caravan: Caravan) -> None:
    token = await caravan.user("hedwig")
    async with graphql_socket(caravan.url, headers={"Authorization": f"Bearer {token}"}) as socket:
        assert await socket.init() == {"type": "connection_ack"}
        operation = await socket.subscribe("{ viewer { id } }")
        assert [r async for r in socket.results(operation)] == [{"data": {"viewer": {"id": "hedwig"}}}]


async def test_subscribing_before_the_connection_is_acknowledged_closes_with_4401(caravan: Caravan) -> None:
    async with graphql_socket(caravan.url) as socket:
        await socket.subscribe(EVENTS)
        assert await socket.closed_with() == 4401


async def test_legacy_graphql_ws_subprotocol_is_refused(caravan: Caravan) -> None:
    async with graphql_socket(caravan.url, protocols=("graphql-ws",)) as socket:
        assert socket.ws.subprotocol is None
        assert await socket.closed_with() == 4406


# -- sessionEvents ----------------------------------------------------------------------------------


async def test_another_users_session_is_not_found(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    session_id = await create(caravan, alice, "alices-job")
    async with authenticated_socket(caravan.url, bob) as socket:
        events = await socket.subscribe(EVENTS, {"id": session_id})
        assert await error_of(socket, events) == {"code": "NOT_FOUND", "field": "sessionId"}
        logs = await socket.subscribe(LOGS, {"id": session_id, "kernel": "main1", "tail": 0})
        assert await error_of(socket, logs) == {"code": "NOT_FOUND", "field": "sessionId"}
        missing = await socket.subscribe(EVENTS, {"id": "no-such-session"})
        assert await error_of(socket, missing) == {"code": "NOT_FOUND", "field": "sessionId"}


async def test_bad_arguments_are_invalid_input(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "alices-job")
    async with authenticated_socket(caravan.url, alice) as socket:
        cursor = await socket.subscribe(EVENTS, {"after": "yesterday"})
        assert await error_of(socket, cursor) == {"code": "INVALID_INPUT", "field": "after"}
        tail = await socket.subscribe(LOGS, {"id": session_id, "kernel": "main1", "tail": -1})
        assert await error_of(socket, tail) == {"code": "INVALID_INPUT", "field": "tailBytes"}
        kernel = await socket.subscribe(LOGS, {"id": session_id, "kernel": "sub9", "tail": 0})
        assert await error_of(socket, kernel) == {"code": "NOT_FOUND", "field": "kernel"}


async def test_logs_and_kernel_logs_hold_tail_bytes_to_one_rule(caravan: Caravan) -> None:
    """0 to 4 MiB for both (logs used to take any number and clamp it)."""
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "tailed")
    logs = "query($id: ID!, $tail: Int!) { session(id: $id) { mainKernel { logs(tailBytes: $tail) { stdout } } } }"
    async with authenticated_socket(caravan.url, alice) as socket:
        for tail in (-5, 4 * 1024 * 1024 + 1):
            refused = await socket.subscribe(LOGS, {"id": session_id, "kernel": "main1", "tail": tail})
            assert await error_of(socket, refused) == {"code": "INVALID_INPUT", "field": "tailBytes"}
            body = (
                await post(caravan, {"query": logs, "variables": {"id": session_id, "tail": tail}}, token=alice)
            ).json()
            assert [e["extensions"] for e in body["errors"]] == [{"code": "INVALID_INPUT", "field": "tailBytes"}]
    for tail in (0, 4 * 1024 * 1024):  # accepted: nothing to read before the kernel has run
        body = (await post(caravan, {"query": logs, "variables": {"id": session_id, "tail": tail}}, token=alice)).json()
        assert body == {"data": {"session": {"mainKernel": {"logs": None}}}}


async def test_one_sessions_events_arrive_in_order_and_the_subscription_completes(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "watched")
    async with authenticated_socket(caravan.url, alice) as socket:
        operation = await socket.subscribe(EVENTS, {"id": session_id})
        [created] = await take(socket, operation, 1)  # replayed from the session's stream: nothing is missed
        assert (created["sessionId"], created["status"], created["kernels"]) == (
            session_id,
            "PENDING",
            [{"hostname": "main1", "status": "PENDING"}],
        )
        steps = [
            (S.SCHEDULED, "scheduled"),
            (S.PREPARING, "pulling"),
            (S.RUNNING, "started"),
            (S.TERMINATED, "task-finished"),
        ]
        for status, reason in steps:
            await move(caravan, session_id, status, reason)
        rest = [r["data"]["sessionEvents"] async for r in socket.results(operation)]  # ends: the session is TERMINATED
    assert statuses(rest) == [(s.value, r) for s, r in steps]
    assert rest[-1]["kernels"] == [{"hostname": "main1", "status": "TERMINATED"}]
    ids = [created["eventId"], *(e["eventId"] for e in rest)]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-")))) and len(set(ids)) == len(ids)
    stored = await caravan.store.get(session_id)
    assert stored is not None
    assert [(c.status.value, c.reason) for c in stored.status_history] == statuses([created, *rest])


async def test_all_sessions_subscription_sees_only_the_viewers_sessions_created_after_subscribing(
    caravan: Caravan,
) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    async with authenticated_socket(caravan.url, alice) as socket:
        operation = await socket.subscribe(EVENTS)
        # no wait for the subscription to start: the connection's acknowledgement is the starting point
        first = await create(caravan, alice, "first-job")
        await create(caravan, bob, "bobs-job")
        second = await create(caravan, alice, "second-job")
        await move(caravan, first, S.CANCELLED, "user-requested")
        events = await take(socket, operation, 3)
    assert [(e["sessionId"], e["status"], e["reason"]) for e in events] == [
        (first, "PENDING", "created"),
        (second, "PENDING", "created"),
        (first, "CANCELLED", "user-requested"),
    ]


async def test_a_reconnecting_client_resumes_after_its_last_event(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "resumed")
    async with authenticated_socket(caravan.url, alice) as socket:
        one = await socket.subscribe(EVENTS, {"id": session_id})
        everything = await socket.subscribe(EVENTS)
        await move(caravan, session_id, S.SCHEDULED, "scheduled")
        seen_one = await take(socket, one, 2)
        [seen_all] = await take(socket, everything, 1)
    assert statuses(seen_one) == [("PENDING", "created"), ("SCHEDULED", "scheduled")]
    assert statuses([seen_all]) == [("SCHEDULED", "scheduled")]
    # disconnected: these are published while nobody listens
    await move(caravan, session_id, S.PREPARING, "pulling")
    await move(caravan, session_id, S.RUNNING, "started")
    async with authenticated_socket(caravan.url, alice) as socket:
        one = await socket.subscribe(EVENTS, {"id": session_id, "after": seen_one[-1]["eventId"]})
        everything = await socket.subscribe(EVENTS, {"after": seen_all["eventId"]})
        missed_one = await take(socket, one, 2)
        missed_all = await take(socket, everything, 2)
        await move(caravan, session_id, S.TERMINATED, "task-finished")
        last_one = [r["data"]["sessionEvents"] async for r in socket.results(one)]
        [last_all] = await take(socket, everything, 1)
    assert statuses(missed_one) == statuses(missed_all) == [("PREPARING", "pulling"), ("RUNNING", "started")]
    assert statuses(last_one) == statuses([last_all]) == [("TERMINATED", "task-finished")]


async def test_an_ended_session_replays_its_history_and_completes(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "finished")
    await move(caravan, session_id, S.CANCELLED, "pending-timeout")
    async with authenticated_socket(caravan.url, alice) as socket:
        operation = await socket.subscribe(EVENTS, {"id": session_id})
        events = [r["data"]["sessionEvents"] async for r in socket.results(operation)]
        after_all = await socket.subscribe(EVENTS, {"id": session_id, "after": events[-1]["eventId"]})
        assert [r async for r in socket.results(after_all)] == []
    assert statuses(events) == [("PENDING", "created"), ("CANCELLED", "pending-timeout")]


async def test_an_ended_session_whose_stream_expired_gives_its_final_status(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "long-gone")
    await move(caravan, session_id, S.CANCELLED, "user-requested")
    await caravan.store.redis.delete(caravan.store.keys.session_events(session_id))  # as its TTL would
    async with authenticated_socket(caravan.url, alice) as socket:
        operation = await socket.subscribe(EVENTS, {"id": session_id})
        events = [r["data"]["sessionEvents"] async for r in socket.results(operation)]
    assert statuses(events) == [("CANCELLED", "user-requested")]


async def test_admins_follow_other_users_sessions_by_id(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "supervised")
    async with authenticated_socket(caravan.url, ADMIN_TOKEN) as socket:
        operation = await socket.subscribe(EVENTS, {"id": session_id})
        await move(caravan, session_id, S.CANCELLED, "user-requested")
        events = [r["data"]["sessionEvents"] async for r in socket.results(operation)]
    assert statuses(events) == [("PENDING", "created"), ("CANCELLED", "user-requested")]


# -- limits -----------------------------------------------------------------------------------------


async def test_the_rate_limit_counts_subscribe_messages(gateway_with: GatewayWith) -> None:
    async with gateway_with(rate_limit=3, rate_window=10**8) as caravan:
        token = await caravan.user("eager")
        over_http = await caravan.users.issue_token("eager", "another")  # another token, the same budget
        assert (await post(caravan, "{ viewer { id } }", token=over_http)).status_code == 200
        async with authenticated_socket(caravan.url, token) as socket:
            for _ in range(2):
                operation = await socket.subscribe("{ viewer { id } }")
                assert [r async for r in socket.results(operation)] == [{"data": {"viewer": {"id": "eager"}}}]
            refused = await socket.subscribe(EVENTS)
            message = await socket.message_of(refused)
            assert message["type"] == "error"
            [error] = message["payload"]
            assert error["extensions"]["code"] == "RATE_LIMITED" and error["extensions"]["retryAfter"] >= 1


async def test_the_depth_limit_applies_to_subscriptions(gateway_with: GatewayWith) -> None:
    async with gateway_with(max_depth=1) as caravan:
        token = await caravan.user("deep")
        async with authenticated_socket(caravan.url, token) as socket:
            operation = await socket.subscribe(EVENTS)
            message = await socket.message_of(operation)
            assert message["type"] == "error"
            assert {e["extensions"]["code"] for e in message["payload"]} == {"QUERY_TOO_DEEP"}


async def test_a_document_over_the_token_limit_is_answered_and_the_connection_stays_open(
    gateway_with: GatewayWith,
) -> None:
    async with gateway_with(max_tokens=50) as caravan:
        token = await caravan.user("wordy")
        async with authenticated_socket(caravan.url, token) as socket:
            long = await socket.subscribe("{ viewer { " + "id " * 60 + "} }")
            message = await socket.message_of(long)
            assert message["type"] == "error", message
            [error] = message["payload"]
            assert error["extensions"] == {"code": "TOO_MANY_TOKENS", "limit": 50}
            short = await socket.subscribe("{ viewer { id } }")  # the same connection goes on
            assert [r async for r in socket.results(short)] == [{"data": {"viewer": {"id": "wordy"}}}]
            broken = await socket.subscribe("{ viewer { id ")  # as a syntax error is
            assert (await socket.message_of(broken))["payload"][0]["extensions"] == {"code": "INVALID_INPUT"}
            again = await socket.subscribe("{ viewer { id } }")
            assert [r async for r in socket.results(again)] == [{"data": {"viewer": {"id": "wordy"}}}]


async def test_a_cursor_older_than_the_kept_events_is_refused(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    async with authenticated_socket(caravan.url, alice) as socket:
        operation = await socket.subscribe(EVENTS)
        await create(caravan, alice, "first-job")
        [first] = await take(socket, operation, 1)
    await create(caravan, alice, "second-job")
    await caravan.store.redis.xtrim(caravan.store.keys.owner_events("alice"), maxlen=1, approximate=False)
    async with authenticated_socket(caravan.url, alice) as socket:
        resumed = await socket.subscribe(EVENTS, {"after": first["eventId"]})
        assert await error_of(socket, resumed) == {"code": "INVALID_INPUT", "field": "after"}


async def test_a_subscription_over_http_is_refused_with_a_code(caravan: Caravan) -> None:
    response = await post(caravan, "subscription { sessionEvents { status } }")
    assert error_of_response(response, 400) == {"code": "INVALID_INPUT"}
    response = await post(caravan, "subscription { sessionEvents { status } }", accept="application/json")
    assert error_of_response(response, 200) == {"code": "INVALID_INPUT"}


async def test_more_subscriptions_than_redis_connections_in_the_pool(caravan: Caravan) -> None:
    """Subscriptions do not each hold a Redis connection (the gateway's pool has 100): 120 wait at once, all get
    the event, and the gateway still answers queries."""
    alice = await caravan.user("alice")
    async with contextlib.AsyncExitStack() as stack:
        sockets = [await stack.enter_async_context(authenticated_socket(caravan.url, alice)) for _ in range(3)]
        operations = [(socket, await socket.subscribe(EVENTS)) for socket in sockets for _ in range(40)]
        first = await create(caravan, alice, "joined")
        for socket, operation in operations:  # each has seen an event: all 120 follow (and wait) now
            [event] = await take(socket, operation, 1)
            assert event["sessionId"] == first
        session_id = await create(caravan, alice, "watched-by-many")
        for socket, operation in operations:
            [event] = await take(socket, operation, 1)
            assert (event["sessionId"], event["status"]) == (session_id, "PENDING")
        assert (await caravan.gql("{ viewer { id } }", token=alice))["viewer"]["id"] == "alice"
