// Recurring schedules: the list (timing, paused, next run times, the latest runs and their sessions), create and edit
// (a template's or the launcher's own session options: SpecFields), pause/resume, trigger now, delete.
// Its own chunk (main.jsx loads it lazily). No event announces a run: the list is read again every few seconds, 20
// schedules at a time with their 3 latest runs (the API's query cost limit).
import { useEffect, useState } from "preact/hooks";
import { gql } from "./api.js";
import { Link, localTime, timeZone, duration, StatusBadge, ErrorBox } from "./util.jsx";
import { OPTIONS, EMPTY, useFieldKit, formField, fromSpec, toInput, SpecFields } from "./launcher.jsx";

const SPEC = `type driver image startupCommand environ { name value } resources { slot amount } resourceGroup startsAt
  batchTimeout clusterSize clusterMode preopenPorts preset apps { name port protocol } mounts { folder path mode }`;
const FIELDS = `id name ownerId project cron interval timeZone startingDeadline endAt maxRuns missedRuns concurrency paused
  templateId nextDue runsStarted nextRunTimes(count: 3)
  history(limit: 3) { key dueAt at outcome reason missed triggered sessionIds sessions { id name status result } }`;
const LIST = `query List($after: String) { schedules(first: 20, after: $after) { totalCount
  edges { node { ${FIELDS} } } pageInfo { hasNextPage endCursor } } }`;
const ONE = `query One($id: ID!) { schedule(id: $id) { id name cron interval timeZone startingDeadline endAt maxRuns
  missedRuns concurrency templateId spec { ${SPEC} } overridden overrides { ${SPEC} priority } } }`;
const CREATE = `mutation Create($input: CreateScheduleInput!) { createSchedule(input: $input) { id } }`;
const UPDATE = `mutation Update($id: ID!, $input: UpdateScheduleInput!) { updateSchedule(id: $id, input: $input) { id } }`;
const PAUSE = `mutation Pause($id: ID!) { pauseSchedule(id: $id) { id } }`;
const RESUME = `mutation Resume($id: ID!) { resumeSchedule(id: $id) { id } }`;
const TRIGGER = `mutation Trigger($id: ID!) { triggerSchedule(id: $id) { id } }`;
const DELETE = `mutation Delete($id: ID!) { deleteSchedule(id: $id) }`;
const REFRESH_MS = 3000;
/** The browser's IANA zones, offered as the time zone's suggestions. */
const ZONES = typeof Intl.supportedValuesOf === "function" ? Intl.supportedValuesOf("timeZone") : [];

const BLANK = {
  ...EMPTY,
  type: "BATCH",
  scheduleName: "",
  timing: "interval",
  cron: "",
  interval: "",
  timeZone,
  concurrency: "ALLOW",
  missedRuns: "RUN_LATEST",
  startingDeadline: "",
  endAt: "",
  maxRuns: "",
  templateId: "",
  o_image: "",
  o_startupCommand: "",
  o_environ: "",
  o_cpu: "",
  o_mem: "",
  o_batchTimeout: "",
};
/** The template's options a schedule may override (ScheduleOverridesInput), as the form's `o_<name>` fields. */
const OVERRIDABLE = [
  ["image", "Image"],
  ["startupCommand", "Startup command"],
  ["environ", "Environment variables", "one NAME=value per line, merged into the template's"],
  ["cpu", "CPU (cores)"],
  ["mem", "Memory", "512m, 2g"],
  ["batchTimeout", "Timeout", "30s, 2h"],
];
const OWN = [
  "cron",
  "interval",
  "timeZone",
  "concurrency",
  "missedRuns",
  "startingDeadline",
  "endAt",
  "maxRuns",
  "templateId",
];

/** Which control an API error's field belongs to: 'name' is the schedule's, 'spec.mem' the session options' (with a
 * template: the override's control, 'o_mem', when there is one; else none, and the error shows in the form's box). */
