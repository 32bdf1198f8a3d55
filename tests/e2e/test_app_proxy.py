"""Session apps through the gateway's proxy (gateway/apps/), against real apps in real sessions: busybox httpd with
CGI scripts in an exec kernel (isolated network namespace, reached only through its Nomad host port), a WebSocket
echo server the test ships in a raw_exec kernel.

Requests go to 127.0.0.1 with the app's ``Host`` (``*.localhost`` resolves to the loopback in browsers and curl, not
necessarily through this machine's resolver)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import websockets
from websockets.asyncio.client import connect
from websockets.typing import Origin

from core.clock import utcnow
from core.settings import Settings
from domain.model import SessionStatus
from domain.users import Role
from stores.activity import read_activity
from tests.conftest import DEFAULT_IMAGE
from tests.harness import CREATE, Caravan
from tests.idle.running import policy_file, running_idle, swept_since
from tests.ingress import caravan_behind_haproxy

SITE = r"""
mkdir -p /tmp/w/cgi-bin && cd /tmp/w/cgi-bin
cat > env <<'EOF'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
env
EOF
cat > sum <<'EOF'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
head -c "${CONTENT_LENGTH:-0}" | sha256sum
EOF
cat > bigsum <<'EOF'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
sha256sum < /tmp/w/big
EOF
cat > sse <<'EOF'
#!/bin/sh
printf 'Content-Type: text/event-stream\r\n\r\n'
printf 'data: one\n\n'
while [ ! -e /tmp/go ]; do sleep 0.1; done
printf 'data: two\n\n'
EOF
cat > go <<'EOF'
#!/bin/sh
touch /tmp/go
printf 'Content-Type: text/plain\r\n\r\nok'
EOF
cat > slow <<'EOF'
#!/bin/sh
sleep 60
EOF
chmod +x *
echo hello > /tmp/w/index.html
dd if=/dev/urandom of=/tmp/w/big bs=1048576 count=50 2>/dev/null
exec httpd -f -p 8080 -h /tmp/w
"""
APP_FIELDS = "apps { name port protocol public url publicUrl }"
LAUNCH = "mutation($s: ID!, $a: String!) { launchApp(sessionId: $s, app: $a) { url expiresAt } }"
SET_PUBLIC = (
    "mutation($s: ID!, $a: String!, $p: Boolean!) { setAppPublic(sessionId: $s, app: $a, public: $p) { publicUrl } }"
)
MIB = 1024 * 1024


@dataclasses.dataclass
class Site:
    caravan: Caravan
    session_id: str
    url: str
    """The web app's gateway URL as the session shows it."""

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[1].rstrip("/")

    def gateway(self, path: str) -> str:
        return f"http://127.0.0.1:{self.caravan.settings.public_port}{path}"

    async def get(self, path: str, token: str | None, **kwargs: Any) -> httpx2.Response:
        headers = {"Host": self.host, **({"Authorization": f"Bearer {token}"} if token else {})}
        headers.update(kwargs.pop("headers", {}))
        return await self.caravan.http.get(self.gateway(path), headers=headers, **kwargs)


async def _running(caravan: Caravan, token: str, **fields: Any) -> str:
    """A new INTERACTIVE session with ``fields``, once RUNNING: its id."""
    session = {"name": "app-" + uuid.uuid4().hex[:8], "type": "INTERACTIVE", **fields}
    data = await caravan.gql(CREATE, {"input": session}, token=token)
    session_id: str = data["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING")
    return session_id


async def _site(caravan: Caravan, token: str, apps: list[dict[str, Any]]) -> Site:
    session_id = await _running(caravan, token, driver="EXEC", startupCommand=SITE, apps=apps)
    shown = await caravan.gql(f'query {{ session(id: "{session_id}") {{ {APP_FIELDS} }} }}', token=token)
    web = next(a for a in shown["session"]["apps"] if a["name"] == "web")
    site = Site(caravan, session_id, web["url"])
    for _ in range(100):  # httpd starts after the kernel does, and after the 50 MiB file is written
        # a cheap page: a big one may outlast a test's short upstream timeout on a busy machine (the proxy then
        # cuts the answer it had begun, a broken read here rather than a status)
        if (await site.get("/index.html", token)).status_code == 200:
            return site
        await asyncio.sleep(0.2)
    raise AssertionError("httpd never answered through the gateway")


