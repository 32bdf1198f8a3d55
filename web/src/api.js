// The one client of the public API: GraphQL over HTTP (queries, mutations) and graphql-transport-ws (subscriptions).
// The token lives in sessionStorage only: never in a URL, gone when the tab closes.
import { createClient } from "graphql-ws";

const TOKEN_KEY = "caravan.token";
export const getToken = () => sessionStorage.getItem(TOKEN_KEY);
export const setToken = (t) => sessionStorage.setItem(TOKEN_KEY, t);
export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  if (wsClient) wsClient.stop();
  wsClient = null;
  connections = 0;
}

/** An API error: message, extensions.code and the input field it is about (extensions.field), when the API names one. */
export class ApiError extends Error {
  constructor(message, code, field, errors) {
    super(message);
    this.code = code || "ERROR";
    this.field = field || null;
    this.errors = errors || [];
  }
}

function toError(errors) {
  const first = errors[0] || {};
  const ext = first.extensions || {};
  return new ApiError(first.message || "request failed", ext.code, ext.field, errors);
}

export async function gql(query, variables = {}, token = getToken()) {
  let response;
  try {
    response = await fetch("/graphql", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/json",
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
      body: JSON.stringify({ query, variables }),
    });
  } catch (exc) {
    throw new ApiError(`the gateway is unreachable (${exc.message})`, "UNREACHABLE");
  }
  let body;
  try {
    body = await response.json();
  } catch {
    throw new ApiError(`the gateway answered ${response.status} without JSON`, "BAD_RESPONSE");
  }
  if (body.errors && body.errors.length) throw toError(body.errors);
  return body.data;
}

