"""Users and API tokens through the gateway: several tokens per user, stored hashed, revoked and refused at once;
deactivation; who may create and change whom; sessions' projects and creation on behalf of another user."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from core.clock import from_iso, utcnow
from core.errors import Conflict
from core.settings import Settings
from domain.users import BOOTSTRAP_ADMIN_ID, Role, User
from stores.users import UserStore
from tests.harness import ADMIN_TOKEN, Caravan, GraphQLErrors, running_caravan
from tests.ws_client import GraphQLSocket, authenticated_socket

VIEWER = "{ viewer { id role projects } }"
TOKENS = "query($u: ID) { tokens(userId: $u) { id userId label createdAt expiresAt lastUsedAt } }"
ISSUE = """mutation($label: String!, $u: ID, $exp: String) {
  issueToken(label: $label, userId: $u, expiresIn: $exp) { secret token { id userId label createdAt expiresAt } } }"""
REVOKE = "mutation($id: ID!) { revokeToken(id: $id) { id label } }"
USERS = "{ users { id role projects active } }"
CREATE_USER = """mutation($name: String!, $role: Role!, $projects: [String!]!) {
  createUser(input: {name: $name, role: $role, projects: $projects}) { id name role projects active } }"""
UPDATE_USER = """mutation($id: ID!, $role: Role, $projects: [String!]) {
  updateUser(input: {id: $id, role: $role, projects: $projects}) { id role projects } }"""
DEACTIVATE = "mutation($id: ID!) { deactivateUser(id: $id) { id active } }"
CREATE_SESSION = """mutation($input: CreateSessionInput!) {
  createSession(input: $input) { sessions { id ownerId project status } } }"""


async def refused(
    caravan: Caravan, query: str, variables: dict[str, Any] | None = None, *, token: str | None = ADMIN_TOKEN
) -> tuple[str, str | None]:
    """The code and field of the one error a request must get."""
    with pytest.raises(GraphQLErrors) as refusal:
        await caravan.gql(query, variables, token=token)
    [error] = refusal.value.errors
    extensions = error.get("extensions", {})
    return extensions.get("code", ""), extensions.get("field")


def session_input(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "type": "INTERACTIVE", "driver": "EXEC", **more}


async def test_viewer_shows_role_and_projects(caravan: Caravan) -> None:
    token = await caravan.user("alice", projects=("ml", "web"))
    assert (await caravan.gql(VIEWER, token=token))["viewer"] == {
        "id": "alice",
        "role": "USER",
        "projects": ["ml", "web"],
    }


async def test_several_tokens_each_work_and_a_revoked_one_is_refused_at_once(caravan: Caravan) -> None:
    first = await caravan.user("alice")
    issued = [(await caravan.gql(ISSUE, {"label": f"laptop {i}"}, token=first))["issueToken"] for i in range(3)]
    secrets = [first, *(i["secret"] for i in issued)]
    assert len(set(secrets)) == 4
    for secret in secrets:
        assert (await caravan.gql(VIEWER, token=secret))["viewer"]["id"] == "alice"

    listed = (await caravan.gql(TOKENS, token=first))["tokens"]
    assert [t["label"] for t in listed] == ["api", "laptop 0", "laptop 1", "laptop 2"]
    assert all(t["userId"] == "alice" and t["expiresAt"] is None for t in listed)
    assert all(t["lastUsedAt"] for t in listed), "each was just used"

    revoked = issued[1]["token"]
    assert (await caravan.gql(REVOKE, {"id": revoked["id"]}, token=first))["revokeToken"]["label"] == "laptop 1"
    assert await refused(caravan, VIEWER, token=issued[1]["secret"]) == ("UNAUTHENTICATED", None)
    for secret in (first, issued[0]["secret"], issued[2]["secret"]):
        assert (await caravan.gql(VIEWER, token=secret))["viewer"]["id"] == "alice"
    assert revoked["id"] not in [t["id"] for t in (await caravan.gql(TOKENS, token=first))["tokens"]]
    assert await refused(caravan, REVOKE, {"id": revoked["id"]}, token=first) == ("NOT_FOUND", "id")


async def test_secrets_are_stored_only_hashed(caravan: Caravan) -> None:
    token = await caravan.user("alice")
    issued = (await caravan.gql(ISSUE, {"label": "ci"}, token=token))["issueToken"]
    redis, prefix = caravan.users.redis, caravan.settings.redis.prefix
    stored: list[str] = []
    async for key in redis.scan_iter(f"{prefix}:*"):
        kind = await redis.type(key)
        stored.append(key)
        if kind == "string":
            stored.append(await redis.get(key) or "")
        elif kind == "hash":
            stored.extend(f"{k}={v}" for k, v in (await redis.hgetall(key)).items())
        elif kind == "set":
            stored.extend(await redis.smembers(key))
    for secret in (token, issued["secret"], ADMIN_TOKEN):
        assert not any(secret in text for text in stored)
    assert "secret" not in str(await caravan.gql(TOKENS, token=token))


async def test_a_revoked_token_closes_its_websocket_at_the_next_operation(caravan: Caravan) -> None:
    token = await caravan.user("alice")
    second = (await caravan.gql(ISSUE, {"label": "socket"}, token=token))["issueToken"]
    async with authenticated_socket(caravan.url, second["secret"]) as socket:
        first = await socket.subscribe("{ viewer { id } }")
        assert [p["data"] async for p in socket.results(first)] == [{"viewer": {"id": "alice"}}]
        await socket.subscribe("subscription { sessionEvents { sessionId } }")  # runs until the connection ends
        await caravan.gql(REVOKE, {"id": second["token"]["id"]}, token=token)
        with contextlib.suppress(ConnectionClosed):  # the revocation itself may have closed it already
            await socket.subscribe("{ viewer { id } }")
        assert await socket.closed_with() == 4403


async def streaming(socket: GraphQLSocket, caravan: Caravan, token: str) -> str:
    """A sessionEvents subscription of the token's user, with an event delivered: the connection is streaming."""
    operation = await socket.subscribe("subscription { sessionEvents { sessionId status } }")
    await caravan.gql(CREATE_SESSION, {"input": session_input("s-" + uuid.uuid4().hex[:6])}, token=token)
    assert (await socket.message_of(operation))["type"] == "next"
    return operation


