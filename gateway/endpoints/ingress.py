"""The inference endpoints' part of HAProxy's configuration (``gateway.apps.ingress_config`` calls in here: its
frontend's endpoint rules, the pool of backends, the activator's listener), and the files it reads.

Per request, HAProxy alone decides (no Python on the way once an endpoint has a routable replica):

1. the ``Host`` is an endpoint's (``domain.endpoint_routes.host_pattern``); until the endpoint control plane marked a
   complete build (``endpoint_meta.map``) and the apps' one did too (``meta.map``: the user maps step 2 reads), 503
   (a restarted HAProxy lets no one in, and refuses no valid token);
2. ``endpoints.map`` gives owner, project, public flag and backend; a bearer token is hashed and looked up in
   ``endpoint_tokens.map`` (``host|hash``: an endpoint token of this endpoint) and in the apps' ``tokens.map`` (an
   API token: its user passes as the apps' rule says, owner, project admin, superadmin). A refusal waits once
   (``lua.await_control``, as the apps do) so a token issued a moment ago passes. No credential: 401; unknown
   endpoint or not the user's: 404;
3. a body over ``CARAVAN_ENDPOINT_MAX_BODY`` by its ``Content-Length``: 413 at once; a chunked one is counted as it
   streams through (a Lua filter on each endpoint backend, :data:`LUA`'s ``ep_body_cap``) and cut with 413 at the
   first byte over (the replica sees its request aborted); over ``CARAVAN_ENDPOINT_RATE_LIMIT``
   requests/s for its token (or client address, without one): 429 with ``Retry-After: 1`` (stick table
   ``endpoint_rate``); a WebSocket is kept in a table with who opened it, with which token (:data:`WS_TABLE`): the
   endpoint control plane closes it when that stops passing;
4. ``use_backend`` the endpoint's: ``leastconn`` over its routable replicas (server slots the control plane fills),
   upstream keep-alive, an idempotent request that fails before an answer (refused, reset, empty) retried on another
   replica, the rest 502 with the typed JSON body. With no replica in service the backup server takes the request:
   the activator's unix socket, a listener that marks it (a header carrying a secret only HAProxy and the gateway
   know) and hands it to the gateway (``gateway.endpoints.activator``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from core.settings import EndpointSettings
from domain.app_routes import FIELD
from domain.endpoint_routes import ENDPOINT_MAPS, backend_name, host_pattern, server_names

META_MAP = "endpoint_meta"
RATE_TABLE = "endpoint_rate"
WS_TABLE = "endpoint_websockets"
ACTIVATOR_HEADER = "x-caravan-activator"
ACTIVATOR_BACKEND = "endpoint_activator"
"""HAProxy's backend from the activator's listener to the gateways (the same servers as its ``gateway`` backend)."""
SERVER_CHECKS = "check inter 1s rise 1 fall 2 observe layer4 error-limit 1 on-error mark-down"
"""A replica that refuses a connection is out at once (``leastconn`` would otherwise send the retry back to it: a
dead replica has the fewest connections); a TCP check every second brings it back once it listens. The control plane
declares a replica up when it puts it in (its Nomad check passed)."""
IDEMPOTENT = ("GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE")
"""RFC 9110 9.2.2: what may be sent twice (retried on another replica when the first failed before answering)."""


LATENCY_COMMAND = "caravan latencies"
"""Runtime API command (registered by :data:`LUA`): each endpoint backend's response times since the last call."""
MAX_SAMPLES = 4096
"""Response times kept per backend between two reads (the control plane reads every second)."""
LUA = """
-- Each endpoint request's time to its response's headers (ms), per backend, until the control plane reads them.
local samples = {}

core.register_action("ep_start", { "http-req" }, function(txn)
    local now = core.now()
    txn:set_priv(now.sec * 1000 + now.usec / 1000)
end)

core.register_action("ep_done", { "http-res" }, function(txn)
    local start = txn:get_priv()
    if type(start) ~= "number" then return end
    local now = core.now()
    local name = txn.f:be_name()
    local ring = samples[name]
    if ring == nil then
        ring = {}
        samples[name] = ring
    end
    if #ring < MAX_SAMPLES then
        ring[#ring + 1] = now.sec * 1000 + now.usec / 1000 - start
    end
end)

-- A request body over MAX_BODY bytes, counted as it streams (chunked: no Content-Length to refuse it by), is cut: the
-- filter's error ends the request with HAProxy's 400, which the endpoint backends answer with their 413 file.
BodyCap = {}
BodyCap.id = "endpoint body cap"
BodyCap.flags = filter.FLT_CFG_FL_HTX
BodyCap.__index = BodyCap

function BodyCap:new()
    return setmetatable({ seen = 0 }, BodyCap)
end

function BodyCap:start_analyze(txn, chn)
    if not chn:is_resp() then filter.register_data_filter(self, chn) end
end

function BodyCap:http_payload(txn, msg)
    local n = msg:input()
    if self.seen + n > MAX_BODY then
        -- input() counts the end-of-message block too: the body's own bytes decide
        local body = msg:body(0, -1)
        if self.seen + (body and #body or 0) > MAX_BODY then
            error("request body over MAX_BODY bytes")
        end
    end
    self.seen = self.seen + msg:forward(n)
end

core.register_filter("ep_body_cap", BodyCap, function(class, args) return class end)

core.register_cli({ "caravan", "latencies" }, "endpoint response times since the last call", function(applet)
    local taken = samples
    samples = {}
    for name, ring in pairs(taken) do
        local parts = {}
        for i, ms in ipairs(ring) do parts[i] = string.format("%.1f", ms) end
        applet:send(name .. " " .. table.concat(parts, " ") .. "\\n")
    end
end)
"""