async def _refused(site: Site, token: str | None, status: int = 401, **kwargs: Any) -> None:
    """The next requests are answered ``status`` (a refusal, or 200 once a change lets them pass) once the control
    plane pushed a change to HAProxy (its maps are edited within milliseconds of the Redis write; bench/app_proxy
    measures it): wait for it, at most :data:`CHANGE_BOUND` seconds, the bound the product promises (revocations
    within 1 s), widened for a busy machine."""
    deadline = asyncio.get_running_loop().time() + CHANGE_BOUND
    while (answer := await site.get("/", token, **kwargs)).status_code != status:
        assert asyncio.get_running_loop().time() < deadline, (answer.status_code, answer.text[:200])
        await asyncio.sleep(0.02)


CHANGE_BOUND = 5.0


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    """Every app test through the stack's data plane: a HAProxy of the test's own in front of the gateway."""
    async with caravan_behind_haproxy(settings) as (running, _):
        yield running


@pytest.fixture
async def alice(caravan: Caravan) -> str:
    return await caravan.user("alice")


WEB = [{"name": "web", "port": 8080}, {"name": "nothing", "port": 9}]


async def test_http_through_the_proxy(caravan: Caravan, alice: str) -> None:
    site = await _site(caravan, alice, WEB)
    assert site.url == (
        f"http://web--{site.session_id}.{caravan.settings.gateway.apps_domain}:{caravan.settings.public_port}/"
    )
    page = await site.get("/", alice)
    assert page.status_code == 200 and page.text == "hello\n"

    # what the app sees: forwarded headers, never the gateway's credentials, its own cookies kept
    env = await site.get(
        "/cgi-bin/env",
        alice,
        headers={"Cookie": "mine=1; caravan_app=secret", "Connection": "close, X-Drop", "X-Drop": "1"},
    )
    seen = dict(line.split("=", 1) for line in env.text.splitlines() if "=" in line)
    assert seen["HTTP_X_FORWARDED_FOR"] == "127.0.0.1"
    assert seen["HTTP_X_FORWARDED_PROTO"] == "http"
    assert seen["HTTP_X_FORWARDED_HOST"] == site.host
    assert seen["HTTP_COOKIE"] == "mine=1"
    assert "HTTP_AUTHORIZATION" not in seen and "HTTP_X_DROP" not in seen
    assert alice not in env.text

    # bodies both ways, 50 MiB, byte-exact, streamed (never whole in the gateway's memory)
    payload = os.urandom(50 * MIB)
    upload = await caravan.http.post(
        site.gateway("/cgi-bin/sum"), content=payload, headers={"Host": site.host, "Authorization": f"Bearer {alice}"}
    )
    assert upload.status_code == 200
    assert upload.text.split()[0] == hashlib.sha256(payload).hexdigest()
    expected = (await site.get("/cgi-bin/bigsum", alice)).text.split()[0]
    digest, size = hashlib.sha256(), 0
    async with caravan.http.stream(
        "GET", site.gateway("/big"), headers={"Host": site.host, "Authorization": f"Bearer {alice}"}
    ) as download:
        async for chunk in download.aiter_raw():
            digest.update(chunk)
            size += len(chunk)
    assert (size, digest.hexdigest()) == (50 * MIB, expected)

    # SSE: the first event arrives while the stream is still open (the second waits for /cgi-bin/go)
    async with caravan.http.stream(
        "GET", site.gateway("/cgi-bin/sse"), headers={"Host": site.host, "Authorization": f"Bearer {alice}"}
    ) as events:
        lines = events.aiter_lines()
        assert await anext(lines) == "data: one"
        assert (await site.get("/cgi-bin/go", alice)).text == "ok"
        rest = [line async for line in lines]
    assert "data: two" in rest

    # nobody listens on the "nothing" app's port: 502 with a JSON body
    refused = await site.get("/", alice, headers={"Host": site.host.replace("web--", "nothing--")})
    assert refused.status_code == 502 and refused.json()["error"]["code"] == "UPSTREAM_UNREACHABLE"


