// One session: kernels, history, wait reasons, idle checks, logs, apps, terminal, and its actions.
import { useEffect, useRef, useState } from "preact/hooks";
import { lazy, Suspense } from "preact/compat";
import { gql, onReconnect, subscribe } from "./api.js";
import { navigate, useNow, localTime, duration, resources, StatusBadge, ErrorBox, TERMINAL } from "./util.jsx";
import { TimeChart } from "./chart.jsx";

const Terminal = lazy(() => import("./terminal.jsx"));

const SESSION = `query Session($id: ID!) { session(id: $id) {
  id name type status statusInfo statusDetail result exitCode createdAt startedAt terminatedAt ownerId project
  resourceGroup driver image startupCommand resources { slot amount } waitReasons queuePosition retries
  statusHistory { status at reason detail }
  kernels { role index hostname status statusInfo statusDetail agent startedAt finishedAt exitCode ports restarts }
  apps { name port protocol url public preferredPort preferredPortTaken hostPort }
  idleChecks { checkedAt terminate reason checks { name expired remaining measuredAgainst note
    utilization { metric average threshold } } } } }`;
const POLICY = `query Policy($id: ID!) { effectiveIdlePolicy(sessionId: $id) { source checkInterval maxSessionLifetime
  networkIdleTimeout exemptFrom utilization { __typename } } }`;
const IDLE = `query Idle($id: ID!) { session(id: $id) { idleChecks { checkedAt terminate reason checks { name expired remaining
  measuredAgainst note utilization { metric average threshold } } } } }`;
const UTILIZATION = `query Utilization($id: ID!, $kernel: String) { session(id: $id) { utilization(kernel: $kernel) {
  kernel kernels points { at until values { metric value unit } } thresholds { metric threshold } } } }`;
/** What each metric is called on its chart (device metrics: "<prefix>_util" busy time, "<prefix>_mem" device memory). */
const METRIC_LABELS = {
  cpu_util: "CPU (% of allocated cores)",
  mem: "Memory (% of allocated)",
  net_rx: "Network received",
  net_tx: "Network sent",
};
const metricLabel = (m) =>
  METRIC_LABELS[m] ||
  (m.endsWith("_util") ? `${m.slice(0, -5)} utilization (%)` : m.endsWith("_mem") ? `${m.slice(0, -4)} memory (%)` : m);
/** How often a RUNNING session's idle verdict is read again: the API has no event for a new verdict (the idle checker
 * writes one each sweep), so this one small read repeats; everything else on the page follows sessionEvents. */
const IDLE_REFRESH_MS = 30_000;
/** How often a RUNNING session's usage charts are read again (a point per sweep; sweeps are 15 s by default). */
const UTILIZATION_REFRESH_MS = 15_000;
const EVENTS = `subscription Events($id: ID!) { sessionEvents(sessionId: $id) { eventId status reason } }`;
const LOGS = `subscription Logs($id: ID!, $kernel: String!, $stream: LogStream!) {
  kernelLogs(sessionId: $id, kernel: $kernel, stream: $stream, tailBytes: 65536) }`;
const LAUNCH = `mutation Launch($id: ID!, $app: String!) { launchApp(sessionId: $id, app: $app) { url } }`;
const RENAME = `mutation Rename($id: ID!, $name: String!) { renameSession(id: $id, name: $name) { id name } }`;
const RESTART = `mutation Restart($id: ID!) { restartSession(id: $id) { id status } }`;
const DESTROY = `mutation Destroy($id: ID!, $forced: Boolean!) { destroySession(ids: [$id], forced: $forced) { id status } }`;

const kernelName = (k) => `${k.role}${k.index}`;

