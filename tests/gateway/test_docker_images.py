"""Docker image references: Docker's grammar, a fixed tag, the operator's allowlist; refused by field at creation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from core.errors import InvalidInput
from core.settings import Settings, load_settings
from domain.docker_images import check_docker_image
from tests.harness import CREATE, Caravan, GraphQLErrors, running_caravan

ALLOWED = ("caravan/*", "registry.internal:5000/ml/*")


@pytest.mark.parametrize(
    "reference",
    [
        "caravan/busybox:1.35.0-4-deb12u1-b1",
        "caravan/a.b_c__d-e/f:v1.2_3",
        "registry.internal:5000/ml/trainer:2024.1",
        "registry.internal:5000/ml/trainer:2@sha256:" + "a" * 64,
    ],
)
def test_well_formed_pinned_allowed_references_pass(reference: str) -> None:
    check_docker_image(reference, ALLOWED)


@pytest.mark.parametrize(
    ("reference", "why"),
    [
        ("caravan/busybox", "names no tag"),
        ("caravan/busybox:latest", "'latest'"),
        ("caravan/busybox@sha256:" + "a" * 64, "names no tag"),  # a digest alone: Nomad still wants a tag here
        ("caravan/BusyBox:1", "not a Docker image reference"),  # path components are lowercase
        ("caravan/busybox:1 ", "not a Docker image reference"),
        ("caravan//busybox:1", "not a Docker image reference"),
        ("caravan/busybox:-1", "not a Docker image reference"),
        ("caravan/busybox:1\n", "not a Docker image reference"),
        ("-caravan/busybox:1", "not a Docker image reference"),
        ("caravan/" + "a" * 250 + ":1", "longer than 255"),
        ("", "not a Docker image reference"),
        ("busybox:1.36", "not an allowed image"),
        ("docker.io/caravan/busybox:1", "not an allowed image"),  # the same image, but not as the operator wrote it
        ("evil.example/caravan/x:1", "not an allowed image"),
    ],
)
def test_other_references_are_refused_with_the_reason(reference: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why) as refused:
        check_docker_image(reference, ALLOWED, field="kernelRoles.sub.image")
    assert refused.value.field == "kernelRoles.sub.image"


def test_the_allowlist_comes_from_the_environment() -> None:
    assert load_settings({}).docker_images == ("caravan/*",)
    assert load_settings({"CARAVAN_DOCKER_IMAGES": " a/* , b/c:1 ,"}).docker_images == ("a/*", "b/c:1")


def docker_session(name: str, **fields: Any) -> dict[str, Any]:
    return {"input": {"name": name, "type": "INTERACTIVE", "driver": "DOCKER", **fields}}


async def code_and_field(caravan: Caravan, variables: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(CREATE, variables)
    [error] = refused.value.errors
    return error["extensions"]["code"], error["extensions"]["field"]


async def test_creation_refuses_bad_images_by_field_and_stores_nothing(caravan: Caravan) -> None:
    cases = [
        (docker_session("no-tag", image="caravan/busybox"), "image"),
        (docker_session("latest", image="caravan/busybox:latest"), "image"),
        (docker_session("outside", image="python:3.12"), "image"),
        (
            docker_session(
                "role", image="caravan/busybox:1", clusterSize=2, kernelRoles=[{"role": "SUB", "image": "ubuntu:24.04"}]
            ),
            "kernelRoles.sub.image",
        ),
    ]
    for variables, field in cases:
        assert await code_and_field(caravan, variables) == ("INVALID_INPUT", field), variables
    assert await caravan.store.session_ids() == []
    await caravan.gql(CREATE, docker_session("allowed", image="caravan/busybox:1"))  # not run: no scheduler here


async def test_the_operators_allowlist_and_default_image_are_applied(redis_settings: Settings) -> None:
    ours = dataclasses.replace(
        redis_settings, docker_images=("registry.internal/ml/*",), default_image="caravan/busybox:1"
    )
    async with running_caravan(ours, scheduler=False) as caravan:
        assert await code_and_field(caravan, docker_session("default-image")) == ("INVALID_INPUT", "image")
        await caravan.gql(CREATE, docker_session("theirs", image="registry.internal/ml/trainer:3"))
