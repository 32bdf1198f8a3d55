"""The tenancy matrix: every query and mutation that touches a session, token, user, session template or resource
policy, tried by each kind of caller, with the outcome each must get.

The objects belong to ``alice`` (a USER of project p1). The callers: alice herself (the owner), bob (another USER
of p1), carol (an ADMIN of p1), dave (an ADMIN of p2), the bootstrap SUPERADMIN, and an anonymous request.
Objects a call changes or ends are made afresh for each call, through the API; users are seeded through
``UserStore``. A refused mutation must also have changed nothing. The test prints the matrix as it found it
(``ok``, a listing with alice's object ``listed`` or ``hidden``, or the error code: NF = NOT_FOUND,
FB = FORBIDDEN, UA = UNAUTHENTICATED, CF = CONFLICT; ``got≠expected`` marks a wrong cell).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from domain.users import Role, User
from stores.presets import PresetStore
from stores.resource_policies import PolicyStore
from stores.templates import TemplateStore
from tests.harness import ADMIN_TOKEN, Caravan

CALLERS = ("owner", "user", "admin", "admin'", "super", "anon")
"""owner: alice; user: bob (same project); admin: carol (ADMIN of p1); admin': dave (ADMIN of p2);
super: the bootstrap SUPERADMIN; anon: no token."""

OK, LISTED, HIDDEN = "ok", "listed", "hidden"
NF, FB, UA, CF, II = "NOT_FOUND", "FORBIDDEN", "UNAUTHENTICATED", "CONFLICT", "INVALID_INPUT"
SHORT = {NF: "NF", FB: "FB", UA: "UA", CF: "CF", "INVALID_INPUT": "II", "INTERNAL": "500"}

ACCESS = (OK, NF, OK, NF, OK, UA)
"""Alice's object, reached by those who may act on it: herself, her project's admin, the superadmin."""
LISTING = (LISTED, HIDDEN, LISTED, HIDDEN, LISTED, UA)
ADMINISTRATION = (FB, FB, OK, NF, OK, UA)
"""Admin work on alice or p1: users may do none; the other project's admin does not see them."""

CREATE = "mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }"
ISSUE = "mutation($label: String!, $userId: ID) { issueToken(label: $label, userId: $userId) { token { id } } }"
CREATE_TEMPLATE = """mutation($name: String!, $scope: TemplateScope!, $project: String, $driver: Driver = EXEC) {
  createSessionTemplate(input: {name: $name, scope: $scope, project: $project,
                                spec: {type: INTERACTIVE, driver: $driver}}) { id } }"""
FROM_TEMPLATE = (
    "mutation($id: ID!, $name: String!) { createSessionFromTemplate(templateId: $id, "
    "overrides: {name: $name}) { sessions { id } } }"
)
USER_POLICY = (
    "mutation($userId: String!) { setUserResourcePolicy(userId: $userId, policy: {maxPendingSessions: 500})"
    " { userId } }"
)
PROJECT_POLICY = (
    "mutation($project: String!) { setProjectResourcePolicy(project: $project, "
    'policy: {idleTimeout: "8h"}) { project } }'
)


def session_input(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "type": "INTERACTIVE", "driver": "EXEC", **more}


