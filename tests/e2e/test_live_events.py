"""Live status events and live kernel logs over graphql-transport-ws, with the scheduler and real Nomad."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any
from urllib.parse import urlparse

from domain.users import Role
from nomad_jobs.client import NomadClient
from nomad_jobs.meta import TASK_NAME
from tests.faults import NetworkCut
from tests.harness import CREATE, Caravan
from tests.ws_client import GraphQLSocket, authenticated_socket

EVENTS = """subscription($id: ID) {
  sessionEvents(sessionId: $id) { eventId sessionId status reason kernels { hostname status } }
}"""

LOGS = """subscription($id: ID!, $tail: Int!) { kernelLogs(sessionId: $id, tailBytes: $tail) }"""

COUNTING = 'i=1; while [ $i -le 20 ]; do echo "line $i"; i=$((i+1)); sleep 0.2; done'
"""Prints a line every 0.2 s for about 4 s."""


async def create(caravan: Caravan, token: str, name: str, command: str) -> str:
    data = await caravan.gql(
        CREATE, {"input": {"name": name, "type": "BATCH", "driver": "EXEC", "startupCommand": command}}, token=token
    )
    return str(data["createSession"]["sessions"][0]["id"])


def history_of(session: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["status"], c["reason"]) for c in session["statusHistory"]]


async def test_a_client_subscribed_before_creating_a_session_sees_its_whole_life(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    async with authenticated_socket(caravan.url, alice) as socket:
        everything = await socket.subscribe(EVENTS)
        session_id = await create(caravan, alice, "lived", "echo working; sleep 1")
        one = await socket.subscribe(EVENTS, {"id": session_id})
        seen_all: list[dict[str, Any]] = []
        while not seen_all or seen_all[-1]["status"] not in ("TERMINATED", "CANCELLED"):
            message = await socket.message_of(everything, timeout=90)
            assert message["type"] == "next", message
            event = message["payload"]["data"]["sessionEvents"]
            assert event["sessionId"] == session_id
            seen_all.append(event)
        seen_one = [r["data"]["sessionEvents"] async for r in socket.results(one, timeout=30)]  # it completes
    session = await caravan.wait_for(session_id, "TERMINATED")
    expected = history_of(session)
    assert [s for s, _ in expected][:2] == ["PENDING", "SCHEDULED"] and expected[-1] == ("TERMINATED", "task-finished")
    assert "RUNNING" in [s for s, _ in expected]
    assert [(e["status"], e["reason"]) for e in seen_all] == expected
    assert [(e["status"], e["reason"]) for e in seen_one] == expected
    assert seen_all[-1]["kernels"] == [{"hostname": "main1", "status": "TERMINATED"}]


async def test_kernel_logs_arrive_live_in_order_before_the_session_ends(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "chatty", COUNTING)
    received: list[tuple[str, str]] = []  # (chunk, the session's status when it arrived)
    async with authenticated_socket(caravan.url, alice) as socket:
        # subscribed at once: the subscription waits for the kernel's allocation and for its task to start
        logs = await socket.subscribe(LOGS, {"id": session_id, "tail": 65536})
        async for result in socket.results(logs, timeout=90):
            assert "errors" not in result, result
            stored = await caravan.store.get(session_id)
            assert stored is not None
            received.append((result["data"]["kernelLogs"], stored.status.value))
    text = "".join(chunk for chunk, _ in received)
    assert text.splitlines() == [f"line {i}" for i in range(1, 21)]
    assert len(received) >= 5, "the lines came as they were written, not all at the end"
    live = [chunk for chunk, status in received if status not in ("TERMINATING", "TERMINATED")]
    assert len(live) >= 3, received  # live: as the kernel wrote them, before the session ended
    session = await caravan.wait_for(session_id, "TERMINATED")
    assert session["result"] == "SUCCESS"


SIGNALLED = (
    "n=0; trap 'n=$((n+1)); echo \"late $n\" >&2' USR1; trap 'exit 0' USR2; echo early >&2; while :; do sleep 0.2; done"
)
"""Writes ``early`` to stderr, then ``late <n>`` at each SIGUSR1, and ends at SIGUSR2: it writes when the test says."""


async def test_kernel_logs_of_stderr_from_now_on_and_of_an_ended_kernel(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    session_id = await create(caravan, alice, "stderr-job", SIGNALLED)
    query = """subscription($id: ID!) { kernelLogs(sessionId: $id, stream: STDERR, tailBytes: 0) }"""
    async with authenticated_socket(caravan.url, alice) as socket:
        await caravan.wait_for(session_id, "RUNNING")
        alloc_id = await written(caravan, session_id, "early\n")  # Nomad's log collector may lag behind the task
        live = await socket.subscribe(query, {"id": session_id})
        # The subscription starts following at a moment of the gateway's: a line per signal until one comes through,
        # however slow the machine (none is lost: each is either before that moment or delivered).
        chunks: list[str] = []
        while not chunks:
            await caravan.nomad.signal_allocation(alloc_id, TASK_NAME, "SIGUSR1")
            with contextlib.suppress(TimeoutError):
                message = await socket.message_of(live, timeout=1.0)
                assert message["type"] == "next", message
                chunks.append(message["payload"]["data"]["kernelLogs"])
        await caravan.nomad.signal_allocation(alloc_id, TASK_NAME, "SIGUSR2")
        chunks += [r["data"]["kernelLogs"] async for r in socket.results(live, timeout=60)]  # completes as it ends
        await caravan.wait_for(session_id, "TERMINATED")
        ended = await socket.subscribe(
            LOGS.replace("tailBytes: $tail", "stream: STDERR, tailBytes: $tail"), {"id": session_id, "tail": 1024}
        )
        whole = "".join([r["data"]["kernelLogs"] async for r in socket.results(ended, timeout=30)])
    lines = whole.splitlines()  # an ended kernel: its tail, then the subscription completes
    assert lines == ["early", *(f"late {n}" for n in range(1, len(lines)))], whole
    followed = "".join(chunks)  # tailBytes 0: only what came after subscribing, and all of it
    assert followed.startswith("late ") and whole.endswith(followed), (followed, whole)


async def written(caravan: Caravan, session_id: str, text: str) -> str:
    """Wait until the main kernel's stderr log file holds ``text``; the kernel's allocation."""
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.main_kernel.alloc_id
    for _ in range(100):
        if await caravan.nomad.logs(stored.main_kernel.alloc_id, TASK_NAME, "stderr") == text:
            return stored.main_kernel.alloc_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} never reached the log file")


async def test_a_log_follow_cut_off_midway_carries_on_where_it_stopped(caravan: Caravan) -> None:
    """Nomad's connection is dropped twice while the kernel writes: every line still arrives, once, in order."""
    alice = await caravan.user("alice")
    command = COUNTING.replace("-le 20", "-le 30")
    session_id = await create(caravan, alice, "cut-off", command)
    await caravan.wait_for(session_id, "RUNNING", "TERMINATED")
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.main_kernel.alloc_id
    async with NetworkCut(urlparse(caravan.settings.nomad.addr).port or 4646) as cut:
        nomad = NomadClient(dataclasses.replace(caravan.settings.nomad, addr=f"http://127.0.0.1:{cut.port}"))
        received, severed = "", 0
        try:
            async for chunk in nomad.follow_logs(stored.main_kernel.alloc_id, TASK_NAME, "stdout", tail_bytes=1 << 20):
                received += chunk
                if severed < 2 and received.count("\n") >= 8 * (severed + 1):
                    cut.sever()  # the open follow request dies; new connections go through
                    severed += 1
        finally:
            await nomad.aclose()
    assert severed == 2
    assert received.splitlines() == [f"line {i}" for i in range(1, 31)]


