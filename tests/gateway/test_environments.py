"""The environment catalog through GraphQL, on real Redis and the real Docker engine: a SUPERADMIN registers the
Jupyter image ops/build-env-images built (its apps and resources read from its labels), everyone lists it, committed
images appear as 'customized', retiring takes it out of the list and refuses new sessions, and every refusal is
typed."""

from __future__ import annotations

from typing import Any

import pytest

from core.clock import utcnow
from domain.images import ImageStatus
from domain.users import Role, User
from stores.images import ImageStore
from tests.conftest import DEFAULT_IMAGE, DOCKER, STACK
from tests.domain.test_images import image_of
from tests.harness import CREATE, Caravan, GraphQLErrors

JUPYTER_IMAGE = STACK.get("CARAVAN_JUPYTER_IMAGE", "")
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not (DOCKER and JUPYTER_IMAGE), reason="needs Docker and ops/build-env-images"),
]

VERSION = "tag image apps { name port protocol } startupCommand minResources { slot amount } " + (
    "defaultResources { slot amount } retired"
)
REGISTER = f"mutation($i: String!, $n: String) {{ registerEnvironment(image: $i, name: $n) {{ {VERSION} }} }}"
RETIRE = f"mutation($i: String!, $r: Boolean!) {{ retireEnvironment(image: $i, retired: $r) {{ {VERSION} }} }}"
LIST = (
    f"query($r: Boolean!) {{ environments(includeRetired: $r) {{ name title customized versions {{ {VERSION} }} }} }}"
)


async def refused(caravan: Caravan, query: str, variables: dict[str, Any], token: str | None = None) -> tuple[str, str]:
    with pytest.raises(GraphQLErrors) as caught:
        if token is None:
            await caravan.gql(query, variables)
        else:
            await caravan.gql(query, variables, token=token)
    [error] = caught.value.errors
    return error["extensions"]["code"], error["extensions"].get("field")


async def listed(caravan: Caravan, token: str, include_retired: bool = False) -> dict[str, Any]:
    found = (await caravan.gql(LIST, {"r": include_retired}, token=token))["environments"]
    return {e["name"]: e for e in found}


async def test_register_list_retire_and_use_the_jupyter_environment(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    assert await refused(caravan, REGISTER, {"i": JUPYTER_IMAGE}, alice) == ("FORBIDDEN", None)

    version = (await caravan.gql(REGISTER, {"i": JUPYTER_IMAGE}))["registerEnvironment"]
    assert version["apps"] == [{"name": "jupyter", "port": 8888, "protocol": "HTTP"}]
    assert version["startupCommand"] == "/usr/local/bin/caravan-env-start"
    assert {r["slot"]: r["amount"] for r in version["minResources"]} == {"cpu": "0.5", "mem": "512m"}
    assert await refused(caravan, REGISTER, {"i": JUPYTER_IMAGE}) == ("CONFLICT", "image")

    python = (await listed(caravan, alice))["python"]
    assert python["title"].startswith("Python 3") and not python["customized"]
    assert [v["image"] for v in python["versions"]] == [JUPYTER_IMAGE]

    # a session of it gets its app and default resources without naming them; less than its minimum is refused
    created = await caravan.gql(
        CREATE,
        {"input": {"name": "notebook", "type": "INTERACTIVE", "driver": "DOCKER", "image": JUPYTER_IMAGE}},
        token=alice,
    )
    [session] = created["createSession"]["sessions"]
    stored = await caravan.store.get(session["id"])
    assert stored is not None and [a.name for a in stored.apps] == ["jupyter"]
    assert stored.startup_command == "/usr/local/bin/caravan-env-start" and stored.resources["mem"] == str(2 * 2**30)
    small = {"name": "small", "type": "INTERACTIVE", "driver": "DOCKER", "image": JUPYTER_IMAGE}
    small["resources"] = [{"slot": "mem", "amount": "256m"}]
    assert await refused(caravan, CREATE, {"input": small}, alice) == ("INVALID_INPUT", "resources")

    # retired: gone from the list (admins may still ask for it), refused to new sessions, back when un-retired
    assert (await caravan.gql(RETIRE, {"i": JUPYTER_IMAGE, "r": True}))["retireEnvironment"]["retired"] is True
    assert "python" not in await listed(caravan, alice)
    assert "python" not in await listed(caravan, alice, include_retired=True)  # a user cannot see retired ones
    root = await caravan.user("root", Role.SUPERADMIN)
    assert (await listed(caravan, root, include_retired=True))["python"]["versions"][0]["retired"]
    again = {"name": "again", "type": "INTERACTIVE", "driver": "DOCKER", "image": JUPYTER_IMAGE}
    assert await refused(caravan, CREATE, {"input": again}, alice) == ("INVALID_INPUT", "image")
    await caravan.gql(RETIRE, {"i": JUPYTER_IMAGE, "r": False})
    assert "python" in await listed(caravan, alice)


async def test_refusals_are_typed_and_the_busybox_images_stay_allowed(caravan: Caravan) -> None:
    assert await refused(caravan, REGISTER, {"i": "caravan/busybox"}) == ("INVALID_INPUT", "image")
    assert await refused(caravan, REGISTER, {"i": "caravan/busybox:latest"}) == ("INVALID_INPUT", "image")
    assert await refused(caravan, REGISTER, {"i": "caravan/nothing-here:1"}) == ("NOT_FOUND", "image")
    assert await refused(caravan, REGISTER, {"i": DEFAULT_IMAGE, "n": "Not A Name"}) == ("INVALID_INPUT", "name")
    assert await refused(caravan, RETIRE, {"i": "caravan/nothing-here:1", "r": True}) == ("NOT_FOUND", "image")
    # unregistered, the busybox image still runs (the operator's patterns), and registers with no apps
    await caravan.gql(
        CREATE, {"input": {"name": "busybox", "type": "INTERACTIVE", "driver": "DOCKER", "image": DEFAULT_IMAGE}}
    )
    busybox = (await caravan.gql(REGISTER, {"i": DEFAULT_IMAGE}))["registerEnvironment"]
    assert (busybox["apps"], busybox["startupCommand"]) == ([], None)


async def test_committed_images_are_listed_as_customized_to_whom_may_use_them(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice", projects=("lab",)), await caravan.user("bob", projects=("other",))
    images = ImageStore(caravan.store.redis, caravan.store.keys)
    mine = image_of(User("alice", "alice", Role.USER, ("lab",)), "mine", ImageStatus.COMMITTING)
    mine = mine.evolve(created_at=utcnow(), base_image=JUPYTER_IMAGE)
    await caravan.gql(REGISTER, {"i": JUPYTER_IMAGE})
    await images.ask(mine)
    assert "customized" not in await listed(caravan, alice)  # COMMITTING: not usable yet
    await images.done(mine, mine.evolve(status=ImageStatus.READY), None)
    customized = (await listed(caravan, alice))["customized"]
    assert customized["customized"] and [v["image"] for v in customized["versions"]] == [mine.ref]
    # committed from a Jupyter session, it serves Jupyter too (its labels came along): listed, and given to its sessions
    assert customized["versions"][0]["apps"] == [{"name": "jupyter", "port": 8888, "protocol": "HTTP"}]
    spec = {"name": "again", "type": "INTERACTIVE", "driver": "DOCKER", "image": mine.ref}
    [session] = (await caravan.gql(CREATE, {"input": spec}, token=alice))["createSession"]["sessions"]
    stored = await caravan.store.get(session["id"])
    assert stored is not None and [a.name for a in stored.apps] == ["jupyter"]
    assert "customized" not in await listed(caravan, bob)
