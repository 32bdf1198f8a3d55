// Storage folders: the ones the viewer sees with their usage against the quotas; create, rename, trash and restore,
// share; a folder's files through the gateway's file API (api.js `files`); SFTP access to chosen folders.
// Its own chunk (main.jsx loads it lazily).
import { useEffect, useRef, useState } from "preact/hooks";
import { gql, files, ApiError } from "./api.js";
import { Link, localTime, bytes, StatusBadge, ErrorBox, FieldError, aboutField } from "./util.jsx";

const FIELDS = `id name ownerId project status statusInfo myMode usageBytes nodeId createdAt trashedAt purgeAt
  sharedWithUsers { userId mode } sharedWithProjects { project mode }`;
const LIST = `{ folders { ${FIELDS} } folderUsage { folders maxFolders bytes maxBytes } }`;
const CREATE = `mutation Create($input: CreateFolderInput!) { createFolder(input: $input) { ${FIELDS} } }`;
const RENAME = `mutation Rename($id: ID!, $name: String!) { renameFolder(id: $id, name: $name) { ${FIELDS} } }`;
const TRASH = `mutation Trash($id: ID!) { deleteFolder(id: $id) { ${FIELDS} } }`;
const RESTORE = `mutation Restore($id: ID!) { restoreFolder(id: $id) { ${FIELDS} } }`;
const SHARE = `mutation Share($input: FolderShareInput!) { shareFolder(input: $input) { ${FIELDS} } }`;
const UNSHARE = `mutation Unshare($folder: ID!, $user: String, $project: String) {
  unshareFolder(folder: $folder, user: $user, project: $project) { ${FIELDS} } }`;
const SFTP = `mutation Sftp($input: RequestSftpInput!) { requestSftp(input: $input) { user port privateKey session { id } } }`;
const SFTP_SESSION = `query S($id: ID!) { session(id: $id) { id status statusInfo sftpAddress } }`;
const BUSY = new Set(["CREATING", "PURGING"]);

export default function FoldersPage({ viewer }) {
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const [open, setOpen] = useState(null);
  const load = () => gql(LIST).then((d) => { setData(d); setError(null); }).catch(setError);
  useEffect(() => { load(); }, []);
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
      <CreateFolder viewer={viewer} onCreated={(f) => { setOpen(f.id); load(); }} />
      {data && (data.folders.length === 0
        ? <p class="empty" id="no-folders">No folders yet: create one above.</p>
        : <FolderTable folders={data.folders} open={open} onOpen={setOpen} />)}
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
        <meter class="bar" min="0" max={usage.maxFolders || 1} value={usage.folders} aria-label="folders against the quota" />
        <span class="small">{usage.folders} / {usage.maxFolders}</span>
      </div>
      <div class="bar-row">
        <span>Bytes</span>
        <meter class="bar" min="0" max={Number(usage.maxBytes) || 1} value={Number(usage.bytes)} aria-label="bytes against the quota" />
        <span class="small" id="usage-bytes">{bytes(usage.bytes)} / {bytes(usage.maxBytes)}</span>
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
    setBusy(true); setError(null);
    try {
      const input = { name: name.trim(), ...(project ? { project } : {}) };
      onCreated((await gql(CREATE, { input })).createFolder);
      setName("");
    } catch (exc) { setError(exc); } finally { setBusy(false); }
  }
  return (
    <form class="inline card" onSubmit={submit} aria-label="Create a folder" noValidate>
      <div class="field">
        <label for="f-folder-name">New folder's name</label>
        <input id="f-folder-name" value={name} onInput={(e) => setName(e.currentTarget.value)}
          aria-invalid={aboutField(error, ["name"])} aria-describedby="hint-folder-name" />
        <small class="hint" id="hint-folder-name">1-64 of letters, digits, '_', '.', '-'</small>
        <FieldError error={error} field="name" id="folder-name" />
      </div>
      {viewer.projects.length > 1 && (
        <div class="field">
          <label for="f-folder-project">Project</label>
          <select id="f-folder-project" value={project} onChange={(e) => setProject(e.currentTarget.value)}>
            {viewer.projects.map((p) => <option>{p}</option>)}
          </select>
          <FieldError error={error} field="project" id="folder-project" />
        </div>
      )}
      <button type="submit" id="create-folder" disabled={busy}>{busy ? "Creating…" : "Create folder"}</button>
      {error && !aboutField(error, ["name", "project"]) && <ErrorBox error={error} />}
    </form>
  );
}