async def closed_within(socket: GraphQLSocket, seconds: float) -> float:
    """How long the server took to close the connection with 4403 (it must, within ``seconds``)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await socket.closed_with(timeout=seconds) == 4403
    return loop.time() - started


async def test_a_revoked_tokens_streaming_connections_close_within_seconds(caravan: Caravan) -> None:
    token = await caravan.user("alice")
    revoked = (await caravan.gql(ISSUE, {"label": "revoked"}, token=token))["issueToken"]
    async with (
        authenticated_socket(caravan.url, revoked["secret"]) as doomed,
        authenticated_socket(caravan.url, token) as kept,
    ):
        await streaming(doomed, caravan, revoked["secret"])
        await caravan.gql(REVOKE, {"id": revoked["token"]["id"]}, token=token)
        assert await closed_within(doomed, 5.0) < 5.0  # no operation sent: the revocation itself closes it
        operation = await kept.subscribe("{ viewer { id } }")  # alice's other token's connection stays open
        assert [p["data"] async for p in kept.results(operation)] == [{"viewer": {"id": "alice"}}]


async def test_an_expiring_tokens_streaming_connection_closes_at_its_expiry(caravan: Caravan) -> None:
    token = await caravan.user("alice")
    short = (await caravan.gql(ISSUE, {"label": "short", "exp": "2s"}, token=token))["issueToken"]
    async with authenticated_socket(caravan.url, short["secret"]) as socket:
        await streaming(socket, caravan, token)
        await closed_within(socket, 6.0)
        assert utcnow() >= from_iso(short["token"]["expiresAt"])  # at its expiry, not before


async def test_a_deactivated_users_streaming_connections_close_within_seconds(caravan: Caravan) -> None:
    token = await caravan.user("bob")
    async with authenticated_socket(caravan.url, token) as socket:
        await streaming(socket, caravan, token)
        await caravan.gql(DEACTIVATE, {"id": "bob"})
        assert await closed_within(socket, 5.0) < 5.0


async def test_open_connections_cost_redis_nothing_while_idle(caravan: Caravan) -> None:
    """Watching tokens is one reader per gateway process, not a poll per connection."""
    tokens = [await caravan.user(f"idle{i}") for i in range(10)]
    prefix = caravan.settings.redis.prefix
    async with contextlib.AsyncExitStack() as stack:
        served = await stack.enter_async_context(commands_of(caravan, "gateway"))
        sockets = [await stack.enter_async_context(authenticated_socket(caravan.url, t)) for t in tokens]
        for socket in sockets:
            await socket.subscribe("subscription { sessionEvents { sessionId } }")
        joined = {f"XRANGE {prefix}:events:owner:idle{i} " for i in range(10)}  # each subscription's first read
        async with asyncio.timeout(30):
            while not all(any(c.startswith(j) for c in served) for j in joined):
                await asyncio.sleep(0.05)
        settled = len(served)
        await asyncio.sleep(3.0)  # the window measured
        idle = served[settled:]
    assert len(idle) <= 6, idle  # a few blocking reads (5 s each) in all, whatever the number of connections


@contextlib.asynccontextmanager
async def commands_of(caravan: Caravan, user: str) -> AsyncIterator[list[str]]:
    """The commands Redis serves to connections of ``user`` that name this test's keys, as they come (read with
    MONITOR: the server is shared by the whole test session, so others' commands are left out)."""
    served: list[str] = []
    prefix = caravan.settings.redis.prefix

    watching = asyncio.Event()

    async def follow() -> None:
        async with caravan.store.redis.monitor() as monitor:
            watching.set()
            while True:
                command = await monitor.next_command()
                if (
                    prefix in command["command"]
                    and await user_of(f"{command['client_address']}:{command['client_port']}") == user
                ):
                    served.append(command["command"])

    users: dict[str, str] = {}

    async def user_of(addr: str) -> str | None:
        if addr not in users:
            users.update({c["addr"]: c["user"] for c in await caravan.store.redis.client_list()})
        return users.get(addr)

    task = asyncio.create_task(follow())
    try:
        await watching.wait()
        yield served
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_bootstrap_admin_token_is_listed_and_keeps_working(caravan: Caravan) -> None:
    listed = (await caravan.gql(TOKENS))["tokens"]
    assert [(t["id"], t["userId"], t["label"]) for t in listed] == [("bootstrap", BOOTSTRAP_ADMIN_ID, "bootstrap")]
    await caravan.users.ensure_bootstrap_admin(ADMIN_TOKEN)  # what each start does
    assert (await caravan.gql(VIEWER))["viewer"]["role"] == "SUPERADMIN"
    await caravan.users.ensure_bootstrap_admin("a-new-configured-token")  # a new configured token replaces the old
    assert (await caravan.gql(VIEWER, token="a-new-configured-token"))["viewer"]["id"] == BOOTSTRAP_ADMIN_ID
    assert await refused(caravan, VIEWER, token=ADMIN_TOKEN) == ("UNAUTHENTICATED", None)


