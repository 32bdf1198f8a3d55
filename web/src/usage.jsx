// Usage: what was allocated (and measured) per day, stacked by user or project, for a period in the viewer's time
// zone (or UTC); a table of the period's totals and the CSV of the same report. Its own chunk (main.jsx loads it
// lazily). The API decides whose usage is in the answer: a user their own, an admin their projects', a superadmin all.
import { useEffect, useState } from "preact/hooks";
import { gql, usageCsv } from "./api.js";
import { ErrorBox, saveBlob, timeZone } from "./util.jsx";

const QUERY = `query Usage($from: Date!, $to: Date!, $groupBy: [UsageGroupBy!], $timeZone: String!) {
  usage(from: $from, to: $to, groupBy: $groupBy, timeZone: $timeZone) { timeZone rows { day user project seconds
    slots { slot resourceSeconds hours } utilization { metric averagePercent measuredSeconds } } } }`;
const COLORS = [
  "#3b6ea5",
  "#d9822b",
  "#4f9d69",
  "#b5485d",
  "#7e5fa8",
  "#9c7a3c",
  "#2f8f9d",
  "#c25e9b",
  "#6b7a8f",
  "#8aa33d",
];
const pad = (n) => String(n).padStart(2, "0");
const isoDay = (d) => `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
/** What a slot's hours are called (cpu: CPU-hours; an accelerator: device- or share-hours; mem: byte-hours shown as GiB-hours). */
const unitOf = (slot) => (slot === "mem" ? "GiB-hours" : slot === "cpu" ? "CPU-hours" : `${slot}-hours`);
const shown = (slot, hours) => (slot === "mem" ? hours / 1024 ** 3 : hours);
const fixed = (n) => (n >= 100 ? n.toFixed(0) : n.toFixed(2));

function daysBetween(from, to) {
  const days = [];
  for (let t = Date.parse(`${from}T00:00:00Z`); days.length < 400 && !Number.isNaN(t); t += 86400000) {
    const day = new Date(t).toISOString().slice(0, 10);
    if (day > to) break;
    days.push(day);
  }
  return days;
}

/** The period's rows summed per stack key (user or project): seconds, each slot's hours, utilization weighted by time. */
function totals(rows, by) {
  const out = new Map();
  for (const r of rows) {
    const key = r[by];
    const t = out.get(key) || { key, seconds: 0, hours: {}, used: {} };
    t.seconds += r.seconds;
    for (const s of r.slots) t.hours[s.slot] = (t.hours[s.slot] || 0) + s.hours;
    for (const u of r.utilization) {
      const m = t.used[u.metric] || { weighted: 0, seconds: 0 };
      m.weighted += u.averagePercent * u.measuredSeconds;
      m.seconds += u.measuredSeconds;
      t.used[u.metric] = m;
    }
    out.set(key, t);
  }
  return [...out.values()].sort((a, b) => String(a.key).localeCompare(String(b.key)));
}

function Chart({ rows, by, slot, days, keys }) {
  const perDay = new Map(days.map((d) => [d, new Map()]));
  for (const r of rows) {
    const hours = (r.slots.find((s) => s.slot === slot) || {}).hours || 0;
    const day = perDay.get(r.day);
    if (day && hours) day.set(r[by], (day.get(r[by]) || 0) + shown(slot, hours));
  }
  const max = Math.max(0, ...[...perDay.values()].map((m) => [...m.values()].reduce((a, b) => a + b, 0)));
  const width = 720,
    height = 220,
    left = 48,
    bottom = 24,
    bar = (width - left) / Math.max(days.length, 1);
  const scale = max > 0 ? (height - bottom - 8) / max : 0;
  return (
    <svg
      id="usage-chart"
      viewBox={`0 0 ${width} ${height}`}
      role="img"
      aria-label={`${unitOf(slot)} per day by ${by}`}
      class="usage-chart"
    >
      <line x1={left} y1={height - bottom} x2={width} y2={height - bottom} stroke="currentColor" stroke-opacity="0.4" />
      <text x={left - 4} y={12} text-anchor="end" font-size="10">
        {fixed(max)}
      </text>
      <text x={left - 4} y={height - bottom} text-anchor="end" font-size="10">
        0
      </text>
      {days.map((day, i) => {
        let y = height - bottom;
        return (
          <g key={day} data-day={day}>
            {keys.map((key, k) => {
              const value = perDay.get(day).get(key) || 0;
              if (!value) return null;
              const h = value * scale;
              y -= h;
              return (
                <rect
                  x={left + i * bar + 1}
                  y={y}
                  width={Math.max(bar - 2, 1)}
                  height={h}
                  fill={COLORS[k % COLORS.length]}
                  data-key={key}
                >
                  <title>{`${day} ${key}: ${fixed(value)} ${unitOf(slot)}`}</title>
                </rect>
              );
            })}
            {(days.length <= 16 || i % Math.ceil(days.length / 10) === 0) && (
              <text x={left + i * bar + bar / 2} y={height - 8} text-anchor="middle" font-size="9">
                {day.slice(5)}
              </text>
            )}
          </g>
        );
      })}
    </svg>
  );
}

export default function UsagePage({ viewer }) {
  const today = new Date();
  const [from, setFrom] = useState(isoDay(new Date(today.getFullYear(), today.getMonth(), 1)));
  const [to, setTo] = useState(isoDay(today));
  const [by, setBy] = useState(viewer.role === "USER" ? "project" : "user");
  const [zone, setZone] = useState(timeZone);
  const [slot, setSlot] = useState("cpu");
  const [report, setReport] = useState(null);
  const [error, setError] = useState(null);
  const params = { from, to, timeZone: zone };

  useEffect(() => {
    let live = true;
    setError(null);
    gql(QUERY, { ...params, groupBy: ["DAY", by === "user" ? "USER" : "PROJECT"] })
      .then((data) => live && setReport(data.usage))
      .catch((exc) => live && (setError(exc), setReport(null)));
    return () => {
      live = false;
    };
  }, [from, to, by, zone]);

  const download = () =>
    usageCsv({ ...params, groupBy: `${by},day` })
      .then((blob) => saveBlob(blob, `usage-${from}-${to}.csv`))
      .catch(setError);
  const rows = report ? report.rows : [];
  const slots = [...new Set(rows.flatMap((r) => r.slots.map((s) => s.slot)))].sort();
  const table = totals(rows, by);
  const keys = table.map((t) => t.key);
  const metrics = [...new Set(table.flatMap((t) => Object.keys(t.used)))].sort();
  const chosen = slots.includes(slot) ? slot : slots[0] || "cpu";
  return (
    <section class="usage">
      <h1>Usage</h1>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          From <input type="date" id="usage-from" value={from} onChange={(e) => setFrom(e.currentTarget.value)} />
        </label>
        <label>
          To <input type="date" id="usage-to" value={to} onChange={(e) => setTo(e.currentTarget.value)} />
        </label>
        <label>
          Stacked by{" "}
          <select id="usage-by" value={by} onChange={(e) => setBy(e.currentTarget.value)}>
            <option value="user">user</option>
            <option value="project">project</option>
          </select>
        </label>
        <label>
          Resource{" "}
          <select id="usage-slot" value={chosen} onChange={(e) => setSlot(e.currentTarget.value)}>
            {(slots.length ? slots : ["cpu"]).map((s) => (
              <option value={s}>{unitOf(s)}</option>
            ))}
          </select>
        </label>
        <label>
          Days in{" "}
          <select id="usage-zone" value={zone} onChange={(e) => setZone(e.currentTarget.value)}>
            <option value={timeZone}>{timeZone}</option>
            {timeZone !== "UTC" && <option value="UTC">UTC</option>}
          </select>
        </label>
        <button type="button" class="secondary" id="usage-csv" onClick={download}>
          Download CSV
        </button>
      </form>
      <ErrorBox error={error} />
      {report &&
        (rows.length === 0 ? (
          <p class="empty" id="usage-empty">
            No usage in this period.
          </p>
        ) : (
          <>
            <Chart rows={rows} by={by} slot={chosen} days={daysBetween(from, to)} keys={keys} />
            <ul class="legend">
              {keys.map((k, i) => (
                <li key={k}>
                  <span class="swatch" style={{ background: COLORS[i % COLORS.length] }} />
                  {k}
                </li>
              ))}
            </ul>
            <table id="usage-table">
              <thead>
                <tr>
                  <th>{by}</th>
                  <th>hours held</th>
                  {slots.map((s) => (
                    <th key={s}>{unitOf(s)}</th>
                  ))}
                  {metrics.map((m) => (
                    <th key={m}>{m} used (avg %)</th>
                  ))}
                </tr>
              </thead>
              <tbody>
                {table.map((t) => (
                  <tr key={t.key} data-key={t.key}>
                    <td>{t.key}</td>
                    <td>{fixed(t.seconds / 3600)}</td>
                    {slots.map((s) => (
                      <td key={s} data-slot={s}>
                        {fixed(shown(s, t.hours[s] || 0))}
                      </td>
                    ))}
                    {metrics.map((m) => (
                      <td key={m}>
                        {t.used[m] && t.used[m].seconds ? (t.used[m].weighted / t.used[m].seconds).toFixed(1) : "—"}
                      </td>
                    ))}
                  </tr>
                ))}
              </tbody>
            </table>
          </>
        ))}
    </section>
  );
}