const shares = (f) => [...f.sharedWithUsers.map((s) => `${s.userId} ${s.mode}`),
  ...f.sharedWithProjects.map((s) => `project ${s.project} ${s.mode}`)].join(", ");

function FolderTable({ folders, open, onOpen }) {
  return (
    <div class="table-wrap">
      <table id="folders">
        <thead><tr><th>Name</th><th>Status</th><th>My mode</th><th>Usage</th><th>Owner</th><th>Shares</th><th>Created</th></tr></thead>
        <tbody>{folders.map((f) => (
          <tr data-folder={f.name} data-id={f.id} aria-selected={open === f.id}>
            <td><button type="button" class="secondary" onClick={() => onOpen(f.id)} aria-pressed={open === f.id}
              aria-label={`Open folder ${f.name}`}>{f.name}</button></td>
            <td><StatusBadge status={f.status} />{f.status === "TRASHED" && <span class="small muted"> purged {localTime(f.purgeAt)}</span>}
              {f.statusInfo && <div class="small muted">{f.statusInfo}</div>}</td>
            <td data-mode={f.myMode}>{f.myMode}</td>
            <td>{bytes(f.usageBytes)}</td>
            <td>{f.ownerId} <span class="muted small">({f.project})</span></td>
            <td class="small">{shares(f) || <span class="muted">—</span>}</td>
            <td class="small">{localTime(f.createdAt)}</td>
          </tr>
        ))}</tbody>
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
    setBusy(true); setError(null);
    try { await gql(query, variables); onChanged(); return true; } catch (exc) { setError(exc); return false; } finally { setBusy(false); }
  }
  return (
    <section class="card" id="folder-card" aria-label={`Folder ${folder.name}`} data-id={folder.id} data-status={folder.status}>
      <h2>{folder.name} <StatusBadge status={folder.status} /> <span class="badge">{folder.myMode}</span></h2>
      {folder.status === "TRASHED" && (
        <p id="trashed-note">In the trash since {localTime(folder.trashedAt)}; its data is deleted for good at{" "}
          <strong id="purge-at">{localTime(folder.purgeAt)}</strong> unless restored.</p>
      )}
      {owner && <RenameForm folder={folder} busy={busy} error={error}
        onRename={(name) => act(RENAME, { id: folder.id, name })} />}
      {owner && (
        <div class="toolbar">
          {folder.status === "TRASHED"
            ? <button type="button" id="restore-folder" disabled={busy} onClick={() => act(RESTORE, { id: folder.id })}>Restore</button>
            : folder.status !== "PURGING" && <button type="button" class="danger" id="trash-folder" disabled={busy}
              onClick={() => act(TRASH, { id: folder.id })}>Move to trash</button>}
        </div>
      )}
      {error && !aboutField(error, ["name"]) && <ErrorBox error={error} />}
      {owner && folder.status !== "TRASHED" && folder.status !== "PURGING" && <Sharing folder={folder} onChanged={onChanged} />}
      {folder.status === "READY" && <FileBrowser folder={folder} onChanged={onChanged} />}
      {folder.status === "CREATING" && <p class="loading">The folder's volume is being made…</p>}
    </section>
  );
}

function RenameForm({ folder, busy, error, onRename }) {
  const [name, setName] = useState(folder.name);
  return (
    <form class="inline" aria-label="Rename the folder" noValidate
      onSubmit={(e) => { e.preventDefault(); onRename(name.trim()); }}>
      <div class="field">
        <label for="f-rename-folder">Name</label>
        <input id="f-rename-folder" value={name} onInput={(e) => setName(e.currentTarget.value)}
          aria-invalid={aboutField(error, ["name"])} />
        <FieldError error={error} field="name" id="rename-folder" />
      </div>
      <button type="submit" class="secondary" id="rename-folder" disabled={busy || !name.trim() || name.trim() === folder.name}>Rename</button>
    </form>
  );
}

function Sharing({ folder, onChanged }) {
  const [kind, setKind] = useState("user");
  const [whom, setWhom] = useState("");
  const [mode, setMode] = useState("RO");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  async function run(query, variables) {
    setBusy(true); setError(null);
    try { await gql(query, variables); onChanged(); setWhom(""); } catch (exc) { setError(exc); } finally { setBusy(false); }
  }
  const share = (e) => { e.preventDefault(); run(SHARE, { input: { folder: folder.id, [kind]: whom.trim(), mode } }); };
  const list = [...folder.sharedWithUsers.map((s) => ({ kind: "user", whom: s.userId, mode: s.mode })),
    ...folder.sharedWithProjects.map((s) => ({ kind: "project", whom: s.project, mode: s.mode }))];
  return (
    <div class="sharing">
      <h3>Shared with</h3>
      {list.length === 0 ? <p class="empty" id="no-shares">Nobody else.</p> : (
        <ul id="shares">{list.map((s) => (
          <li data-share={`${s.kind}:${s.whom}`}>{s.kind} <strong>{s.whom}</strong> <span class="badge">{s.mode}</span>{" "}
            <button type="button" class="secondary" disabled={busy} aria-label={`Stop sharing with ${s.kind} ${s.whom}`}
              onClick={() => run(UNSHARE, { folder: folder.id, [s.kind]: s.whom })}>Unshare</button></li>
        ))}</ul>
      )}
      <form class="inline" aria-label="Share the folder" onSubmit={share} noValidate>
        <div class="field">
          <label for="f-share-kind">With a</label>
          <select id="f-share-kind" value={kind} onChange={(e) => setKind(e.currentTarget.value)}>
            <option value="user">user</option><option value="project">project</option>
          </select>
        </div>
        <div class="field">
          <label for="f-share-whom">{kind === "user" ? "User id" : "Project"}</label>
          <input id="f-share-whom" value={whom} onInput={(e) => setWhom(e.currentTarget.value)}
            aria-invalid={aboutField(error, ["user", "project"])} />
          <FieldError error={error} field={["user", "project"]} id="share-whom" />
        </div>
        <div class="field">
          <label for="f-share-mode">Mode</label>
          <select id="f-share-mode" value={mode} onChange={(e) => setMode(e.currentTarget.value)}>
            <option value="RO">RO (read-only)</option><option value="RW">RW (read-write)</option>
          </select>
          <FieldError error={error} field="mode" id="share-mode" />
        </div>
        <button type="submit" id="share-folder" disabled={busy || !whom.trim()}>Share</button>
      </form>
      {error && !aboutField(error, ["user", "project", "mode"]) && <ErrorBox error={error} />}
    </div>
  );
}

const join = (dir, name) => (dir ? `${dir}/${name}` : name);

/** Have the browser download `url` (same origin) as a file named `name`. */
function saveLink(url, name) {
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

function FileBrowser({ folder, onChanged }) {
  const rw = folder.myMode === "RW";
  const [dir, setDir] = useState("");
  const [entries, setEntries] = useState(null);
  const [error, setError] = useState(null);
  const [progress, setProgress] = useState(null);
  const [newDir, setNewDir] = useState("");
  const [moving, setMoving] = useState(null);
  const [target, setTarget] = useState("");
  const [done, setDone] = useState(null);
  const picker = useRef(null);
  const load = () => files.list(folder.id, dir).then((e) => { setEntries(e); }).catch(setError);
  useEffect(() => { setEntries(null); load(); }, [dir]);
  async function run(fn, message) {
    setError(null); setDone(null);
    try {
      await fn();
      await load();  // the listing as it is now, then the message: both tell the same state
      if (message) { setDone(message); onChanged(); }  // a write: the folder's usage changed
      return true;
    } catch (exc) { setError(exc); return false; }
  }
  async function upload(e) {
    const chosen = [...e.currentTarget.files];
    for (const file of chosen) {
      await run(async () => {
        setProgress({ name: file.name, sent: 0, total: file.size });
        try {
          await files.upload(folder.id, join(dir, file.name), file, (sent, total) => setProgress({ name: file.name, sent, total }));
        } finally { setProgress(null); }
      }, `Uploaded ${file.name}.`);
    }
    if (picker.current) picker.current.value = "";
  }
  const parts = dir ? dir.split("/") : [];
  return (
    <div class="files" id="file-browser" aria-label={`Files of ${folder.name}`}>
      <h3>Files</h3>
      <nav class="crumbs" aria-label="Folder path">
        <button type="button" class="secondary" onClick={() => setDir("")}>{folder.name}</button>
        {parts.map((p, i) => <> / <button type="button" class="secondary" onClick={() => setDir(parts.slice(0, i + 1).join("/"))}>{p}</button></>)}
      </nav>
      {rw ? (
        <div class="toolbar">
          <label for="upload-input">Upload files</label>
          <input type="file" id="upload-input" multiple ref={picker} onChange={upload} disabled={!!progress} />
          <form class="inline" aria-label="Make a directory" noValidate
            onSubmit={(e) => { e.preventDefault(); run(() => files.mkdir(folder.id, join(dir, newDir.trim())), `Made ${newDir.trim()}.`).then((ok) => ok && setNewDir("")); }}>
            <label for="f-mkdir">New directory</label>
            <input id="f-mkdir" value={newDir} onInput={(e) => setNewDir(e.currentTarget.value)} />
            <button type="submit" class="secondary" id="mkdir" disabled={!newDir.trim()}>Make</button>
          </form>
        </div>
      ) : <p class="hint" id="read-only">Read-only: this folder is shared with you RO.</p>}
      {progress && (
        <div role="status" id="upload-status">
          <label for="upload-progress">Uploading {progress.name}: {bytes(progress.sent)} of {bytes(progress.total)}</label>{" "}
          <progress id="upload-progress" max={progress.total || 1} value={progress.sent} />
        </div>
      )}
      {done && <p role="status" id="files-done">{done}</p>}
      {error && <ErrorBox error={error} />}
      {!entries && !error && <p class="loading">Loading files…</p>}
      {entries && entries.length === 0 && <p class="empty" id="no-files">This directory is empty.</p>}
      {entries && entries.length > 0 && (
        <table id="files">
          <thead><tr><th>Name</th><th>Size</th><th>Modified</th><th>Actions</th></tr></thead>
          <tbody>{entries.map((f) => (
            <tr data-file={f.name} data-type={f.type}>
              <td>{f.type === "dir"
                ? <button type="button" class="secondary" onClick={() => setDir(join(dir, f.name))} aria-label={`Open directory ${f.name}`}>{f.name}/</button>
                : f.name}</td>
              <td>{f.type === "dir" ? "—" : bytes(f.size)}</td>
              <td class="small">{localTime(new Date(f.modified * 1000).toISOString())}</td>
              <td><div class="toolbar">
                {f.type === "file" && <button type="button" class="secondary" aria-label={`Download ${f.name}`}
                  onClick={() => run(async () => saveLink(await files.link(folder.id, join(dir, f.name)), f.name), null)}>Download</button>}
                {rw && <button type="button" class="secondary" aria-label={`Move or rename ${f.name}`}
                  onClick={() => { setMoving(f.name); setTarget(join(dir, f.name)); }}>Move</button>}
                {rw && <button type="button" class="danger" aria-label={`Delete ${f.name}`}
                  onClick={() => confirm(`Delete ${f.name}${f.type === "dir" ? " and all it holds" : ""}?`) &&
                    run(() => files.remove(folder.id, join(dir, f.name)), `Deleted ${f.name}.`)}>Delete</button>}
              </div></td>
            </tr>
          ))}</tbody>
        </table>
      )}
      {moving && (
        <form class="inline" aria-label={`Move ${moving}`} noValidate onSubmit={(e) => {
          e.preventDefault();
          run(() => files.move(folder.id, join(dir, moving), target.trim()), `Moved ${moving} to ${target.trim()}.`)
            .then((ok) => ok && setMoving(null));
        }}>
          <label for="f-move-to">Move {moving} to (path in the folder)</label>
          <input id="f-move-to" value={target} onInput={(e) => setTarget(e.currentTarget.value)} />
          <button type="submit" id="move">Move</button>
          <button type="button" class="secondary" onClick={() => setMoving(null)}>Cancel</button>
        </form>
      )}
    </div>
  );
}

function SftpAccess({ folders }) {
  const [chosen, setChosen] = useState([]);
  const [publicKey, setPublicKey] = useState("");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const [access, setAccess] = useState(null);
  const [session, setSession] = useState(null);
  useEffect(() => {  // the address shows once the SFTP session runs
    if (!access || (session && (session.sftpAddress || ["ERROR", "TERMINATED", "CANCELLED"].includes(session.status)))) return undefined;
    const id = setTimeout(() => gql(SFTP_SESSION, { id: access.session.id }).then((d) => setSession(d.session)).catch(setError), session ? 1000 : 0);
    return () => clearTimeout(id);
  }, [access, session]);
  async function submit(e) {
    e.preventDefault();
    setBusy(true); setError(null); setAccess(null); setSession(null);
    try {
      const input = { folders: chosen, ...(publicKey.trim() ? { publicKey: publicKey.trim() } : {}) };
      setAccess((await gql(SFTP, { input })).requestSftp);
    } catch (exc) { setError(exc); } finally { setBusy(false); }
  }
  const toggle = (id) => setChosen(chosen.includes(id) ? chosen.filter((x) => x !== id) : [...chosen, id]);
  const [host, port] = session && session.sftpAddress ? session.sftpAddress.split(":") : [null, null];
  return (
    <section class="card" aria-labelledby="sftp-title" id="sftp">
      <h2 id="sftp-title">SFTP access</h2>
      {folders.length === 0 ? <p class="empty">No READY folder to serve.</p> : (
        <form onSubmit={submit} aria-label="Request SFTP access" noValidate>
          <fieldset class="plain"><legend>Folders (1-8; RO shares are served read-only)</legend>
            {folders.map((f) => (
              <label class="check"><input type="checkbox" checked={chosen.includes(f.id)} onChange={() => toggle(f.id)}
                data-sftp-folder={f.name} /> {f.name} <span class="muted small">{f.myMode}</span></label>
            ))}
            <FieldError error={error} field="folders" id="sftp-folders" />
          </fieldset>
          <div class="field">
            <label for="f-sftp-key">Your public key (optional)</label>
            <textarea id="f-sftp-key" rows="2" value={publicKey} onInput={(e) => setPublicKey(e.currentTarget.value)}
              placeholder="ssh-ed25519 AAAA… (left empty: a key pair is made for you)" aria-invalid={aboutField(error, ["publicKey"])} />
            <FieldError error={error} field="publicKey" id="sftp-key" />
          </div>
          <button type="submit" id="request-sftp" disabled={busy || chosen.length === 0}>{busy ? "Requesting…" : "Request SFTP access"}</button>
          {error && !aboutField(error, ["folders", "publicKey"]) && <ErrorBox error={error} />}
        </form>
      )}
      {access && (
        <div class="secret" id="sftp-access" role="status">
          <p>SFTP session <Link to={`/sessions/${access.session.id}`}>{access.session.id}</Link>:{" "}
            {session && session.sftpAddress
              ? <>connect to <code id="sftp-address">{session.sftpAddress}</code> as <code>{access.user}</code>
                {" "}(<code>sftp -i caravan-sftp.key -P {port} {access.user}@{host}</code>)</>
              : <span class="muted">starting{session ? ` (${session.status})` : ""}…</span>}</p>
          {access.privateKey && (
            <div id="sftp-private-key">
              <p><strong>Shown once:</strong> this private key is not stored anywhere; copy or download it now and keep it
                with mode 0600.</p>
              <label for="sftp-key-text">Private key</label>
              <textarea id="sftp-key-text" readonly rows="6" value={access.privateKey} />
              <div class="toolbar">
                <button type="button" class="secondary" onClick={() => navigator.clipboard.writeText(access.privateKey)
                  .catch(() => setError(new ApiError("the clipboard refused: select the key and copy it", "CLIPBOARD")))}>Copy</button>
                <button type="button" class="secondary" onClick={() => saveBlob(new Blob([access.privateKey], { type: "text/plain" }), "caravan-sftp.key")}>Download</button>
              </div>
            </div>
          )}
        </div>
      )}
    </section>
  );
}
