"""commitSession on the real stack: a docker kernel's container becomes a local image tag owned by the user, made on
its node by the platform's short docker job; a new session from it has the committed file; other drivers refused."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import pytest

from tests.conftest import DEFAULT_IMAGE, DOCKER
from tests.harness import CREATE, Caravan, GraphQLErrors

pytestmark = pytest.mark.skipif(not DOCKER, reason="needs Docker")

COMMIT = """mutation($id: ID!, $name: String!, $tag: String!) {
  commitSession(id: $id, name: $name, tag: $tag) { id ref status statusInfo ownerId } }"""
IMAGE = "query($id: ID!) { sessionImage(id: $id) { id ref status statusInfo } }"
IMAGES = "{ sessionImages { ref status } }"
DELETE = "mutation($id: ID!) { deleteSessionImage(id: $id) { status } }"


async def create(caravan: Caravan, token: str, **spec: Any) -> str:
    data = await caravan.gql(CREATE, {"input": {"type": "INTERACTIVE", **spec}}, token=token)
    return str(data["createSession"]["sessions"][0]["id"])


async def image_status(
    caravan: Caravan, token: str, image_id: str, *wanted: str, timeout: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, Any] = (await caravan.gql(IMAGE, {"id": image_id}, token=token))["sessionImage"]
        if found["status"] in wanted:
            return found
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.3)


def docker_has(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


async def test_a_committed_image_starts_a_session_that_has_the_committed_file(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    source = await create(
        caravan, alice, name="to-commit", driver="DOCKER", image=DEFAULT_IMAGE,
        startupCommand="echo kept-in-the-image > /committed.txt && sleep 600",
    )  # fmt: skip
    await caravan.wait_for(source, "RUNNING")
    await asyncio.sleep(1)  # the startup command writes the file as the task starts
    image = (await caravan.gql(COMMIT, {"id": source, "name": "snap", "tag": "v1"}, token=alice))["commitSession"]
    assert (image["ref"], image["status"], image["ownerId"]) == ("caravan/u-alice-snap:v1", "COMMITTING", "alice")
    with pytest.raises(GraphQLErrors) as early:  # its docker commit is still to run: a docker rmi would race it
        await caravan.gql(DELETE, {"id": image["id"]}, token=alice)
    assert early.value.errors[0]["extensions"]["code"] == "CONFLICT"
    ready = await image_status(caravan, alice, image["id"], "READY", "FAILED")
    assert ready["status"] == "READY", ready
    assert docker_has("caravan/u-alice-snap:v1")
    assert (await caravan.gql(IMAGES, token=alice))["sessionImages"] == [
        {"ref": "caravan/u-alice-snap:v1", "status": "READY"}
    ]
    bob = await caravan.user("bob")
    assert (await caravan.gql(IMAGES, token=bob))["sessionImages"] == []

    again = await create(
        caravan, alice, name="from-image", type="BATCH", driver="DOCKER", image=ready["ref"],
        startupCommand="cat /committed.txt",
    )  # fmt: skip
    done = await caravan.wait_for(again, "TERMINATED", "ERROR")
    assert done["mainKernel"]["logs"]["stdout"] == "kept-in-the-image\n", done

    await caravan.gql(DELETE, {"id": image["id"]}, token=alice)
    deadline = time.monotonic() + 60
    while (await caravan.gql(IMAGES, token=alice))["sessionImages"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.3)
    assert not docker_has("caravan/u-alice-snap:v1")


async def test_only_a_running_docker_kernel_can_be_committed(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    exec_session = await create(caravan, alice, name="exec-one", driver="EXEC", startupCommand="sleep 600")
    await caravan.wait_for(exec_session, "RUNNING")
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(COMMIT, {"id": exec_session, "name": "snap", "tag": "v1"}, token=alice)
    [error] = failed.value.errors
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("UNSUPPORTED_RESOURCE", "id")
    for name, tag, field in (("Bad/Name", "v1", "name"), ("ok", "latest", "tag"), ("ok", "a b", "tag")):
        with pytest.raises(GraphQLErrors) as failed:
            await caravan.gql(COMMIT, {"id": exec_session, "name": name, "tag": tag}, token=alice)
        assert failed.value.errors[0]["extensions"]["field"] in (field, "id")
    bob = await caravan.user("bob")
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(COMMIT, {"id": exec_session, "name": "snap", "tag": "v1"}, token=bob)
    assert failed.value.codes == ["NOT_FOUND"]
