// Small shared helpers: navigation under /ui/, time in the browser's time zone, amounts.
import { useEffect, useState } from "preact/hooks";

export const BASE = "/ui";
export function navigate(path) {
  history.pushState(null, "", BASE + path);
  dispatchEvent(new PopStateEvent("popstate"));
}
export function usePath() {
  const read = () => location.pathname.replace(/^\/ui/, "") || "/";
  const [path, setPath] = useState(read());
  useEffect(() => {
    const on = () => setPath(read());
    addEventListener("popstate", on);
    return () => removeEventListener("popstate", on);
  }, []);
  return path;
}
export function Link({ to, children, ...rest }) {
  return (
    <a
      href={BASE + to}
      onClick={(e) => {
        if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
        e.preventDefault();
        navigate(to);
      }}
      {...rest}
    >
      {children}
    </a>
  );
}

/** A clock that ticks every `ms` (ages and countdowns; no request is made). */
export function useNow(ms = 1000) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const id = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(id);
  }, [ms]);
  return now;
}

const timeFormat = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });
/** An API DateTime in the browser's time zone. */
export const localTime = (iso) => (iso ? timeFormat.format(new Date(iso)) : "—");
export const timeZone = Intl.DateTimeFormat().resolvedOptions().timeZone;

export function duration(seconds) {
  if (seconds == null) return "—";
  seconds = Math.max(0, Math.round(seconds));
  const d = Math.floor(seconds / 86400),
    h = Math.floor((seconds % 86400) / 3600);
  const m = Math.floor((seconds % 3600) / 60),
    s = seconds % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

export function amount(slot, value) {
  const n = Number(value);
  if (slot === "mem" && !Number.isNaN(n)) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n,
      i = 0;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i++;
    }
    return `${v.toFixed(v < 10 && i ? 1 : 0)} ${units[i]}`;
  }
  return Number.isNaN(n) ? value : String(+n.toFixed(2));
}
export const resources = (list) => (list || []).map((r) => `${r.slot} ${amount(r.slot, r.amount)}`).join(", ");

export const TERMINAL = new Set(["TERMINATED", "CANCELLED", "ERROR"]);

export function StatusBadge({ status }) {
  return (
    <span class={`badge status-${status.toLowerCase()}`} data-status={status}>
      {status}
    </span>
  );
}

export function ErrorBox({ error }) {
  if (!error) return null;
  return (
    <div class="error" role="alert">
      <strong>{error.code || "ERROR"}</strong>: {error.message}
    </div>
  );
}

/** Bytes, human-readable (KiB, MiB…). */
export const bytes = (n) => amount("mem", n);

/** An API error that names `field` (extensions.field, or its head: 'mounts.0.path' is about 'mounts'), shown under
 * the control with id `id` (role=alert, data-code); nothing for other errors. */
export function FieldError({ error, field, id }) {
  if (!aboutField(error, Array.isArray(field) ? field : [field])) return null;
  return (
    <small class="field-error" id={`error-${id}`} role="alert" data-code={error.code}>
      {error.code}: {error.message}
    </small>
  );
}
/** Whether `error` belongs under one of `fields` (so a form shows it there, not in its general error box). */
export const aboutField = (error, fields) =>
  !!(
    error &&
    error.field &&
    fields.some((f) => error.field === f || error.field.startsWith(`${f}.`) || error.field.startsWith(`${f}[`))
  );

/** Have the browser download `url` (same origin) as a file named `name`. */
export function saveLink(url, name) {
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
}

/** Save a Blob as a file the browser downloads (an object URL: the token never appears in a link). */
export function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  saveLink(url, name);
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
