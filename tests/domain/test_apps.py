"""Session apps (domain/apps.py): pure."""

from __future__ import annotations

import uuid

import pytest

from core.errors import InvalidInput
from domain.apps import (
    App,
    AppProtocol,
    app_host,
    checked_apps,
    cookie_may_pass,
    grant_preferred_ports,
    parse_app_host,
    published_port,
    session_apps,
)

SID = str(uuid.UUID(int=7))


@pytest.mark.parametrize(
    ("apps", "field"),
    [
        ([App("Web", 80)], "apps[0].name"),
        ([App("a--b", 80)], "apps[0].name"),
        ([App("web-", 80)], "apps[0].name"),
        ([App("x" * 26, 80)], "apps[0].name"),
        ([App("web", 0)], "apps[0].port"),
        ([App("web", 65536)], "apps[0].port"),
        ([App("web", 80), App("web", 81)], "apps[1].name"),
        ([App("web", 80), App("api", 80)], "apps[1].port"),
        ([App(f"a{i}", 1000 + i) for i in range(17)], "apps"),
    ],
)
def test_bad_apps_name_their_field(apps: list[App], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        checked_apps(apps)
    assert refused.value.field == field


def test_preopened_ports_are_apps_unless_declared() -> None:
    declared = (App("web", 8080), App("raw", 9000, AppProtocol.TCP))
    assert session_apps(declared, (8080, 8888)) == (*declared, App("p8888", 8888))


def test_hosts_round_trip_and_foreign_hosts_are_not_apps() -> None:
    host = app_host("web", SID, "apps.localhost")
    assert parse_app_host(host + ":8420", "apps.localhost") == ("web", SID)
    assert parse_app_host(host.upper(), "apps.localhost") == ("web", SID)
    for other in (
        "localhost:8420",
        "127.0.0.1",
        f"web--{SID}.apps.evil",
        "web--nope.apps.localhost",
        f"{SID}.apps.localhost",
    ):
        assert parse_app_host(other, "apps.localhost") is None


def test_published_port() -> None:
    ports = ("8080=127.0.0.1:23456", "9000=10.0.0.5:31000")
    assert published_port(ports, 8080) == ("127.0.0.1", 23456)
    assert published_port(ports, 9000) == ("10.0.0.5", 31000)
    assert published_port(ports, 80) is None


HOST = f"web--{SID}.apps.localhost:8420"
OWN = f"http://{HOST}"
OTHER = f"http://bob--{SID}.apps.localhost:8420"
# (method, websocket, Origin, Sec-Fetch-Site, Sec-Fetch-Mode, Sec-Fetch-Dest) -> may the app's cookie count
ORIGIN_RULE = [
    # the app's own pages: subresources, fetch, forms, WebSockets
    (("GET", False, None, "same-origin", "no-cors", "image"), True),
    (("POST", False, OWN, "same-origin", "cors", "empty"), True),
    (("POST", False, "null", "same-origin", "navigate", "iframe"), True),  # a no-referrer page's form
    (("GET", True, OWN, "same-origin", "websocket", "websocket"), True),
    (("GET", True, OWN.upper(), None, None, None), True),
    (("GET", False, f"https://{HOST}", "same-origin", "cors", "empty"), True),  # TLS ended by an ingress
    # typed, bookmarked, or a link or redirect to the app from anywhere: a top-level GET navigation
    (("GET", False, None, "none", "navigate", "document"), True),
    (("GET", False, None, "cross-site", "navigate", "document"), True),
    (("GET", False, None, "same-site", "navigate", "document"), True),
    # another app's page (same site): WebSockets, POSTs, subresources, frames
    (("GET", True, OTHER, "same-site", "websocket", "websocket"), False),
    (("GET", True, OTHER, None, None, None), False),
    (("POST", False, OTHER, "same-site", "navigate", "document"), False),  # a form POST
    (("POST", False, OTHER, "same-site", "no-cors", "empty"), False),
    (("POST", False, "null", "same-site", "navigate", "iframe"), False),
    (("GET", False, OTHER, "same-site", "cors", "empty"), False),
    (("GET", False, None, "same-site", "no-cors", "image"), False),
    (("GET", False, None, "same-site", "no-cors", "script"), False),
    (("GET", False, None, "cross-site", "no-cors", "empty"), False),
    (("GET", False, None, "same-site", "navigate", "iframe"), False),
    (("HEAD", False, None, "same-site", "navigate", "document"), False),
    (("GET", False, f"http://web--{SID}.apps.localhost:8421", None, None, None), False),  # another port
    (("GET", False, f"http://{HOST}.evil", None, None, None), False),
    (("GET", False, "javascript:", None, None, None), False),
    # no Sec-Fetch-* (older browsers, plain http elsewhere): what a browser always marks with Origin must have it
    (("POST", False, None, None, None, None), False),
    (("POST", False, "null", None, None, None), False),
    (("GET", True, None, None, None, None), False),
    (("POST", False, OWN, None, None, None), True),
    (("GET", False, None, None, None, None), True),
]


@pytest.mark.parametrize(("request_", "passes"), ORIGIN_RULE)
def test_the_apps_cookie_counts_only_from_the_apps_own_origin(
    request_: tuple[str, bool, str | None, str | None, str | None, str | None], passes: bool
) -> None:
    method, websocket, origin, site, mode, dest = request_
    judged = cookie_may_pass(
        host=HOST,
        method=method,
        websocket=websocket,
        origin=origin,
        fetch_site=site,
        fetch_mode=mode,
        fetch_dest=dest,
    )
    assert judged is passes


def test_a_preferred_port_is_granted_unless_held_on_the_node() -> None:
    apps = [App("db", 5432, AppProtocol.TCP, preferred_port=25432), App("web", 8080), App("ssh", 22, preferred_port=2)]
    assert grant_preferred_ports(apps, set()) == ({5432: 25432, 22: 2}, ())
    assert grant_preferred_ports(apps, {25432}) == ({22: 2}, ("db",))