async def test_who_may_pass(caravan: Caravan, alice: str) -> None:
    site = await _site(caravan, alice, WEB)
    bob = await caravan.user("bob")
    admin_elsewhere = await caravan.user("carol", Role.ADMIN, projects=("other",))
    assert (await site.get("/", None)).status_code == 401  # no credentials: the session is not revealed either
    assert (await site.get("/", "not-a-token")).status_code == 401
    for token in (bob, admin_elsewhere):  # another user, an admin of another project: not found
        refused = await site.get("/", token)
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "NOT_FOUND")
    assert (await site.get("/", "test-admin-token")).status_code == 200  # a SUPERADMIN
    unknown = site.host.replace(site.session_id, str(uuid.uuid4()))
    assert (await site.get("/", alice, headers={"Host": unknown})).status_code == 404
    assert (await site.get("/", alice, headers={"Host": site.host.replace("web--", "nope--")})).status_code == 404

    # the owner makes the app public, and private again
    with pytest.raises(AssertionError):  # bob cannot: NOT_FOUND
        await caravan.gql(SET_PUBLIC, {"s": site.session_id, "a": "web", "p": True}, token=bob)
    public = await caravan.gql(SET_PUBLIC, {"s": site.session_id, "a": "web", "p": True}, token=alice)
    assert public["setAppPublic"]["publicUrl"] == site.url
    assert (await site.get("/", None)).text == "hello\n"
    await caravan.gql(SET_PUBLIC, {"s": site.session_id, "a": "web", "p": False}, token=alice)
    await _refused(site, None)

    # a deactivated user's token is refused (at the next request once HAProxy has it; a kept-alive connection too)
    assert (await site.get("/", alice)).status_code == 200
    await caravan.users.deactivate("alice")
    await _refused(site, alice)


async def test_browser_launch_flow(caravan: Caravan, alice: str) -> None:
    site = await _site(caravan, alice, [{"name": "web", "port": 8080}, {"name": "other", "port": 8080 + 1}])
    launch = (await caravan.gql(LAUNCH, {"s": site.session_id, "a": "web"}, token=alice))["launchApp"]
    assert launch["url"].startswith(site.url + ".caravan/launch?code=") and alice not in launch["url"]
    path = launch["url"].split(site.host, 1)[1]
    exchanged = await site.get(path, None)
    assert exchanged.status_code == 303 and exchanged.headers["location"] == "/"
    set_cookie = exchanged.headers["set-cookie"]
    attributes = [a.strip().lower() for a in set_cookie.split(";")]
    assert "httponly" in attributes and "samesite=lax" in attributes and "path=/" in attributes
    assert not any(a.startswith("domain") for a in attributes)  # host-only: this app's origin alone
    cookie = set_cookie.split(";", 1)[0]
    assert (await site.get(path, None)).status_code == 404  # single use

    with_cookie = await site.get("/", None, headers={"Cookie": cookie})
    assert with_cookie.text == "hello\n"
    # the cookie is not accepted by another app of the same session, nor by the GraphQL endpoint
    other = await site.get("/", None, headers={"Cookie": cookie, "Host": site.host.replace("web--", "other--")})
    assert other.status_code == 401
    graphql = await caravan.http.post(
        caravan.url, json={"query": "query Me { viewer { id } }"}, headers={"Cookie": cookie}
    )
    assert graphql.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    # cookies tossed in from another origin under the same name do not shadow the real one, however many, before or
    # after it, another app's own valid cookie among them
    other_launch = (await caravan.gql(LAUNCH, {"s": site.session_id, "a": "other"}, token=alice))["launchApp"]
    other_host = site.host.replace("web--", "other--")
    other_exchange = await site.get(other_launch["url"].split(other_host, 1)[1], None, headers={"Host": other_host})
    other_cookie = other_exchange.headers["set-cookie"].split(";", 1)[0]
    decoys = [f"caravan_app={secrets.token_urlsafe(32)}" for _ in range(8)] + [other_cookie]
    for jar in ([*decoys, cookie], [cookie, *decoys], [other_cookie, cookie, *decoys[:3]]):
        tossed = await site.get("/", None, headers={"Cookie": "; ".join(jar)})
        assert tossed.status_code == 200, jar

    await caravan.users.deactivate("alice")  # the cookie stands for the token: refused with it
    await _refused(site, None, headers={"Cookie": cookie})


