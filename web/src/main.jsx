// The app shell: sign-in gate, navigation shaped by the viewer's role, and the pages.
import { render } from "preact";
import { useEffect, useErrorBoundary, useState } from "preact/hooks";
import { lazy, Suspense } from "preact/compat";
import { gql, getToken, setToken, clearToken, ApiError } from "./api.js";
import { Link, navigate, usePath, ErrorBox, timeZone } from "./util.jsx";
import { SessionsPage } from "./sessions.jsx";
import { LauncherPage } from "./launcher.jsx";
import { DetailPage } from "./detail.jsx";
import { AdminPage } from "./admin.jsx";
import "./style.css";

// pages most sessions never open: chunks of their own, loaded when opened
const FoldersPage = lazy(() => import("./folders.jsx"));
const SchedulesPage = lazy(() => import("./schedules.jsx"));
const UsagePage = lazy(() => import("./usage.jsx"));
const EndpointsPage = lazy(() => import("./endpoints.jsx"));

const VIEWER = `{ viewer { id name role projects } }`;

function SignIn({ onSignedIn }) {
  const [token, setValue] = useState("");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  async function submit(e) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const data = await gql(VIEWER, {}, token.trim());
      setToken(token.trim());
      onSignedIn(data.viewer);
    } catch (exc) {
      setError(
        exc instanceof ApiError && exc.code === "UNAUTHENTICATED"
          ? new ApiError("this token is not valid (unknown, revoked or expired)", exc.code)
          : exc,
      );
    } finally {
      setBusy(false);
    }
  }
  return (
    <main class="signin">
      <h1>Caravan</h1>
      <form onSubmit={submit} aria-label="Sign in">
        <label for="token">API token</label>
        <input
          id="token"
          name="token"
          type="password"
          autocomplete="off"
          required
          value={token}
          onInput={(e) => setValue(e.currentTarget.value)}
          autofocus
        />
        <button type="submit" disabled={busy || !token.trim()}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
        <ErrorBox error={error} />
        <p class="hint">The token stays in this tab (session storage) and is sent only to this gateway.</p>
      </form>
    </main>
  );
}

/** A page that fails to render shows why (and logs it), instead of a frozen page. */
function Guarded({ children, path }) {
  const [error, reset] = useErrorBoundary((exc) => console.error("the page failed to render:", exc));
  useEffect(() => {
    if (error) reset();
  }, [path]);
  if (error) return <ErrorBox error={{ code: "UI_ERROR", message: `this page failed to render: ${error.message}` }} />;
  return children;
}

function Shell({ viewer, onSignOut }) {
  const path = usePath();
  const admin = viewer.role === "ADMIN" || viewer.role === "SUPERADMIN";
  let page;
  const detail = path.match(/^\/sessions\/([^/]+)$/);
  if (path === "/" || path === "/sessions") page = <SessionsPage viewer={viewer} />;
  else if (path === "/launch") page = <LauncherPage viewer={viewer} />;
  else if (detail && detail[1] !== "new") page = <DetailPage id={decodeURIComponent(detail[1])} viewer={viewer} />;
  else if (path === "/folders") page = <FoldersPage viewer={viewer} />;
  else if (path === "/schedules") page = <SchedulesPage viewer={viewer} />;
  else if (path === "/usage") page = <UsagePage viewer={viewer} />;
  else if (path === "/endpoints") page = <EndpointsPage viewer={viewer} />;
  else if (path.startsWith("/admin") && admin) page = <AdminPage viewer={viewer} section={path.slice(7) || "groups"} />;
  else
    page = (
      <p class="empty">
        Nothing here. <Link to="/">Back to the sessions</Link>
      </p>
    );
  const current = (p) => (path.startsWith(p) ? "page" : undefined);
  return (
    <>
      <header class="top">
        <Link to="/" class="brand">
          Caravan
        </Link>
        <nav aria-label="Main">
          <Link to="/" aria-current={path === "/" || path.startsWith("/sessions") ? "page" : undefined}>
            Sessions
          </Link>
          <Link to="/launch" aria-current={current("/launch")}>
            Launch
          </Link>
          <Link to="/folders" aria-current={current("/folders")}>
            Folders
          </Link>
          <Link to="/schedules" aria-current={current("/schedules")}>
            Schedules
          </Link>
          <Link to="/endpoints" aria-current={current("/endpoints")} id="nav-endpoints">
            Endpoints
          </Link>
          <Link to="/usage" aria-current={current("/usage")} id="nav-usage">
            Usage
          </Link>
          {admin && (
            <Link to="/admin" aria-current={current("/admin")} id="nav-admin">
              Admin
            </Link>
          )}
        </nav>
        <span class="who" title={`times in ${timeZone}`}>
          <span id="viewer-name">{viewer.name}</span> <span class="badge">{viewer.role}</span>
        </span>
        <button type="button" class="secondary" onClick={onSignOut} id="sign-out">
          Sign out
        </button>
      </header>
      <main class="content">
        <Guarded path={path}>
          <Suspense fallback={<p class="loading">Loading…</p>}>{page}</Suspense>
        </Guarded>
      </main>
    </>
  );
}

function App() {
  const [viewer, setViewer] = useState(null);
  const [state, setState] = useState(getToken() ? "checking" : "signed-out");
  const [error, setError] = useState(null);
  useEffect(() => {
    if (state !== "checking") return;
    gql(VIEWER)
      .then((d) => {
        setViewer(d.viewer);
        setState("signed-in");
      })
      .catch((exc) => {
        if (exc.code === "UNAUTHENTICATED") {
          clearToken();
          setState("signed-out");
        } else {
          setError(exc);
          setState("error");
        }
      });
  }, [state]);
  if (state === "checking") return <p class="loading">Loading…</p>;
  if (state === "error")
    return (
      <main class="signin">
        <ErrorBox error={error} />
        <button type="button" onClick={() => setState("checking")}>
          Retry
        </button>
      </main>
    );
  if (state === "signed-out" || !viewer)
    return (
      <SignIn
        onSignedIn={(v) => {
          setViewer(v);
          setState("signed-in");
        }}
      />
    );
  return (
    <Shell
      viewer={viewer}
      onSignOut={() => {
        clearToken();
        setViewer(null);
        setState("signed-out");
        navigate("/");
      }}
    />
  );
}

const root = document.getElementById("app");
root.textContent = ""; // the static "Loading…" of index.html
render(<App />, root);
