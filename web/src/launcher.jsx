// The launcher: every createSession option, sent as the API takes it; the API's own validation error shown next to its
// field (extensions.field), so the form validates exactly as the API does. Templates: start from one, save as one.
import { useEffect, useState } from "preact/hooks";
import { gql } from "./api.js";
import { navigate, ErrorBox } from "./util.jsx";
import { addRecent, loadRecent, renameRecent, saveRecent, togglePin } from "./recent.js";

/** What the "HPC threads" field sets (the job sets each to the kernel's allocated cores, rounded up, unless the session's
 * environment names it: nomad_jobs/session_job.py HPC_THREAD_VARIABLES, less NPROC, which stays the core count). */
export const THREAD_VARIABLES = [
  "OMP_NUM_THREADS",
  "OPENBLAS_NUM_THREADS",
  "MKL_NUM_THREADS",
  "VECLIB_MAXIMUM_THREADS",
  "NUMEXPR_NUM_THREADS",
];

export const OPTIONS = `{ resourcePresets { name resources { slot amount } } resourceGroups { name allowedDrivers capacity { slot amount } }
  sessionTemplates { id name scope spec { type driver image startupCommand environ { name value } resources { slot amount }
    resourceGroup startsAt batchTimeout clusterSize clusterMode preopenPorts preset apps { name port protocol preferredPort }
    mounts { folder path mode } } }
  folders { id name status myMode }
  environments { name title description customized versions { tag image apps { name } } } }`;
const CREATE = `mutation Create($input: CreateSessionInput!) { createSession(input: $input) { sessions { id name } } }`;
const SAVE = `mutation Save($input: CreateSessionTemplateInput!) { createSessionTemplate(input: $input) { id name } }`;

export const EMPTY = {
  name: "",
  type: "INTERACTIVE",
  driver: "DOCKER",
  image: "",
  preset: "",
  cpu: "",
  mem: "",
  accelerators: "",
  resourceGroup: "default",
  clusterMode: "SINGLE_NODE",
  clusterSize: "1",
  environ: "",
  startupCommand: "",
  startsAt: "",
  batchTimeout: "",
  dependencies: "",
  apps: "",
  preopenPorts: "",
  mounts: "",
  templateName: "",
  count: "1",
  threads: "",
  preferPort: false,
  preferredPort: "",
};

/** The form's text fields as CreateSessionInput (or a template's spec when `spec`); `folders` (id, name) turn a mount's
 * folder name into its id (an unknown one is sent as written, for the API to refuse on its field). */
