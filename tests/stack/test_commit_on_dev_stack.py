"""Committing a session on the stack the README starts: ``caravan stack up`` as ``./ops/dev`` runs it (Docker on,
``CARAVAN_ENABLE_RAW_EXEC`` not set, so the users' namespace disables raw_exec). The commit's platform job runs in the
platform's namespace, which allows raw_exec and nothing else; a SUPERADMIN's raw_exec session still waits, naming the
driver, as the README says it does on this stack."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from core.secrets import nomad_token_path, read_secret
from core.settings import NomadSettings
from tests.conftest import DEFAULT_IMAGE, DOCKER, STACK
from tests.dev_stack import CREATE, Stack, stack_home

pytestmark = [
    pytest.mark.skipif("CARAVAN_NOMAD_HOME" not in STACK, reason="ops/install-nomad builds Nomad"),
    pytest.mark.skipif(not DOCKER, reason="needs Docker"),
    pytest.mark.nomad,
    pytest.mark.redis,
]  # `caravan stack up` starts both

COMMIT = """mutation($id: ID!) { commitSession(id: $id, name: "snap", tag: "v1") { id ref status } }"""
IMAGE = "query($id: ID!) { sessionImage(id: $id) { ref status statusInfo } }"
DELETE = "mutation($id: ID!) { deleteSessionImage(id: $id) { status } }"
IMAGES = "{ sessionImages { ref } }"
SESSION = """query($id: ID!) { session(id: $id) { status waitReasons mainKernel { logs { stdout } } } }"""


@pytest.fixture
def stack() -> Iterator[Stack]:
    """What ./ops/dev exports from ops/'s stack file for Docker, and nothing that opens raw_exec to sessions."""
    with stack_home() as home:
        running = Stack(home, CARAVAN_DOCKER_AVAILABLE="1", CARAVAN_PAUSE_IMAGE=STACK.get("CARAVAN_PAUSE_IMAGE", ""))
        assert "CARAVAN_ENABLE_RAW_EXEC" not in running.env
        yield running
        running.reset()


def until(stack: Stack, query: str, variables: dict[str, Any], done: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not done(found := next(iter(stack.gql(query, variables).values()))):
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
    return found  # type: ignore[no-any-return]


def create(stack: Stack, **spec: Any) -> str:
    return str(stack.gql(CREATE, {"input": spec})["createSession"]["sessions"][0]["id"])


LAUNCH = """mutation($s: ID!) { launchApp(sessionId: $s, app: "web") { url } }"""


def app_page(stack: Stack, session_id: str, timeout: float = 60) -> bytes:
    """The app ``web``'s front page as a browser gets it: the launch URL (its cookie), then ``/``, each sent to the
    stack's public port with the app's host (``*.localhost`` resolves to loopback in a browser, not here)."""
    url = urllib.parse.urlsplit(stack.gql(LAUNCH, {"s": session_id})["launchApp"]["url"])
    public = urllib.parse.urlsplit(stack.gateway)

    def get(path: str, cookie: str = "") -> tuple[int, bytes, str]:
        request = urllib.request.Request(f"http://{public.netloc}{path}", headers={"Host": url.netloc})
        if cookie:
            request.add_header("Cookie", cookie)
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(request, timeout=10) as response:
                return response.status, response.read(), response.headers.get("Set-Cookie", "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("Set-Cookie", "")

    status, _, set_cookie = get(f"{url.path}?{url.query}")
    assert status in (302, 303), status
    cookie = set_cookie.split(";", 1)[0]
    deadline = time.monotonic() + timeout
    while (answer := get("/", cookie))[0] != 200:  # the app's server starts just after the kernel does
        assert time.monotonic() < deadline, answer[:2]
        time.sleep(0.5)
    return answer[1]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def namespace(stack: Stack, name: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{stack.nomad}/v1/namespace/{urllib.parse.quote(name)}")
    request.add_header("X-Nomad-Token", read_secret(nomad_token_path(stack.home / "secrets", "admin")) or "")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_a_docker_session_commits_on_the_readme_stack_whose_sessions_have_no_raw_exec(stack: Stack) -> None:
    stack.run("up")
    source = create(
        stack, name="to-commit", type="INTERACTIVE", driver="DOCKER", image=DEFAULT_IMAGE,
        startupCommand="echo made-on-the-dev-stack > /kept.txt && mkdir -p /www && echo served > /www/index.html"
        " && exec httpd -f -p 8080 -h /www",
        apps=[{"name": "web", "port": 8080}],
    )  # fmt: skip
    until(stack, SESSION, {"id": source}, lambda s: s["status"] == "RUNNING")
    time.sleep(1)  # the startup command writes the file as the task starts
    # its app, through the stack's HAProxy: the gateway's control plane (under uvloop, as uvicorn runs it) built it
    assert app_page(stack, source) == b"served\n"
    image = stack.gql(COMMIT, {"id": source})["commitSession"]
    done = until(stack, IMAGE, {"id": image["id"]}, lambda i: i["status"] in ("READY", "FAILED"))
    assert done["status"] == "READY", done  # was: FAILED, raw_exec "is not allowed in namespace default"

    again = create(
        stack, name="from-it", type="BATCH", driver="DOCKER", image=done["ref"], startupCommand="cat /kept.txt"
    )
    ended = until(stack, SESSION, {"id": again}, lambda s: s["status"] in ("TERMINATED", "ERROR"))
    assert ended["mainKernel"]["logs"]["stdout"] == "made-on-the-dev-stack\n", ended
    stack.gql(DELETE, {"id": image["id"]})  # docker rmi, by the platform's job too: nothing left on the machine
    until(stack, IMAGES, {}, lambda found: found == [])

    # raw_exec runs on the node for the platform alone: the users' namespace still refuses it, and a SUPERADMIN's
    # raw_exec session waits naming the driver (README: ./ops/dev runs raw_exec sessions only when enabled)
    users, platform = namespace(stack, NomadSettings.namespace), namespace(stack, NomadSettings.platform_namespace)
    assert users["Capabilities"]["DisabledTaskDrivers"] == ["raw_exec"], users
    assert platform["Capabilities"]["EnabledTaskDrivers"] == ["raw_exec"], platform
    raw = create(stack, name="on-the-host", type="BATCH", driver="RAW_EXEC", startupCommand="echo on the host")
    waiting = until(stack, SESSION, {"id": raw}, lambda s: bool(s["waitReasons"]))
    assert waiting["status"] == "PENDING"
    assert waiting["waitReasons"] == [
        "never-fits: no schedulable agent of resource group default has driver:raw_exec"
    ], waiting