function Logs({ session }) {
  const kernels = session.kernels.map(kernelName);
  const [kernel, setKernel] = useState(kernels[0] || "main1");
  const [stream, setStream] = useState("STDOUT");
  const [following, setFollowing] = useState(true);
  const [text, setText] = useState("");
  const [state, setState] = useState("idle");
  const [error, setError] = useState(null);
  const box = useRef(null);
  useEffect(() => {
    if (!following) return;
    setText("");
    setError(null);
    setState("following");
    const stop = subscribe(
      LOGS,
      { id: session.id, kernel, stream },
      {
        onNext: (d) => setText((t) => (t + d.kernelLogs).slice(-1_000_000)),
        onError: (exc) => {
          setError(exc);
          setState("error");
        },
        onDone: () => setState("ended"),
      },
    );
    return stop;
  }, [following, kernel, stream, session.id]);
  useEffect(() => {
    if (box.current) box.current.scrollTop = box.current.scrollHeight;
  }, [text]);
  function download() {
    const url = URL.createObjectURL(new Blob([text], { type: "text/plain" }));
    const a = Object.assign(document.createElement("a"), {
      href: url,
      download: `${session.name}-${kernel}-${stream.toLowerCase()}.log`,
    });
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }
  return (
    <section aria-labelledby="logs-title" class="card">
      <h2 id="logs-title">Logs</h2>
      <div class="toolbar">
        <label>
          Kernel{" "}
          <select id="log-kernel" value={kernel} onChange={(e) => setKernel(e.currentTarget.value)}>
            {kernels.map((k) => (
              <option>{k}</option>
            ))}
          </select>
        </label>
        <label>
          Stream{" "}
          <select id="log-stream" value={stream} onChange={(e) => setStream(e.currentTarget.value)}>
            <option>STDOUT</option>
            <option>STDERR</option>
          </select>
        </label>
        <button type="button" id="log-follow" onClick={() => setFollowing(!following)}>
          {following ? "Stop" : "Follow"}
        </button>
        <button type="button" class="secondary" onClick={download} disabled={!text}>
          Download
        </button>
        <span class="muted small" aria-live="polite">
          {following ? state : "stopped"}
        </span>
      </div>
      <ErrorBox error={error} />
      <pre class="logs" id="logs" ref={box} tabindex="0" aria-label="Log output">
        {text || (state === "following" ? "(waiting for output…)" : "(no output)")}
      </pre>
    </section>
  );
}

/** Bytes per second, readable: B/s, KB/s, MB/s, GB/s (powers of 1000). */
const rate = (v) => {
  let u = 0;
  while (v >= 1000 && u < 3) {
    v /= 1000;
    u += 1;
  }
  return `${v.toFixed(v < 10 && u ? 1 : 0)} ${["B", "KB", "MB", "GB"][u]}/s`;
};

const METRIC_FRAME = { width: 360, height: 130, left: 34, right: 6, top: 8, bottom: 18 };

/** One metric of one kernel over the session's life: a line over time (older points average several sweeps), in
 * percent with the idle threshold judged for it drawn dashed across the same axes (under it the kernel counts as idle),
 * or network I/O in bytes per second on an axis of its own (no threshold: the idle policy's network check is the time
 * since the session's last traffic through the gateway). */
function MetricChart({ metric, points, threshold }) {
  const values = points.map((p) => [Date.parse(p.at), p.values.find((v) => v.metric === metric)]).filter(([, v]) => v);
  const series = values.map(([t, v]) => [t, v.value]);
  const bytes = values.some(([, v]) => v.unit === "BYTES_PER_SECOND");
  const shown = (v) => (bytes ? rate(v) : `${v.toFixed(1)}%`);
  const t0 = series.length ? series[0][0] : 0,
    t1 = series.length ? series[series.length - 1][0] : 1;
  const max = Math.max(bytes ? 1000 : 100, threshold || 0, ...series.map(([, v]) => v));
  const last = series.length ? series[series.length - 1][1] : null;
  const minutes = (t1 - t0) / 60000;
  return (
    <figure class="metric-chart" data-metric={metric} data-unit={bytes ? "BYTES_PER_SECOND" : "PERCENT"}>
      <figcaption>
        {metricLabel(metric)}
        {last != null && <span class="muted small"> now {shown(last)}</span>}
        {threshold != null && <span class="muted small"> · idle below {threshold}%</span>}
      </figcaption>
      <TimeChart
        frame={METRIC_FRAME}
        t0={t0}
        t1={t1}
        aria-label={`${metricLabel(metric)} over the session's life`}
        labels={{
          yMax: bytes ? rate(max).replace("/s", "") : max.toFixed(0),
          yZero: "0",
          tStart: minutes >= 1 ? `${minutes.toFixed(0)} min ago` : "start",
          tEnd: "now",
        }}
        lines={[{ points: series, max, class: "series", stroke: "#3b6ea5" }]}
        overlay={(y) =>
          threshold != null && (
            <line
              class="threshold"
              x1={METRIC_FRAME.left}
              x2={METRIC_FRAME.width - METRIC_FRAME.right}
              y1={y(threshold, max)}
              y2={y(threshold, max)}
              stroke="#b5485d"
              stroke-dasharray="4 3"
              data-threshold={threshold}
            >
              <title>{`idle threshold ${threshold}%`}</title>
            </line>
          )
        }
      />
    </figure>
  );
}