export function toInput(f, { spec = false, folders = [] } = {}) {
  const input = {
    type: f.type,
    driver: f.driver,
    resourceGroup: f.resourceGroup || "default",
    clusterMode: f.clusterMode,
    clusterSize: parseInt(f.clusterSize || "1", 10),
  };
  if (!spec) input.name = f.name.trim();
  if (f.image.trim()) input.image = f.image.trim();
  if (f.preset) input.preset = f.preset;
  const res = [];
  if (f.cpu.trim()) res.push({ slot: "cpu", amount: f.cpu.trim() });
  if (f.mem.trim()) res.push({ slot: "mem", amount: f.mem.trim() });
  for (const part of f.accelerators
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)) {
    const [slot, amount = "1"] = part.split("=");
    res.push({ slot: slot.trim(), amount: amount.trim() });
  }
  input.resources = res;
  input.environ = f.environ
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => {
      const eq = l.indexOf("=");
      return eq < 0 ? { name: l, value: "" } : { name: l.slice(0, eq), value: l.slice(eq + 1) };
    });
  const threads = (f.threads || "").trim();
  if (threads) {
    // a variable the environment names itself keeps its value
    for (const name of THREAD_VARIABLES)
      if (!input.environ.some((e) => e.name === name)) input.environ.push({ name, value: threads });
  }
  if (!spec && (f.count || "1").trim() !== "1") input.count = parseInt(f.count, 10);
  if (f.startupCommand.trim()) input.startupCommand = f.startupCommand;
  if (f.startsAt.trim()) input.startsAt = f.startsAt.trim();
  if (f.batchTimeout.trim()) input.batchTimeout = f.batchTimeout.trim();
  if (!spec) input.dependencies = f.dependencies.split(/[\s,]+/).filter(Boolean);
  input.preopenPorts = f.preopenPorts
    .split(/[\s,]+/)
    .filter(Boolean)
    .map((p) => parseInt(p, 10));
  input.apps = f.apps
    .split(/[\n,]+/)
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => {
      const [name, port, ...rest] = l.split(":").map((x) => x.trim());
      const options = rest.map((x) => x.toLowerCase());
      const protocol = (options.find((x) => x !== "public" && !x.startsWith("prefer=")) || "http").toUpperCase();
      const app = { name, port: parseInt(port, 10), protocol };
      if (options.includes("public")) app.public = true;
      const prefer = options.find((x) => x.startsWith("prefer="));
      if (prefer) app.preferredPort = parseInt(prefer.slice(7), 10);
      return app;
    });
  // "Try preferred port": the first app's host port, unless its line names one (prefer=<port>)
  if (f.preferPort && f.preferredPort.trim() && input.apps.length && input.apps[0].preferredPort == null) {
    input.apps[0].preferredPort = parseInt(f.preferredPort, 10);
  }
  input.mounts = f.mounts
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => {
      const [folder, path = "", mode = "RW"] = l.split(":").map((x) => x.trim());
      const known = folders.find((x) => x.name === folder || x.id === folder);
      return { folder: known ? known.id : folder, path, mode: mode.toUpperCase() };
    });
  return input;
}

export function fromSpec(t, folders = []) {
  const s = t.spec,
    slot = (n) => (s.resources.find((r) => r.slot === n) || {}).amount || "";
  return {
    ...EMPTY,
    type: s.type,
    driver: s.driver,
    image: s.image || "",
    preset: s.preset || "",
    cpu: slot("cpu"),
    mem: slot("mem"),
    accelerators: s.resources
      .filter((r) => r.slot !== "cpu" && r.slot !== "mem")
      .map((r) => `${r.slot}=${r.amount}`)
      .join(", "),
    resourceGroup: s.resourceGroup,
    clusterMode: s.clusterMode,
    clusterSize: String(s.clusterSize),
    environ: s.environ.map((e) => `${e.name}=${e.value}`).join("\n"),
    startupCommand: s.startupCommand || "",
    startsAt: s.startsAt || "",
    batchTimeout: s.batchTimeout || "",
    preopenPorts: s.preopenPorts.join(", "),
    apps: s.apps
      .map((a) => `${a.name}:${a.port}:${a.protocol}${a.preferredPort ? `:prefer=${a.preferredPort}` : ""}`)
      .join("\n"),
    mounts: (s.mounts || [])
      .map((m) => `${(folders.find((x) => x.id === m.folder) || { name: m.folder }).name}:${m.path}:${m.mode}`)
      .join("\n"),
  };
}