def activator_secret(cookie_key: str) -> str:
    """The value HAProxy's activator listener sets in :data:`ACTIVATOR_HEADER`: derived from the app cookie's key
    (a secret only HAProxy's 0600 configuration and the gateway hold)."""
    return hashlib.sha256(f"caravan-activator:{cookie_key}".encode()).hexdigest()


def activator_socket(state_dir: Path) -> Path:
    return state_dir / "activator.sock"


def map_path(state_dir: Path, name: str) -> Path:
    return state_dir / "maps" / f"{name}.map"


def _quoted(body: str) -> str:
    return body.replace("\\", "\\\\").replace('"', '\\"')


def _return(status: int, code: str, message: str, condition: str, extra: str = "") -> str:
    body = _quoted(f'{{"error": {{"code": "{code}", "message": "{message}"}}}}')
    return (
        f'    http-request return status {status} content-type application/json string "{body}"{extra} if {condition}'
    )


def _admission(state_dir: Path, when: str) -> list[str]:
    m = {name: map_path(state_dir, name) for name in (*ENDPOINT_MAPS, "tokens")}
    return [
        f"    http-request set-var(txn.info) var(txn.host),map({m['endpoints']}) if {when}",
        f"    http-request set-var(txn.owner) var(txn.info),field(1,'{FIELD}') if {when}",
        f"    http-request set-var(txn.project) var(txn.info),field(2,'{FIELD}') if {when}",
        f"    http-request set-var(txn.ep_backend) var(txn.info),field(4,'{FIELD}') if {when}",
        f"    http-request set-var(txn.token) http_auth_bearer,sha2(256),hex,lower if {when} bearer",
        f"    http-request set-var(txn.user) var(txn.token),map({m['tokens']}) if {when} bearer",
        f"    http-request set-var(txn.ep_grant) var(txn.host),concat('{FIELD}',txn.token),"
        f"map({m['endpoint_tokens']}) if {when} bearer",
    ]


