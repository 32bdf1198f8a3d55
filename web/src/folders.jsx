// Storage folders: the ones the viewer sees with their usage against the quotas; create, rename, trash and restore,
// share (folder_sharing.jsx); a folder's files (folder_files.jsx); SFTP access to chosen folders (folder_sftp.jsx).
// Its own chunk with those three (main.jsx loads it lazily).
import { useEffect, useState } from "preact/hooks";
import { gql } from "./api.js";
import { localTime, bytes, StatusBadge, ErrorBox, FieldError, aboutField } from "./util.jsx";
import { Sharing } from "./folder_sharing.jsx";
import { FileBrowser } from "./folder_files.jsx";
import { SftpAccess } from "./folder_sftp.jsx";

const FIELDS = `id name ownerId project status statusInfo myMode usageBytes nodeId createdAt trashedAt purgeAt
  sharedWithUsers { userId mode } sharedWithProjects { project mode }`;
const LIST = `{ folders { ${FIELDS} } folderUsage { folders maxFolders bytes maxBytes } }`;
const CREATE = `mutation Create($input: CreateFolderInput!) { createFolder(input: $input) { ${FIELDS} } }`;
const RENAME = `mutation Rename($id: ID!, $name: String!) { renameFolder(id: $id, name: $name) { ${FIELDS} } }`;
const TRASH = `mutation Trash($id: ID!) { deleteFolder(id: $id) { ${FIELDS} } }`;
const RESTORE = `mutation Restore($id: ID!) { restoreFolder(id: $id) { ${FIELDS} } }`;
const BUSY = new Set(["CREATING", "PURGING"]);

export default function FoldersPage({ viewer }) {
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const [open, setOpen] = useState(null);
  const load = () =>
    gql(LIST)
      .then((d) => {
        setData(d);
        setError(null);
      })
      .catch(setError);
  useEffect(() => {
    load();
  }, []);
  // CREATING turns READY (and PURGING goes) when the scheduler has acted: read again until nothing is in between
  const waiting = data && data.folders.some((f) => BUSY.has(f.status));
  useEffect(() => {
    if (!waiting) return undefined;
    const id = setTimeout(load, 1000);
    return () => clearTimeout(id);
  }, [data]);
  const folder = data && open && data.folders.find((f) => f.id === open);
  const changed = () => load();
  return (
    <section aria-labelledby="folders-title">
      <h1 id="folders-title">Storage folders</h1>
      {error && <ErrorBox error={error} />}
      {!data && !error && <p class="loading">Loading folders…</p>}
      {data && <Usage usage={data.folderUsage} />}
      <CreateFolder
        viewer={viewer}
        onCreated={(f) => {
          setOpen(f.id);
          load();
        }}
      />
      {data &&
        (data.folders.length === 0 ? (
          <p class="empty" id="no-folders">
            No folders yet: create one above.
          </p>
        ) : (
          <FolderTable folders={data.folders} open={open} onOpen={setOpen} />
        ))}
      {folder && <FolderCard key={folder.id} folder={folder} viewer={viewer} onChanged={changed} />}
      {data && <SftpAccess folders={data.folders.filter((f) => f.status === "READY")} />}
    </section>
  );
}

function Usage({ usage }) {
  return (
    <div class="card" id="folder-usage" aria-label="Usage against quotas">
      <div class="bar-row">
        <span>Folders</span>
        <meter
          class="bar"
          min="0"
          max={usage.maxFolders || 1}
          value={usage.folders}
          aria-label="folders against the quota"
        />
        <span class="small">
          {usage.folders} / {usage.maxFolders}
        </span>
      </div>
      <div class="bar-row">
        <span>Bytes</span>
        <meter
          class="bar"
          min="0"
          max={Number(usage.maxBytes) || 1}
          value={Number(usage.bytes)}
          aria-label="bytes against the quota"
        />
        <span class="small" id="usage-bytes">
          {bytes(usage.bytes)} / {bytes(usage.maxBytes)}
        </span>
      </div>
    </div>
  );
}

function CreateFolder({ viewer, onCreated }) {
  const [name, setName] = useState("");
  const [project, setProject] = useState(viewer.projects[0] || "");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  async function submit(e) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const input = { name: name.trim(), ...(project ? { project } : {}) };
      onCreated((await gql(CREATE, { input })).createFolder);
      setName("");
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy(false);
    }
  }
  return (
    <form class="inline card" onSubmit={submit} aria-label="Create a folder" noValidate>
      <div class="field">
        <label for="f-folder-name">New folder's name</label>
        <input
          id="f-folder-name"
          value={name}
          onInput={(e) => setName(e.currentTarget.value)}
          aria-invalid={aboutField(error, ["name"])}
          aria-describedby="hint-folder-name"
        />
        <small class="hint" id="hint-folder-name">
          1-64 of letters, digits, '_', '.', '-'
        </small>
        <FieldError error={error} field="name" id="folder-name" />
      </div>
      {viewer.projects.length > 1 && (
        <div class="field">
          <label for="f-folder-project">Project</label>
          <select id="f-folder-project" value={project} onChange={(e) => setProject(e.currentTarget.value)}>
            {viewer.projects.map((p) => (
              <option>{p}</option>
            ))}
          </select>
          <FieldError error={error} field="project" id="folder-project" />
        </div>
      )}
      <button type="submit" id="create-folder" disabled={busy}>
        {busy ? "Creating…" : "Create folder"}
      </button>
      {error && !aboutField(error, ["name", "project"]) && <ErrorBox error={error} />}
    </form>
  );
}

