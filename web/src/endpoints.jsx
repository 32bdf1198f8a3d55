// Endpoints: the viewer's live inference endpoints (INFERENCE sessions) with what HAProxy measured of each
// (requests/s, latency, in-flight, errors), its replicas and the autoscaler's last decision, its recent cold starts,
// a chart of requests/s and replicas over the last hour, and its access (public flag, endpoint tokens). Re-read
// every few seconds (the figures are samples, not events). Its own chunk (main.jsx loads it lazily).
import { useEffect, useState } from "preact/hooks";
import { gql } from "./api.js";
import { ErrorBox, Link, StatusBadge, localTime } from "./util.jsx";
import { TimeChart } from "./chart.jsx";

const LIVE = ["PENDING", "SCHEDULED", "PREPARING", "RUNNING"];
const QUERY = `query Endpoints($filter: SessionFilter) { sessions(first: 100, filter: $filter) { edges { node {
  id name status
  autoscaling { desiredReplicas currentReplicas readyReplicas lastDecisionReason lastDecisionAt panicking }
  endpoint { url public tokens { id name createdAt }
    stats { sampledAt requestsPerSecond inFlight requestsTotal errorsTotal held p50Ms p99Ms }
    coldStarts { arrivedAt startedAt routableAt firstByteAt outcome secondsToFirstByte }
    series { at requestsPerSecond replicas } } } } } }`;
const SET_PUBLIC = `mutation Public($id: ID!, $public: Boolean!) { setEndpointPublic(sessionId: $id, public: $public) { public } }`;
const ISSUE = `mutation Issue($id: ID!, $name: String!) { issueEndpointToken(sessionId: $id, name: $name) { token { id name } secret } }`;
const REVOKE = `mutation Revoke($id: ID!, $token: ID!) { revokeEndpointToken(sessionId: $id, tokenId: $token) }`;
const REFRESH_MS = 3000;
const RPS = "#3b6ea5",
  REPLICAS = "#d9822b";
const ms = (v) => (v == null ? "—" : `${v.toFixed(v < 10 ? 1 : 0)} ms`);
const since = (from, to) => (from && to ? `${((Date.parse(to) - Date.parse(from)) / 1000).toFixed(2)} s` : "—");

/** Requests/s (left axis) and routable replicas (right axis) over the series' span, as two lines. */
function Chart({ id, series }) {
  if (series.length < 2)
    return (
      <p class="empty" data-chart="empty">
        The chart starts after a few seconds of traffic samples.
      </p>
    );
  const times = series.map((p) => Date.parse(p.at));
  const maxRps = Math.max(1, ...series.map((p) => p.requestsPerSecond));
  const maxReplicas = Math.max(1, ...series.map((p) => p.replicas));
  const points = (value) => series.map((p, i) => [times[i], value(p)]);
  return (
    <TimeChart
      id={`endpoint-chart-${id}`}
      class="usage-chart endpoint-chart"
      aria-label="requests per second and replicas over time"
      data-points={series.length}
      frame={{ width: 720, height: 180, left: 40, right: 28, top: 8, bottom: 20 }}
      t0={times[0]}
      t1={times[times.length - 1]}
      labels={{
        yMax: [maxRps.toFixed(maxRps < 10 ? 1 : 0), RPS],
        yZero: "0",
        yMaxRight: [maxReplicas, REPLICAS],
        tStart: localTime(series[0].at),
        tEnd: localTime(series[series.length - 1].at),
      }}
      lines={[
        { points: points((p) => p.requestsPerSecond), max: maxRps, stroke: RPS, "data-line": "rps" },
        {
          points: points((p) => p.replicas),
          max: maxReplicas,
          stroke: REPLICAS,
          "stroke-dasharray": "4 2",
          "data-line": "replicas",
        },
      ]}
    />
  );
}

function Tokens({ session, onChange, setError }) {
  const [name, setName] = useState("");
  const [issued, setIssued] = useState(null);
  const [busy, setBusy] = useState(false);
  const act = async (fn) => {
    setBusy(true);
    try {
      await fn();
      setError(null);
      onChange();
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy(false);
    }
  };
  const issue = (e) => {
    e.preventDefault();
    act(async () => {
      const d = await gql(ISSUE, { id: session.id, name: name.trim() });
      setIssued(d.issueEndpointToken);
      setName("");
    });
  };
  const tokens = session.endpoint.tokens;
  return (
    <div class="endpoint-tokens">
      <h3>Tokens</h3>
      {tokens.length === 0 ? (
        <p class="empty">No endpoint token.</p>
      ) : (
        <ul>
          {tokens.map((t) => (
            <li key={t.id} data-token={t.name}>
              {t.name} <span class="hint">issued {localTime(t.createdAt)}</span>{" "}
              <button
                type="button"
                class="secondary"
                disabled={busy}
                data-revoke={t.name}
                onClick={() => act(() => gql(REVOKE, { id: session.id, token: t.id }))}
              >
                Revoke
              </button>
            </li>
          ))}
        </ul>
      )}
      <form onSubmit={issue} aria-label="Issue a token">
        <input
          placeholder="token name"
          value={name}
          maxLength={100}
          data-issue-name
          onInput={(e) => setName(e.currentTarget.value)}
        />
        <button type="submit" disabled={busy || !name.trim()} data-issue>
          Issue token
        </button>
      </form>
      {issued && (
        <p class="secret" data-secret>
          Secret of <b>{issued.token.name}</b> (shown this once): <code>{issued.secret}</code>
        </p>
      )}
    </div>
  );
}

