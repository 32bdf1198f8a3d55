"""commitSession on the real stack: a docker kernel's container becomes a local image tag owned by the user, made on
its node by the platform's short docker job; a new session from it has the committed file; other drivers refused;
another user cannot run it, by createSession, a template or a schedule (at creation and at each run)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import pytest

from domain.users import Role, User
from tests.conftest import DEFAULT_IMAGE, DOCKER
from tests.harness import CREATE, Caravan, GraphQLErrors

pytestmark = pytest.mark.skipif(not DOCKER, reason="needs Docker")

COMMIT = """mutation($id: ID!, $name: String!, $tag: String!) {
  commitSession(id: $id, name: $name, tag: $tag) { id ref status statusInfo ownerId } }"""
IMAGE = "query($id: ID!) { sessionImage(id: $id) { id ref status statusInfo } }"
IMAGES = "{ sessionImages { ref status } }"
DELETE = "mutation($id: ID!) { deleteSessionImage(id: $id) { status } }"
TEMPLATE = "mutation($i: CreateSessionTemplateInput!) { createSessionTemplate(input: $i) { id } }"
FROM_TEMPLATE = """mutation($t: ID!, $o: SessionOverridesInput!) {
  createSessionFromTemplate(templateId: $t, overrides: $o) { sessions { id } } }"""
SCHEDULE = "mutation($i: CreateScheduleInput!) { createSchedule(input: $i) { id } }"
TRIGGER = "mutation($id: ID!) { triggerSchedule(id: $id) { id } }"
RUNS = "query($id: ID!) { schedule(id: $id) { history(limit: 10) { outcome reason } } }"


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


async def commit_running(caravan: Caravan, token: str, name: str, writes: str) -> dict[str, Any]:
    """A running docker session of the user's whose startup command wrote ``writes``, asked to commit as
    ``<name>:v1``: the image as commitSession answered."""
    source = await create(
        caravan,
        token,
        name=f"{name}-box",
        driver="DOCKER",
        image=DEFAULT_IMAGE,
        startupCommand=f"{writes} && sleep 600",
    )
    await caravan.wait_for(source, "RUNNING")
    await asyncio.sleep(1)  # the startup command writes its file as the task starts
    image: dict[str, Any] = (await caravan.gql(COMMIT, {"id": source, "name": name, "tag": "v1"}, token=token))[
        "commitSession"
    ]
    return image


def docker_has(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


async def test_a_committed_image_starts_a_session_that_has_the_committed_file(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    image = await commit_running(caravan, alice, "snap", "echo kept-in-the-image > /committed.txt")
    assert (image["ref"], image["status"], image["ownerId"]) == ("caravan/u/alice/snap:v1", "COMMITTING", "alice")
    with pytest.raises(GraphQLErrors) as early:  # its docker commit is still to run: a docker rmi would race it
        await caravan.gql(DELETE, {"id": image["id"]}, token=alice)
    assert early.value.errors[0]["extensions"]["code"] == "CONFLICT"
    ready = await image_status(caravan, alice, image["id"], "READY", "FAILED")
    assert ready["status"] == "READY", ready
    assert docker_has("caravan/u/alice/snap:v1")
    assert (await caravan.gql(IMAGES, token=alice))["sessionImages"] == [
        {"ref": "caravan/u/alice/snap:v1", "status": "READY"}
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
    assert not docker_has("caravan/u/alice/snap:v1")


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


async def refused(caravan: Caravan, query: str, variables: dict[str, Any], token: str) -> tuple[str, str]:
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(query, variables, token=token)
    [error] = failed.value.errors
    return error["extensions"]["code"], error["extensions"].get("field")


async def test_a_committed_image_is_usable_by_its_owner_alone_at_every_creation(caravan: Caravan) -> None:
    bob, alice = await caravan.user("bob"), await caravan.user("alice")
    carol = await caravan.user("carol", Role.ADMIN)  # an admin of bob's project: she may use his image, alice not
    image = await commit_running(caravan, bob, "secret", "echo bobs-secret > /secret.txt")
    ready = await image_status(caravan, bob, image["id"], "READY", "FAILED")
    assert ready["status"] == "READY", ready
    ref = ready["ref"]
    batch = {"type": "BATCH", "driver": "DOCKER", "startupCommand": "cat /secret.txt"}

    # createSession: another user's image is NOT_FOUND, exactly as one that does not exist
    for named in (ref, "caravan/u/bob/no-such-image:v1"):
        spec = {"name": "stolen", **batch, "image": named}
        assert await refused(caravan, CREATE, {"input": spec}, alice) == ("NOT_FOUND", "image"), named
    # a template: refused at save, and at use when someone allowed saved it (a PROJECT template of bob's admin)
    template = {"name": "bobs", "spec": {**batch, "image": ref}}
    assert await refused(caravan, TEMPLATE, {"i": template}, alice) == ("NOT_FOUND", "spec.image")
    shared = {**template, "scope": "PROJECT", "project": "default"}
    template_id = (await caravan.gql(TEMPLATE, {"i": shared}, token=carol))["createSessionTemplate"]["id"]
    use = {"t": template_id, "o": {"name": "from-bobs-template"}}
    assert await refused(caravan, FROM_TEMPLATE, use, alice) == ("NOT_FOUND", "image")
    # a schedule: refused at creation, and at each run once its owner may no longer use the image
    schedule = {"name": "bobs-runs", "cron": "@yearly", "spec": {**batch, "image": ref}}
    assert await refused(caravan, SCHEDULE, {"i": schedule}, alice) == ("NOT_FOUND", "spec.image")
    schedule_id = (await caravan.gql(SCHEDULE, {"i": schedule}, token=carol))["createSchedule"]["id"]
    await caravan.users.put(User(id="carol", name="carol", role=Role.USER, projects=("default",)))
    await caravan.gql(TRIGGER, {"id": schedule_id}, token=carol)
    deadline = time.monotonic() + 60
    while not (runs := (await caravan.gql(RUNS, {"id": schedule_id}, token=carol))["schedule"]["history"]):
        assert time.monotonic() < deadline, "the triggered run was never recorded"
        await asyncio.sleep(0.3)
    assert [r["outcome"] for r in runs] == ["FAILED"], runs
    assert runs[0]["reason"].startswith("NOT_FOUND (image)"), runs

    # its owner runs it
    own = await create(caravan, bob, name="bobs-own", **batch, image=ref)
    done = await caravan.wait_for(own, "TERMINATED", "ERROR")
    assert done["mainKernel"]["logs"]["stdout"] == "bobs-secret\n", done
    await caravan.gql(DELETE, {"id": image["id"]}, token=bob)
    deadline = time.monotonic() + 60
    while docker_has(ref):  # no image left behind on the machine
        assert time.monotonic() < deadline
        await asyncio.sleep(0.3)
