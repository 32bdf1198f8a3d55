"""A researcher's day on the real stack: the Jupyter environment ops/build-env-images built, registered in the
catalog, launched as a docker session with a storage folder mounted and no app declared; Jupyter reached through
HAProxy on the app's own origin (its REST API with its XSRF cookie, a kernel's WebSocket), a cell computed with numpy
and pandas, the notebook saved into the folder, the kernel's terminal running tmux; the session terminated and the
notebook read back through the file API.

Requests go to 127.0.0.1 with the app's ``Host`` (``*.localhost`` resolves to the loopback in browsers and curl, not
necessarily through this machine's resolver), as in tests/e2e/test_app_proxy.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from websockets.asyncio.client import ClientConnection, connect

from core.settings import Settings
from tests.conftest import DOCKER, STACK
from tests.e2e.test_storage import ready_folder
from tests.e2e.test_terminal import terminal, until_output
from tests.harness import CREATE, Caravan
from tests.ingress import caravan_behind_haproxy

JUPYTER_IMAGE = STACK.get("CARAVAN_JUPYTER_IMAGE", "")
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not (DOCKER and JUPYTER_IMAGE), reason="needs Docker and ops/build-env-images"),
]

REGISTER = "mutation($i: String!) { registerEnvironment(image: $i) { image } }"
APPS = "query($id: ID!) { session(id: $id) { apps { name port url } } }"
DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }"
CELL = (
    "import numpy as np, pandas as pd\n"
    "frame = pd.DataFrame({'x': np.arange(10)})\n"
    "print('sum of squares', int((frame.x ** 2).sum()), 'mean', frame.x.mean())"
)
ANSWER = "sum of squares 285 mean 4.5\n"


class Jupyter:
    """Jupyter's REST API and a kernel's channels through the gateway's data plane, as a browser uses them: the app's
    Host (and Origin, for the WebSocket), the user's bearer token, Jupyter's XSRF cookie echoed in a header."""

    def __init__(self, caravan: Caravan, url: str, token: str) -> None:
        self.caravan = caravan
        self.host = url.split("://", 1)[1].rstrip("/")
        self.port = caravan.settings.public_port
        self.token = token
        self.xsrf = ""

    def headers(self) -> dict[str, str]:
        headers = {"Host": self.host, "Authorization": f"Bearer {self.token}"}
        if self.xsrf:
            headers |= {"X-XSRFToken": self.xsrf, "Cookie": f"_xsrf={self.xsrf}"}
        return headers

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        url = f"http://127.0.0.1:{self.port}{path}"
        return await self.caravan.http.request(method, url, headers=self.headers(), **kwargs)

    async def answering(self, attempts: int = 600) -> None:
        """Wait for Jupyter to answer through the gateway (it starts after the kernel does), then take its XSRF
        cookie from its start page, as a browser does."""
        for _ in range(attempts):
            status = await self.call("GET", "/api/status")
            if status.status_code == 200:
                break
            assert status.status_code in (502, 503), (status.status_code, status.text[:300])
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("Jupyter never answered through the gateway")
        page = await self.call("GET", "/tree")
        assert page.status_code == 200 and "Jupyter" in page.text, page.text[:300]
        self.xsrf = page.cookies["_xsrf"]

    def channels(self, kernel_id: str) -> connect:
        return connect(
            f"ws://{self.host}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}",
            host="127.0.0.1",
            port=self.port,
            origin=f"http://{self.host}",  # type: ignore[arg-type]
            additional_headers={"Authorization": f"Bearer {self.token}"},
            max_size=2**24,
        )


async def execute(ws: ClientConnection, code: str) -> tuple[str, str]:
    """Run ``code`` in the kernel (Jupyter's messaging protocol, v5, as JSON on the channels' WebSocket): its stdout
    and the reply's status."""
    msg_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "test",
            "session": "s",
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "stop_on_error": True,
        },
        "channel": "shell",
        "buffers": [],
    }
    await ws.send(json.dumps(request))
    stdout, status = "", ""
    while not status:
        message = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = message["msg_type"]
        if kind == "stream" and message["content"]["name"] == "stdout":
            stdout += message["content"]["text"]
        elif kind == "error":
            raise AssertionError(message["content"]["traceback"])
        elif kind == "execute_reply":
            status = message["content"]["status"]
    return stdout, status