@dataclass
class World:
    caravan: Caravan
    tokens: dict[str, str | None]
    session_id: str = ""
    template_id: str = ""
    """alice's PERSONAL template in p1."""
    project_template_id: str = ""
    """carol's PROJECT template of p1."""
    raw_template_id: str = ""
    """The SUPERADMIN's PROJECT template of p1 running raw_exec (host root): only a SUPERADMIN may use it."""
    numbers: itertools.count[int] = field(default_factory=itertools.count)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.numbers)}"

    async def gql(self, query: str, variables: dict[str, Any], caller: str = "owner") -> dict[str, Any]:
        return await self.caravan.gql(query, variables, token=self.tokens[caller])

    async def new_session(self) -> str:
        created = await self.gql(CREATE, {"input": session_input(self.unique("fresh"))})
        session_id: str = created["createSession"]["sessions"][0]["id"]
        return session_id

    async def new_token(self) -> str:
        issued = await self.gql(ISSUE, {"label": self.unique("fresh")})
        token_id: str = issued["issueToken"]["token"]["id"]
        return token_id

    async def new_template(self, scope: str = "PERSONAL", caller: str = "owner", driver: str = "EXEC") -> str:
        created = await self.gql(
            CREATE_TEMPLATE, {"name": self.unique("tpl"), "scope": scope, "project": "p1", "driver": driver}, caller
        )
        template_id: str = created["createSessionTemplate"]["id"]
        return template_id

    async def new_member(self) -> str:
        user_id = self.unique("member")
        await self.caravan.users.put(User(id=user_id, name=user_id, role=Role.USER, projects=("p1",)))
        return user_id

    @property
    def policies(self) -> PolicyStore:
        return PolicyStore(self.caravan.store.redis, self.caravan.store.keys)

    @property
    def templates(self) -> TemplateStore:
        return TemplateStore(self.caravan.store.redis, self.caravan.store.keys)


Variables = dict[str, Any]
Prepare = Callable[[World, str], Awaitable[Variables]]
"""The variables of one call by one caller, making what the call needs first."""
Unchanged = Callable[[World, Variables], Awaitable[bool]]


@dataclass(frozen=True)
class Row:
    name: str
    document: str
    expected: tuple[str, str, str, str, str, str]
    """Per caller, in the order of ``CALLERS``."""
    prepare: Prepare
    listed: Callable[[dict[str, Any]], list[str]] | None = None
    """For listings: the ids a response lists; the outcome is whether ``looked_for`` is among them."""
    looked_for: Callable[[World], str] | None = None
    unchanged: Unchanged | None = None
    """For mutations: whether the object is as it was, checked when the call was refused."""


# -- sessions ---------------------------------------------------------------------------------------


async def the_session(world: World, caller: str) -> Variables:
    return {"id": world.session_id}


async def a_fresh_session(world: World, caller: str) -> Variables:
    return {"id": await world.new_session()}


async def renaming(world: World, caller: str) -> Variables:
    return {"id": world.session_id, "name": world.unique("renamed")}


async def for_alice(world: World, caller: str) -> Variables:
    return {"input": session_input(world.unique("for-alice"), owner="alice")}


async def raw_exec(world: World, caller: str) -> Variables:
    return {"input": session_input(world.unique("raw"), driver="RAW_EXEC")}


async def in_p1(world: World, caller: str) -> Variables:
    return {"input": session_input(world.unique("in-p1"), project="p1")}


async def after_alices(world: World, caller: str) -> Variables:
    return {
        "input": session_input(
            world.unique("after"), type="BATCH", startupCommand="true", dependencies=[world.session_id]
        )
    }


async def nothing(world: World, caller: str) -> Variables:
    return {}


async def still_pending(world: World, variables: Variables) -> bool:
    session = await world.caravan.store.get(variables["id"])
    return session is not None and session.status.value == "PENDING"


async def not_renamed(world: World, variables: Variables) -> bool:
    session = await world.caravan.store.get(variables["id"])
    return session is not None and session.name != variables["name"]


def session_ids(data: dict[str, Any]) -> list[str]:
    return [edge["node"]["id"] for edge in data["sessions"]["edges"]]


def alices_session(world: World) -> str:
    return world.session_id