async def test_the_cookie_counts_only_from_the_apps_own_origin(caravan: Caravan, alice: str) -> None:
    """The browser's headers as Chromium sends them (tests/ui/test_app_origins_ui.py runs the browser itself)."""
    site = await _site(caravan, alice, WEB)
    launch = (await caravan.gql(LAUNCH, {"s": site.session_id, "a": "web"}, token=alice))["launchApp"]
    exchanged = await site.get(launch["url"].split(site.host, 1)[1], None)
    # every request on the client's kept-alive connections (HAProxy no longer gives up on a busy app's connect:
    # tests/gateway/test_ingress.py, test_a_busy_app_is_waited_for_on_a_kept_alive_connection)
    cookie = {"Cookie": exchanged.headers["set-cookie"].split(";", 1)[0]}
    own = {"Origin": f"http://{site.host}"}
    other = {"Origin": "http://" + site.host.replace(site.session_id, str(uuid.uuid4()))}
    subresource = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    navigation = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}

    async def post(headers: dict[str, str], token: str | None = None) -> httpx2.Response:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        return await caravan.http.post(
            site.gateway("/cgi-bin/sum"), content=b"x", headers={"Host": site.host, **auth, **headers}
        )

    for refused in (
        await site.get("/", None, headers={**cookie, **other}),
        await site.get("/", None, headers={**cookie, **subresource}),
        await post({**cookie, **other}),
        await post({**cookie, **other, **navigation, "Sec-Fetch-Site": "same-site"}),  # a form POST
        await post(cookie),  # a browser always says where a POST comes from
    ):
        assert refused.status_code == 403
        assert refused.json() == {"error": {"code": "CROSS_ORIGIN", "message": refused.json()["error"]["message"]}}
    for passed in (
        await site.get("/", None, headers=cookie),
        await site.get("/", None, headers={**cookie, **navigation}),  # a link to the app, from anywhere
        await site.get("/", None, headers={**cookie, **subresource, "Sec-Fetch-Site": "same-origin"}),
        await post({**cookie, **own}),
        await post({**cookie, **own, "Sec-Fetch-Site": "same-origin"}),
        await post(other, token=alice),  # a bearer token is not sent by a browser on its own: no origin check
    ):
        assert passed.status_code == 200, passed.text

    # a public app passes such a request as it passes anyone's, without the cookie's user
    await caravan.gql(SET_PUBLIC, {"s": site.session_id, "a": "web", "p": True}, token=alice)
    await _refused(site, None, status=200, headers={**cookie, **subresource})  # once HAProxy has the change
    assert (await site.get("/", None, headers={**cookie, **subresource})).text == "hello\n"


async def test_a_silent_app_is_504(settings: Settings) -> None:
    quick = dataclasses.replace(settings, gateway=dataclasses.replace(settings.gateway, app_upstream_timeout=1.0))
    async with caravan_behind_haproxy(quick) as (caravan, _):
        token = await caravan.user("alice")
        site = await _site(caravan, token, WEB)
        silent = await site.get("/cgi-bin/slow", token)
        assert (silent.status_code, silent.json()["error"]["code"]) == (504, "UPSTREAM_TIMEOUT")


ECHO = """
import asyncio, os, sys
from websockets.asyncio.server import serve
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with serve(echo, "127.0.0.1", int(os.environ["NOMAD_PORT_p8765"])):
        await asyncio.Future()
asyncio.run(main())
"""