async def test_a_token_expires(caravan: Caravan) -> None:
    token = await caravan.user("alice")
    issued = (await caravan.gql(ISSUE, {"label": "short", "exp": "2s"}, token=token))["issueToken"]
    expires_at = from_iso(issued["token"]["expiresAt"])
    assert (await caravan.gql(VIEWER, token=issued["secret"]))["viewer"]["id"] == "alice"
    while (await caravan.post(VIEWER, token=issued["secret"])).get("data"):  # until it is refused
        assert utcnow() < expires_at + timedelta(seconds=10), "the token outlived its expiry"
        await asyncio.sleep(0.1)
    assert utcnow() >= expires_at  # at its expiry, not before
    assert await refused(caravan, VIEWER, token=issued["secret"]) == ("UNAUTHENTICATED", None)
    assert [t["label"] for t in (await caravan.gql(TOKENS, token=token))["tokens"]] == ["api"]


async def test_a_users_tokens_are_capped_per_user(redis_settings: Settings) -> None:
    capped = dataclasses.replace(
        redis_settings, gateway=dataclasses.replace(redis_settings.gateway, max_tokens_per_user=3)
    )
    async with running_caravan(capped, scheduler=False) as caravan:
        alice = await caravan.user("alice")  # her first token
        short = (await caravan.gql(ISSUE, {"label": "short", "exp": "3s"}, token=alice))["issueToken"]["token"]
        kept = (await caravan.gql(ISSUE, {"label": "kept"}, token=alice))["issueToken"]["token"]
        code, field = await refused(caravan, ISSUE, {"label": "fourth"}, token=alice)
        assert (code, field) == ("QUOTA_EXCEEDED", "userId")
        with pytest.raises(GraphQLErrors) as again:  # an admin issuing for her counts against her too
            await caravan.gql(ISSUE, {"label": "by admin", "u": "alice"})
        assert "already has 3 tokens" in again.value.errors[0]["message"]
        bob = await caravan.user("bob")  # the cap is per user, not global
        assert (await caravan.gql(ISSUE, {"label": "bob's second"}, token=bob))["issueToken"]["token"]["id"]
        await caravan.gql(REVOKE, {"id": kept["id"]}, token=alice)
        assert (await caravan.gql(ISSUE, {"label": "after revoking"}, token=alice))["issueToken"]
        while short["id"] in {t["id"] for t in (await caravan.gql(TOKENS, token=alice))["tokens"]}:  # until expired
            assert utcnow() < from_iso(short["expiresAt"]) + timedelta(seconds=10), "the token outlived its expiry"
            await asyncio.sleep(0.1)
        assert (await caravan.gql(ISSUE, {"label": "after expiry"}, token=alice))["issueToken"]
        for label in ("b", "c"):  # the bootstrap admin at the cap: a restart's token replaces its own, not an extra
            await caravan.gql(ISSUE, {"label": label})
        restarting = UserStore(caravan.store.redis, caravan.store.keys, max_tokens=3)  # as the gateway's start does
        await restarting.ensure_bootstrap_admin("a-new-configured-token")
        assert (await caravan.gql(VIEWER, token="a-new-configured-token"))["viewer"]["id"] == BOOTSTRAP_ADMIN_ID


