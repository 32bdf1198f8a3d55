"""The web UI as the gateway serves it (gateway/web.py): the page for every UI path, never cached and locked to this
origin by its CSP; hashed assets cached for a year, gzip-encoded when the browser accepts it; nothing else under
/ui/assets; a clear 503 when the UI was not built. The UI itself, in Chromium: tests/ui/."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from gateway import web
from tests.harness import Caravan

pytestmark = pytest.mark.skipif(not web.built(), reason="the web UI is not built (ops/build-web)")


def base(caravan: Caravan) -> str:
    return caravan.url.removesuffix("/graphql")


async def test_the_root_leads_to_the_ui_and_every_ui_path_is_the_page(caravan: Caravan) -> None:
    root = await caravan.http.get(base(caravan) + "/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    index = (web.DIST / "index.html").read_text()
    for path in ("/ui", "/ui/", "/ui/sessions/abc", "/ui/admin/users", "/ui/launch"):
        page = await caravan.http.get(base(caravan) + path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), path
        assert page.text == index
        assert page.headers["cache-control"] == "no-cache"
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["cross-origin-opener-policy"] == "same-origin"  # an opened app has no handle to it
    assert "http://" not in index and "https://" not in index  # no CDN: every asset from this gateway


async def test_assets_are_immutable_and_sent_compressed_when_accepted(caravan: Caravan) -> None:
    index = (web.DIST / "index.html").read_text()
    scripts = re.findall(r'src="(/ui/assets/[^"]+\.js)"', index)
    assert scripts, index
    for url in scripts:
        plain = await caravan.http.get(base(caravan) + url, headers={"accept-encoding": "identity"})
        assert plain.status_code == 200
        assert plain.headers["content-type"] == "text/javascript; charset=utf-8"
        assert plain.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert "content-encoding" not in plain.headers
        on_disk = (web.DIST / url.removeprefix("/ui/")).read_bytes()
        assert plain.content == on_disk
        raw = await caravan.http.get(base(caravan) + url, headers={"accept-encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip" and raw.headers["vary"] == "Accept-Encoding"
        assert raw.content == on_disk  # the client decoded it: the same bytes
        assert int(raw.headers["content-length"]) < len(on_disk) / 2
        assert gzip.decompress((web.DIST / (url.removeprefix("/ui/") + ".gz")).read_bytes()) == on_disk


async def test_nothing_else_is_served_under_the_assets(caravan: Caravan) -> None:
    names = [".built-x", "..%2Findex.html", "%2E%2E/package.json", "missing-abc.js", "index.html", "a/b.js"]
    for name in names:
        refused = await caravan.http.get(f"{base(caravan)}/ui/assets/{name}")
        assert refused.status_code == 404, name
        assert refused.json()["error"]["code"] == "NOT_FOUND"


async def test_an_unbuilt_ui_is_a_clear_503(caravan: Caravan, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(web, "DIST", tmp_path)
    page = await caravan.http.get(base(caravan) + "/ui/")
    assert page.status_code == 503
    assert page.json()["error"]["code"] == "UNAVAILABLE" and "ops/build-web" in page.json()["error"]["message"]