function EndpointCard({ session, onChange }) {
  const [error, setError] = useState(null);
  const { endpoint, autoscaling } = session;
  const stats = endpoint.stats;
  const toggle = async () => {
    try {
      await gql(SET_PUBLIC, { id: session.id, public: !endpoint.public });
      setError(null);
      onChange();
    } catch (exc) {
      setError(exc);
    }
  };
  return (
    <article class="card endpoint" data-endpoint={session.id}>
      <h2>
        <Link to={`/sessions/${encodeURIComponent(session.id)}`}>{session.name}</Link>{" "}
        <StatusBadge status={session.status} />{" "}
        <span class="badge" data-access>
          {endpoint.public ? "public" : "private"}
        </span>{" "}
        <button type="button" class="secondary" data-toggle-public onClick={toggle}>
          {endpoint.public ? "Make private" : "Make public"}
        </button>
      </h2>
      <p>
        <code data-url>{endpoint.url}</code>
      </p>
      <ErrorBox error={error} />
      <dl class="figures">
        <div>
          <dt>Replicas (ready / desired)</dt>
          <dd data-replicas>{autoscaling ? `${autoscaling.readyReplicas} / ${autoscaling.desiredReplicas}` : "—"}</dd>
        </div>
        <div>
          <dt>Requests/s</dt>
          <dd data-rps>{stats ? stats.requestsPerSecond.toFixed(1) : "—"}</dd>
        </div>
        <div>
          <dt>Latency p50 / p99</dt>
          <dd data-latency>{stats ? `${ms(stats.p50Ms)} / ${ms(stats.p99Ms)}` : "—"}</dd>
        </div>
        <div>
          <dt>In flight</dt>
          <dd data-in-flight>{stats ? stats.inFlight + stats.held : "—"}</dd>
        </div>
        <div>
          <dt>Requests / errors</dt>
          <dd data-errors>{stats ? `${stats.requestsTotal} / ${stats.errorsTotal}` : "—"}</dd>
        </div>
      </dl>
      <p class="decision" data-decision>
        Last scaling decision:{" "}
        {autoscaling && autoscaling.lastDecisionReason ? (
          <>
            {autoscaling.lastDecisionReason}{" "}
            <span class="hint">
              ({localTime(autoscaling.lastDecisionAt)}
              {autoscaling.panicking ? ", panic mode" : ""})
            </span>
          </>
        ) : (
          "none yet"
        )}
      </p>
      <Chart id={session.id} series={endpoint.series} />
      <ul class="legend">
        <li>
          <span class="swatch" style={{ background: RPS }} />
          requests/s
        </li>
        <li>
          <span class="swatch" style={{ background: REPLICAS }} />
          replicas
        </li>
      </ul>
      <h3>Recent cold starts</h3>
      {endpoint.coldStarts.length === 0 ? (
        <p class="empty">No cold start yet.</p>
      ) : (
        <table data-cold-starts>
          <thead>
            <tr>
              <th>arrived</th>
              <th>to started</th>
              <th>to routable</th>
              <th>to first byte</th>
              <th>outcome</th>
            </tr>
          </thead>
          <tbody>
            {endpoint.coldStarts.slice(0, 5).map((c) => (
              <tr key={c.arrivedAt}>
                <td>{localTime(c.arrivedAt)}</td>
                <td>{since(c.arrivedAt, c.startedAt)}</td>
                <td>{since(c.arrivedAt, c.routableAt)}</td>
                <td>{since(c.arrivedAt, c.firstByteAt)}</td>
                <td>{c.outcome}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <Tokens session={session} onChange={onChange} setError={setError} />
    </article>
  );
}

export default function EndpointsPage() {
  const [sessions, setSessions] = useState(null);
  const [error, setError] = useState(null);
  const [turn, setTurn] = useState(0);
  useEffect(() => {
    let live = true;
    const load = () =>
      gql(QUERY, { filter: { type: "INFERENCE", statuses: LIVE } })
        .then((d) => {
          if (live) {
            setSessions(d.sessions.edges.map((e) => e.node));
            setError(null);
          }
        })
        .catch((exc) => live && setError(exc));
    load();
    const timer = setInterval(load, REFRESH_MS);
    return () => {
      live = false;
      clearInterval(timer);
    };
  }, [turn]);
  return (
    <section class="endpoints">
      <h1>Endpoints</h1>
      <ErrorBox error={error} />
      {sessions && sessions.length === 0 && (
        <p class="empty" id="endpoints-empty">
          No live endpoint. <Link to="/launch">Launch an INFERENCE session</Link>.
        </p>
      )}
      {sessions &&
        sessions
          .filter((s) => s.endpoint)
          .map((s) => <EndpointCard key={s.id} session={s} onChange={() => setTurn((t) => t + 1)} />)}
    </section>
  );
}
