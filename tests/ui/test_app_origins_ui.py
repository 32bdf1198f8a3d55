"""App origins in a real headless Chromium: all apps are subdomains of one site (``*.apps.localhost``), so a page of
one app can make the browser send another app's ``SameSite=Lax`` cookie. Alice opens her private app from the web UI
(her browser then holds its cookie), then visits bob's public app, whose page tries every way of using that cookie
(tests/ui/origin_app.py): HAProxy (the stack's data plane) lets none of it reach her app, while her own app's page
keeps working."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from core.settings import Settings
from tests.harness import ADMIN_TOKEN, CREATE, Caravan
from tests.idle.running import eventually
from tests.ingress import caravan_behind_haproxy
from tests.ui.browser import Browser, attribute_is, sign_in, visible, wait

pytestmark = [pytest.mark.ui]

APP = Path(__file__).with_name("origin_app.py")
SET_PUBLIC = 'mutation($s: ID!) { setAppPublic(sessionId: $s, app: "web", public: true) { publicUrl } }'

OWN_PAGE = """
const finish = arguments[arguments.length - 1];
const out = {};
const ws = new WebSocket(location.origin.replace(/^http/, "ws") + "/ws?kind=own-ws");
ws.onopen = () => ws.send("hello");
ws.onmessage = (e) => { out.ws = e.data; ws.close(); post(); };
ws.onerror = () => { out.ws = "refused"; post(); };
function post() {
  fetch("/record?kind=own-fetch-post", {method: "POST", body: "x"})
    .then((r) => r.text()).then((t) => { out.fetchPost = t; form(); }, () => { out.fetchPost = "failed"; form(); });
}
function form() {
  const sink = document.createElement("iframe");
  sink.name = "sink";
  document.body.appendChild(sink);
  const f = document.createElement("form");
  f.method = "POST"; f.target = "sink"; f.action = "/record?kind=own-form";
  document.body.appendChild(f);
  sink.onload = () => { out.form = sink.contentDocument.body.textContent; finish(out); };
  f.submit();
}
"""
"""On the app's own page: a WebSocket echo, a fetch POST and a form POST, each with the app's cookie only."""


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    """The apps through the stack's data plane: a HAProxy of the test's own in front of the gateway."""
    async with caravan_behind_haproxy(settings) as (running, _):
        yield running


async def _app_session(caravan: Caravan, owner: str) -> tuple[str, str]:
    """A RUNNING raw_exec session of ``owner`` (made by the SUPERADMIN: raw_exec is theirs alone) serving
    origin_app.py as its app ``web``: its id and the app's URL, once the app answers."""
    session = {
        "name": f"origin-{owner}",
        "type": "INTERACTIVE",
        "driver": "RAW_EXEC",
        "owner": owner,
        "startupCommand": f"exec {sys.executable} {APP} $NOMAD_PORT_p8765",
        "apps": [{"name": "web", "port": 8765}],
    }
    made = await caravan.gql(CREATE, {"input": session}, token=ADMIN_TOKEN)
    session_id: str = made["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING")
    found = await caravan.gql(f'query {{ session(id: "{session_id}") {{ apps {{ url }} }} }}')
    url: str = found["session"]["apps"][0]["url"]

    async def answers() -> bool:
        return await _seen(caravan, url) is not None

    await eventually(answers, timeout=60, every=0.2)  # the server starts after the kernel
    return session_id, url


async def _seen(caravan: Caravan, url: str) -> list[dict[str, Any]] | None:
    """What reached the app at ``url`` (read with the SUPERADMIN's bearer token, which is not a cookie)."""
    host = url.split("://", 1)[1].rstrip("/")
    try:
        response = await caravan.http.get(
            f"http://127.0.0.1:{caravan.settings.public_port}/seen",
            headers={"Host": host, "Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
    except httpx2.TransportError:
        return None
    if response.status_code != 200:
        return None
    seen: list[dict[str, Any]] = response.json()
    return seen if isinstance(seen, list) else None


async def test_another_apps_page_cannot_use_an_apps_cookie(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    bob = await caravan.user("bob")
    alice_session, alice_app = await _app_session(caravan, "alice")
    bob_session, bob_app = await _app_session(caravan, "bob")
    await caravan.gql(SET_PUBLIC, {"s": bob_session}, token=bob)
    target = alice_app.rstrip("/")
    attack = f"{bob_app}attack?target={target}"

    def open_own_app(d: WebDriver) -> dict[str, Any]:
        sign_in(d, browser.base, alice)
        d.get(f"{browser.base}/ui/sessions/{alice_session}")
        attribute_is(d, "#session-detail", "data-status", "RUNNING")
        start = d.window_handles
        visible(d, "button.app[data-app='web']").click()
        wait(d).until(lambda d: len(d.window_handles) == len(start) + 1)
        d.switch_to.window(next(h for h in d.window_handles if h not in start))
        visible(d, "#own")  # through the launch address: the app's cookie is set
        assert d.current_url == alice_app
        opener_cut = d.execute_script("return window.opener === null")
        d.set_script_timeout(30)
        own: dict[str, Any] = d.execute_async_script(OWN_PAGE)
        return {"openerCut": opener_cut, **own}

    own = await browser.run(open_own_app)
    assert own == {"openerCut": True, "ws": "hello", "fetchPost": "recorded", "form": "recorded"}

    def visit_bob(d: WebDriver) -> dict[str, str]:
        d.get(attack)  # in alice's browser, which holds her app's cookie
        wait(d).until(lambda d: len(json.loads(d.find_element("id", "results").text)) == 7)
        results: dict[str, str] = json.loads(d.find_element("id", "results").text)
        return results

    results = await browser.run(visit_bob)
    # the refused requests' 403s and CORS failures are the console's errors here, and expected
    await browser.run(lambda d: browser.console_errors())
    seen = await _seen(caravan, alice_app)
    assert seen is not None
    kinds = [entry["kind"] for entry in seen]
    assert {"own-ws", "own-fetch-post", "own-form"} <= set(kinds)
    assert [k for k in kinds if k.startswith("attack-")] == [], seen  # nothing of bob's page reached alice's app
    assert results["ws"] == "refused" and not results["fetchCors"].startswith("read:"), results
