"""The web UI, served by the gateway itself: the page at ``/ui/`` (and every path below it, which the UI routes in
the browser), its hashed assets at ``/ui/assets/<name>``; ``/`` redirects to it.

The UI is built from ``web/`` (Vite + Preact, npm packages pinned by ``web/package-lock.json``) into ``web/dist`` by
``ops/build-web``, which ``ops/install`` and ``ops/test`` run (cached on the lockfile and the sources' hash). Nothing
comes from a CDN. Assets carry a content hash in their name, so they are cached for a year (``immutable``); the page
itself is never cached, so a new build is picked up at the next load. Each text asset has a gzip copy made at build
time (``<name>.gz``), sent to browsers that accept gzip. The UI speaks only the public API (``/graphql``, its
WebSocket, the terminal WebSocket and the apps' origins), so a script can do everything it shows.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response

DIST = Path(__file__).resolve().parent.parent / "web" / "dist"
"""Where ``ops/build-web`` puts the built UI."""
PREFIX = "/ui"
"""Where the UI is served."""
ASSET_MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".woff2": "font/woff2",
    ".png": "image/png",
}
"""The asset types the build makes, by suffix; other names are not served."""
IMMUTABLE = "public, max-age=31536000, immutable"
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    # scripts and styles only from this origin (xterm.js sets inline styles); no framing
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # a window this page opens (an app, on another origin) gets no handle back to it, nor it to that window
    "Cross-Origin-Opener-Policy": "same-origin",
}
NOT_BUILT = (
    "the web UI is not built on this gateway: run ops/build-web (ops/install does); the GraphQL API at /graphql "
    "works without it"
)


def built() -> bool:
    return (DIST / "index.html").is_file()


async def root(request: Request) -> Response:
    """``GET /``: to the UI."""
    return RedirectResponse(PREFIX + "/", status_code=307)


async def page(request: Request) -> Response:
    """``GET /ui/`` and every path below it but the assets: the UI's page (the browser routes the path)."""
    if not built():
        return JSONResponse({"error": {"code": "UNAVAILABLE", "message": NOT_BUILT}}, status_code=503)
    return HTMLResponse((DIST / "index.html").read_text(encoding="utf-8"), headers=PAGE_HEADERS)


async def asset(request: Request) -> Response:
    """``GET /ui/assets/<name>``: one built asset, gzip-encoded when the browser accepts it; 404 for anything else."""
    name: str = request.path_params["name"]
    path = DIST / "assets" / name
    media_type = ASSET_MEDIA_TYPES.get(Path(name).suffix)
    if "/" in name or name.startswith(".") or media_type is None or not path.is_file():
        return JSONResponse({"error": {"code": "NOT_FOUND", "message": f"no UI asset {name[:80]!r}"}}, status_code=404)
    headers = {"Cache-Control": IMMUTABLE, "Vary": "Accept-Encoding", "X-Content-Type-Options": "nosniff"}
    compressed = path.with_name(name + ".gz")
    if "gzip" in request.headers.get("accept-encoding", "") and compressed.is_file():
        return FileResponse(compressed, media_type=media_type, headers={**headers, "Content-Encoding": "gzip"})
    return FileResponse(path, media_type=media_type, headers=headers)
