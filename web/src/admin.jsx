// Admin views: resource groups (capacity and occupancy bars per agent), users and tokens, presets and policies.
import { useEffect, useState } from "preact/hooks";
import { gql } from "./api.js";
import { Link, localTime, amount, resources, duration, ErrorBox } from "./util.jsx";

const GROUPS = `{ resourceGroups { name allowedDrivers capacity { slot amount } occupied { slot amount } free { slot amount }
  agents { id name schedulable drivers capacity { slot amount } occupied { slot amount } } } }`;
const USERS = `{ users { id name role projects active } }`;
const TOKENS = `query Tokens($userId: ID) { tokens(userId: $userId) { id label createdAt expiresAt lastUsedAt } }`;
const ISSUE = `mutation Issue($label: String!, $userId: ID, $expiresIn: String) {
  issueToken(label: $label, userId: $userId, expiresIn: $expiresIn) { secret token { id label } } }`;
const REVOKE = `mutation Revoke($id: ID!) { revokeToken(id: $id) { id } }`;
const POLICIES = `{ resourcePresets { name resources { slot amount } sharedMemory }
  resourcePolicies { users { userId stored maxConcurrentSessions maxPendingSessions maxPriority totalResourceSlots { slot amount }
    maxSessionLifetime idleTimeout allowedResourceGroups allowedDrivers }
    projects { project totalResourceSlots { slot amount } maxSessionLifetime idleTimeout allowedResourceGroups allowedDrivers } } }`;

const ENVIRONMENTS = `query Environments { environments(includeRetired: true) { name title customized
  versions { tag image retired registeredAt apps { name port } minResources { slot amount } defaultResources { slot amount } } } }`;
const REGISTER = `mutation Register($image: String!) { registerEnvironment(image: $image) { image } }`;
const RETIRE = `mutation Retire($image: String!, $retired: Boolean!) { retireEnvironment(image: $image, retired: $retired) { image } }`;

function useQuery(query, variables) {
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const load = () =>
    gql(query, variables)
      .then((d) => {
        setData(d);
        setError(null);
      })
      .catch(setError);
  useEffect(() => {
    load();
  }, [JSON.stringify(variables)]);
  return { data, error, load };
}

function Bars({ capacity, occupied, label }) {
  const used = Object.fromEntries(occupied.map((r) => [r.slot, Number(r.amount)]));
  return (
    <div class="bars">
      {capacity.map((c) => {
        const total = Number(c.amount),
          u = used[c.slot] || 0,
          pct = total ? Math.min(100, (100 * u) / total) : 0;
        return (
          <div class="bar-row">
            <span class="slot">{c.slot}</span>
            <meter
              class="bar"
              min="0"
              max={total || 1}
              value={u}
              aria-label={`${label} ${c.slot} occupancy`}
              title={`${amount(c.slot, u)} of ${amount(c.slot, total)}`}
              data-slot={c.slot}
            />
            <span class="small">
              {amount(c.slot, u)} / {amount(c.slot, total)} ({pct.toFixed(0)}%)
            </span>
          </div>
        );
      })}
    </div>
  );
}

function Groups() {
  const { data, error } = useQuery(GROUPS);
  if (error) return <ErrorBox error={error} />;
  if (!data) return <p class="loading">Loading resource groups…</p>;
  if (!data.resourceGroups.length) return <p class="empty">No resource groups.</p>;
  return data.resourceGroups.map((g) => (
    <section class="card group" data-group={g.name} aria-label={`Resource group ${g.name}`}>
      <h2>
        {g.name} {g.allowedDrivers && <span class="muted small">drivers: {g.allowedDrivers.join(", ")}</span>}
      </h2>
      <Bars capacity={g.capacity} occupied={g.occupied} label={g.name} />
      {(g.agents || []).map((a) => (
        <div class="agent" data-agent={a.id}>
          <h3>
            {a.name} {!a.schedulable && <span class="badge status-error">not schedulable</span>}
            <span class="muted small"> {a.drivers.join(", ")}</span>
          </h3>
          <Bars capacity={a.capacity} occupied={a.occupied} label={a.name} />
        </div>
      ))}
    </section>
  ));
}

