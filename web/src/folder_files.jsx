// A folder's files through the gateway's file API (api.js `files`): browse, upload, download, make, move, delete.
import { useEffect, useRef, useState } from "preact/hooks";
import { files } from "./api.js";
import { localTime, bytes, ErrorBox, saveLink } from "./util.jsx";

const join = (dir, name) => (dir ? `${dir}/${name}` : name);

export function FileBrowser({ folder, onChanged }) {
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
  const load = () =>
    files
      .list(folder.id, dir)
      .then((e) => {
        setEntries(e);
      })
      .catch(setError);
  useEffect(() => {
    setEntries(null);
    load();
  }, [dir]);
  async function run(fn, message) {
    setError(null);
    setDone(null);
    try {
      await fn();
      await load(); // the listing as it is now, then the message: both tell the same state
      if (message) {
        setDone(message);
        onChanged();
      } // a write: the folder's usage changed
      return true;
    } catch (exc) {
      setError(exc);
      return false;
    }
  }
  async function upload(e) {
    const chosen = [...e.currentTarget.files];
    for (const file of chosen) {
      await run(async () => {
        setProgress({ name: file.name, sent: 0, total: file.size });
        try {
          await files.upload(folder.id, join(dir, file.name), file, (sent, total) =>
            setProgress({ name: file.name, sent, total }),
          );
        } finally {
          setProgress(null);
        }
      }, `Uploaded ${file.name}.`);
    }
    if (picker.current) picker.current.value = "";
  }
  const parts = dir ? dir.split("/") : [];
  return (
    <div class="files" id="file-browser" aria-label={`Files of ${folder.name}`}>
      <h3>Files</h3>
      <nav class="crumbs" aria-label="Folder path">
        <button type="button" class="secondary" onClick={() => setDir("")}>
          {folder.name}
        </button>
        {parts.map((p, i) => (
          <>
            {" "}
            /{" "}
            <button type="button" class="secondary" onClick={() => setDir(parts.slice(0, i + 1).join("/"))}>
              {p}
            </button>
          </>
        ))}
      </nav>
      {rw ? (
        <div class="toolbar">
          <label for="upload-input">Upload files</label>
          <input type="file" id="upload-input" multiple ref={picker} onChange={upload} disabled={!!progress} />
          <form
            class="inline"
            aria-label="Make a directory"
            noValidate
            onSubmit={(e) => {
              e.preventDefault();
              run(() => files.mkdir(folder.id, join(dir, newDir.trim())), `Made ${newDir.trim()}.`).then(
                (ok) => ok && setNewDir(""),
              );
            }}
          >
            <label for="f-mkdir">New directory</label>
            <input id="f-mkdir" value={newDir} onInput={(e) => setNewDir(e.currentTarget.value)} />
            <button type="submit" class="secondary" id="mkdir" disabled={!newDir.trim()}>
              Make
            </button>
          </form>
        </div>
      ) : (
        <p class="hint" id="read-only">
          Read-only: this folder is shared with you RO.
        </p>
      )}
      {progress && (
        <div role="status" id="upload-status">
          <label for="upload-progress">
            Uploading {progress.name}: {bytes(progress.sent)} of {bytes(progress.total)}
          </label>{" "}
          <progress id="upload-progress" max={progress.total || 1} value={progress.sent} />
        </div>
      )}
      {done && (
        <p role="status" id="files-done">
          {done}
        </p>
      )}
      {error && <ErrorBox error={error} />}
      {!entries && !error && <p class="loading">Loading files…</p>}
      {entries && entries.length === 0 && (
        <p class="empty" id="no-files">
          This directory is empty.
        </p>
      )}
      {entries && entries.length > 0 && (
        <table id="files">
          <thead>
            <tr>
              <th>Name</th>
              <th>Size</th>
              <th>Modified</th>
              <th>Actions</th>
            </tr>
          </thead>
          <tbody>
            {entries.map((f) => (
              <tr data-file={f.name} data-type={f.type}>
                <td>
                  {f.type === "dir" ? (
                    <button
                      type="button"
                      class="secondary"
                      onClick={() => setDir(join(dir, f.name))}
                      aria-label={`Open directory ${f.name}`}
                    >
                      {f.name}/
                    </button>
                  ) : (
                    f.name
                  )}
                </td>
                <td>{f.type === "dir" ? "—" : bytes(f.size)}</td>
                <td class="small">{localTime(new Date(f.modified * 1000).toISOString())}</td>
                <td>
                  <div class="toolbar">
                    {f.type === "file" && (
                      <button
                        type="button"
                        class="secondary"
                        aria-label={`Download ${f.name}`}
                        onClick={() =>
                          run(async () => saveLink(await files.link(folder.id, join(dir, f.name)), f.name), null)
                        }
                      >
                        Download
                      </button>
                    )}
                    {rw && (
                      <button
                        type="button"
                        class="secondary"
                        aria-label={`Move or rename ${f.name}`}
                        onClick={() => {
                          setMoving(f.name);
                          setTarget(join(dir, f.name));
                        }}
                      >
                        Move
                      </button>
                    )}
                    {rw && (
                      <button
                        type="button"
                        class="danger"
                        aria-label={`Delete ${f.name}`}
                        onClick={() =>
                          confirm(`Delete ${f.name}${f.type === "dir" ? " and all it holds" : ""}?`) &&
                          run(() => files.remove(folder.id, join(dir, f.name)), `Deleted ${f.name}.`)
                        }
                      >
                        Delete
                      </button>
                    )}
                  </div>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {moving && (
        <form
          class="inline"
          aria-label={`Move ${moving}`}
          noValidate
          onSubmit={(e) => {
            e.preventDefault();
            run(
              () => files.move(folder.id, join(dir, moving), target.trim()),
              `Moved ${moving} to ${target.trim()}.`,
            ).then((ok) => ok && setMoving(null));
          }}
        >
          <label for="f-move-to">Move {moving} to (path in the folder)</label>
          <input id="f-move-to" value={target} onInput={(e) => setTarget(e.currentTarget.value)} />
          <button type="submit" id="move">
            Move
          </button>
          <button type="button" class="secondary" onClick={() => setMoving(null)}>
            Cancel
          </button>
        </form>
      )}
    </div>
  );
}