/** The kernels' utilization over the session's life as the idle checker sampled it, per metric, with its thresholds. */
function UsageCharts({ id, running, kernels }) {
  const [kernel, setKernel] = useState(null);
  const [series, setSeries] = useState(null);
  useEffect(() => {
    let live = true;
    const read = () =>
      gql(UTILIZATION, { id, kernel })
        .then((d) => live && setSeries(d.session.utilization))
        .catch(() => {});
    read();
    const every = running ? setInterval(read, UTILIZATION_REFRESH_MS) : null;
    return () => {
      live = false;
      if (every) clearInterval(every);
    };
  }, [id, kernel, running]);
  if (!series) return null;
  const thresholds = Object.fromEntries(series.thresholds.map((t) => [t.metric, t.threshold]));
  const metrics = [
    ...new Set([...series.points.flatMap((p) => p.values.map((v) => v.metric)), ...Object.keys(thresholds)]),
  ].sort();
  const name = (host) => {
    const k = kernels.find((k) => k.hostname === host);
    return k ? `${kernelName(k)} (${host})` : host;
  };
  return (
    <section class="card" aria-labelledby="usage-title" id="usage-charts" data-kernel={series.kernel || ""}>
      <h2 id="usage-title">Usage over time</h2>
      {series.kernels.length > 1 && (
        <label>
          Kernel{" "}
          <select id="usage-kernel" value={series.kernel} onChange={(e) => setKernel(e.currentTarget.value)}>
            {series.kernels.map((h) => (
              <option value={h}>{name(h)}</option>
            ))}
          </select>
        </label>
      )}
      {series.points.length === 0 ? (
        <p class="muted" id="usage-none">
          No samples yet: the idle checker samples every running session's usage (a point every few sweeps) and keeps
          them a day after the last.
        </p>
      ) : (
        <div class="charts">
          {metrics.map((m) => (
            <MetricChart key={m} metric={m} points={series.points} threshold={thresholds[m]} />
          ))}
        </div>
      )}
    </section>
  );
}