@pytest.fixture
async def echo_site(caravan: Caravan) -> AsyncIterator[tuple[Caravan, str, str]]:
    """A raw_exec kernel (SUPERADMIN only; host network: it listens on the Nomad host port itself) running the
    WebSocket echo server this test ships, with this interpreter."""
    command = f"exec {sys.executable} -c '{ECHO}'"
    apps = [{"name": "echo", "port": 8765, "protocol": "WEBSOCKET"}]
    session_id = await _running(caravan, "test-admin-token", driver="RAW_EXEC", startupCommand=command, apps=apps)
    yield caravan, session_id, f"echo--{session_id}.{caravan.settings.gateway.apps_domain}"


def _connect(caravan: Caravan, host: str, token: str) -> connect:
    """A WebSocket to the app ``host`` (its URL's host), connected to the gateway on 127.0.0.1."""
    port = caravan.settings.public_port
    return connect(
        f"ws://{host}:{port}/", host="127.0.0.1", port=port, additional_headers={"Authorization": f"Bearer {token}"}
    )


async def _open(caravan: Caravan, host: str, token: str) -> websockets.asyncio.client.ClientConnection:
    for _ in range(100):
        try:
            return await _connect(caravan, host, token)
        except websockets.exceptions.InvalidStatus as exc:
            if exc.response.status_code != 502:
                raise
            await asyncio.sleep(0.2)  # the server starts after the kernel does
    raise AssertionError("the echo server never answered")


async def test_websocket_echo_and_revocation(echo_site: tuple[Caravan, str, str]) -> None:
    caravan, session_id, host = echo_site
    await caravan.user("dave")
    dave = await caravan.users.issue_token("dave")
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        await _connect(caravan, host, dave)
    assert refused.value.response.status_code == 404

    await caravan.user("eve", Role.SUPERADMIN)
    eve = await caravan.users.issue_token("eve")
    ws = await _open(caravan, host, eve)
    binary = bytes(range(256)) * 1000
    for message in ("hello", binary, "é\x00\u2028"):
        await ws.send(message)
        assert await ws.recv() == message
    # an open WebSocket is an open connection to the idle checker (HAProxy's counters, sampled by the control plane)
    deadline = asyncio.get_running_loop().time() + 30
    while (await read_activity(caravan.store.redis, caravan.store.keys, [session_id], utcnow()))[
        session_id
    ].open_connections != 1:
        assert asyncio.get_running_loop().time() < deadline, "the open WebSocket never counted as a connection"
        await asyncio.sleep(0.2)

    await caravan.users.deactivate("eve")  # HAProxy cuts the connection (it sends no close frame of its own)
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 30)


async def test_a_websocket_with_the_cookie_only_from_the_apps_origin(echo_site: tuple[Caravan, str, str]) -> None:
    caravan, session_id, host = echo_site
    await _open(caravan, host, "test-admin-token")  # the echo server answers
    port = caravan.settings.public_port
    launch = (await caravan.gql(LAUNCH, {"s": session_id, "a": "echo"}))["launchApp"]
    path = launch["url"].split(f"{host}:{port}", 1)[1]
    exchanged = await caravan.http.get(f"http://127.0.0.1:{port}{path}", headers={"Host": f"{host}:{port}"})
    cookie = exchanged.headers["set-cookie"].split(";", 1)[0]

    def browser(origin: str, site: str) -> connect:
        headers = {"Cookie": cookie, "Sec-Fetch-Site": site, "Sec-Fetch-Mode": "websocket"}
        return connect(
            f"ws://{host}:{port}/", host="127.0.0.1", port=port, origin=Origin(origin), additional_headers=headers
        )

    for origin, site in (
        (f"http://bob--{uuid.uuid4()}.{caravan.settings.gateway.apps_domain}:{port}", "same-site"),
        ("null", "cross-site"),
    ):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            await browser(origin, site)
        assert refused.value.response.status_code == 403
        assert json.loads(refused.value.response.body)["error"]["code"] == "CROSS_ORIGIN"
    async with browser(f"http://{host}:{port}", "same-origin") as own:
        await own.send("mine")
        assert await own.recv() == "mine"


HELLO = "mkdir -p /tmp/w && echo hello > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w"