let wsClient = null;
let connections = 0;
const reconnected = new Set();
/** Call `fn` each time the subscriptions' connection comes back after a loss; returns the function that stops it. */
export function onReconnect(fn) {
  reconnected.add(fn);
  return () => reconnected.delete(fn);
}
function ws() {
  if (!wsClient) {
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/graphql`;
    // A socket closed while it still connects makes the browser log an error ("closed before the connection is
    // established"): `stop` (sign-out) waits for it to open or fail, then disposes of the client.
    let connecting = false;
    let stopping = false;
    const client = createClient({
      url,
      connectionParams: () => ({ authorization: `Bearer ${getToken()}` }),
      retryAttempts: 1000,
      shouldRetry: () => !stopping,
      lazy: true,
      on: {
        connecting: () => {
          connecting = true;
        },
        opened: () => {
          connecting = false;
          if (stopping) client.dispose();
        },
        closed: () => {
          connecting = false;
          if (stopping) client.dispose();
        },
        connected: () => {
          if (connections++ > 0) reconnected.forEach((fn) => fn()); // events may have been missed meanwhile
        },
      },
    });
    client.stop = () => {
      stopping = true;
      if (!connecting) client.dispose();
    };
    wsClient = client;
  }
  return wsClient;
}

/** Subscribe; returns the unsubscribe function. onNext(data), onError(ApiError), onDone(). */
export function subscribe(query, variables, { onNext, onError, onDone }) {
  return ws().subscribe(
    { query, variables },
    {
      next: (result) => (result.errors ? onError && onError(toError(result.errors)) : onNext(result.data)),
      error: (err) => {
        if (!onError) return;
        if (Array.isArray(err)) onError(toError(err));
        else
          onError(
            new ApiError(
              err && err.reason ? err.reason : String(err && err.message ? err.message : err),
              "SUBSCRIPTION",
            ),
          );
      },
      complete: () => onDone && onDone(),
    },
  );
}

// -- a storage folder's files (the gateway's file API, /folders/<id>/files): the token in the Authorization header,
// never in a URL; errors are JSON {"error": {code, message, field}} and become ApiError like GraphQL's.

const PIECE = 8 << 20;
/** Bytes an upload sends per request: each piece after the first appends at the file's size (`offset`), so a broken
 * connection costs at most one piece, and the upload resumes where the file ends. */

const filesUrl = (folder, verb, params) =>
  `/folders/${encodeURIComponent(folder)}/files${verb ? `/${verb}` : ""}?${new URLSearchParams(params)}`;
const auth = () => ({ authorization: `Bearer ${getToken()}` });

async function fileError(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    /* not JSON */
  }
  const e = (body && body.error) || {};
  return new ApiError(
    e.message || `the gateway answered ${response.status}`,
    e.code || `HTTP_${response.status}`,
    e.field,
  );
}

async function filesCall(method, folder, verb, params) {
  let response;
  try {
    response = await fetch(filesUrl(folder, verb, params), { method, headers: auth() });
  } catch (exc) {
    throw new ApiError(`the gateway is unreachable (${exc.message})`, "UNREACHABLE");
  }
  if (!response.ok) throw await fileError(response);
  return response;
}

export const files = {
  /** A directory's entries: [{name, type: file|dir|link, size (bytes), modified (epoch seconds)}]. */
  list: async (folder, path) => (await (await filesCall("GET", folder, "", { path })).json()).entries,
  mkdir: (folder, path) => filesCall("POST", folder, "mkdir", { path }),
  move: (folder, from, to) => filesCall("POST", folder, "move", { from, to }),
  remove: (folder, path) => filesCall("DELETE", folder, "", { path }),
  /** A single-use link (valid a minute) that downloads the file without the token: the browser streams it to disk,
   * the page holds none of it, and no token appears in a URL. */
  link: async (folder, path) => (await (await filesCall("POST", folder, "link", { path })).json()).url,
  /** Upload `file` to `path` in pieces; onProgress(sentBytes, totalBytes). A piece that fails on the network is sent
   * again from the size the file has (up to 3 times); an API refusal (quota, RO share) stops the upload. */
  upload: async (folder, path, file, onProgress) => {
    let sent = 0,
      retries = 0;
    onProgress(0, file.size);
    do {
      const piece = file.slice(sent, Math.min(file.size, sent + PIECE));
      try {
        // the first piece replaces the file (or makes it), the next ones append at its size
        await putPiece(filesUrl(folder, "", sent === 0 ? { path } : { path, offset: sent }), piece, (n) =>
          onProgress(sent + n, file.size),
        );
        sent += piece.size;
        retries = 0;
        onProgress(sent, file.size);
      } catch (exc) {
        if (exc.code !== "UNREACHABLE" || sent === 0 || ++retries > 3) throw exc;
        const dir = path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : "";
        const name = path.slice(path.lastIndexOf("/") + 1);
        const there = (await files.list(folder, dir)).find((e) => e.name === name);
        sent = there ? there.size : 0; // resume where the file ends
      }
    } while (sent < file.size);
  },
};

/** One PUT by XMLHttpRequest, the one browser API that reports an upload's progress. */
function putPiece(url, body, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", url);
    xhr.setRequestHeader("authorization", `Bearer ${getToken()}`);
    xhr.upload.onprogress = (e) => onProgress(e.loaded);
    xhr.onerror = () => reject(new ApiError("the upload's connection broke", "UNREACHABLE"));
    xhr.onload = () => {
      if (xhr.status < 300) return resolve();
      let e = {};
      try {
        e = JSON.parse(xhr.responseText).error || {};
      } catch {
        /* not JSON */
      }
      reject(new ApiError(e.message || `the gateway answered ${xhr.status}`, e.code || `HTTP_${xhr.status}`, e.field));
    };
    xhr.send(body);
  });
}

/** Usage as CSV (`/usage.csv`: the same report as the `usage` query), as a Blob; a refusal as an ApiError. */
export async function usageCsv(params) {
  let response;
  try {
    response = await fetch(`/usage.csv?${new URLSearchParams(params)}`, { headers: auth() });
  } catch (exc) {
    throw new ApiError(`the gateway is unreachable (${exc.message})`, "UNREACHABLE");
  }
  if (!response.ok) throw await fileError(response);
  return response.blob();
}