/** Which form field an API error's extensions.field belongs to ('resources.cpu' -> cpu, 'apps[0].port' -> apps). */
export function formField(apiField) {
  if (!apiField) return null;
  const head = apiField.split(/[.[]/)[0];
  if (head === "resources") return /mem/.test(apiField) ? "mem" : /cpu/.test(apiField) ? "cpu" : "accelerators";
  if (head === "environ") return "environ";
  if (head === "kernelRoles") return "image";
  if (/^apps\[0\]\.preferredPort$/.test(apiField)) return "preferredPort";
  return head in EMPTY ? head : null;
}

/** The form's controls: Field (label, control, hint, the API error of its field) and input (a text input bound to
 * the form), for any form whose state is one object of text fields; `field` is the form field the error is about,
 * which gets the focus when the error arrives. */
export function useFieldKit({ form, setForm, field, error }) {
  useEffect(() => {
    // the field the API refused gets the focus (its error is read out: role=alert)
    const el = field && document.getElementById(`f-${field}`);
    if (el) {
      el.focus();
      el.scrollIntoView({ block: "center" });
    }
  }, [error]);
  const set = (k) => (e) => setForm({ ...form, [k]: e.currentTarget.value });
  const toggle = (k) => (e) => setForm({ ...form, [k]: e.currentTarget.checked });
  function Field({ name, label, hint, children }) {
    const wrong = field === name;
    return (
      <div class={`field${wrong ? " invalid" : ""}`}>
        <label for={`f-${name}`}>{label}</label>
        {children}
        {hint && (
          <small id={`hint-${name}`} class="hint">
            {hint}
          </small>
        )}
        {wrong && (
          <small class="field-error" id={`error-${name}`} role="alert" data-code={error.code}>
            {error.code}: {error.message}
          </small>
        )}
      </div>
    );
  }
  const input = (name, props = {}) => (
    <input
      id={`f-${name}`}
      name={name}
      value={form[name]}
      onInput={set(name)}
      aria-invalid={field === name}
      aria-describedby={field === name ? `error-${name}` : undefined}
      {...props}
    />
  );
  return { Field, input, set, toggle, field };
}

/** A session's options (createSession's, a template's or a schedule's spec) as fieldsets; `children` lead the first
 * (the launcher's session name); `batchOnly`: a schedule's runs, always BATCH, with no dependencies. */
export function SpecFields({ kit, form, options, viewer, batchOnly = false, children }) {
  const { Field, input, set, toggle } = kit;
  const field = kit.field;
  const batch = batchOnly || form.type === "BATCH";
  // accelerator slots (anything but cpu and mem) some group's agents have: the field shows only when there are some
  const accelerators = options
    ? [...new Set(options.resourceGroups.flatMap((g) => g.capacity.map((c) => c.slot)))]
        .filter((x) => x !== "cpu" && x !== "mem")
        .sort()
    : [];
  return (
    <>
      <fieldset>
        <legend>Session</legend>
        {children}
        {!batchOnly &&
          Field({
            name: "type",
            label: "Type",
            children: (
              <select id="f-type" value={form.type} onChange={set("type")}>
                <option>INTERACTIVE</option>
                <option>BATCH</option>
                <option>INFERENCE</option>
              </select>
            ),
          })}
        {Field({
          name: "driver",
          label: "Driver",
          children: (
            <select id="f-driver" value={form.driver} onChange={set("driver")}>
              <option>DOCKER</option>
              <option>EXEC</option>
              <option>QEMU</option>
              {viewer.role === "SUPERADMIN" && <option>RAW_EXEC</option>}
            </select>
          ),
        })}
        {form.driver === "DOCKER" && options && options.environments.length > 0 ? (
          <ImagePicker kit={kit} form={form} environments={options.environments} />
        ) : (
          Field({
            name: "image",
            label: "Image",
            hint: "docker: an allowed image; qemu: a VM image; empty: the default",
            children: input("image"),
          })
        )}
        {Field({
          name: "startupCommand",
          label: "Startup command",
          hint: batch ? "required for BATCH" : undefined,
          children: (
            <textarea
              id="f-startupCommand"
              rows="2"
              value={form.startupCommand}
              onInput={set("startupCommand")}
              aria-invalid={field === "startupCommand"}
            />
          ),
        })}
      </fieldset>
      <fieldset>
        <legend>Resources</legend>
        {Field({
          name: "resourceGroup",
          label: "Resource group",
          children: (
            <select id="f-resourceGroup" value={form.resourceGroup} onChange={set("resourceGroup")}>
              {(options ? options.resourceGroups : [{ name: "default" }]).map((g) => (
                <option>{g.name}</option>
              ))}
            </select>
          ),
        })}
        {Field({
          name: "preset",
          label: "Preset",
          children: (
            <select id="f-preset" value={form.preset} onChange={set("preset")}>
              <option value="">none (explicit resources)</option>
              {options && options.resourcePresets.map((p) => <option value={p.name}>{p.name}</option>)}
            </select>
          ),
        })}
        {Field({
          name: "cpu",
          label: "CPU (cores)",
          children: input("cpu", { placeholder: "0.25", inputmode: "decimal" }),
        })}
        {Field({
          name: "mem",
          label: "Memory",
          hint: "bytes with units: 512m, 2g",
          children: input("mem", { placeholder: "256m" }),
        })}
        {(accelerators.length > 0 || form.accelerators) &&
          Field({
            name: "accelerators",
            label: "Accelerators",
            hint: `slot=count, comma-separated; the agents have: ${accelerators.join(", ") || "none"}`,
            children: input("accelerators"),
          })}
        {Field({
          name: "clusterMode",
          label: "Cluster mode",
          children: (
            <select id="f-clusterMode" value={form.clusterMode} onChange={set("clusterMode")}>
              <option>SINGLE_NODE</option>
              <option>MULTI_NODE</option>
            </select>
          ),
        })}
        {Field({
          name: "clusterSize",
          label: "Cluster size",
          children: input("clusterSize", { type: "number", min: 1 }),
        })}
      </fieldset>
      <fieldset>
        <legend>Environment and apps</legend>
        {Field({
          name: "environ",
          label: "Environment variables",
          hint: "one NAME=value per line",
          children: (
            <textarea
              id="f-environ"
              rows="3"
              value={form.environ}
              onInput={set("environ")}
              aria-invalid={field === "environ"}
            />
          ),
        })}
        {Field({
          name: "threads",
          label: "HPC threads",
          hint: `${THREAD_VARIABLES.slice(0, 3).join(", ")}…; empty: the allocated cores`,
          children: input("threads", { type: "number", min: 1, placeholder: "cores" }),
        })}
        {Field({
          name: "apps",
          label: "Apps",
          hint: "name:port[:HTTP|WEBSOCKET|TCP][:public][:prefer=<host port>], one per line; public: open to anyone with the link, no sign-in",
          children: (
            <textarea id="f-apps" rows="2" value={form.apps} onInput={set("apps")} aria-invalid={field === "apps"} />
          ),
        })}
        <label class="check">
          <input type="checkbox" id="f-preferPort" checked={form.preferPort} onChange={toggle("preferPort")} /> Try
          preferred port
        </label>
        {form.preferPort &&
          Field({
            name: "preferredPort",
            label: "Preferred host port",
            hint: "the first app's port on its node, 20000-32000 (for direct TCP clients); if taken there, it gets another and the session page says so",
            children: input("preferredPort", { type: "number", min: 20000, max: 32000, placeholder: "25432" }),
          })}
        {Field({
          name: "preopenPorts",
          label: "Preopened ports",
          hint: "comma-separated",
          children: input("preopenPorts"),
        })}
      </fieldset>
      <fieldset>
        <legend>Storage folders</legend>
        {Field({
          name: "mounts",
          label: "Mounts",
          hint: `folder:/path[:RW|RO], one per line; your folders: ${
            options
              ? options.folders
                  .filter((x) => x.status === "READY")
                  .map((x) => `${x.name} (${x.myMode})`)
                  .join(", ") || "none"
              : "…"
          }`,
          children: (
            <textarea
              id="f-mounts"
              rows="2"
              value={form.mounts}
              onInput={set("mounts")}
              aria-invalid={field === "mounts"}
              placeholder="datasets:/data:RO"
            />
          ),
        })}
      </fieldset>
      {batch && (
        <fieldset>
          <legend>Batch</legend>
          {Field({
            name: "startsAt",
            label: "Start time",
            hint: "ISO 8601 with a zone, or a delay such as 90s",
            children: input("startsAt"),
          })}
          {Field({ name: "batchTimeout", label: "Timeout", hint: "30s, 2h", children: input("batchTimeout") })}
          {!batchOnly &&
            Field({
              name: "dependencies",
              label: "Dependencies",
              hint: "session ids that must succeed first",
              children: input("dependencies"),
            })}
        </fieldset>
      )}
    </>
  );
}

/** The docker image as an environment and a version from the catalog (`environments`: its apps come with it), or
 * any other allowed image typed in; the form keeps the image reference. */
function ImagePicker({ kit, form, environments }) {
  const { Field, input, set } = kit;
  const [other, setOther] = useState(false);
  const current = environments.find((e) => e.versions.some((v) => v.image === form.image));
  const typed = other || (!current && form.image !== "");
  const setImage = (value) => set("image")({ currentTarget: { value } });
  function choose(e) {
    const name = e.currentTarget.value;
    setOther(name === "__other");
    if (name === "__other") return;
    const chosen = environments.find((x) => x.name === name);
    setImage(chosen ? chosen.versions[0].image : "");
  }
  const apps = current && (current.versions.find((v) => v.image === form.image) || {}).apps;
  return (
    <>
      <div class="field">
        <label for="f-environment">Environment</label>
        <select id="f-environment" value={typed ? "__other" : current ? current.name : ""} onChange={choose}>
          <option value="">the default image</option>
          {environments.map((e) => (
            <option value={e.name}>{e.customized ? "Customized (your images)" : e.title}</option>
          ))}
          <option value="__other">another image…</option>
        </select>
        {current && current.description && <small class="hint">{current.description}</small>}
      </div>
      {typed
        ? Field({ name: "image", label: "Image", hint: "an allowed docker image, name:tag", children: input("image") })
        : current &&
          Field({
            name: "image",
            label: "Version",
            hint: apps && apps.length ? `apps: ${apps.map((a) => a.name).join(", ")}` : undefined,
            children: (
              <select id="f-image" value={form.image} onChange={set("image")}>
                {current.versions.map((v) => (
                  <option value={v.image}>{v.tag}</option>
                ))}
              </select>
            ),
          })}
    </>
  );
}

/** The five latest launches of this browser's user (recent.js): fill the form with one, launch it again as it was,
 * rename it, pin it so newer launches never push it out. */
function RecentLaunches({ recent, busy, onChange, onUse, onLaunch }) {
  const [renaming, setRenaming] = useState(null);
  const [label, setLabel] = useState("");
  if (!recent.length) return null;
  return (
    <section class="card recent" aria-labelledby="recent-title" id="recent-launches">
      <h2 id="recent-title">Recent launches</h2>
      <ul>
        {recent.map((r) => (
          <li key={r.id} data-recent={r.label} data-pinned={r.pinned ? "true" : "false"}>
            {renaming === r.id ? (
              <form
                class="inline"
                onSubmit={(e) => {
                  e.preventDefault();
                  onChange(renameRecent(recent, r.id, label.trim() || r.label));
                  setRenaming(null);
                }}
              >
                <input
                  class="recent-label"
                  aria-label="New name"
                  value={label}
                  onInput={(e) => setLabel(e.currentTarget.value)}
                />
                <button type="submit" class="secondary">
                  Save
                </button>
              </form>
            ) : (
              <span class="recent-name">
                {r.pinned ? "📌 " : ""}
                {r.label}
              </span>
            )}
            <span class="muted small">
              {" "}
              {r.form.type.toLowerCase()} · {r.form.image || r.form.driver.toLowerCase()}
              {r.form.count && r.form.count !== "1" ? ` ×${r.form.count}` : ""}
            </span>
            <button type="button" class="secondary recent-use" onClick={() => onUse(r)}>
              Edit
            </button>
            <button type="button" class="recent-launch" disabled={busy} onClick={() => onLaunch(r)}>
              Re-launch
            </button>
            <button
              type="button"
              class="secondary recent-rename"
              onClick={() => {
                setRenaming(r.id);
                setLabel(r.label);
              }}
            >
              Rename
            </button>
            <button
              type="button"
              class="secondary recent-pin"
              aria-pressed={r.pinned}
              onClick={() => onChange(togglePin(recent, r.id))}
            >
              {r.pinned ? "Unpin" : "Pin"}
            </button>
          </li>
        ))}
      </ul>
    </section>
  );
}

export function LauncherPage({ viewer }) {
  const [form, setForm] = useState(EMPTY);
  const [options, setOptions] = useState(null);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState(null);
  const [recent, setRecent] = useState(() => loadRecent(viewer.id));
  const keepRecent = (list) => setRecent(saveRecent(viewer.id, list));
  useEffect(() => {
    gql(OPTIONS).then(setOptions).catch(setError);
  }, []);
  const field = error && formField(error.field);
  const kit = useFieldKit({ form, setForm, field, error });
  const { Field, input } = kit;

  async function submit(e, launched = form) {
    if (e) e.preventDefault();
    setBusy(true);
    setError(null);
    setSaved(null);
    try {
      const d = await gql(CREATE, { input: toInput(launched, { folders: options ? options.folders : [] }) });
      keepRecent(addRecent(loadRecent(viewer.id), launched, Date.now()));
      const made = d.createSession.sessions;
      navigate(made.length === 1 ? `/sessions/${made[0].id}` : "/");
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy(false);
    }
  }
  async function saveTemplate() {
    setBusy(true);
    setError(null);
    setSaved(null);
    try {
      const d = await gql(SAVE, {
        input: {
          name: form.templateName.trim(),
          spec: toInput(form, { spec: true, folders: options ? options.folders : [] }),
        },
      });
      setSaved(d.createSessionTemplate.name);
      setOptions(await gql(OPTIONS)); // the new template among the others
    } catch (exc) {
      setError(
        exc.field
          ? { ...exc, field: exc.field === "name" ? "templateName" : exc.field, message: exc.message, code: exc.code }
          : exc,
      );
    } finally {
      setBusy(false);
    }
  }
  return (
    <section aria-labelledby="launch-title">
      <h1 id="launch-title">Launch a session</h1>
      {!options && !error && <p class="loading">Loading presets and resource groups…</p>}
      <RecentLaunches
        recent={recent}
        busy={busy}
        onChange={keepRecent}
        onUse={(r) => setForm({ ...EMPTY, ...r.form })}
        onLaunch={(r) => {
          setForm({ ...EMPTY, ...r.form });
          submit(null, { ...EMPTY, ...r.form });
        }}
      />
      <form class="launcher" onSubmit={submit} noValidate aria-label="Launch a session">
        {options && options.sessionTemplates.length > 0 && (
          <div class="field">
            <label for="f-template">Start from a template</label>
            <select
              id="f-template"
              onChange={(e) => {
                const t = options.sessionTemplates.find((x) => x.id === e.currentTarget.value);
                if (t && t.spec) setForm({ ...fromSpec(t, options.folders), name: form.name });
              }}
            >
              <option value="">—</option>
              {options.sessionTemplates.map((t) => (
                <option value={t.id}>
                  {t.name} ({t.scope.toLowerCase()})
                </option>
              ))}
            </select>
          </div>
        )}
        <SpecFields kit={kit} form={form} options={options} viewer={viewer}>
          {Field({
            name: "name",
            label: "Name",
            hint: "4-64 characters: letters, digits, '_', and '.' or '-' inside",
            children: input("name", { required: true }),
          })}
          {Field({
            name: "count",
            label: "Sessions to create",
            hint: "more than one: named name-1, name-2…",
            children: input("count", { type: "number", min: 1, max: 100 }),
          })}
        </SpecFields>
        {error && !field && <ErrorBox error={error} />}
        <div class="actions">
          <button type="submit" id="launch" disabled={busy}>
            {busy ? "Launching…" : "Launch"}
          </button>
          <span class="save-template">
            {Field({ name: "templateName", label: "Save as template named", children: input("templateName") })}
            <button type="button" class="secondary" disabled={busy || !form.templateName.trim()} onClick={saveTemplate}>
              Save template
            </button>
            {saved && <span role="status">Saved template {saved}.</span>}
          </span>
        </div>
      </form>
    </section>
  );
}