async def test_app_traffic_keeps_a_session_from_network_idleness(caravan: Caravan, tmp_path: Path) -> None:
    token = await caravan.user("alice")
    used, unused = [
        Site(caravan, sid, f"http://web--{sid}.{caravan.settings.gateway.apps_domain}:{caravan.settings.public_port}/")
        for sid in [await _running(caravan, token, driver="EXEC", startupCommand=HELLO, apps=WEB) for _ in range(2)]
    ]

    async def browse() -> None:  # a user at work in the used app, twice a second, through the proxy only
        while True:
            await used.get("/", token)
            await asyncio.sleep(0.5)

    path = policy_file(tmp_path, 'check_interval = "1s"\ndefaults {\n  network_idle_timeout = "4s"\n}\n')
    task = asyncio.create_task(browse())
    try:
        async with running_idle(caravan.settings, path) as service:
            ended = await caravan.wait_for(unused.session_id, "TERMINATED", "ERROR", timeout=60)
            assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "idle-timeout")
            await swept_since(service.idle_store, used.session_id, utcnow())  # judged since, and kept
            found = await caravan.store.get(used.session_id)
            assert found is not None and found.status is SessionStatus.RUNNING
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.docker
async def test_an_app_in_a_docker_kernel(caravan: Caravan, alice: str) -> None:
    """busybox httpd in the tests' busybox image, in a docker kernel (its own network namespace): reached through the
    gateway, by its owner only."""
    fields = {"driver": "DOCKER", "image": DEFAULT_IMAGE, "startupCommand": HELLO, "apps": WEB}
    session_id = await _running(caravan, alice, **fields)
    gateway = caravan.settings.gateway
    site = Site(caravan, session_id, f"http://web--{session_id}.{gateway.apps_domain}:{caravan.settings.public_port}/")
    for _ in range(100):  # httpd starts after the container does
        page = await site.get("/", alice)
        if page.status_code == 200:
            break
        await asyncio.sleep(0.2)
    assert (page.status_code, page.text) == (200, "hello\n")
    bob = await caravan.user("bob")
    assert (await site.get("/", bob)).status_code == 404


TEMPLATE = """mutation($i: CreateSessionTemplateInput!) {
  createSessionTemplate(input: $i) { id spec { apps { name port } } } }"""
FROM_TEMPLATE = """mutation($t: ID!, $o: SessionOverridesInput!) {
  createSessionFromTemplate(templateId: $t, overrides: $o) { sessions { id apps { name url } } } }"""


async def test_a_session_from_a_template_with_an_app_answers_through_the_gateway(caravan: Caravan, alice: str) -> None:
    """The README's path: a template declares the app; a session made from it shows the app's address, which
    answers the owner's token (and nobody else's)."""
    spec = {
        "type": "INTERACTIVE",
        "driver": "EXEC",
        "startupCommand": "mkdir -p /tmp/w && echo from-template > /tmp/w/index.html && "
        "exec httpd -f -p 8080 -h /tmp/w",
        "apps": [{"name": "web", "port": 8080}],
    }
    template = await caravan.gql(TEMPLATE, {"i": {"name": "web-" + uuid.uuid4().hex[:6], "spec": spec}}, token=alice)
    assert template["createSessionTemplate"]["spec"]["apps"] == [{"name": "web", "port": 8080}]
    made = await caravan.gql(
        FROM_TEMPLATE,
        {"t": template["createSessionTemplate"]["id"], "o": {"name": "tpl-" + uuid.uuid4().hex[:6]}},
        token=alice,
    )
    [session] = made["createSessionFromTemplate"]["sessions"]
    [web] = session["apps"]
    await caravan.wait_for(session["id"], "RUNNING")
    site = Site(caravan, session["id"], web["url"])
    for _ in range(100):  # httpd starts just after the kernel does
        page = await site.get("/", alice)
        if page.status_code == 200:
            break
        await asyncio.sleep(0.2)
    assert (page.status_code, page.text) == (200, "from-template\n")
    stranger = await caravan.user("stranger-" + uuid.uuid4().hex[:6])
    assert (await site.get("/", stranger)).status_code == 404
