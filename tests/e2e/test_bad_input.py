"""Bad requests get a typed error naming the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest

from domain.users import Role
from tests.harness import CREATE, Caravan, GraphQLErrors

GOOD = {"name": "fine-name", "type": "BATCH", "startupCommand": "true", "driver": "EXEC"}

CASES = [
    ("empty command", {"startupCommand": "  "}, "INVALID_INPUT", "startupCommand"),
    ("short name", {"name": "abc"}, "INVALID_INPUT", "name"),
    ("name with quote", {"name": 'bad"name'}, "INVALID_INPUT", "name"),
    ("name with newline", {"name": "bad\nname"}, "INVALID_INPUT", "name"),
    ("negative cpu", {"resources": [{"slot": "cpu", "amount": "-1"}]}, "INVALID_INPUT", "resources.cpu"),
    ("garbage mem", {"resources": [{"slot": "mem", "amount": "lots"}]}, "INVALID_INPUT", "resources.mem"),
    (
        "unknown slot",
        {"resources": [{"slot": "quantum.qubits", "amount": "2"}]},
        "UNSUPPORTED_RESOURCE",
        "resources.quantum.qubits",
    ),
    ("reserved env", {"environ": [{"name": "NOMAD_TOKEN", "value": "x"}]}, "INVALID_INPUT", "environ.NOMAD_TOKEN"),
    ("bad env name", {"environ": [{"name": "A B", "value": "x"}]}, "INVALID_INPUT", "environ"),
    ("NUL in env", {"environ": [{"name": "A", "value": "x\u0000y"}]}, "INVALID_INPUT", "environ.A"),
]


async def stored(caravan: Caravan) -> int:
    return len(await caravan.store.session_ids())


@pytest.mark.parametrize(("change", "code", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_rejected_with_code_and_field(caravan: Caravan, change: dict[str, Any], code: str, field: str) -> None:
    with pytest.raises(GraphQLErrors) as raised:
        await caravan.gql(CREATE, {"input": {**GOOD, **change}})
    [error] = raised.value.errors
    assert error["extensions"]["code"] == code
    assert error["extensions"]["field"] == field
    assert "Traceback" not in error["message"]
    assert await stored(caravan) == 0


async def test_unknown_type_is_a_validation_error(caravan: Caravan) -> None:
    body = await caravan.post(CREATE, {"input": {**GOOD, "type": "SPACESHIP"}})
    assert body["errors"] and "SPACESHIP" in body["errors"][0]["message"]
    assert await stored(caravan) == 0


@pytest.mark.parametrize("role", [Role.USER, Role.ADMIN])
async def test_raw_exec_is_forbidden_for_all_but_superadmins(caravan: Caravan, role: Role) -> None:
    token = await caravan.user("alice", role)  # an ADMIN of a project must not become root on shared hosts
    with pytest.raises(GraphQLErrors) as raised:
        await caravan.gql(CREATE, {"input": {**GOOD, "driver": "RAW_EXEC"}}, token=token)
    assert raised.value.codes == ["FORBIDDEN"]
    assert raised.value.errors[0]["extensions"]["field"] == "driver"
    assert await stored(caravan) == 0


async def test_anonymous_is_unauthenticated(caravan: Caravan) -> None:
    with pytest.raises(GraphQLErrors) as raised:
        await caravan.gql(CREATE, {"input": GOOD}, token=None)
    assert raised.value.codes == ["UNAUTHENTICATED"]
    with pytest.raises(GraphQLErrors) as raised:
        await caravan.gql("{ viewer { id } }", token="not-a-token")
    assert raised.value.codes == ["UNAUTHENTICATED"]


async def test_users_see_only_their_own_sessions(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    data = await caravan.gql(CREATE, {"input": GOOD}, token=alice)
    session_id = data["createSession"]["sessions"][0]["id"]
    with pytest.raises(GraphQLErrors) as raised:
        await caravan.gql("query($id: ID!) { session(id: $id) { id } }", {"id": session_id}, token=bob)
    assert raised.value.codes == ["NOT_FOUND"]
    listing = "{ sessions { edges { node { id } } } }"
    assert (await caravan.gql(listing, token=bob))["sessions"]["edges"] == []
    assert [e["node"]["id"] for e in (await caravan.gql(listing, token=alice))["sessions"]["edges"]] == [session_id]