async def test_admins_issue_and_revoke_tokens_of_users_they_manage(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("ml",))
    carol = await caravan.user("carol", Role.ADMIN, projects=("ml",))
    dave = await caravan.user("dave", Role.ADMIN, projects=("web",))
    issued = (await caravan.gql(ISSUE, {"label": "for alice", "u": "alice"}, token=carol))["issueToken"]
    assert issued["token"]["userId"] == "alice"
    assert (await caravan.gql(VIEWER, token=issued["secret"]))["viewer"]["id"] == "alice"
    assert await refused(caravan, ISSUE, {"label": "x", "u": "alice"}, token=dave) == ("NOT_FOUND", "userId")
    assert await refused(caravan, ISSUE, {"label": "x", "u": "carol"}, token=alice) == ("NOT_FOUND", "userId")
    # carol sees a fellow ADMIN of her project but does not manage them
    await caravan.user("erin", Role.ADMIN, projects=("ml",))
    assert await refused(caravan, ISSUE, {"label": "x", "u": "erin"}, token=carol) == ("FORBIDDEN", "userId")
    assert await refused(caravan, TOKENS, {"u": "erin"}, token=carol) == ("FORBIDDEN", "userId")
    # a USER in a project carol does not administer too is not hers to act for
    await caravan.user("frank", projects=("ml", "web"))
    assert await refused(caravan, ISSUE, {"label": "x", "u": "frank"}, token=carol) == ("FORBIDDEN", "userId")
    assert (await caravan.gql(REVOKE, {"id": issued["token"]["id"]}, token=carol))["revokeToken"]
    assert await refused(caravan, VIEWER, token=issued["secret"]) == ("UNAUTHENTICATED", None)


async def test_token_input_is_checked(caravan: Caravan) -> None:
    token = await caravan.user("alice")
    for label in ("", "   ", "x" * 65, "bell\x07"):
        assert await refused(caravan, ISSUE, {"label": label}, token=token) == ("INVALID_INPUT", "label")
    for expiry in ("soon", "-5m", "0s", "400d"):
        assert await refused(caravan, ISSUE, {"label": "x", "exp": expiry}, token=token) == (
            "INVALID_INPUT",
            "expiresIn",
        )
    assert await refused(caravan, ISSUE, {"label": "x", "u": "nobody"}) == ("NOT_FOUND", "userId")
    assert await refused(caravan, REVOKE, {"id": "nope"}, token=token) == ("NOT_FOUND", "id")
    assert await refused(caravan, VIEWER, token=None) == ("UNAUTHENTICATED", None)
    assert await refused(caravan, VIEWER, token="cv_made_up") == ("UNAUTHENTICATED", None)