SESSIONS_PAGE = "{ sessions(first: 100%s) { edges { node { id } } } }"
SESSION_ROWS = [
    Row("session", "query($id: ID!) { session(id: $id) { id } }", ACCESS, the_session),
    Row("session.logs", "query($id: ID!) { session(id: $id) { mainKernel { logs { stdout } } } }", ACCESS, the_session),
    Row("session.idleChecks", "query($id: ID!) { session(id: $id) { idleChecks { checkedAt } } }", ACCESS, the_session),
    Row("sessions", SESSIONS_PAGE % "", LISTING, nothing, session_ids, alices_session),
    Row(
        "sessions(filter: owner)",
        SESSIONS_PAGE % ', filter: {owner: "alice"}',
        LISTING,
        nothing,
        session_ids,
        alices_session,
    ),
    Row(
        "sessions(filter: project)",
        SESSIONS_PAGE % ', filter: {project: "p1"}',
        LISTING,
        nothing,
        session_ids,
        alices_session,
    ),
    Row(
        "effectiveIdlePolicy",
        "query($id: ID!) { effectiveIdlePolicy(sessionId: $id) { source } }",
        (FB, NF, OK, NF, OK, UA),
        the_session,
    ),
    Row("createSession(owner)", CREATE, (OK, FB, FB, FB, OK, UA), for_alice),
    Row("createSession(project)", CREATE, (OK, OK, OK, FB, OK, UA), in_p1),  # a SUPERADMIN acts in any project
    Row("createSession(raw_exec)", CREATE, (FB, FB, FB, FB, OK, UA), raw_exec),  # root on the host: SUPERADMIN only
    Row("createSession(dependencies)", CREATE, ACCESS, after_alices),
    Row(
        "destroySession",
        "mutation($id: ID!) { destroySession(ids: [$id]) { id } }",
        ACCESS,
        a_fresh_session,
        unchanged=still_pending,
    ),
    Row(
        "renameSession",
        "mutation($id: ID!, $name: String!) { renameSession(id: $id, name: $name) { id } }",
        ACCESS,
        renaming,
        unchanged=not_renamed,
    ),
    Row(
        "restartSession", "mutation($id: ID!) { restartSession(id: $id) { id } }", (CF, NF, CF, NF, CF, UA), the_session
    ),  # CONFLICT: allowed, but a PENDING session has nothing to restart
    Row(
        "updateEndpointScaling",
        "mutation($id: ID!) { updateEndpointScaling(id: $id, autoscaling: null) { desiredReplicas } }",
        (II, NF, II, NF, II, UA),
        the_session,
    ),  # INVALID_INPUT: allowed, but the session is no INFERENCE endpoint; others do not learn it exists
    Row(
        "updateEndpoint",
        'mutation($id: ID!) { updateEndpoint(id: $id, input: {startupCommand: "serve"}) { revision } }',
        (II, NF, II, NF, II, UA),
        the_session,
    ),
]


# -- tokens and users -------------------------------------------------------------------------------


async def alice(world: World, caller: str) -> Variables:
    return {"id": "alice", "userId": "alice"}


async def a_fresh_token(world: World, caller: str) -> Variables:
    return {"id": await world.new_token()}


async def a_new_name(world: World, caller: str) -> Variables:
    return {"name": world.unique("newcomer")}


async def alice_into_p1(world: World, caller: str) -> Variables:
    return {"id": "alice", "projects": ["p1"]}


async def a_fresh_member(world: World, caller: str) -> Variables:
    # alice is the owner of her user object: in her column she tries to deactivate herself
    return {"id": "alice" if caller == "owner" else await world.new_member()}


async def a_deactivated_member(world: World, caller: str) -> Variables:
    user_id = await world.new_member()
    await world.caravan.users.deactivate(user_id)
    return {"id": user_id}


async def still_deactivated(world: World, variables: Variables) -> bool:
    user = await world.caravan.users.get(variables["id"])
    return user is not None and not user.active


async def token_kept(world: World, variables: Variables) -> bool:
    return await world.caravan.users.token(variables["id"]) is not None


async def user_unchanged(world: World, variables: Variables) -> bool:
    user = await world.caravan.users.get(variables["id"])
    return user is not None and user.active and user.projects == ("p1",)


def user_ids(data: dict[str, Any]) -> list[str]:
    return [u["id"] for u in data["users"]]