def notebook(code: str, output: str) -> dict[str, Any]:
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "cells": [
            {
                "id": "c1",
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {},
                "source": code,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": output}],
            }
        ],
    }


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with caravan_behind_haproxy(settings) as (running, _):
        yield running


async def test_a_notebook_computed_in_jupyter_through_the_gateway_is_kept_in_the_folder(caravan: Caravan) -> None:
    await caravan.gql(REGISTER, {"i": JUPYTER_IMAGE})
    alice = await caravan.user("alice")
    folder = await ready_folder(caravan, alice, "notebooks")
    spec = {
        "name": "researcher",
        "type": "INTERACTIVE",
        "driver": "DOCKER",
        "image": JUPYTER_IMAGE,  # no apps, no startup command: the environment declares them
        "resources": [{"slot": "cpu", "amount": "1"}, {"slot": "mem", "amount": "1g"}],
        "mounts": [{"folder": folder["id"], "path": "/home/work/data", "mode": "RW"}],
    }
    [session] = (await caravan.gql(CREATE, {"input": spec}, token=alice))["createSession"]["sessions"]
    await caravan.wait_for(session["id"], "RUNNING", timeout=180)
    [app] = (await caravan.gql(APPS, {"id": session["id"]}, token=alice))["session"]["apps"]
    assert (app["name"], app["port"]) == ("jupyter", 8888)
    jupyter = Jupyter(caravan, app["url"], alice)
    await jupyter.answering()
    assert (await jupyter.call("GET", "/api/kernels")).json() == []

    # no XSRF echo: Jupyter refuses the POST (its own protection stays on behind the gateway)
    refused = await caravan.http.post(
        f"http://127.0.0.1:{jupyter.port}/api/kernels",
        headers={"Host": jupyter.host, "Authorization": f"Bearer {alice}"},
    )
    assert refused.status_code == 403
    started = await jupyter.call("POST", "/api/kernels", json={"name": "python3"})
    assert started.status_code == 201, started.text
    kernel_id = started.json()["id"]
    async with jupyter.channels(kernel_id) as ws:
        assert await execute(ws, CELL) == (ANSWER, "ok")

    saved = await jupyter.call(
        "PUT", "/api/contents/data/analysis.ipynb", json={"type": "notebook", "content": notebook(CELL, ANSWER)}
    )
    assert saved.status_code in (200, 201), saved.text
    assert (await jupyter.call("DELETE", f"/api/kernels/{kernel_id}")).status_code == 204

    # the kernel's terminal runs tmux (the image's $ENV for interactive shells), where the folder's notebook is
    async with terminal(caravan, session["id"], alice) as ws:
        await ws.send(json.dumps({"type": "resize", "rows": 30, "cols": 100}))
        await until_output(ws, b"[main]")  # tmux's status line: its session "main"
        await ws.send(b"ls data; echo in-tmux-$((6*7))\r")
        await until_output(ws, b"in-tmux-42")

    await caravan.gql(DESTROY, {"ids": [session["id"]]}, token=alice)
    await caravan.wait_for(session["id"], "TERMINATED", timeout=120)
    files = caravan.url.removesuffix("/graphql") + f"/folders/{folder['id']}/files"
    kept = await caravan.http.get(
        files, params={"path": "analysis.ipynb"}, headers={"Authorization": f"Bearer {alice}"}
    )
    assert kept.status_code == 200, kept.text
    [cell] = json.loads(kept.content)["cells"]
    assert ("".join(cell["source"]), "".join(cell["outputs"][0]["text"])) == (CELL, ANSWER)  # nbformat: lines