async def test_a_deactivated_user_is_refused_and_their_sessions_are_left_alone(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    second = (await caravan.gql(ISSUE, {"label": "second"}, token=alice))["issueToken"]["secret"]
    [session] = (await caravan.gql(CREATE_SESSION, {"input": session_input("work")}, token=alice))["createSession"][
        "sessions"
    ]

    assert (await caravan.gql(DEACTIVATE, {"id": "alice"}))["deactivateUser"] == {"id": "alice", "active": False}
    for secret in (alice, second):
        assert await refused(caravan, VIEWER, token=secret) == ("UNAUTHENTICATED", None)
    assert (await caravan.gql(TOKENS, {"u": "alice"}))["tokens"] == []
    assert await refused(caravan, ISSUE, {"label": "again", "u": "alice"}) == ("CONFLICT", "userId")
    assert await refused(caravan, CREATE_SESSION, {"input": session_input("more", owner="alice")}) == (
        "CONFLICT",
        "owner",
    )
    stored = await caravan.store.get(session["id"])
    assert stored is not None and stored.status.value == "PENDING", "deactivation leaves sessions alone"
    assert {"id": "alice", "role": "USER", "projects": ["default"], "active": False} in (await caravan.gql(USERS))[
        "users"
    ]


async def test_deactivation_rules(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("ml",))
    carol = await caravan.user("carol", Role.ADMIN, projects=("ml",))
    await caravan.user("erin", Role.ADMIN, projects=("ml",))
    assert await refused(caravan, DEACTIVATE, {"id": "alice"}, token=alice) == ("FORBIDDEN", None)
    assert await refused(caravan, DEACTIVATE, {"id": "carol"}, token=carol) == ("FORBIDDEN", "id")
    assert await refused(caravan, DEACTIVATE, {"id": "erin"}, token=carol) == ("FORBIDDEN", "id")
    assert await refused(caravan, DEACTIVATE, {"id": BOOTSTRAP_ADMIN_ID}) == ("FORBIDDEN", "id")
    assert await refused(caravan, DEACTIVATE, {"id": "nobody"}) == ("NOT_FOUND", "id")
    assert (await caravan.gql(DEACTIVATE, {"id": "alice"}, token=carol))["deactivateUser"]["active"] is False


REACTIVATE = "mutation($id: ID!) { reactivateUser(id: $id) { id active } }"


async def test_a_deactivated_user_is_reactivated_by_who_may_deactivate_them(caravan: Caravan) -> None:
    """Reactivation follows deactivation's rules; the revoked tokens stay revoked, new ones work; the name is kept."""
    alice = await caravan.user("alice", projects=("ml",))
    carol = await caravan.user("carol", Role.ADMIN, projects=("ml",))
    erin = await caravan.user("erin", Role.ADMIN, projects=("cv",))
    await caravan.gql(DEACTIVATE, {"id": "alice"}, token=carol)
    taken = await refused(caravan, CREATE_USER, {"name": "alice", "role": "USER", "projects": ["ml"]})
    assert taken == ("CONFLICT", "name")
    assert await refused(caravan, REACTIVATE, {"id": "alice"}, token=erin) == ("NOT_FOUND", "id")  # not her project
    assert await refused(caravan, REACTIVATE, {"id": "carol"}, token=carol) == ("FORBIDDEN", "id")  # herself
    assert await refused(caravan, REACTIVATE, {"id": "nobody"}) == ("NOT_FOUND", "id")

    assert (await caravan.gql(REACTIVATE, {"id": "alice"}, token=carol))["reactivateUser"] == {
        "id": "alice",
        "active": True,
    }
    assert await refused(caravan, VIEWER, token=alice) == ("UNAUTHENTICATED", None)  # her old token stays revoked
    fresh = (await caravan.gql(ISSUE, {"label": "back", "u": "alice"}, token=carol))["issueToken"]["secret"]
    assert (await caravan.gql(VIEWER, token=fresh))["viewer"]["id"] == "alice"
    assert await refused(caravan, REACTIVATE, {"id": "alice"}, token=carol) == ("CONFLICT", "id")  # already active


async def test_user_names_follow_the_documented_rule_and_the_error_states_it(caravan: Caravan) -> None:
    with pytest.raises(GraphQLErrors) as raised:
        await caravan.gql(CREATE_USER, {"name": "no spaces", "role": "USER", "projects": ["ml"]})
    [error] = raised.value.errors
    rule = "1-64 characters: letters, digits, '_', '.' and '-', starting with a letter or digit"
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("INVALID_INPUT", "name")
    assert rule in error["message"]
    described = await caravan.gql('{ __type(name: "CreateUserInput") { inputFields { name description } } }')
    descriptions = {f["name"]: f["description"] for f in described["__type"]["inputFields"]}
    assert rule in descriptions["name"] and rule in descriptions["projects"]


async def test_issuing_races_deactivation_without_leaving_a_live_token(caravan: Caravan) -> None:
    await caravan.users.put(User(id="alice", name="alice", role=Role.USER))
    outcomes = await asyncio.gather(
        *(caravan.users.issue_token("alice", f"t{i}") for i in range(20)),
        caravan.users.deactivate("alice"),
        return_exceptions=True,
    )
    issued = [o for o in outcomes[:-1] if isinstance(o, str)]
    assert all(isinstance(o, (str, Conflict)) for o in outcomes[:-1]), outcomes
    assert await caravan.users.tokens_of("alice") == []
    for secret in issued:
        assert await caravan.users.by_token(secret) is None


async def test_who_creates_which_users(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("ml",))
    carol = await caravan.user("carol", Role.ADMIN, projects=("ml", "cv"))
    made = await caravan.gql(CREATE_USER, {"name": "gus", "role": "USER", "projects": ["ml"]}, token=carol)
    assert made["createUser"] == {"id": "gus", "name": "gus", "role": "USER", "projects": ["ml"], "active": True}
    assert (await caravan.gql(CREATE_USER, {"name": "root2", "role": "SUPERADMIN", "projects": ["x"]}))["createUser"][
        "role"
    ] == "SUPERADMIN"
    cases = [
        (alice, {"name": "h1", "role": "USER", "projects": ["ml"]}, ("FORBIDDEN", None)),
        (carol, {"name": "h2", "role": "ADMIN", "projects": ["ml"]}, ("FORBIDDEN", "role")),
        (carol, {"name": "h3", "role": "USER", "projects": ["ml", "web"]}, ("FORBIDDEN", "projects")),
        (ADMIN_TOKEN, {"name": "gus", "role": "USER", "projects": ["ml"]}, ("CONFLICT", "name")),
        (ADMIN_TOKEN, {"name": "", "role": "USER", "projects": ["ml"]}, ("INVALID_INPUT", "name")),
        (ADMIN_TOKEN, {"name": "a:b", "role": "USER", "projects": ["ml"]}, ("INVALID_INPUT", "name")),
        (ADMIN_TOKEN, {"name": "x" * 65, "role": "USER", "projects": ["ml"]}, ("INVALID_INPUT", "name")),
        (ADMIN_TOKEN, {"name": "-dash", "role": "USER", "projects": ["ml"]}, ("INVALID_INPUT", "name")),
        (ADMIN_TOKEN, {"name": "h4", "role": "USER", "projects": []}, ("INVALID_INPUT", "projects")),
        (ADMIN_TOKEN, {"name": "h5", "role": "USER", "projects": ["ok", "bad project"]}, ("INVALID_INPUT", "projects")),
        (
            ADMIN_TOKEN,
            {"name": "h6", "role": "USER", "projects": [f"p{i}" for i in range(33)]},
            ("INVALID_INPUT", "projects"),
        ),
    ]
    for token, variables, expected in cases:
        assert await refused(caravan, CREATE_USER, variables, token=token) == expected, variables
    assert await caravan.users.get("h2") is None


async def test_who_changes_which_users_and_nobody_raises_themself(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("ml",))
    carol = await caravan.user("carol", Role.ADMIN, projects=("ml", "cv"))
    assert (await caravan.gql(UPDATE_USER, {"id": "alice", "projects": ["ml", "cv"]}, token=carol))["updateUser"] == {
        "id": "alice",
        "role": "USER",
        "projects": ["ml", "cv"],
    }
    cases = [
        (alice, {"id": "alice", "role": "ADMIN"}, ("FORBIDDEN", None)),
        (carol, {"id": "carol", "role": "SUPERADMIN"}, ("FORBIDDEN", "role")),
        (carol, {"id": "carol", "projects": ["ml", "cv", "web"]}, ("FORBIDDEN", "projects")),
        (carol, {"id": "alice", "role": "ADMIN"}, ("FORBIDDEN", "role")),
        (carol, {"id": "alice", "projects": ["web"]}, ("FORBIDDEN", "projects")),
        (carol, {"id": "alice", "projects": []}, ("INVALID_INPUT", "projects")),
        (carol, {"id": BOOTSTRAP_ADMIN_ID, "projects": ["ml"]}, ("NOT_FOUND", "id")),
        (ADMIN_TOKEN, {"id": BOOTSTRAP_ADMIN_ID, "role": "USER"}, ("FORBIDDEN", "role")),
        (ADMIN_TOKEN, {"id": "nobody", "role": "USER"}, ("NOT_FOUND", "id")),
    ]
    for token, variables, expected in cases:
        assert await refused(caravan, UPDATE_USER, variables, token=token) == expected, variables
    # lowering oneself is fine; a SUPERADMIN changes anyone
    assert (await caravan.gql(UPDATE_USER, {"id": "carol", "projects": ["ml"]}, token=carol))["updateUser"][
        "projects"
    ] == ["ml"]
    assert (await caravan.gql(UPDATE_USER, {"id": "alice", "role": "ADMIN", "projects": ["web"]}))["updateUser"] == {
        "id": "alice",
        "role": "ADMIN",
        "projects": ["web"],
    }
    assert (await caravan.gql(VIEWER, token=alice))["viewer"] == {"id": "alice", "role": "ADMIN", "projects": ["web"]}


async def test_who_lists_which_users(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("ml",))
    carol = await caravan.user("carol", Role.ADMIN, projects=("ml",))
    await caravan.user("bob", projects=("web",))
    await caravan.user("frank", projects=("web", "ml"))
    assert await refused(caravan, USERS, token=alice) == ("FORBIDDEN", None)
    assert sorted(u["id"] for u in (await caravan.gql(USERS, token=carol))["users"]) == ["alice", "carol", "frank"]
    assert sorted(u["id"] for u in (await caravan.gql(USERS))["users"]) == ["admin", "alice", "bob", "carol", "frank"]
    # moving a user between projects moves them between admins' listings
    await caravan.gql(UPDATE_USER, {"id": "frank", "projects": ["web"]})
    assert sorted(u["id"] for u in (await caravan.gql(USERS, token=carol))["users"]) == ["alice", "carol"]


async def test_sessions_go_to_a_project_of_their_owner(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("ml", "web"))
    bob = await caravan.user("bob", projects=("web",))

    async def create(token: str, name: str, **more: Any) -> dict[str, Any]:
        payload = await caravan.gql(CREATE_SESSION, {"input": session_input(name, **more)}, token=token)
        [session] = payload["createSession"]["sessions"]
        return session

    assert (await create(alice, "first"))["project"] == "ml"
    assert (await create(alice, "second", project="web"))["project"] == "web"
    assert await refused(caravan, CREATE_SESSION, {"input": session_input("third", project="cv")}, token=alice) == (
        "FORBIDDEN",
        "project",
    )
    assert await refused(caravan, CREATE_SESSION, {"input": session_input("fourth", owner="alice")}, token=bob) == (
        "FORBIDDEN",
        "owner",
    )
    for_bob = await create(ADMIN_TOKEN, "for-bob", owner="bob")
    assert (for_bob["ownerId"], for_bob["project"]) == ("bob", "web")
    seen = await caravan.gql(
        "query($id: ID!) { session(id: $id) { ownerId project } }", {"id": for_bob["id"]}, token=bob
    )
    assert seen["session"] == {"ownerId": "bob", "project": "web"}
    assert await refused(caravan, CREATE_SESSION, {"input": session_input("x-bob", owner="bob", project="ml")}) == (
        "INVALID_INPUT",
        "project",
    )
    assert await refused(caravan, CREATE_SESSION, {"input": session_input("x-nobody", owner="nobody")}) == (
        "NOT_FOUND",
        "owner",
    )
    # a SUPERADMIN acts on everything: their own sessions may go to any (well-formed) project
    assert (await create(ADMIN_TOKEN, "root-in-ml", project="ml"))["project"] == "ml"
    assert await refused(caravan, CREATE_SESSION, {"input": session_input("root-bad", project="no such/project")}) == (
        "INVALID_INPUT",
        "project",
    )