function IdleChecks({ idle, now }) {
  if (!idle) return <p class="muted">No idle verdict yet (the idle checker judges RUNNING sessions).</p>;
  const age = (now - Date.parse(idle.checkedAt)) / 1000;
  return (
    <table class="compact" id="idle-checks">
      <thead>
        <tr>
          <th>Check</th>
          <th>Time left</th>
          <th>Counts down to</th>
          <th>Note</th>
        </tr>
      </thead>
      <tbody>
        {idle.checks.map((c) => (
          <tr>
            <td>{c.name}</td>
            <td>{c.expired ? "expired" : c.remaining == null ? "—" : duration(c.remaining - age)}</td>
            <td>{c.measuredAgainst || "—"}</td>
            <td class="small">
              {c.note}
              {c.utilization.map(
                (u) => ` ${u.metric} ${u.average == null ? "?" : u.average.toFixed(1)}/${u.threshold}`,
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function DetailPage({ id, viewer }) {
  const [session, setSession] = useState(null);
  const [error, setError] = useState(null);
  const [policy, setPolicy] = useState(null);
  const [actionError, setActionError] = useState(null);
  const [name, setName] = useState("");
  const [terminal, setTerminal] = useState(null);
  const now = useNow();
  const load = () =>
    gql(SESSION, { id })
      .then((d) => {
        setSession(d.session);
        setName(d.session.name);
        setError(null);
      })
      .catch(setError);
  useEffect(() => {
    load();
    if (viewer.role !== "USER")
      gql(POLICY, { id })
        .then((d) => setPolicy(d.effectiveIdlePolicy))
        .catch(() => setPolicy(null));
    const stop = subscribe(EVENTS, { id }, { onNext: () => load(), onError: () => {} });
    const stopReloading = onReconnect(load); // what changed while the connection was cut
    return () => {
      stop();
      stopReloading();
    };
  }, [id]);
  const running = session && session.status === "RUNNING";
  useEffect(() => {
    if (!running) return undefined;
    const read = () =>
      gql(IDLE, { id })
        .then((d) => setSession((s) => s && { ...s, idleChecks: d.session.idleChecks }))
        .catch(() => {});
    const first = setTimeout(read, 3000); // the first verdict comes with the first sweep after the start
    const every = setInterval(read, IDLE_REFRESH_MS);
    return () => {
      clearTimeout(first);
      clearInterval(every);
    };
  }, [id, running]);
  const [notice, setNotice] = useState(null);
  async function act(fn, done = null) {
    setActionError(null);
    setNotice(null);
    try {
      await fn();
      await load();
      setNotice(done);
    } catch (exc) {
      setActionError(exc);
    }
  }
  async function openApp(app) {
    // Opened now, while the click still counts as one (popup blockers), and cut from this page before it goes
    // anywhere, as "noopener" would: the app gets no window.opener (it could navigate this tab away). No referrer
    // either (this page's Referrer-Policy), and the page's Cross-Origin-Opener-Policy separates the two in any case.
    const tab = window.open("about:blank", "_blank");
    if (tab) tab.opener = null;
    try {
      const d = await gql(LAUNCH, { id, app });
      if (tab) tab.location.href = d.launchApp.url;
      else location.assign(d.launchApp.url);
    } catch (exc) {
      if (tab) tab.close();
      setActionError(exc);
    }
  }
  if (error) return <ErrorBox error={error} />;
  if (!session) return <p class="loading">Loading session…</p>;
  const s = session,
    ended = TERMINAL.has(s.status);
  return (
    <article aria-labelledby="session-title" id="session-detail" data-status={s.status}>
      <div class="title-row">
        <h1 id="session-title">{s.name}</h1>
        <StatusBadge status={s.status} />
        {s.status === "TERMINATED" && s.result !== "UNDEFINED" && (
          <span class={`result result-${s.result.toLowerCase()}`} id="session-result">
            {s.result}
          </span>
        )}
        <span class="muted">
          {s.statusInfo}
          {s.statusDetail ? `: ${s.statusDetail}` : ""}
        </span>
      </div>
      <ErrorBox error={actionError} />
      {notice && (
        <p role="status" class="notice" id="notice">
          {notice}
        </p>
      )}
      <div class="toolbar actions">
        <form
          onSubmit={(e) => {
            e.preventDefault();
            act(() => gql(RENAME, { id, name }));
          }}
          class="inline"
        >
          <label for="rename">Name</label>
          <input id="rename" value={name} onInput={(e) => setName(e.currentTarget.value)} disabled={ended} />
          <button type="submit" class="secondary" disabled={ended || name === s.name}>
            Rename
          </button>
        </form>
        <button
          type="button"
          class="secondary"
          id="restart"
          disabled={s.status !== "RUNNING"}
          onClick={() =>
            act(
              () => gql(RESTART, { id }),
              "Restart requested: the kernels restart in place within a second or so (see Restarts).",
            )
          }
        >
          Restart
        </button>
        <button
          type="button"
          class="danger"
          id="terminate"
          disabled={ended}
          onClick={() => confirm(`Terminate ${s.name}?`) && act(() => gql(DESTROY, { id, forced: false }))}
        >
          Terminate
        </button>
        {s.status === "TERMINATING" && (
          <button type="button" class="danger" onClick={() => act(() => gql(DESTROY, { id, forced: true }))}>
            Force
          </button>
        )}
      </div>
      <div class="grid">
        <section class="card" aria-labelledby="about-title">
          <h2 id="about-title">About</h2>
          <dl>
            <dt>Type</dt>
            <dd>
              {s.type} · {s.driver}
              {s.image ? ` · ${s.image}` : ""}
            </dd>
            <dt>Resources</dt>
            <dd>
              {resources(s.resources)} in {s.resourceGroup}
            </dd>
            <dt>Owner</dt>
            <dd>
              {s.ownerId} ({s.project})
            </dd>
            <dt>Created</dt>
            <dd>{localTime(s.createdAt)}</dd>
            <dt>Started</dt>
            <dd>{localTime(s.startedAt)}</dd>
            <dt>Ended</dt>
            <dd>
              {localTime(s.terminatedAt)}
              {s.exitCode != null ? ` (exit ${s.exitCode})` : ""}
            </dd>
            {s.startupCommand && (
              <>
                <dt>Command</dt>
                <dd>
                  <code>{s.startupCommand}</code>
                </dd>
              </>
            )}
          </dl>
          {s.status === "PENDING" && (
            <div id="wait-reasons">
              <h3>Waiting{s.queuePosition ? ` (position ${s.queuePosition} in the queue)` : ""}</h3>
              {s.waitReasons.length ? (
                <ul>
                  {s.waitReasons.map((r) => (
                    <li>{r}</li>
                  ))}
                </ul>
              ) : (
                <p class="muted">Not judged by a scheduling pass yet.</p>
              )}
            </div>
          )}
        </section>
        <section class="card" aria-labelledby="apps-title">
          <h2 id="apps-title">Apps</h2>
          {s.apps.length === 0 ? (
            <p class="muted">No apps.</p>
          ) : (
            <ul class="apps">
              {s.apps.map((a) => (
                <li>
                  {a.url ? (
                    <button
                      type="button"
                      class="app"
                      data-app={a.name}
                      disabled={s.status !== "RUNNING"}
                      onClick={() => openApp(a.name)}
                    >
                      Open {a.name}
                    </button>
                  ) : (
                    <span>{a.name}</span>
                  )}
                  <span class="muted small">
                    {" "}
                    port {a.port} · {a.protocol}
                    {a.public ? " · public" : ""}
                    {a.hostPort != null && ` · host port ${a.hostPort}`}
                  </span>
                  {a.preferredPort != null && (
                    <span
                      class={`small preferred-port${a.preferredPortTaken ? " taken" : ""}`}
                      data-app={a.name}
                      data-taken={String(a.preferredPortTaken)}
                    >
                      {a.preferredPortTaken
                        ? ` · preferred port ${a.preferredPort} was taken on its node: published on ${a.hostPort ?? "another port"} instead`
                        : ` · preferred port ${a.preferredPort}`}
                    </span>
                  )}
                </li>
              ))}
            </ul>
          )}
          <h2>Idle checks</h2>
          <IdleChecks idle={s.idleChecks} now={now} />
          {policy && (
            <p class="small muted" id="idle-policy">
              Effective policy ({policy.source}): lifetime {duration(policy.maxSessionLifetime)}, network idle{" "}
              {duration(policy.networkIdleTimeout)}, check every {duration(policy.checkInterval)}
              {policy.exemptFrom.length ? `, exempt from ${policy.exemptFrom.join(", ")}` : ""}
            </p>
          )}
        </section>
      </div>
      <section class="card" aria-labelledby="kernels-title">
        <h2 id="kernels-title">Kernels</h2>
        <div class="table-wrap">
          <table class="compact" id="kernels">
            <thead>
              <tr>
                <th>Kernel</th>
                <th>Status</th>
                <th>Agent</th>
                <th>Ports</th>
                <th>Started</th>
                <th>Restarts</th>
                <th>Terminal</th>
              </tr>
            </thead>
            <tbody>
              {s.kernels.map((k) => (
                <tr>
                  <td>
                    {kernelName(k)} <span class="muted small">{k.hostname}</span>
                  </td>
                  <td>
                    <StatusBadge status={k.status} />{" "}
                    <span class="small">
                      {k.statusInfo}
                      {k.statusDetail ? `: ${k.statusDetail}` : ""}
                    </span>
                  </td>
                  <td>{k.agent || "—"}</td>
                  <td class="small">{k.ports.join(", ") || "—"}</td>
                  <td>{localTime(k.startedAt)}</td>
                  <td class="restarts">{k.restarts}</td>
                  <td>
                    <button
                      type="button"
                      class="secondary"
                      disabled={k.status !== "RUNNING" || s.driver === "QEMU"}
                      onClick={() => setTerminal(kernelName(k))}
                    >
                      Open terminal
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
        {terminal && (
          <Suspense fallback={<p class="loading">Loading the terminal…</p>}>
            <Terminal sessionId={s.id} kernel={terminal} onClose={() => setTerminal(null)} />
          </Suspense>
        )}
      </section>
      <UsageCharts id={s.id} running={s.status === "RUNNING"} kernels={s.kernels} />
      <Logs session={s} key={s.id + (s.status === "RUNNING" ? "r" : "")} />
      <section class="card" aria-labelledby="history-title">
        <h2 id="history-title">Status history</h2>
        <ol class="history" id="history">
          {s.statusHistory.map((h) => (
            <li>
              <time datetime={h.at}>{localTime(h.at)}</time> <StatusBadge status={h.status} /> <code>{h.reason}</code>
              {h.detail && <span class="small"> {h.detail}</span>}
            </li>
          ))}
        </ol>
      </section>
      <p>
        <a
          href="/ui/"
          onClick={(e) => {
            e.preventDefault();
            navigate("/");
          }}
        >
          ← All sessions
        </a>
      </p>
    </article>
  );
}