def frontend_rules(settings: EndpointSettings, state_dir: Path, apps_domain: str) -> list[str]:
    """The frontend's rules for endpoint hosts (after the apps' ACLs, which they reuse: ``bearer``, ``public``,
    ``known``, ``has_user``, ``owner``, ``superadmin``, ``project_admin``); they end in ``use_backend``."""
    meta = map_path(state_dir, META_MAP)
    return [
        f"    http-request del-header {ACTIVATOR_HEADER}",  # only HAProxy's activator listener sets it
        f"    acl ep_host var(txn.host) -m reg ^{host_pattern(apps_domain)}$",
        "    http-request set-var(txn.ep) bool(1) if ep_host",
        "    acl ep var(txn.ep) -m bool",
        f"    acl ep_built str(generation),map({meta}) -m found",
        # both marks: the admission below reads the apps' user maps (tokens, roles, admins) as well as the endpoint
        # maps, and the apps' control plane rebuilds them on its own (bench/chaos: a valid API token answered 401 by
        # a restarted HAProxy whose endpoint maps were rebuilt before its tokens map)
        _return(
            503, "UNAVAILABLE", "the endpoint routes are being rebuilt: retry in a moment", "ep !ep_built || ep !built"
        ),
        *_admission(state_dir, "ep"),
        "    acl ep_grant var(txn.ep_grant) -m found",
        "    acl ep_user_ok var(txn.user) -m found",
        "    http-request set-var(txn.ep_refuse) bool(1) if ep !known",
        "    http-request set-var(txn.ep_refuse) bool(1) if ep !public !ep_grant !ep_user_ok",
        "    http-request set-var(txn.ep_refuse) bool(1) if ep !public !ep_grant !owner !superadmin !project_admin",
        "    acl ep_refuse var(txn.ep_refuse) -m bool",
        "    http-request lua.await_control if ep ep_refuse",
        "    http-request unset-var(txn.user) if ep ep_refuse",
        "    http-request unset-var(txn.ep_grant) if ep ep_refuse",
        *_admission(state_dir, "ep ep_refuse"),
        _return(
            401,
            "UNAUTHENTICATED",
            "send an endpoint token or your API token as 'Authorization: Bearer <token>'",
            "ep !public !ep_grant !ep_user_ok",
        ),
        _return(404, "NOT_FOUND", "no such endpoint", "ep !known"),
        _return(404, "NOT_FOUND", "no such endpoint", "ep !public !ep_grant !owner !superadmin !project_admin"),
        _return(
            413,
            "PAYLOAD_TOO_LARGE",
            f"the request body is over {settings.max_body} bytes",
            f"ep {{ req.hdr_val(content-length) gt {settings.max_body} }}",
        ),
        # who opened a WebSocket, with which token: the endpoint control plane closes it when that stops passing
        f'    http-request set-var-fmt(txn.ep_ws) "%ci:%cp{FIELD}%[var(txn.host)]{FIELD}%[var(txn.token)]{FIELD}'
        f'%[var(txn.user)]" if ep is_ws',
        f"    http-request track-sc0 var(txn.ep_ws) table {WS_TABLE} if ep is_ws",
        "    http-request set-var(txn.ep_rate) var(txn.token) if ep { var(txn.token) -m found }",
        "    http-request set-var(txn.ep_rate) src if ep !{ var(txn.token) -m found }",
        f"    http-request track-sc1 var(txn.ep_rate) table {RATE_TABLE} if ep",
        _return(
            429,
            "RATE_LIMITED",
            f"over {settings.rate_limit} requests per second for this token",
            f"ep {{ sc1_http_req_rate gt {settings.rate_limit} }}",
            " hdr retry-after 1",
        ),
        "    use_backend %[var(txn.ep_backend)] if ep",
    ]


Servers = Mapping[int, Mapping[str, str]]
"""Endpoint backend slot -> server slot name -> ``host:port`` (the replicas a new HAProxy starts with)."""


def server_lines(servers: Mapping[str, str]) -> list[str]:
    """One endpoint backend's server slots: those in ``servers`` ready at their replica, the others in maintenance
    until the control plane fills them."""
    return [
        f"    server {name} {servers[name]} {SERVER_CHECKS}" if name in servers
        else f"    server {name} 0.0.0.0:0 disabled {SERVER_CHECKS}"
        for name in server_names()
    ]  # fmt: skip