USER_ROWS = [
    Row("tokens(userId)", "query($userId: ID) { tokens(userId: $userId) { id } }", ACCESS, alice),
    Row(
        "issueToken(userId)",
        'mutation($userId: ID) { issueToken(label: "m", userId: $userId) { token { id } } }',
        ACCESS,
        alice,
    ),
    Row(
        "revokeToken", "mutation($id: ID!) { revokeToken(id: $id) { id } }", ACCESS, a_fresh_token, unchanged=token_kept
    ),
    Row("user", "query($id: ID!) { user(id: $id) { id } }", ACCESS, alice),
    Row("users", "{ users { id } }", (FB, FB, LISTED, HIDDEN, LISTED, UA), nothing, user_ids, lambda _: "alice"),
    Row(
        "createUser",
        'mutation($name: String!) { createUser(input: {name: $name, projects: ["p1"]}) { id } }',
        (FB, FB, OK, FB, OK, UA),
        a_new_name,
    ),
    Row(
        "updateUser",
        "mutation($id: ID!, $projects: [String!]) { updateUser(input: {id: $id, projects: $projects}) { id } }",
        (FB, NF, OK, NF, OK, UA),
        alice_into_p1,
        unchanged=user_unchanged,
    ),
    Row(
        "deactivateUser",
        "mutation($id: ID!) { deactivateUser(id: $id) { id } }",
        (FB, NF, OK, NF, OK, UA),
        a_fresh_member,
        unchanged=user_unchanged,
    ),
    Row(
        "reactivateUser",
        "mutation($id: ID!) { reactivateUser(id: $id) { id } }",
        (NF, NF, OK, NF, OK, UA),
        a_deactivated_member,
        unchanged=still_deactivated,
    ),  # by deactivation's rules; a USER sees no other user
]


# -- session templates ------------------------------------------------------------------------------


async def the_template(world: World, caller: str) -> Variables:
    return {"id": world.template_id}


async def the_project_template(world: World, caller: str) -> Variables:
    return {"id": world.project_template_id}


async def a_fresh_template(world: World, caller: str) -> Variables:
    return {"id": await world.new_template()}


async def renaming_template(world: World, caller: str) -> Variables:
    return {"id": world.template_id, "name": world.unique("tpl-renamed")}


async def from_template(world: World, caller: str) -> Variables:
    return {"id": world.template_id, "name": world.unique("from-tpl")}


async def from_raw_template(world: World, caller: str) -> Variables:
    return {"id": world.raw_template_id, "name": world.unique("from-raw")}


async def personal_in_p1(world: World, caller: str) -> Variables:
    return {"name": world.unique("tpl-p1"), "scope": "PERSONAL", "project": "p1"}


async def project_template_of_p1(world: World, caller: str) -> Variables:
    return {"name": world.unique("tpl-project"), "scope": "PROJECT", "project": "p1"}


async def template_kept(world: World, variables: Variables) -> bool:
    return await world.templates.get(variables["id"]) is not None


async def template_not_renamed(world: World, variables: Variables) -> bool:
    template = await world.templates.get(variables["id"])
    return template is not None and template.name != variables["name"]


def template_ids(data: dict[str, Any]) -> list[str]:
    return [t["id"] for t in data["sessionTemplates"]]


TEMPLATE_ROWS = [
    Row("sessionTemplate", "query($id: ID!) { sessionTemplate(id: $id) { id } }", ACCESS, the_template),
    Row("sessionTemplates", "{ sessionTemplates { id } }", LISTING, nothing, template_ids, lambda w: w.template_id),
    Row("createSessionTemplate(project)", CREATE_TEMPLATE, (OK, OK, OK, FB, OK, UA), personal_in_p1),
    Row(
        "updateSessionTemplate",
        "mutation($id: ID!, $name: String) { updateSessionTemplate(id: $id, input: {name: $name}) { id } }",
        ACCESS,
        renaming_template,
        unchanged=template_not_renamed,
    ),
    Row(
        "deleteSessionTemplate",
        "mutation($id: ID!) { deleteSessionTemplate(id: $id) }",
        ACCESS,
        a_fresh_template,
        unchanged=template_kept,
    ),
    Row("createSessionFromTemplate", FROM_TEMPLATE, ACCESS, from_template),
    Row(
        "sessionTemplate(PROJECT)",
        "query($id: ID!) { sessionTemplate(id: $id) { id } }",
        (OK, OK, OK, NF, OK, UA),
        the_project_template,
    ),
    Row("createSessionTemplate(PROJECT)", CREATE_TEMPLATE, (FB, FB, OK, FB, OK, UA), project_template_of_p1),
    Row("createSessionFromTemplate(raw_exec)", FROM_TEMPLATE, (FB, FB, FB, NF, OK, UA), from_raw_template),
    Row(
        "updateSessionTemplate(PROJECT)",
        "mutation($id: ID!) { updateSessionTemplate(id: $id, input: {}) { id } }",
        (FB, FB, OK, NF, OK, UA),
        the_project_template,
    ),
]


