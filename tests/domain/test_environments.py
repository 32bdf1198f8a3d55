"""The environment catalog (domain.environments): an image's labels read into a catalog entry, the catalog as the
image allowlist (registered images allowed, retired ones refused), and a session of a catalog image getting its apps,
startup command and resources. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.errors import CaravanError
from domain.apps import App, AppProtocol
from domain.environments import EnvironmentImage, environment_of
from domain.model import Driver, SessionType
from domain.session_requests import CreationRules, SessionRequest, build_sessions
from domain.users import Role, User
from tests.domain.test_images import image_of

NOW = datetime(2026, 11, 27, 7, 0, tzinfo=UTC)
ALICE = User("alice", "alice", Role.USER, ("lab",))
IMAGE = "caravan/env-python:3.11-jupyter-1"
LABELS = {
    "ai.caravan.environment": "python",
    "ai.caravan.title": "Python 3.11 + Jupyter",
    "ai.caravan.apps": "jupyter:http:8888, tb:websocket:6006",
    "ai.caravan.startup-command": "/usr/local/bin/caravan-env-start",
    "ai.caravan.resource.min.cpu": "0.5",
    "ai.caravan.resource.min.mem": "512m",
    "ai.caravan.resource.default.cpu": "1",
    "ai.caravan.resource.default.mem": "2g",
}


def refusal(call: object) -> tuple[str, str | None]:
    with pytest.raises(CaravanError) as refused:
        call()  # type: ignore[operator]
    return refused.value.code, refused.value.field


def test_the_labels_declare_the_apps_command_and_resources() -> None:
    entry = environment_of(IMAGE, LABELS, now=NOW)
    assert (entry.name, entry.tag, entry.title) == ("python", "3.11-jupyter-1", "Python 3.11 + Jupyter")
    assert entry.apps == (App("jupyter", 8888), App("tb", 6006, AppProtocol.WEBSOCKET))
    assert entry.startup_command == "/usr/local/bin/caravan-env-start"
    assert entry.min_resources == {"cpu": "0.5", "mem": "512m"}
    assert entry.default_resources == {"cpu": "1", "mem": "2g"}
    bare = environment_of("caravan/busybox:1.35", {}, now=NOW)  # an image without labels: named by its path
    assert (bare.name, bare.apps, bare.startup_command) == ("busybox", (), None)
    assert environment_of(IMAGE, LABELS, now=NOW, name="py").name == "py"


@pytest.mark.parametrize(
    ("labels", "name", "field"),
    [
        ({"ai.caravan.apps": "jupyter:8888"}, None, "labels"),
        ({"ai.caravan.apps": "jupyter:gopher:8888"}, None, "labels"),
        ({"ai.caravan.apps": "Jupyter:http:8888"}, None, "labels[0].name"),
        ({"ai.caravan.apps": "a:http:8888,b:http:8888"}, None, "labels[1].port"),
        ({"ai.caravan.resource.min.mem": "lots"}, None, "labels"),
        ({"ai.caravan.title": "x" * 500}, None, "labels"),
        ({}, "Bad Name", "name"),
        ({}, "customized", "name"),
    ],
)
def test_labels_that_do_not_read_are_refused_by_field(labels: dict[str, str], name: str | None, field: str) -> None:
    assert refusal(lambda: environment_of(IMAGE, labels, now=NOW, name=name)) == ("INVALID_INPUT", field)


def rules_with(*entries: EnvironmentImage, patterns: tuple[str, ...] = ("caravan/*",)) -> CreationRules:
    return CreationRules(docker_images=patterns, environments={e.image: e for e in entries})


def docker(image: str, **fields: object) -> SessionRequest:
    return SessionRequest(name="work", type=SessionType.INTERACTIVE, driver=Driver.DOCKER, image=image, **fields)  # type: ignore[arg-type]


def test_a_session_of_a_catalog_image_gets_its_apps_command_and_default_resources() -> None:
    rules = rules_with(environment_of(IMAGE, LABELS, now=NOW))
    [session] = build_sessions(docker(IMAGE), viewer=ALICE, now=NOW, rules=rules)
    assert [a.name for a in session.apps] == ["jupyter", "tb"]
    assert session.startup_command == "/usr/local/bin/caravan-env-start"
    assert (session.resources["cpu"], session.resources["mem"]) == ("1", str(2 * 2**30))
    # what the session says wins over what the image declares
    mine = docker(IMAGE, apps=(App("web", 8080),), startup_command="sleep 1", resources={"cpu": "2"})
    [session] = build_sessions(mine, viewer=ALICE, now=NOW, rules=rules)
    assert ([a.name for a in session.apps], session.startup_command) == (["web"], "sleep 1")
    assert (session.resources["cpu"], session.resources["mem"]) == ("2", str(2 * 2**30))


def test_less_than_the_images_minimum_is_refused() -> None:
    rules = rules_with(environment_of(IMAGE, LABELS, now=NOW))
    for small in (docker(IMAGE, resources={"mem": "256m"}), docker(IMAGE, resources={"cpu": "0.25"})):
        assert refusal(lambda small=small: build_sessions(small, viewer=ALICE, now=NOW, rules=rules)) == (
            "INVALID_INPUT",
            "resources",
        )


def test_the_catalog_is_the_allowlist_and_a_retired_image_is_refused() -> None:
    outside = environment_of("registry.internal/ml/torch:2.3", {}, now=NOW)
    rules = rules_with(outside, patterns=("caravan/*",))
    assert build_sessions(docker(outside.image), viewer=ALICE, now=NOW, rules=rules)[0].image == outside.image
    assert refusal(
        lambda: build_sessions(docker("registry.internal/ml/other:1"), viewer=ALICE, now=NOW, rules=rules)
    ) == (
        "INVALID_INPUT",
        "image",
    )
    retired = environment_of(IMAGE, LABELS, now=NOW).evolve(retired=True)
    rules = rules_with(retired)  # caravan/* would allow it: retiring wins
    assert refusal(lambda: build_sessions(docker(IMAGE), viewer=ALICE, now=NOW, rules=rules)) == (
        "INVALID_INPUT",
        "image",
    )
    assert build_sessions(docker("caravan/busybox:1.35"), viewer=ALICE, now=NOW, rules=rules)[0].apps == ()


def test_a_committed_image_serves_the_apps_of_the_image_its_session_ran() -> None:
    jupyter = environment_of(IMAGE, LABELS, now=NOW)
    record = image_of(ALICE, "mine").evolve(base_image=IMAGE)
    rules = CreationRules(environments={IMAGE: jupyter}, committed_images={record.ref: [record]})
    [session] = build_sessions(docker(record.ref), viewer=ALICE, now=NOW, rules=rules)
    assert ([a.name for a in session.apps], session.startup_command) == (["jupyter", "tb"], jupyter.startup_command)
    plain = record.evolve(base_image="")  # committed before the base was kept: no apps
    rules = CreationRules(environments={IMAGE: jupyter}, committed_images={record.ref: [plain]})
    assert build_sessions(docker(record.ref), viewer=ALICE, now=NOW, rules=rules)[0].apps == ()
