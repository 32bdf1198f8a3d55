// The sessions page: one page of the Relay connection, kept live by the sessionEvents subscription (no polling).
import { useEffect, useRef, useState } from "preact/hooks";
import { gql, onReconnect, subscribe } from "./api.js";
import { Link, useNow, localTime, duration, resources, StatusBadge, ErrorBox, TERMINAL } from "./util.jsx";

const STATUSES = ["PENDING", "SCHEDULED", "PREPARING", "RUNNING", "TERMINATING", "TERMINATED", "CANCELLED", "ERROR"];
const TYPES = ["INTERACTIVE", "BATCH", "INFERENCE", "SYSTEM"];
const PAGE_SIZES = [25, 50, 100];

const LIST = `query Sessions($first: Int, $after: String, $last: Int, $before: String, $filter: SessionFilter) {
  sessions(first: $first, after: $after, last: $last, before: $before, filter: $filter) {
    totalCount
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    edges { node { id name type status statusInfo result createdAt terminatedAt ownerId project resourceGroup
      resources { slot amount } idleChecks { checkedAt checks { name remaining expired } } } }
  }
}`;
const EVENTS = `subscription { sessionEvents { eventId sessionId status reason detail at } }`;
const SESSION_EVENTS = `subscription One($id: ID!) { sessionEvents(sessionId: $id) { eventId sessionId status reason detail at } }`;
const DESTROY = `mutation Destroy($ids: [ID!]!) { destroySession(ids: $ids) { id status } }`;

/** Seconds until the soonest idle check ends the session, as of now; null when none counts down. */
export function idleLeft(session, now) {
  const idle = session.idleChecks;
  if (!idle) return null;
  const left = idle.checks
    .filter((c) => c.remaining != null)
    .map((c) => c.remaining - (now - Date.parse(idle.checkedAt)) / 1000);
  return left.length ? Math.max(0, Math.min(...left)) : null;
}

