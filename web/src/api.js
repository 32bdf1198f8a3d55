// The one client of the public API: GraphQL over HTTP (queries, mutations) and graphql-transport-ws (subscriptions).
// The token lives in sessionStorage only: never in a URL, gone when the tab closes.
import { createClient } from "graphql-ws";

const TOKEN_KEY = "caravan.token";
export const getToken = () => sessionStorage.getItem(TOKEN_KEY);
export const setToken = (t) => sessionStorage.setItem(TOKEN_KEY, t);
export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  if (wsClient) wsClient.dispose();
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
      headers: { "content-type": "application/json", accept: "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
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
    wsClient = createClient({
      url,
      connectionParams: () => ({ authorization: `Bearer ${getToken()}` }),
      retryAttempts: 1000,
      shouldRetry: () => true,
      lazy: true,
      on: {
        connected: () => {
          if (connections++ > 0) reconnected.forEach((fn) => fn());  // events may have been missed meanwhile
        },
      },
    });
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
        else onError(new ApiError(err && err.reason ? err.reason : String(err && err.message ? err.message : err), "SUBSCRIPTION"));
      },
      complete: () => onDone && onDone(),
    },
  );
}