# -- resource policies and presets ------------------------------------------------------------------


async def alices_policy(world: World, caller: str) -> Variables:
    await world.gql(USER_POLICY, {"userId": "alice"}, "super")  # stored, so that admins list it
    return {"userId": "alice"}


async def p1_policy(world: World, caller: str) -> Variables:
    await world.gql(PROJECT_POLICY, {"project": "p1"}, "super")
    return {"project": "p1"}


async def a_new_preset(world: World, caller: str) -> Variables:
    return {"name": world.unique("preset")}


async def a_stored_preset(world: World, caller: str) -> Variables:
    name = world.unique("preset")
    await world.gql(PRESET % ("createResourcePreset", "1"), {"name": name}, "super")
    return {"name": name}


async def no_preset(world: World, variables: Variables) -> bool:
    return not await PresetStore(world.caravan.store.redis, world.caravan.store.keys).named(variables["name"])


async def preset_kept(world: World, variables: Variables) -> bool:
    stored = await PresetStore(world.caravan.store.redis, world.caravan.store.keys).named(variables["name"])
    return stored[variables["name"]].resources == {"cpu": "1"}


async def user_policy_kept(world: World, variables: Variables) -> bool:
    return await world.policies.user(variables["userId"]) is not None


async def project_policy_kept(world: World, variables: Variables) -> bool:
    return await world.policies.project(variables["project"]) is not None


def policy_users(data: dict[str, Any]) -> list[str]:
    return [p["userId"] for p in data["resourcePolicies"]["users"] if p["stored"]]


def agents_shown(data: dict[str, Any]) -> list[str]:
    """Everyone reads the groups they may use and their capacity; only admins their agents."""
    return ["agents"] if any(g["agents"] is not None for g in data["resourceGroups"]) else []


def policy_projects(data: dict[str, Any]) -> list[str]:
    return [p["project"] for p in data["resourcePolicies"]["projects"]]


PRESET = 'mutation($name: String!) { %s(input: {name: $name, resources: [{slot: "cpu", amount: "%s"}]}) { name } }'
PRESETS = (FB, FB, FB, FB, OK, UA)
"""Presets are global: only a SUPERADMIN writes them (a project's admin would change every project's sessions)."""

POLICY_ROWS = [
    Row(
        "resourcePolicies.users",
        "{ resourcePolicies { users { userId stored } } }",
        LISTING,
        alices_policy,
        policy_users,
        lambda _: "alice",
    ),
    Row(
        "resourcePolicies.projects",
        "{ resourcePolicies { projects { project } } }",
        (LISTED, LISTED, LISTED, HIDDEN, LISTED, UA),
        p1_policy,
        policy_projects,
        lambda _: "p1",
    ),
    Row("setUserResourcePolicy", USER_POLICY, ADMINISTRATION, alice),
    Row(
        "deleteUserResourcePolicy",
        "mutation($userId: String!) { deleteUserResourcePolicy(userId: $userId) }",
        ADMINISTRATION,
        alices_policy,
        unchanged=user_policy_kept,
    ),
    Row("setProjectResourcePolicy", PROJECT_POLICY, ADMINISTRATION, p1_policy),
    Row(
        "deleteProjectResourcePolicy",
        "mutation($project: String!) { deleteProjectResourcePolicy(project: $project) }",
        ADMINISTRATION,
        p1_policy,
        unchanged=project_policy_kept,
    ),
    Row("resourcePresets", "{ resourcePresets { name } }", (OK, OK, OK, OK, OK, UA), nothing),
    Row(
        "resourceGroups.agents",
        "{ resourceGroups { name free { slot } agents { id } } }",
        (HIDDEN, HIDDEN, LISTED, LISTED, LISTED, UA),
        nothing,
        agents_shown,
        lambda _: "agents",
    ),
    Row("createResourcePreset", PRESET % ("createResourcePreset", "1"), PRESETS, a_new_preset, unchanged=no_preset),
    Row(
        "updateResourcePreset", PRESET % ("updateResourcePreset", "2"), PRESETS, a_stored_preset, unchanged=preset_kept
    ),
    Row(
        "deleteResourcePreset",
        "mutation($name: String!) { deleteResourcePreset(name: $name) }",
        PRESETS,
        a_stored_preset,
        unchanged=preset_kept,
    ),
]