export function SessionsPage({ viewer }) {
  const [filter, setFilter] = useState({ status: "", type: "", search: "" });
  const [search, setSearch] = useState("");
  const [pageSize, setPageSize] = useState(50);
  const [cursor, setCursor] = useState({ first: 50 });
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const [selected, setSelected] = useState(new Set());
  const [busy, setBusy] = useState(false);
  const [live, setLive] = useState("connecting");
  const reload = useRef(() => {});
  const now = useNow();

  const variables = () => {
    const f = {};
    if (filter.status) f.statuses = [filter.status];
    if (filter.type) f.type = filter.type;
    if (filter.search) f.nameContains = filter.search;
    return { ...cursor, filter: f };
  };
  async function load() {
    try {
      const d = await gql(LIST, variables());
      setData(d.sessions);
      setError(null);
    } catch (exc) {
      setError(exc);
    }
  }
  reload.current = load;
  useEffect(() => {
    // the first page shown: a mark bench/ui reads (ms since the navigation started)
    if (data && !performance.getEntriesByName("caravan:sessions-rendered").length)
      performance.mark("caravan:sessions-rendered");
  }, [data]);
  useEffect(() => {
    load();
  }, [filter, cursor]);
  useEffect(() => {
    // search as you type, 250 ms after the last key
    const id = setTimeout(() => {
      if (search !== filter.search) {
        setFilter({ ...filter, search });
        setCursor({ first: pageSize });
      }
    }, 250);
    return () => clearTimeout(id);
  }, [search]);

  /** Apply one event to the row of its session; whether this page shows that session. */
  function apply(e) {
    let known = false;
    setData((d) => {
      if (!d) return d;
      const edges = d.edges.map((edge) => {
        if (edge.node.id !== e.sessionId) return edge;
        known = true;
        return {
          ...edge,
          node: {
            ...edge.node,
            status: e.status,
            statusInfo: e.reason,
            ...(TERMINAL.has(e.status) ? { terminatedAt: e.at } : {}),
          },
        };
      });
      return { ...d, edges };
    });
    return known;
  }
  useEffect(() => {
    // the viewer's own sessions: one subscription, which also announces new ones
    const stop = subscribe(
      EVENTS,
      {},
      {
        onNext: ({ sessionEvents: e }) => {
          setLive("live");
          if (!apply(e)) reload.current(); // a session this page does not show yet (a new one): read the page again
        },
        onError: (exc) => {
          setLive("error");
          setError(exc);
        },
      },
    );
    setLive("live");
    const stopReloading = onReconnect(() => {
      setLive("live");
      reload.current();
    }); // what changed while cut off
    return () => {
      stop();
      stopReloading();
    };
  }, []);
  // others' sessions an admin sees on this page: one subscription per live session (the API sends a viewer the
  // events of their own sessions only, and any session's by its id)
  const others = data
    ? data.edges
        .map((e) => e.node)
        .filter((s) => s.ownerId !== viewer.id && !TERMINAL.has(s.status))
        .map((s) => s.id)
        .sort()
        .join(",")
    : "";
  useEffect(() => {
    if (!others) return undefined;
    const stops = others
      .split(",")
      .map((id) =>
        subscribe(SESSION_EVENTS, { id }, { onNext: ({ sessionEvents: e }) => apply(e), onError: () => {} }),
      );
    return () => stops.forEach((stop) => stop());
  }, [others]);

  function toggle(id) {
    const next = new Set(selected);
    next.has(id) ? next.delete(id) : next.add(id);
    setSelected(next);
  }
  async function terminate() {
    if (!confirm(`Terminate ${selected.size} session(s)?`)) return;
    setBusy(true);
    try {
      await gql(DESTROY, { ids: [...selected] });
      setSelected(new Set());
      await load();
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy(false);
    }
  }
  const edges = data ? data.edges : [];
  const selectable = edges.filter((e) => !TERMINAL.has(e.node.status));
  const all = selectable.length > 0 && selectable.every((e) => selected.has(e.node.id));
  return (
    <section aria-labelledby="sessions-title">
      <div class="title-row">
        <h1 id="sessions-title">Sessions</h1>
        <span class={`live live-${live}`} aria-live="polite">
          {live === "live" ? "● live" : live}
        </span>
        <Link to="/launch" class="button">
          Launch a session
        </Link>
      </div>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="Filters">
        <label>
          Search{" "}
          <input
            type="search"
            id="search"
            placeholder="name contains…"
            value={search}
            onInput={(e) => setSearch(e.currentTarget.value)}
          />
        </label>
        <label>
          Status{" "}
          <select
            id="filter-status"
            value={filter.status}
            onChange={(e) => {
              setFilter({ ...filter, status: e.currentTarget.value });
              setCursor({ first: pageSize });
            }}
          >
            <option value="">any</option>
            {STATUSES.map((s) => (
              <option>{s}</option>
            ))}
          </select>
        </label>
        <label>
          Type{" "}
          <select
            id="filter-type"
            value={filter.type}
            onChange={(e) => {
              setFilter({ ...filter, type: e.currentTarget.value });
              setCursor({ first: pageSize });
            }}
          >
            <option value="">any</option>
            {TYPES.map((s) => (
              <option>{s}</option>
            ))}
          </select>
        </label>
        <label>
          Per page{" "}
          <select
            value={pageSize}
            aria-label="Sessions per page"
            onChange={(e) => {
              const n = +e.currentTarget.value;
              setPageSize(n);
              setCursor({ first: n });
            }}
          >
            {PAGE_SIZES.map((n) => (
              <option value={n}>{n}</option>
            ))}
          </select>
        </label>
        <button
          type="button"
          id="terminate-selected"
          class="danger"
          disabled={!selected.size || busy}
          onClick={terminate}
        >
          Terminate selected ({selected.size})
        </button>
      </form>
      <ErrorBox error={error} />
      {!data && !error && <p class="loading">Loading sessions…</p>}
      {data && edges.length === 0 && (
        <p class="empty" id="no-sessions">
          No sessions{filter.status || filter.type || filter.search ? " match these filters" : " yet"}.{" "}
          <Link to="/launch">Launch one</Link>.
        </p>
      )}
      {data && edges.length > 0 && (
        <div class="table-wrap">
          <table class="sessions" id="sessions-table" data-count={edges.length}>
            <thead>
              <tr>
                <th>
                  <input
                    type="checkbox"
                    aria-label="Select all on this page"
                    checked={all}
                    onChange={() => setSelected(all ? new Set() : new Set(selectable.map((e) => e.node.id)))}
                  />
                </th>
                <th>Name</th>
                <th>Status</th>
                <th>Type</th>
                <th>Resources</th>
                <th>Age</th>
                <th>Idle in</th>
                {viewer.role !== "USER" && <th>Owner</th>}
              </tr>
            </thead>
            <tbody>
              {edges.map(({ node: s }) => (
                <tr key={s.id} data-session={s.id} data-name={s.name}>
                  <td>
                    <input
                      type="checkbox"
                      aria-label={`Select ${s.name}`}
                      disabled={TERMINAL.has(s.status)}
                      checked={selected.has(s.id)}
                      onChange={() => toggle(s.id)}
                    />
                  </td>
                  <td>
                    <Link to={`/sessions/${s.id}`}>{s.name}</Link>
                  </td>
                  <td>
                    <StatusBadge status={s.status} />{" "}
                    {s.status === "TERMINATED" && s.result !== "UNDEFINED" && (
                      <span class={`result result-${s.result.toLowerCase()}`}>{s.result}</span>
                    )}
                    <div class="muted small">{s.statusInfo}</div>
                  </td>
                  <td>{s.type}</td>
                  <td class="small">{resources(s.resources)}</td>
                  <td title={localTime(s.createdAt)}>
                    {duration(((s.terminatedAt ? Date.parse(s.terminatedAt) : now) - Date.parse(s.createdAt)) / 1000)}
                  </td>
                  <td>{s.status === "RUNNING" ? duration(idleLeft(s, now)) : "—"}</td>
                  {viewer.role !== "USER" && <td>{s.ownerId}</td>}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {data && (
        <nav class="pager" aria-label="Pages">
          <span>{data.totalCount} session(s)</span>
          <button
            type="button"
            disabled={!data.pageInfo.hasPreviousPage}
            onClick={() => setCursor({ last: pageSize, before: data.pageInfo.startCursor })}
          >
            ← Newer
          </button>
          <button
            type="button"
            disabled={!data.pageInfo.hasNextPage}
            id="next-page"
            onClick={() => setCursor({ first: pageSize, after: data.pageInfo.endCursor })}
          >
            Older →
          </button>
        </nav>
      )}
    </section>
  );
}
