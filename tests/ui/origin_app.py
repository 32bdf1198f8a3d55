"""A session app for tests/ui/test_app_origins_ui.py, run as a script in a raw_exec kernel (host network: it listens
on 127.0.0.1 at the port it is given, the kernel's Nomad host port ``$NOMAD_PORT_p8765``) with the tests' interpreter.

It records every request that reaches it (the proxy passes a private app's request only with a credential it
accepted), echoes WebSocket messages, and serves two pages: ``/`` (the app's own) and ``/attack?target=<origin>``, a
page whose script tries, from this app's origin, every way a page has of sending the browser's cookies to another
app: a WebSocket, POSTs (``fetch`` and a form), GETs with credentials (``fetch`` in both modes, ``<img>``,
``<script>``). Each attempt is marked ``kind=attack-*``; its outcome, as the page sees it, is in ``#results``."""

from __future__ import annotations

import json
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

SEEN: list[dict[str, Any]] = []
"""Every request that reached the app: its ``kind`` (query), method, ``Origin`` and ``Sec-Fetch-Site``."""

OWN = "<!doctype html><title>own</title><p id=own>the app's own page</p>"

ATTACK = """<!doctype html><title>attack</title><pre id=results>{}</pre><iframe name=sink></iframe>
<script>
const T = %s;
const results = {};
const done = (key, value) => {
  if (key in results) return;
  results[key] = value;
  document.getElementById("results").textContent = JSON.stringify(results);
};
const ws = new WebSocket(T.replace(/^http/, "ws") + "/ws?kind=attack-ws");
ws.onopen = () => ws.send("anyone there?");
ws.onmessage = (e) => done("ws", "read: " + e.data);
ws.onerror = ws.onclose = () => done("ws", "refused");
const sent = (key) => [() => done(key, "sent"), () => done(key, "failed")];
fetch(T + "/record?kind=attack-fetch-post", {method: "POST", mode: "no-cors", credentials: "include", body: "x"})
  .then(...sent("fetchPost"));
fetch(T + "/record?kind=attack-fetch-cors", {credentials: "include"})
  .then((r) => r.text()).then((t) => done("fetchCors", "read: " + t), () => done("fetchCors", "failed"));
fetch(T + "/record?kind=attack-fetch-no-cors", {mode: "no-cors", credentials: "include"}).then(...sent("fetchNoCors"));
const img = new Image();
img.onload = img.onerror = () => done("img", "loaded");
img.src = T + "/record?kind=attack-img";
const script = document.createElement("script");
script.onload = script.onerror = () => done("script", "loaded");
script.src = T + "/record?kind=attack-script";
document.body.appendChild(script);
const form = document.createElement("form");
form.method = "POST"; form.target = "sink"; form.action = T + "/record?kind=attack-form";
document.body.appendChild(form);
document.querySelector("iframe").onload = () => done("form", "loaded");
form.submit();
</script>"""


def _seen(request: Request | WebSocket) -> None:
    SEEN.append(
        {
            "kind": request.query_params.get("kind", ""),
            "method": request.scope.get("method", "WEBSOCKET"),
            "origin": request.headers.get("origin"),
            "site": request.headers.get("sec-fetch-site"),
        }
    )


async def own(request: Request) -> Response:
    return HTMLResponse(OWN)


async def attack(request: Request) -> Response:
    return HTMLResponse(ATTACK % json.dumps(request.query_params["target"]))


async def record(request: Request) -> Response:
    _seen(request)
    await request.body()
    return PlainTextResponse("recorded")


async def seen(request: Request) -> Response:
    return JSONResponse(SEEN)


async def echo(websocket: WebSocket) -> None:
    _seen(websocket)
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        return


app = Starlette(
    routes=[
        Route("/", own),
        Route("/attack", attack),
        Route("/record", record, methods=["GET", "POST"]),
        Route("/seen", seen),
        WebSocketRoute("/ws", echo),
    ]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