ROWS = SESSION_ROWS + USER_ROWS + TEMPLATE_ROWS + POLICY_ROWS


# -- the run ----------------------------------------------------------------------------------------


async def outcome(world: World, row: Row, caller: str) -> str:
    variables = await row.prepare(world, caller)
    body = await world.caravan.post(row.document, variables, token=world.tokens[caller])
    if body.get("errors"):
        code: str = body["errors"][0].get("extensions", {}).get("code", "?")
        if row.unchanged is not None and not await row.unchanged(world, variables):
            return code + " but changed"
        return code
    if row.listed is not None and row.looked_for is not None:
        return LISTED if row.looked_for(world) in row.listed(body["data"]) else HIDDEN
    return OK


def table(found: dict[tuple[str, str], str]) -> str:
    cells = {}
    for row in ROWS:
        for caller, expected in zip(CALLERS, row.expected, strict=True):
            got = SHORT.get(found[row.name, caller], found[row.name, caller])
            right = found[row.name, caller] == expected
            cells[row.name, caller] = got if right else f"{got}≠{SHORT.get(expected, expected)}"
    width = max(len(r.name) for r in ROWS) + 2
    cell = max(9, *(len(c) + 2 for c in cells.values()))
    lines = ["".ljust(width) + "".join(c.ljust(cell) for c in CALLERS)]
    lines += [row.name.ljust(width) + "".join(cells[row.name, c].ljust(cell) for c in CALLERS) for row in ROWS]
    return "\n".join(lines)


async def test_tenancy_matrix(caravan_on_nomad: Caravan, capsys: pytest.CaptureFixture[str]) -> None:
    caravan = caravan_on_nomad  # resourceGroups.agents reads Nomad's nodes
    world = World(
        caravan,
        {
            "owner": await caravan.user("alice", projects=("p1",)),
            "user": await caravan.user("bob", projects=("p1",)),
            "admin": await caravan.user("carol", Role.ADMIN, projects=("p1",)),
            "admin'": await caravan.user("dave", Role.ADMIN, projects=("p2",)),
            "super": ADMIN_TOKEN,
            "anon": None,
        },
    )
    world.session_id = await world.new_session()
    world.template_id = await world.new_template()
    world.project_template_id = await world.new_template("PROJECT", caller="admin")
    world.raw_template_id = await world.new_template("PROJECT", caller="super", driver="RAW_EXEC")

    found = {(row.name, caller): await outcome(world, row, caller) for row in ROWS for caller in CALLERS}

    wrong = [
        (row.name, caller, found[row.name, caller], expected)
        for row in ROWS
        for caller, expected in zip(CALLERS, row.expected, strict=True)
        if found[row.name, caller] != expected
    ]
    report = table(found)
    with capsys.disabled():
        print(
            f"\ntenancy matrix: {len(ROWS)} operations × {len(CALLERS)} callers = {len(found)} cases, "
            f"{len(found) - len(wrong)} as expected, {len(wrong)} not\n{report}"
        )
    assert not wrong, f"{wrong}\n{report}"