async def first_answers(socket: GraphQLSocket, operations: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """How many of the subscriptions got log data first, and the error extensions of those refused (each refusal
    then completes its operation)."""
    followed, refused = await followers(socket, operations)
    return len(followed), refused


async def followers(socket: GraphQLSocket, operations: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """The subscriptions that got log data first, and the error extensions of those refused (each refusal then
    completes its operation). Which of many subscribed at once get the places is the gateway's to say: each claims its
    place after reading the session, and those reads may answer in any order."""
    followed: list[str] = []
    refused = []
    for operation in operations:
        message = await socket.message_of(operation, timeout=30)  # an answer for each: none waits unanswered
        assert message["type"] == "next", message
        if "errors" in message["payload"]:
            [error] = message["payload"]["errors"]
            refused.append(error["extensions"])
            assert (await socket.message_of(operation))["type"] == "complete"
        else:
            assert "tick" in message["payload"]["data"]["kernelLogs"]
            followed.append(operation)
    return followed, refused


TICKING = "while true; do echo tick; sleep 0.5; done"


async def ticking_session(caravan: Caravan, token: str, name: str) -> str:
    """A RUNNING session of the user's whose main kernel prints a line every half second until destroyed."""
    data = await caravan.gql(
        CREATE,
        {"input": {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": TICKING}},
        token=token,
    )
    session_id = str(data["createSession"]["sessions"][0]["id"])
    await caravan.wait_for(session_id, "RUNNING")
    return session_id


async def follow_once_freed(
    socket: GraphQLSocket, variables: dict[str, Any], count: int, refusal: dict[str, Any]
) -> None:
    """Subscribe until ``count`` more follows got log data: the places freed are free once the follows holding them
    have ended, a moment after their completion or their connection's close; until then, each is refused with
    ``refusal``."""
    followed = 0
    async with asyncio.timeout(30):
        while followed < count:
            more, refused = await first_answers(
                socket, [await socket.subscribe(LOGS, variables) for _ in range(count - followed)]
            )
            assert all(r == refusal for r in refused), refused
            followed += more
            if refused:  # not ended yet
                await asyncio.sleep(0.1)


async def test_log_follows_beyond_the_connection_and_gateway_caps_are_refused_with_a_code(caravan: Caravan) -> None:
    """A connection follows at most 8 logs at once (CARAVAN_GRAPHQL_MAX_LOG_FOLLOWS) and a gateway process 64, the
    Nomad client's follow pool: each subscription beyond gets TOO_MANY_LOG_FOLLOWS at once (without the caps, 64 of
    100 on one connection got data and 36 got nothing, ever). Admins of the session's project follow it too: each
    follows at most 16 (the user's cap), so five of them fill the gateway."""
    alice = await caravan.user("alice")
    session_id = await ticking_session(caravan, alice, "ticking")
    admins = [await caravan.user(f"admin{i}", role=Role.ADMIN) for i in range(4)]
    variables = {"id": session_id, "tail": 4096}
    at_gateway_cap = {"code": "TOO_MANY_LOG_FOLLOWS", "limit": 64, "per": "gateway"}
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(authenticated_socket(caravan.url, alice))
        many = [await first.subscribe(LOGS, variables) for _ in range(100)]
        following, refused = await followers(first, many)
        assert len(following) == 8 and len(refused) == 92
        assert refused[0] == {"code": "TOO_MANY_LOG_FOLLOWS", "limit": 8, "per": "connection"}
        second = await stack.enter_async_context(authenticated_socket(caravan.url, alice))
        assert await first_answers(second, [await second.subscribe(LOGS, variables) for _ in range(8)]) == (8, [])
        for admin in admins[:3]:  # 16 + 3 × 16 = 64 in the process
            for _ in range(2):
                socket = await stack.enter_async_context(authenticated_socket(caravan.url, admin))
                assert await first_answers(socket, [await socket.subscribe(LOGS, variables) for _ in range(8)]) == (
                    8, [],
                )  # fmt: skip
        last = await stack.enter_async_context(authenticated_socket(caravan.url, admins[3]))
        followed, refused = await first_answers(last, [await last.subscribe(LOGS, variables) for _ in range(8)])
        assert followed == 0 and refused == [at_gateway_cap] * 8  # 64 in the process: the gateway's cap
        for operation in following[:5]:
            await first.complete(operation)
        await follow_once_freed(last, variables, 5, at_gateway_cap)  # the completed follows end: five more follow


async def test_one_user_follows_at_most_their_share_of_a_gateways_log_follows(caravan: Caravan) -> None:
    """One user following from three connections gets at most 16 follows in one gateway process
    (CARAVAN_GRAPHQL_MAX_USER_LOG_FOLLOWS), refused with TOO_MANY_LOG_FOLLOWS per user beyond; another user still
    follows. A follow completed or its connection closed frees its place. (Without the user's cap, 3 connections ×
    30 subscriptions took all 64 of the gateway's follows, and every other user was refused.)"""
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    alices, bobs = await asyncio.gather(
        ticking_session(caravan, alice, "alices"), ticking_session(caravan, bob, "bobs")
    )
    variables = {"id": alices, "tail": 4096}
    at_user_cap = {"code": "TOO_MANY_LOG_FOLLOWS", "limit": 16, "per": "user"}
    at_connection_cap = {"code": "TOO_MANY_LOG_FOLLOWS", "limit": 8, "per": "connection"}
    async with (
        authenticated_socket(caravan.url, alice) as first,
        authenticated_socket(caravan.url, alice) as third,
        authenticated_socket(caravan.url, bob) as bobs_socket,
    ):
        async with authenticated_socket(caravan.url, alice) as second:
            following, refused = await followers(first, [await first.subscribe(LOGS, variables) for _ in range(30)])
            assert (len(following), refused) == (8, [at_connection_cap] * 22)
            assert await first_answers(second, [await second.subscribe(LOGS, variables) for _ in range(30)]) == (
                8, [at_connection_cap] * 22,
            )  # fmt: skip
            assert await first_answers(third, [await third.subscribe(LOGS, variables) for _ in range(30)]) == (
                0, [at_user_cap] * 30,
            )  # fmt: skip
            bobs_follows = [await bobs_socket.subscribe(LOGS, {"id": bobs, "tail": 4096}) for _ in range(8)]
            assert await first_answers(bobs_socket, bobs_follows) == (8, [])  # alice's follows left bob his own
            for operation in following[:3]:
                await first.complete(operation)
            await follow_once_freed(third, variables, 3, at_user_cap)  # completed: their places are alice's again
        await follow_once_freed(third, variables, 5, at_user_cap)  # the second connection closed: its 8 are free
        followed, refused = await first_answers(third, [await third.subscribe(LOGS, variables)])
        assert (followed, refused) == (0, [at_connection_cap])  # the third connection follows its 8