function scheduleField(apiField, templated) {
  if (!apiField) return null;
  if (apiField === "name") return "scheduleName";
  const prefix = ["spec.", "overrides."].find((p) => apiField.startsWith(p));
  if (prefix) {
    const own = formField(apiField.slice(prefix.length));
    if (!templated) return own;
    return OVERRIDABLE.some(([name]) => name === own) ? `o_${own}` : null;
  }
  const head = apiField.split(/[.[]/)[0];
  return OWN.includes(head) ? head : null;
}

const pad = (n) => String(n).padStart(2, "0");
/** An API DateTime as a datetime-local control's value (the browser's time zone). */
function toLocalInput(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

function fromSchedule(s, folders) {
  return {
    ...(s.spec ? fromSpec({ spec: s.spec }, folders) : BLANK),
    type: "BATCH",
    scheduleName: s.name,
    timing: s.cron ? "cron" : "interval",
    cron: s.cron || "",
    interval: s.interval != null ? `${s.interval}s` : "",
    timeZone: s.timeZone,
    concurrency: s.concurrency,
    missedRuns: s.missedRuns,
    startingDeadline: s.startingDeadline != null ? `${s.startingDeadline}s` : "",
    endAt: toLocalInput(s.endAt),
    maxRuns: s.maxRuns != null ? String(s.maxRuns) : "",
    templateId: s.templateId || "",
    ...(s.templateId && s.overrides ? fromOverrides(s) : {}),
  };
}

/** A template schedule's overrides as the form's `o_<name>` fields, and those the form has no control for (kept as
 * they are when the form saves: `o_kept`, ScheduleOverridesInput fields). */
function fromOverrides(s) {
  const o = s.overrides,
    has = (name) => s.overridden.includes(name),
    slot = (n) => has("resources") && ((o.resources.find((r) => r.slot === n) || {}).amount || "");
  const kept = {};
  if (has("priority")) kept.priority = o.priority;
  if (has("preset")) kept.preset = o.preset;
  if (has("resource_group")) kept.resourceGroup = o.resourceGroup;
  const others = has("resources") ? o.resources.filter((r) => r.slot !== "cpu" && r.slot !== "mem") : [];
  return {
    o_image: has("image") ? o.image || "" : "",
    o_startupCommand: has("startup_command") ? o.startupCommand || "" : "",
    o_environ: has("environ") ? o.environ.map((e) => `${e.name}=${e.value}`).join("\n") : "",
    o_cpu: slot("cpu") || "",
    o_mem: slot("mem") || "",
    o_batchTimeout: has("batch_timeout") ? o.batchTimeout || "" : "",
    o_kept: kept,
    o_resources: others.map((r) => ({ slot: r.slot, amount: r.amount })),
  };
}

/** The form as CreateScheduleInput (or, when `update`, UpdateScheduleInput: optional values sent as null clear). */
function toScheduleInput(f, folders, { update = false } = {}) {
  const input = {
    name: f.scheduleName.trim(),
    timeZone: f.timeZone.trim() || "UTC",
    concurrency: f.concurrency,
    missedRuns: f.missedRuns,
    startingDeadline: f.startingDeadline.trim() || null,
    endAt: f.endAt ? new Date(f.endAt).toISOString() : null,
    maxRuns: f.maxRuns.trim() ? parseInt(f.maxRuns, 10) : null,
  };
  if (f.timing === "cron") input.cron = f.cron.trim();
  else input.interval = f.interval.trim();
  if (!f.templateId) input.spec = { ...toInput({ ...f, type: "BATCH" }, { spec: true, folders }), type: "BATCH" };
  else {
    if (!update) input.templateId = f.templateId;
    input.overrides = overrides(f); // on update: replaces them all, those without a control kept as they were
  }
  return input;
}

/** The overrides the form sets (left empty: the template's). */
function overrides(f) {
  const spec = toInput(
    {
      ...EMPTY,
      image: f.o_image,
      startupCommand: f.o_startupCommand,
      environ: f.o_environ,
      cpu: f.o_cpu,
      mem: f.o_mem,
      batchTimeout: f.o_batchTimeout,
    },
    { spec: true },
  );
  const out = { ...(f.o_kept || {}) };
  for (const k of ["image", "startupCommand", "batchTimeout"]) if (spec[k] !== undefined) out[k] = spec[k];
  if (spec.environ.length) out.environ = spec.environ;
  const resources = [...spec.resources, ...(f.o_resources || [])];
  if (resources.length) out.resources = resources;
  return out;
}

export default function SchedulesPage({ viewer }) {
  const [pages, setPages] = useState(null);
  const [error, setError] = useState(null);
  const [editing, setEditing] = useState(null); // null: closed; "new"; or the schedule being edited
  const [actionError, setActionError] = useState(null);
  const load = () =>
    gql(LIST)
      .then((d) => {
        setPages(d.schedules);
        setError(null);
      })
      .catch(setError);
  useEffect(() => {
    load();
    const id = setInterval(load, REFRESH_MS);
    return () => clearInterval(id);
  }, []);
  async function act(query, s) {
    setActionError(null);
    try {
      await gql(query, { id: s.id });
      await load();
    } catch (exc) {
      setActionError(exc);
    }
  }
  async function more() {
    try {
      const d = await gql(LIST, { after: pages.pageInfo.endCursor });
      setPages({ ...d.schedules, edges: [...pages.edges, ...d.schedules.edges] });
    } catch (exc) {
      setError(exc);
    }
  }
  const list = pages ? pages.edges.map((e) => e.node) : [];
  return (
    <section aria-labelledby="schedules-title">
      <div class="title-row">
        <h1 id="schedules-title">Schedules</h1>
        {editing === null && (
          <button type="button" id="new-schedule" onClick={() => setEditing("new")}>
            New schedule
          </button>
        )}
      </div>
      {editing !== null && (
        <ScheduleForm
          key={editing === "new" ? "new" : editing.id}
          viewer={viewer}
          schedule={editing === "new" ? null : editing}
          onDone={() => {
            setEditing(null);
            load();
          }}
          onCancel={() => setEditing(null)}
        />
      )}
      {error && <ErrorBox error={error} />}
      {actionError && <ErrorBox error={actionError} />}
      {!pages && !error && <p class="loading">Loading schedules…</p>}
      {pages && list.length === 0 && (
        <p class="empty" id="no-schedules">
          No schedules yet.
        </p>
      )}
      {list.length > 0 && (
        <div class="table-wrap">
          <table id="schedules">
            <thead>
              <tr>
                <th>Name</th>
                <th>When</th>
                <th>State</th>
                <th>Next runs</th>
                <th>Latest runs</th>
                <th>Actions</th>
              </tr>
            </thead>
            <tbody>
              {list.map((s) => (
                <tr data-schedule={s.name} data-id={s.id} data-paused={String(s.paused)}>
                  <td>
                    <strong>{s.name}</strong>
                    <div class="small muted">
                      {s.ownerId} ({s.project}){s.templateId ? " · from a template" : ""}
                    </div>
                  </td>
                  <td>
                    {s.cron ? (
                      <>
                        <code>{s.cron}</code> <span class="small muted">{s.timeZone}</span>
                      </>
                    ) : (
                      <>every {duration(s.interval)}</>
                    )}
                    <div class="small muted">
                      {s.concurrency.toLowerCase()}, missed: {s.missedRuns.toLowerCase()}
                      {s.startingDeadline != null && `, deadline ${duration(s.startingDeadline)}`}
                      {s.endAt && `, ends ${localTime(s.endAt)}`}
                      {s.maxRuns != null && `, at most ${s.maxRuns} runs`}
                    </div>
                  </td>
                  <td>
                    {s.paused ? (
                      <span class="badge status-pending">paused</span>
                    ) : (
                      <span class="badge status-running">active</span>
                    )}
                    <div class="small muted">{s.runsStarted} run(s)</div>
                  </td>
                  <td class="small">
                    {s.nextRunTimes.length ? (
                      s.nextRunTimes.map((t) => <div>{localTime(t)}</div>)
                    ) : (
                      <span class="muted">none</span>
                    )}
                  </td>
                  <td class="small">
                    <History runs={s.history} />
                  </td>
                  <td>
                    <div class="toolbar">
                      {s.paused ? (
                        <button
                          type="button"
                          class="secondary"
                          onClick={() => act(RESUME, s)}
                          aria-label={`Resume ${s.name}`}
                        >
                          Resume
                        </button>
                      ) : (
                        <button
                          type="button"
                          class="secondary"
                          onClick={() => act(PAUSE, s)}
                          aria-label={`Pause ${s.name}`}
                        >
                          Pause
                        </button>
                      )}
                      <button
                        type="button"
                        class="secondary"
                        onClick={() => act(TRIGGER, s)}
                        aria-label={`Run ${s.name} now`}
                      >
                        Run now
                      </button>
                      <button
                        type="button"
                        class="secondary"
                        onClick={() => setEditing(s)}
                        aria-label={`Edit ${s.name}`}
                      >
                        Edit
                      </button>
                      <button
                        type="button"
                        class="danger"
                        aria-label={`Delete ${s.name}`}
                        onClick={() =>
                          confirm(`Delete the schedule ${s.name} and its history? Its sessions stay.`) && act(DELETE, s)
                        }
                      >
                        Delete
                      </button>
                    </div>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {pages && (
        <div class="pager">
          <span>{pages.totalCount} schedule(s)</span>
          {pages.pageInfo.hasNextPage && (
            <button type="button" class="secondary" onClick={more}>
              More
            </button>
          )}
        </div>
      )}
    </section>
  );
}

function History({ runs }) {
  if (!runs.length) return <span class="muted">no run yet</span>;
  return (
    <ul class="history runs">
      {runs.map((r) => (
        <li data-outcome={r.outcome}>
          <span
            class={`result result-${r.outcome === "CREATED" ? "success" : r.outcome === "FAILED" ? "failure" : ""}`}
          >
            {r.outcome}
          </span>{" "}
          {localTime(r.dueAt)}
          {r.triggered && " (run now)"}
          {r.missed > 1 && ` (${r.missed} due times)`}
          {r.reason && <span class="muted"> {r.reason}</span>}
          {r.sessions.map((x) => (
            <div>
              <Link to={`/sessions/${x.id}`} class="run-session" data-session={x.id}>
                {x.name}
              </Link>{" "}
              <StatusBadge status={x.status} />
              {x.result && x.result !== "UNDEFINED" && <span class="small"> {x.result}</span>}
            </div>
          ))}
        </li>
      ))}
    </ul>
  );
}

function ScheduleForm({ viewer, schedule, onDone, onCancel }) {
  const [options, setOptions] = useState(null);
  const [form, setForm] = useState(BLANK);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    // its spec is read only here (the list leaves it out: 20 schedules' specs and runs would cost too much)
    Promise.all([gql(OPTIONS), schedule ? gql(ONE, { id: schedule.id }) : null])
      .then(([o, one]) => {
        setOptions(o);
        if (one) setForm(fromSchedule(one.schedule, o.folders));
      })
      .catch(setError);
  }, []);
  const field = error && scheduleField(error.field, !!form.templateId);
  const kit = useFieldKit({ form, setForm, field, error });
  const { Field, input, set } = kit;
  async function submit(e) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    const folders = options ? options.folders : [];
    try {
      if (schedule) await gql(UPDATE, { id: schedule.id, input: toScheduleInput(form, folders, { update: true }) });
      else await gql(CREATE, { input: toScheduleInput(form, folders) });
      onDone();
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy(false);
    }
  }
  const templates = options ? options.sessionTemplates : [];
  if (schedule && !options) return error ? <ErrorBox error={error} /> : <p class="loading">Loading the schedule…</p>;
  return (
    <form
      class="launcher card"
      onSubmit={submit}
      noValidate
      aria-label={schedule ? `Edit schedule ${schedule.name}` : "New schedule"}
    >
      <h2>{schedule ? `Edit ${schedule.name}` : "New schedule"}</h2>
      <fieldset>
        <legend>Schedule</legend>
        {Field({
          name: "scheduleName",
          label: "Name",
          hint: "4-40 characters; each run is named <name>-<due time UTC>",
          children: input("scheduleName"),
        })}
        {Field({
          name: "timing",
          label: "Runs",
          children: (
            <select id="f-timing" value={form.timing} onChange={set("timing")}>
              <option value="interval">every interval</option>
              <option value="cron">on a cron expression</option>
            </select>
          ),
        })}
        {form.timing === "interval"
          ? Field({
              name: "interval",
              label: "Interval",
              hint: "30s, 5m, 1h (at least 1s)",
              children: input("interval", { placeholder: "1h" }),
            })
          : Field({
              name: "cron",
              label: "Cron expression",
              hint: "minute hour day month weekday, or @daily…",
              children: input("cron", { placeholder: "30 2 * * *" }),
            })}
        {Field({
          name: "timeZone",
          label: "Time zone",
          hint: "IANA name; the cron expression is read in it",
          children: (
            <>
              {input("timeZone", { list: "time-zones", autocomplete: "off" })}
              <datalist id="time-zones">
                {ZONES.map((z) => (
                  <option value={z} />
                ))}
              </datalist>
            </>
          ),
        })}
        {Field({
          name: "concurrency",
          label: "Concurrency",
          hint: "a run due while the previous one still runs",
          children: (
            <select id="f-concurrency" value={form.concurrency} onChange={set("concurrency")}>
              <option value="ALLOW">ALLOW (overlap)</option>
              <option value="FORBID">FORBID (skip it)</option>
              <option value="REPLACE">REPLACE (end the previous)</option>
            </select>
          ),
        })}
        {Field({
          name: "startingDeadline",
          label: "Starting deadline",
          hint: "a run later than this is missed (5m); empty: none",
          children: input("startingDeadline"),
        })}
        {Field({
          name: "missedRuns",
          label: "Missed runs",
          children: (
            <select id="f-missedRuns" value={form.missedRuns} onChange={set("missedRuns")}>
              <option value="RUN_LATEST">RUN_LATEST (run the latest once)</option>
              <option value="SKIP">SKIP</option>
            </select>
          ),
        })}
        {Field({
          name: "endAt",
          label: "End",
          hint: `no run after (${timeZone}); empty: never`,
          children: input("endAt", { type: "datetime-local" }),
        })}
        {Field({
          name: "maxRuns",
          label: "Maximum runs",
          hint: "empty: no limit",
          children: input("maxRuns", { type: "number", min: 1 }),
        })}
      </fieldset>
      {!schedule && templates.length > 0 && (
        <fieldset>
          <legend>Runs' session options</legend>
          {Field({
            name: "templateId",
            label: "From a template",
            hint: "read at each run; or set the options below",
            children: (
              <select id="f-templateId" value={form.templateId} onChange={set("templateId")}>
                <option value="">none: the options below</option>
                {templates.map((t) => (
                  <option value={t.id}>
                    {t.name} ({t.scope.toLowerCase()})
                  </option>
                ))}
              </select>
            ),
          })}
        </fieldset>
      )}
      {schedule && schedule.templateId && (
        <p class="hint">
          Its runs come from a template (the template's options, read at each run, with the overrides below).
        </p>
      )}
      {!form.templateId && <SpecFields kit={kit} form={form} options={options} viewer={viewer} batchOnly />}
      {form.templateId && (
        <fieldset>
          <legend>Over the template's options (empty: the template's)</legend>
          {OVERRIDABLE.map(([name, label, hint]) =>
            Field({
              name: `o_${name}`,
              label,
              hint,
              children:
                name === "environ" || name === "startupCommand" ? (
                  <textarea
                    id={`f-o_${name}`}
                    rows="2"
                    value={form[`o_${name}`]}
                    onInput={set(`o_${name}`)}
                    aria-invalid={field === `o_${name}`}
                  />
                ) : (
                  input(`o_${name}`)
                ),
            }),
          )}
        </fieldset>
      )}
      {error && !field && <ErrorBox error={error} />}
      <div class="actions">
        <button type="submit" id="save-schedule" disabled={busy}>
          {busy ? "Saving…" : schedule ? "Save" : "Create schedule"}
        </button>
        <button type="button" class="secondary" onClick={onCancel}>
          Cancel
        </button>
      </div>
    </form>
  );
}