function Tokens({ user }) {
  const { data, error, load } = useQuery(TOKENS, { userId: user.id });
  const [label, setLabel] = useState("");
  const [expires, setExpires] = useState("");
  const [issued, setIssued] = useState(null);
  const [failure, setFailure] = useState(null);
  async function issue(e) {
    e.preventDefault();
    setFailure(null);
    try {
      const d = await gql(ISSUE, { label, userId: user.id, expiresIn: expires || null });
      setIssued(d.issueToken.secret);
      setLabel("");
      load();
    } catch (exc) {
      setFailure(exc);
    }
  }
  return (
    <div class="tokens">
      <ErrorBox error={error || failure} />
      {issued && (
        <p role="status" class="secret">
          New token (shown once, copy it now): <code>{issued}</code>
        </p>
      )}
      {data &&
        (data.tokens.length === 0 ? (
          <p class="muted">No tokens.</p>
        ) : (
          <table class="compact">
            <thead>
              <tr>
                <th>Label</th>
                <th>Created</th>
                <th>Expires</th>
                <th>Last used</th>
                <th></th>
              </tr>
            </thead>
            <tbody>
              {data.tokens.map((t) => (
                <tr>
                  <td>{t.label}</td>
                  <td>{localTime(t.createdAt)}</td>
                  <td>{localTime(t.expiresAt)}</td>
                  <td>{localTime(t.lastUsedAt)}</td>
                  <td>
                    <button
                      type="button"
                      class="danger"
                      onClick={() =>
                        confirm(`Revoke ${t.label}?`) && gql(REVOKE, { id: t.id }).then(load).catch(setFailure)
                      }
                    >
                      Revoke
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        ))}
      <form class="inline" onSubmit={issue}>
        <label>
          Label <input value={label} required onInput={(e) => setLabel(e.currentTarget.value)} />
        </label>
        <label>
          Expires in <input value={expires} placeholder="30d" onInput={(e) => setExpires(e.currentTarget.value)} />
        </label>
        <button type="submit" disabled={!label.trim()}>
          Issue token
        </button>
      </form>
    </div>
  );
}

function Users() {
  const { data, error } = useQuery(USERS);
  const [open, setOpen] = useState(null);
  if (error) return <ErrorBox error={error} />;
  if (!data) return <p class="loading">Loading users…</p>;
  return (
    <div class="table-wrap">
      <table id="users">
        <thead>
          <tr>
            <th>User</th>
            <th>Role</th>
            <th>Projects</th>
            <th>Active</th>
            <th>Tokens</th>
          </tr>
        </thead>
        <tbody>
          {data.users.map((u) => (
            <>
              <tr>
                <td>{u.name}</td>
                <td>{u.role}</td>
                <td>{u.projects.join(", ")}</td>
                <td>{u.active ? "yes" : "no"}</td>
                <td>
                  <button
                    type="button"
                    class="secondary"
                    aria-expanded={open === u.id}
                    onClick={() => setOpen(open === u.id ? null : u.id)}
                  >
                    {open === u.id ? "Hide" : "Tokens"}
                  </button>
                </td>
              </tr>
              {open === u.id && (
                <tr>
                  <td colspan="5">
                    <Tokens user={u} />
                  </td>
                </tr>
              )}
            </>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** The environment catalog: each image's versions with what its labels declare; a SUPERADMIN registers an image the
 * Docker engine has (its labels read then) and retires or restores a version. */
function Environments({ viewer }) {
  const { data, error, load } = useQuery(ENVIRONMENTS);
  const [image, setImage] = useState("");
  const [failure, setFailure] = useState(null);
  const superadmin = viewer && viewer.role === "SUPERADMIN";
  const act = (query, variables) => {
    setFailure(null);
    return gql(query, variables).then(load).catch(setFailure);
  };
  if (error) return <ErrorBox error={error} />;
  if (!data) return <p class="loading">Loading environments…</p>;
  const catalog = data.environments.filter((e) => !e.customized);
  return (
    <>
      <ErrorBox error={failure} />
      {catalog.length === 0 ? (
        <p class="empty">No environments: register an image.</p>
      ) : (
        <table class="compact" id="environments">
          <thead>
            <tr>
              <th>Environment</th>
              <th>Version</th>
              <th>Apps</th>
              <th>Minimum</th>
              <th>Default</th>
              <th>Status</th>
              <th></th>
            </tr>
          </thead>
          <tbody>
            {catalog.flatMap((e) =>
              e.versions.map((v) => (
                <tr data-image={v.image}>
                  <td>{e.title}</td>
                  <td>
                    <code>{v.tag}</code>
                  </td>
                  <td>{v.apps.map((a) => `${a.name}:${a.port}`).join(", ") || "—"}</td>
                  <td>{resources(v.minResources) || "—"}</td>
                  <td>{resources(v.defaultResources) || "—"}</td>
                  <td class="status">{v.retired ? "retired" : "offered"}</td>
                  <td>
                    {superadmin && (
                      <button
                        type="button"
                        class={v.retired ? "secondary" : "danger"}
                        onClick={() => act(RETIRE, { image: v.image, retired: !v.retired })}
                      >
                        {v.retired ? "Restore" : "Retire"}
                      </button>
                    )}
                  </td>
                </tr>
              )),
            )}
          </tbody>
        </table>
      )}
      {superadmin && (
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            act(REGISTER, { image: image.trim() }).then(() => setImage(""));
          }}
        >
          <label>
            Image{" "}
            <input
              id="environment-image"
              value={image}
              placeholder="caravan/env-python:3.11-jupyter-…"
              onInput={(e) => setImage(e.currentTarget.value)}
            />
          </label>
          <button type="submit" id="register-environment" disabled={!image.trim()}>
            Register
          </button>
        </form>
      )}
    </>
  );
}

const limit = (v, f = (x) => x) => (v == null ? "unlimited" : f(v));
function Policies() {
  const { data, error } = useQuery(POLICIES);
  if (error) return <ErrorBox error={error} />;
  if (!data) return <p class="loading">Loading presets and policies…</p>;
  const { resourcePresets: presets, resourcePolicies: p } = data;
  return (
    <>
      <h2>Resource presets</h2>
      {presets.length === 0 ? (
        <p class="empty">No presets.</p>
      ) : (
        <table class="compact">
          <thead>
            <tr>
              <th>Preset</th>
              <th>Resources</th>
              <th>Shared memory</th>
            </tr>
          </thead>
          <tbody>
            {presets.map((x) => (
              <tr>
                <td>{x.name}</td>
                <td>{resources(x.resources)}</td>
                <td>{x.sharedMemory || "—"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <h2>User policies</h2>
      <table class="compact">
        <thead>
          <tr>
            <th>User</th>
            <th>Concurrent</th>
            <th>Pending</th>
            <th>Priority</th>
            <th>Slots</th>
            <th>Lifetime</th>
            <th>Idle</th>
            <th>Groups</th>
          </tr>
        </thead>
        <tbody>
          {p.users.map((u) => (
            <tr>
              <td>
                {u.userId}
                {u.stored ? "" : " (default)"}
              </td>
              <td>{limit(u.maxConcurrentSessions)}</td>
              <td>{limit(u.maxPendingSessions)}</td>
              <td>{limit(u.maxPriority)}</td>
              <td>{limit(u.totalResourceSlots, resources)}</td>
              <td>{limit(u.maxSessionLifetime, duration)}</td>
              <td>{limit(u.idleTimeout, duration)}</td>
              <td>{limit(u.allowedResourceGroups, (g) => g.join(", "))}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>Project policies</h2>
      {p.projects.length === 0 ? (
        <p class="empty">No project policies.</p>
      ) : (
        <table class="compact">
          <thead>
            <tr>
              <th>Project</th>
              <th>Slots</th>
              <th>Lifetime</th>
              <th>Idle</th>
              <th>Groups</th>
              <th>Drivers</th>
            </tr>
          </thead>
          <tbody>
            {p.projects.map((x) => (
              <tr>
                <td>{x.project}</td>
                <td>{limit(x.totalResourceSlots, resources)}</td>
                <td>{limit(x.maxSessionLifetime, duration)}</td>
                <td>{limit(x.idleTimeout, duration)}</td>
                <td>{limit(x.allowedResourceGroups, (g) => g.join(", "))}</td>
                <td>{limit(x.allowedDrivers, (d) => d.join(", "))}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <p class="muted">The effective idle policy of a session is shown on its page.</p>
    </>
  );
}

export function AdminPage({ section, viewer }) {
  const tabs = [
    ["groups", "Resource groups"],
    ["users", "Users and tokens"],
    ["policies", "Presets and policies"],
    ["environments", "Environments"],
  ];
  const current = section.replace(/^\//, "") || "groups";
  return (
    <section aria-labelledby="admin-title">
      <h1 id="admin-title">Administration</h1>
      <nav class="tabs" aria-label="Administration">
        {tabs.map(([k, label]) => (
          <Link to={`/admin/${k}`} aria-current={current === k ? "page" : undefined}>
            {label}
          </Link>
        ))}
      </nav>
      {current === "users" ? (
        <Users />
      ) : current === "policies" ? (
        <Policies />
      ) : current === "environments" ? (
        <Environments viewer={viewer} />
      ) : (
        <Groups />
      )}
    </section>
  );
}
