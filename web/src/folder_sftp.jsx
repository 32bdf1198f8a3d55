// SFTP access to chosen folders: requestSftp, the SFTP session's address once it runs, the key pair shown once.
import { useEffect, useState } from "preact/hooks";
import { gql, ApiError } from "./api.js";
import { Link, ErrorBox, FieldError, aboutField, saveBlob } from "./util.jsx";

const SFTP = `mutation Sftp($input: RequestSftpInput!) { requestSftp(input: $input) { user port privateKey session { id } } }`;
const SFTP_SESSION = `query S($id: ID!) { session(id: $id) { id status statusInfo sftpAddress } }`;

export function SftpAccess({ folders }) {
  const [chosen, setChosen] = useState([]);
  const [publicKey, setPublicKey] = useState("");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const [access, setAccess] = useState(null);
  const [session, setSession] = useState(null);
  useEffect(() => {
    // the address shows once the SFTP session runs
    if (!access || (session && (session.sftpAddress || ["ERROR", "TERMINATED", "CANCELLED"].includes(session.status))))
      return undefined;
    const id = setTimeout(
      () =>
        gql(SFTP_SESSION, { id: access.session.id })
          .then((d) => setSession(d.session))
          .catch(setError),
      session ? 1000 : 0,
    );
    return () => clearTimeout(id);
  }, [access, session]);
  async function submit(e) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    setAccess(null);
    setSession(null);
    try {
      const input = { folders: chosen, ...(publicKey.trim() ? { publicKey: publicKey.trim() } : {}) };
      setAccess((await gql(SFTP, { input })).requestSftp);
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy(false);
    }
  }
  const toggle = (id) => setChosen(chosen.includes(id) ? chosen.filter((x) => x !== id) : [...chosen, id]);
  const [host, port] = session && session.sftpAddress ? session.sftpAddress.split(":") : [null, null];
  return (
    <section class="card" aria-labelledby="sftp-title" id="sftp">
      <h2 id="sftp-title">SFTP access</h2>
      {folders.length === 0 ? (
        <p class="empty">No READY folder to serve.</p>
      ) : (
        <form onSubmit={submit} aria-label="Request SFTP access" noValidate>
          <fieldset class="plain">
            <legend>Folders (1-8; RO shares are served read-only)</legend>
            {folders.map((f) => (
              <label class="check">
                <input
                  type="checkbox"
                  checked={chosen.includes(f.id)}
                  onChange={() => toggle(f.id)}
                  data-sftp-folder={f.name}
                />{" "}
                {f.name} <span class="muted small">{f.myMode}</span>
              </label>
            ))}
            <FieldError error={error} field="folders" id="sftp-folders" />
          </fieldset>
          <div class="field">
            <label for="f-sftp-key">Your public key (optional)</label>
            <textarea
              id="f-sftp-key"
              rows="2"
              value={publicKey}
              onInput={(e) => setPublicKey(e.currentTarget.value)}
              placeholder="ssh-ed25519 AAAA… (left empty: a key pair is made for you)"
              aria-invalid={aboutField(error, ["publicKey"])}
            />
            <FieldError error={error} field="publicKey" id="sftp-key" />
          </div>
          <button type="submit" id="request-sftp" disabled={busy || chosen.length === 0}>
            {busy ? "Requesting…" : "Request SFTP access"}
          </button>
          {error && !aboutField(error, ["folders", "publicKey"]) && <ErrorBox error={error} />}
        </form>
      )}
      {access && (
        <div class="secret" id="sftp-access" role="status">
          <p>
            SFTP session <Link to={`/sessions/${access.session.id}`}>{access.session.id}</Link>:{" "}
            {session && session.sftpAddress ? (
              <>
                connect to <code id="sftp-address">{session.sftpAddress}</code> as <code>{access.user}</code> (
                <code>
                  sftp -i caravan-sftp.key -P {port} {access.user}@{host}
                </code>
                )
              </>
            ) : (
              <span class="muted">starting{session ? ` (${session.status})` : ""}…</span>
            )}
          </p>
          {access.privateKey && (
            <div id="sftp-private-key">
              <p>
                <strong>Shown once:</strong> this private key is not stored anywhere; copy or download it now and keep
                it with mode 0600.
              </p>
              <label for="sftp-key-text">Private key</label>
              <textarea id="sftp-key-text" readonly rows="6" value={access.privateKey} />
              <div class="toolbar">
                <button
                  type="button"
                  class="secondary"
                  onClick={() =>
                    navigator.clipboard
                      .writeText(access.privateKey)
                      .catch(() =>
                        setError(new ApiError("the clipboard refused: select the key and copy it", "CLIPBOARD")),
                      )
                  }
                >
                  Copy
                </button>
                <button
                  type="button"
                  class="secondary"
                  onClick={() => saveBlob(new Blob([access.privateKey], { type: "text/plain" }), "caravan-sftp.key")}
                >
                  Download
                </button>
              </div>
            </div>
          )}
        </div>
      )}
    </section>
  );
}