const shares = (f) =>
  [
    ...f.sharedWithUsers.map((s) => `${s.userId} ${s.mode}`),
    ...f.sharedWithProjects.map((s) => `project ${s.project} ${s.mode}`),
  ].join(", ");

function FolderTable({ folders, open, onOpen }) {
  return (
    <div class="table-wrap">
      <table id="folders">
        <thead>
          <tr>
            <th>Name</th>
            <th>Status</th>
            <th>My mode</th>
            <th>Usage</th>
            <th>Owner</th>
            <th>Shares</th>
            <th>Created</th>
          </tr>
        </thead>
        <tbody>
          {folders.map((f) => (
            <tr data-folder={f.name} data-id={f.id} aria-selected={open === f.id}>
              <td>
                <button
                  type="button"
                  class="secondary"
                  onClick={() => onOpen(f.id)}
                  aria-pressed={open === f.id}
                  aria-label={`Open folder ${f.name}`}
                >
                  {f.name}
                </button>
              </td>
              <td>
                <StatusBadge status={f.status} />
                {f.status === "TRASHED" && <span class="small muted"> purged {localTime(f.purgeAt)}</span>}
                {f.statusInfo && <div class="small muted">{f.statusInfo}</div>}
              </td>
              <td data-mode={f.myMode}>{f.myMode}</td>
              <td>{bytes(f.usageBytes)}</td>
              <td>
                {f.ownerId} <span class="muted small">({f.project})</span>
              </td>
              <td class="small">{shares(f) || <span class="muted">—</span>}</td>
              <td class="small">{localTime(f.createdAt)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** One folder: rename, trash or restore, share, and its files. */
function FolderCard({ folder, viewer, onChanged }) {
  const owner = folder.ownerId === viewer.id || viewer.role !== "USER";
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  async function act(query, variables) {
    setBusy(true);
    setError(null);
    try {
      await gql(query, variables);
      onChanged();
      return true;
    } catch (exc) {
      setError(exc);
      return false;
    } finally {
      setBusy(false);
    }
  }
  return (
    <section
      class="card"
      id="folder-card"
      aria-label={`Folder ${folder.name}`}
      data-id={folder.id}
      data-status={folder.status}
    >
      <h2>
        {folder.name} <StatusBadge status={folder.status} /> <span class="badge">{folder.myMode}</span>
      </h2>
      {folder.status === "TRASHED" && (
        <p id="trashed-note">
          In the trash since {localTime(folder.trashedAt)}; its data is deleted for good at{" "}
          <strong id="purge-at">{localTime(folder.purgeAt)}</strong> unless restored.
        </p>
      )}
      {owner && (
        <RenameForm
          folder={folder}
          busy={busy}
          error={error}
          onRename={(name) => act(RENAME, { id: folder.id, name })}
        />
      )}
      {owner && (
        <div class="toolbar">
          {folder.status === "TRASHED" ? (
            <button type="button" id="restore-folder" disabled={busy} onClick={() => act(RESTORE, { id: folder.id })}>
              Restore
            </button>
          ) : (
            folder.status !== "PURGING" && (
              <button
                type="button"
                class="danger"
                id="trash-folder"
                disabled={busy}
                onClick={() => act(TRASH, { id: folder.id })}
              >
                Move to trash
              </button>
            )
          )}
        </div>
      )}
      {error && !aboutField(error, ["name"]) && <ErrorBox error={error} />}
      {owner && folder.status !== "TRASHED" && folder.status !== "PURGING" && (
        <Sharing folder={folder} onChanged={onChanged} />
      )}
      {folder.status === "READY" && <FileBrowser folder={folder} onChanged={onChanged} />}
      {folder.status === "CREATING" && <p class="loading">The folder's volume is being made…</p>}
    </section>
  );
}

function RenameForm({ folder, busy, error, onRename }) {
  const [name, setName] = useState(folder.name);
  return (
    <form
      class="inline"
      aria-label="Rename the folder"
      noValidate
      onSubmit={(e) => {
        e.preventDefault();
        onRename(name.trim());
      }}
    >
      <div class="field">
        <label for="f-rename-folder">Name</label>
        <input
          id="f-rename-folder"
          value={name}
          onInput={(e) => setName(e.currentTarget.value)}
          aria-invalid={aboutField(error, ["name"])}
        />
        <FieldError error={error} field="name" id="rename-folder" />
      </div>
      <button
        type="submit"
        class="secondary"
        id="rename-folder"
        disabled={busy || !name.trim() || name.trim() === folder.name}
      >
        Rename
      </button>
    </form>
  );
}
