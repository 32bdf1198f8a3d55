"""GraphiQL works without internet: the page a browser gets at /graphql references only the gateway's own URLs, and the
gateway serves each of them with its media type (and, when Chromium is installed, the page renders GraphiQL in it)."""

from __future__ import annotations

import asyncio
import shutil
from html.parser import HTMLParser

import pytest

from gateway import ide
from tests.harness import Caravan

BROWSER = {"accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


class References(HTMLParser):
    """Every URL a page makes the browser load: scripts' src, links' href, images' src."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "img": "src", "iframe": "src"}.get(tag)
        self.found += [value for name, value in attrs if name == wanted and value]


async def test_the_page_loads_everything_from_the_gateway_itself(caravan: Caravan) -> None:
    assert ide.installed(), "ops/install installs GraphiQL's node modules"
    page = await caravan.http.get(caravan.url, headers=BROWSER)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text  # no CDN, no other host at all
    parser = References()
    parser.feed(page.text)
    scripts_and_styles = [url for url in parser.found if not url.startswith("data:")]
    assert len(scripts_and_styles) == len(ide.ASSETS)
    base = caravan.url.removesuffix("/graphql")
    for url in scripts_and_styles:
        assert url.startswith(ide.PREFIX), url
        asset = await caravan.http.get(base + url)
        path, _ = ide.ASSETS[url.removeprefix(ide.PREFIX)]
        expected = "text/javascript" if url.endswith(".js") else "text/css"
        assert (asset.status_code, asset.headers["content-type"]) == (200, f"{expected}; charset=utf-8"), url
        assert asset.content == (ide.PACKAGES / path).read_bytes()


async def test_only_the_listed_assets_are_served(caravan: Caravan) -> None:
    base = caravan.url.removesuffix("/graphql")
    for name in ("package.json", "..%2Fpackage-lock.json", "react/umd/react.development.js", "graphiql.js"):
        refused = await caravan.http.get(f"{base}/graphiql/{name}")
        assert refused.status_code == 404, name
        assert refused.json()["errors"][0]["extensions"] == {"code": "NOT_FOUND"}


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed (apt package chromium)")
async def test_graphiql_renders_in_a_headless_browser(caravan: Caravan) -> None:
    browser = await asyncio.create_subprocess_exec(
        "chromium",
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--virtual-time-budget=15000",
        "--dump-dom",
        caravan.url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    dom, _ = await asyncio.wait_for(browser.communicate(), 120)
    rendered = dom.decode()
    assert "graphiql-editor" in rendered and "graphiql-execute-button" in rendered, rendered[-2000:]
    assert "viewer { id name role projects }" in rendered  # the example query is in the editor