def sections(
    settings: EndpointSettings,
    state_dir: Path,
    gateway_servers: Sequence[str],
    cookie_key: str,
    error_502: Path,
    servers: Servers | None = None,
) -> list[str]:
    """The pool of endpoint backends (``servers``: the replicas they start with, ``gateway.planes.prefilled``), the
    activator's listener (to the gateways: ``gateway_servers``, the lines of HAProxy's gateway backend, whose slots
    the ingress fills in both backends), the rate table."""
    socket = activator_socket(state_dir)
    lines: list[str] = []
    for slot in range(settings.backends):
        lines += [
            f"backend {backend_name(slot)}",
            "    balance leastconn",
            "    http-reuse safe",
            # upstream connections stay open between requests (the defaults close them for apps and the gateway); one
            # a replica closed while idle is retried for an idempotent request (empty-response below)
            "    option http-keep-alive",
            "    option redispatch 1",
            "    retries 2",
            # a request is sent again only while HAProxy still holds it whole: it waits for a body up to its buffer
            # (tune.bufsize) before connecting; a bigger one streams, and is not retried
            "    option http-buffer-request",
            "    retry-on conn-failure empty-response junk-response",
            f"    http-request disable-l7-retry unless {{ method {' '.join(IDEMPOTENT)} }}",
            f"    errorfile 503 {error_502}",  # HAProxy's 503 here is no replica reachable after the retries
            # the body cap's cut (a filter's error is HAProxy's 400; a request malformed in its headers is refused in
            # the frontend, before any backend)
            f"    errorfile 400 {too_large_path(state_dir)}",
            "    filter lua.ep_body_cap",
            "    option forwardfor",
            "    http-request lua.ep_start",
            "    http-response lua.ep_done",
            "    http-request del-header authorization",
            "    http-request del-header forwarded",
            "    http-request del-header proxy-authorization",
            "    http-request set-header x-forwarded-proto http",
            "    http-request set-header x-forwarded-host %[req.fhdr(host)]",
            *server_lines((servers or {}).get(slot, {})),
            f"    server activator unix@{socket} backup",
        ]
    lines += [
        "frontend endpoint_activator",
        f"    bind unix@{socket} mode 600",
        f"    http-request set-header {ACTIVATOR_HEADER} {activator_secret(cookie_key)}",
        f"    default_backend {ACTIVATOR_BACKEND}",
        f"backend {ACTIVATOR_BACKEND}",
        "    timeout server 3600s",
        *gateway_servers,
        f"backend {RATE_TABLE}",
        "    stick-table type string len 80 size 200k expire 10m store http_req_rate(1s)",
        f"backend {WS_TABLE}",
        "    stick-table type string len 400 size 200k expire 1m store conn_cur",
    ]
    return lines


def lua_path(state_dir: Path) -> Path:
    return state_dir / "endpoints.lua"


def global_lines(state_dir: Path) -> list[str]:
    return [f"    lua-load {lua_path(state_dir)}"]


def too_large_path(state_dir: Path) -> Path:
    return state_dir / "errors" / "endpoint_413.http"


def _too_large(max_body: int) -> str:
    body = f'{{"error": {{"code": "PAYLOAD_TOO_LARGE", "message": "the request body is over {max_body} bytes"}}}}'
    return (
        "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncache-control: no-cache\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}"
    )


def write_files(
    state_dir: Path, settings: EndpointSettings, maps: Mapping[str, Mapping[str, str]] | None = None
) -> None:
    """The maps (empty: fail closed, no endpoint is known and none is marked built; or ``maps``' content,
    ``gateway.planes.prefilled``), the Lua of the latency recorder and the body cap, the body cap's answer
    (``state_dir/errors`` exists)."""
    for name in (*ENDPOINT_MAPS, META_MAP):
        content = (maps or {}).get(name, {})
        map_path(state_dir, name).write_text("".join(f"{key} {value}\n" for key, value in content.items()))
    lua = LUA.replace("MAX_SAMPLES", str(MAX_SAMPLES)).replace("MAX_BODY", str(settings.max_body))
    lua_path(state_dir).write_text(lua)
    lua_path(state_dir).chmod(0o600)
    too_large_path(state_dir).write_text(_too_large(settings.max_body))
