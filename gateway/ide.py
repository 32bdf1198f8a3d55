"""GraphiQL served by the gateway itself: the page at /graphql (for a browser) and its assets at /graphiql/<name>.

Strawberry's GraphiQL page loads React and GraphiQL from a public CDN, so with no internet (this machine, many
clusters) it stays blank. The same page is rendered here with every asset served by the gateway, from the npm
packages ``ops/install`` installs (``npm ci``) into ``gateway/ide_assets/node_modules``, pinned by the lockfile next to
``package.json``. Only the files listed in :data:`ASSETS` are served, each with its media type.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

PACKAGES = Path(__file__).resolve().parent / "ide_assets" / "node_modules"
"""Where ``ops/install`` puts the npm packages (``gateway/ide_assets/package-lock.json``)."""
PREFIX = "/graphiql/"
"""Where the assets are served."""
JS, CSS = "text/javascript; charset=utf-8", "text/css; charset=utf-8"

ASSETS: dict[str, tuple[str, str]] = {
    "react.production.min.js": ("react/umd/react.production.min.js", JS),
    "react-dom.production.min.js": ("react-dom/umd/react-dom.production.min.js", JS),
    "graphiql.min.js": ("graphiql/graphiql.min.js", JS),
    "graphiql.min.css": ("graphiql/graphiql.min.css", CSS),
    "plugin-explorer.umd.js": ("@graphiql/plugin-explorer/dist/index.umd.js", JS),
    "plugin-explorer.css": ("@graphiql/plugin-explorer/dist/style.css", CSS),
}
"""Served name -> (its file under :data:`PACKAGES`, its media type)."""


def installed() -> bool:
    return all((PACKAGES / path).is_file() for path, _ in ASSETS.values())


async def asset(request: Request) -> Response:
    """``GET /graphiql/<name>``: one of :data:`ASSETS` (404 for any other name, 503 when they are not installed)."""
    name = request.path_params["name"]
    if name not in ASSETS:
        return _refusal(404, f"no GraphiQL asset {name[:80]!r}", "NOT_FOUND")
    path, media_type = ASSETS[name]
    if not (PACKAGES / path).is_file():
        return _refusal(503, NOT_INSTALLED, "UNAVAILABLE")
    return FileResponse(PACKAGES / path, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})


def page() -> str:
    """The GraphiQL page, its scripts and styles from :data:`PREFIX`; a page that says why when they are missing."""
    return PAGE.replace("{{PREFIX}}", PREFIX) if installed() else MISSING_PAGE


def _refusal(status: int, message: str, code: str) -> Response:
    return JSONResponse({"errors": [{"message": message, "extensions": {"code": code}}]}, status_code=status)


NOT_INSTALLED = (
    "GraphiQL's assets are not installed on this gateway: run ops/install (npm ci in gateway/ide_assets); "
    "the GraphQL API itself works without them"
)

MISSING_PAGE = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Caravan GraphiQL</title></head>
<body><p>{NOT_INSTALLED}.</p></body></html>
"""

PAGE = """<!doctype html>
<html>
  <head>
    <meta charset="utf-8" />
    <title>Caravan GraphiQL</title>
    <link rel="icon" href="data:," />
    <style>
      body { height: 100%; margin: 0; width: 100%; overflow: hidden; }
      #graphiql { height: 100vh; display: flex; }
      .graphiql-explorer-actions select { margin-left: 4px; }
    </style>
    <script src="{{PREFIX}}react.production.min.js"></script>
    <script src="{{PREFIX}}react-dom.production.min.js"></script>
    <link rel="stylesheet" href="{{PREFIX}}graphiql.min.css" />
    <link rel="stylesheet" href="{{PREFIX}}plugin-explorer.css" />
  </head>
  <body>
    <div id="graphiql" class="graphiql-container">Loading...</div>
    <script src="{{PREFIX}}graphiql.min.js"></script>
    <script src="{{PREFIX}}plugin-explorer.umd.js"></script>
    <script>
      const EXAMPLE_QUERY = `# Caravan's GraphQL API. Put your token in the headers below:
#   {"Authorization": "Bearer <token>"}
# then run (Ctrl-Enter):
{ viewer { id name role projects } }
`;
      const parameters = {};
      for (const entry of window.location.search.slice(1).split("&")) {
        const eq = entry.indexOf("=");
        if (eq >= 0) {
          parameters[decodeURIComponent(entry.slice(0, eq))] = decodeURIComponent(entry.slice(eq + 1));
        }
      }
      function updateURL(data) {
        Object.assign(parameters, data);
        const search = Object.keys(parameters)
          .filter((key) => Boolean(parameters[key]))
          .map((key) => encodeURIComponent(key) + "=" + encodeURIComponent(parameters[key]))
          .join("&");
        history.replaceState(null, null, "?" + search);
      }
      const fetchURL = window.location.href.split("?")[0];
      const subscriptionUrl = (() => {
        const url = new URL(fetchURL);
        url.protocol = url.protocol === "http:" ? "ws:" : "wss:";
        url.hash = "";
        return url.toString();
      })();
      const fetcher = GraphiQL.createFetcher({ url: fetchURL, subscriptionUrl });

      function CaravanGraphiQL() {
        const [query, setQuery] = React.useState(parameters.q || EXAMPLE_QUERY);
        const [variables, setVariables] = React.useState(parameters.variables);
        const [headers, setHeaders] = React.useState(parameters.headers);
        return React.createElement(GraphiQL, {
          fetcher,
          defaultEditorToolsVisibility: true,
          plugins: [GraphiQLPluginExplorer.explorerPlugin()],
          query,
          variables,
          headers,
          onEditQuery: (q) => { setQuery(q); updateURL({ q }); },
          onEditVariables: (v) => { setVariables(v); updateURL({ variables: v }); },
          onEditHeaders: setHeaders,
          inputValueDeprecation: true,
          isHeadersEditorEnabled: true,
          shouldPersistHeaders: true,
        });
      }
      ReactDOM.createRoot(document.getElementById("graphiql")).render(React.createElement(CaravanGraphiQL));
    </script>
  </body>
</html>
"""
