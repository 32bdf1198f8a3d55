// A folder's sharing: with whom it is shared and in which mode; share with a user or a project, unshare.
import { useState } from "preact/hooks";
import { gql } from "./api.js";
import { ErrorBox, FieldError, aboutField } from "./util.jsx";

const SHARE = `mutation Share($input: FolderShareInput!) { shareFolder(input: $input) { id } }`;
const UNSHARE = `mutation Unshare($folder: ID!, $user: String, $project: String) {
  unshareFolder(folder: $folder, user: $user, project: $project) { id } }`;

export function Sharing({ folder, onChanged }) {
  const [kind, setKind] = useState("user");
  const [whom, setWhom] = useState("");
  const [mode, setMode] = useState("RO");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  async function run(query, variables) {
    setBusy(true);
    setError(null);
    try {
      await gql(query, variables);
      onChanged();
      setWhom("");
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy(false);
    }
  }
  const share = (e) => {
    e.preventDefault();
    run(SHARE, { input: { folder: folder.id, [kind]: whom.trim(), mode } });
  };
  const list = [
    ...folder.sharedWithUsers.map((s) => ({ kind: "user", whom: s.userId, mode: s.mode })),
    ...folder.sharedWithProjects.map((s) => ({ kind: "project", whom: s.project, mode: s.mode })),
  ];
  return (
    <div class="sharing">
      <h3>Shared with</h3>
      {list.length === 0 ? (
        <p class="empty" id="no-shares">
          Nobody else.
        </p>
      ) : (
        <ul id="shares">
          {list.map((s) => (
            <li data-share={`${s.kind}:${s.whom}`}>
              {s.kind} <strong>{s.whom}</strong> <span class="badge">{s.mode}</span>{" "}
              <button
                type="button"
                class="secondary"
                disabled={busy}
                aria-label={`Stop sharing with ${s.kind} ${s.whom}`}
                onClick={() => run(UNSHARE, { folder: folder.id, [s.kind]: s.whom })}
              >
                Unshare
              </button>
            </li>
          ))}
        </ul>
      )}
      <form class="inline" aria-label="Share the folder" onSubmit={share} noValidate>
        <div class="field">
          <label for="f-share-kind">With a</label>
          <select id="f-share-kind" value={kind} onChange={(e) => setKind(e.currentTarget.value)}>
            <option value="user">user</option>
            <option value="project">project</option>
          </select>
        </div>
        <div class="field">
          <label for="f-share-whom">{kind === "user" ? "User id" : "Project"}</label>
          <input
            id="f-share-whom"
            value={whom}
            onInput={(e) => setWhom(e.currentTarget.value)}
            aria-invalid={aboutField(error, ["user", "project"])}
          />
          <FieldError error={error} field={["user", "project"]} id="share-whom" />
        </div>
        <div class="field">
          <label for="f-share-mode">Mode</label>
          <select id="f-share-mode" value={mode} onChange={(e) => setMode(e.currentTarget.value)}>
            <option value="RO">RO (read-only)</option>
            <option value="RW">RW (read-write)</option>
          </select>
          <FieldError error={error} field="mode" id="share-mode" />
        </div>
        <button type="submit" id="share-folder" disabled={busy || !whom.trim()}>
          Share
        </button>
      </form>
      {error && !aboutField(error, ["user", "project", "mode"]) && <ErrorBox error={error} />}
    </div>
  );
}
