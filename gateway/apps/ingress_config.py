"""The HAProxy in front of the apps (the data plane): its configuration, generated from settings, and the files it
reads. One module writes all of it; ``caravan.stack.haproxy`` starts HAProxy on it, ``gateway.apps.control`` fills
its maps through the runtime API.

HAProxy decides every app request itself, from maps the control plane keeps (no Python on the way):

- ``hosts.map``: app host -> ``<owner>|<project>|<public 0 or 1>``, for every proxied app of every live session;
- ``routes.map``: app host -> ``<address>:<port>``, the kernel's Nomad host port, from the allocation's placement
  on (``:starting`` appended until the session is RUNNING: ``domain.app_routes.upstream``);
- ``tokens.map``: SHA-256 (hex) of a valid API token -> its user id (active users only);
- ``roles.map``: user id -> ``SUPERADMIN`` (superadmins pass everywhere);
- ``admins.map``: ``<project>|<user id>`` -> 1 for each ADMIN of a project (they pass to its sessions' apps);
- ``meta.map``: ``generation`` -> the control plane's mark of the last complete build (a restarted HAProxy has none,
  and answers every app request 503 until it has).

Every map starts empty: a freshly (re)started HAProxy lets no one in (401/404 for everyone) until the control plane
rebuilt it from Redis. A credential is a bearer token (looked up by ``sha2(256)`` in ``tokens.map``) or the app
cookie, a JWT (HS256, the key in the secrets directory) whose claims bind it to the app's host (``h``), the token it
was launched with (``t``, looked up in ``tokens.map``: a revoked token's cookies die with it) and an expiry
(``exp``). The cookie counts only from the app's own origin: ``domain.apps.cookie_may_pass``, written out as ACLs
below (the same three steps). 401 without a valid credential (unless the app is public), 404 when its user may not
see the app (or there is no such app), 503 while the app has no port yet; each a JSON body.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.settings import EndpointSettings
from domain.app_routes import FIELD, FIELD_OF_ROUTE, STARTING
from domain.apps import APP_NAME_RULE, SEPARATOR, SESSION_ID_RULE
from gateway.endpoints import ingress as endpoint_ingress
from gateway.json_errors import error_body

COOKIE_NAME = "caravan_app"
"""The app cookie (the launch exchange sets it; HAProxy checks it; the app never sees it)."""
LAUNCH_PATH = "/.caravan/launch"
"""On an app origin: the gateway's launch exchange (the one app path HAProxy hands to the gateway)."""
MAPS = ("hosts", "routes", "tokens", "roles", "admins", "meta")
STATS_TABLE = "app_traffic"
"""Stick table of app traffic per host (the idle checker's network evidence, sampled by the control plane)."""
COUNTERS = "http_req_cnt,conn_cur,bytes_in_cnt,bytes_out_cnt"
ERRORS = {
    400: ("BAD_REQUEST", "the request is malformed"),
    403: ("FORBIDDEN", "refused"),
    408: ("REQUEST_TIMEOUT", "the request did not arrive in time"),
    500: ("INTERNAL", "the ingress failed"),
    502: ("UPSTREAM_UNREACHABLE", "the app could not be reached"),
    503: ("UNAVAILABLE", "the service is unavailable"),
    504: ("UPSTREAM_TIMEOUT", "the app did not answer in time"),
}
REASONS = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 500: "Internal Server Error",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}  # fmt: skip


LUA = """
-- Hop-by-hop headers named by Connection (RFC 9110 7.6.1) belong to one connection: dropped both ways.
local function named(value)
    local names = {}
    for token in string.gmatch(value or "", "[^,%s]+") do
        local name = string.lower(token)
        if name ~= "close" and name ~= "keep-alive" and name ~= "upgrade" then
            names[#names + 1] = name
        end
    end
    return names
end

core.register_action("await_control", { "http-req" }, function(txn)
    core.msleep(AWAIT_MS)
end)

-- Several app cookies (another app's page may toss in its own under the same name, Domain= the apps' parent
-- domain): the first whose signature holds and that names this host is the request's.
core.register_action("pick_cookie", { "http-req" }, function(txn)
    local host = txn:get_var("txn.host")
    local seen = 0
    for _, line in pairs(txn.http:req_get_headers()["cookie"] or {}) do
        for name, value in string.gmatch(line, "([^=;%s]+)=([^;]*)") do
            if name == "COOKIE_NAME" then
                seen = seen + 1
                if seen > MAX_CANDIDATES then return end
                local ok = txn.c:jwt_verify(value, "HS256", "COOKIE_KEY")
                if ok == 1 and txn.c:jwt_payload_query(value, "$.h") == host then
                    txn:set_var("txn.jwt", value)
                    return
                end
            end
        end
    end
end)

core.register_action("hop_by_hop_req", { "http-req" }, function(txn)
    for _, name in ipairs(named(txn.f:req_fhdr("connection"))) do
        txn.http:req_del_header(name)
    end
end)

core.register_action("hop_by_hop_res", { "http-res" }, function(txn)
    for _, name in ipairs(named(txn.f:res_fhdr("connection"))) do
        txn.http:res_del_header(name)
    end
end)
"""
MAX_COOKIE_CANDIDATES = 200
"""App cookies looked at per request (more than a browser keeps for one site: Chromium and Firefox keep 180)."""
WS_TABLE = "app_websockets"
"""Stick table of the apps' WebSockets HAProxy admitted, keyed ``<client addr:port>|<host>|<token hash>|<user>``
(``-`` for none): those with ``conn_cur`` 1 are open. The control plane reads it to close the ones that stop passing."""
AWAIT_MS = 100
"""Milliseconds a request about to be refused waits before it is decided again (the control plane applies a change
within milliseconds of its write to Redis): what was granted a moment ago passes; a refusal costs this much more (also
a damper on guessing)."""
CONNECT_TIMEOUT_MS = 100
"""Milliseconds HAProxy waits for the gateway to accept a connection before it tries again on a new socket."""
CONNECT_RETRIES = 30
"""Connect attempts to the gateway after the first before it counts as unreachable."""
APP_CONNECT_TIMEOUT_MS = 25
"""Milliseconds HAProxy waits for an app to accept a connection before it tries again on a new socket, and after an
app refused one (HAProxy 2.6 waits min(``timeout connect``, 1 s) between two connects to the same server): an app
still starting (Jupyter listens ~0.4 s after its container started; its route is in HAProxy from its allocation's
placement on) is reached within this much of listening."""
APP_CONNECT_RETRIES = 120
"""Connect attempts to an app after the first before it counts as unreachable (502 ``UPSTREAM_UNREACHABLE``): about
3 s of tries, as many as it takes a busy or starting app to catch up."""
STARTING_MESSAGE = "the session is still starting and its app is not listening yet: retry in a moment"
"""The ``APP_NOT_READY`` answer of a starting session's app that refused every connect (about 3 s of them)."""
PLAIN_CONNECTION = r"^\s*(keep-alive|close|upgrade)(\s*,\s*(keep-alive|close|upgrade))*\s*$"
"""A ``Connection`` header that names no other header (the usual case: no Lua runs)."""


SOCKET_PATH_MAX = 97
"""The longest unix socket path HAProxy 2.6 binds (it binds ``<path>.<pid>.tmp`` first, then renames it)."""


@dataclass(frozen=True)
class IngressPaths:
    """Where one HAProxy keeps its files: a state directory of its own (0700)."""

    state_dir: Path

    @property
    def config(self) -> Path:
        return self.state_dir / "haproxy.cfg"

    @property
    def socket(self) -> Path:
        """The runtime API (level admin) of the HAProxy serving now: a link to that HAProxy's own socket
        (:meth:`own_socket`), moved to the next one's once it answers. A unix socket 0600: never TCP, so no session
        can reach it."""
        return self.state_dir / "admin.sock"

    def own_socket(self, instance: str) -> Path:
        """One HAProxy's runtime API, ``api-<instance>``. Each has its own path: a new HAProxy given the old one's
        listeners (``-x``) would otherwise be given its runtime socket too, and the two would answer on one socket.
        With a six-character instance it is as long as :attr:`socket`'s: HAProxy takes a unix socket path of at most
        :data:`SOCKET_PATH_MAX` bytes."""
        return self.state_dir / f"api-{instance}"

    def own_sockets(self) -> list[Path]:
        return sorted(self.state_dir.glob("api-*"))

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "haproxy.pid"

    @property
    def lua(self) -> Path:
        return self.state_dir / "caravan.lua"

    def map(self, name: str) -> Path:
        return self.state_dir / "maps" / f"{name}.map"

    def error(self, status: int) -> Path:
        return self.state_dir / "errors" / f"{status}.http"

    @property
    def starting(self) -> Path:
        """The answer of a starting app that did not listen within HAProxy's connects (503 ``APP_NOT_READY``)."""
        return self.state_dir / "errors" / "503-starting.http"


@dataclass(frozen=True)
class IngressConfig:
    port: int
    """Where HAProxy listens (on ``bind``): the apps' origins and, for every other host, the gateway."""
    gateway_port: int
    """The gateway process behind it (127.0.0.1)."""
    apps_domain: str
    cookie_key: str
    """The app cookie's HS256 key (the secrets directory's ``app-cookie.key``)."""
    upstream_timeout: float = 300.0
    gateway_slots: int = 0
    """0: one gateway, at ``gateway_port``. N > 0: the gateway's replicas, up to N, each filled in at run time into a
    slot of the ``gateway`` backend (``gw1``..``gwN``, in maintenance until given an address) through the runtime API
    (:mod:`caravan.ingress`, what ``caravan deploy``'s ingress job runs): HAProxy checks each (``/healthz``) and a
    connection a replica refuses is retried on another."""
    health_port: int | None = None
    """Where HAProxy itself answers ``GET /healthz`` 200 (``monitor-uri``; on ``bind``): the deployed ingress' Nomad
    check, on a port of its own (the public one is HAProxy's bind, not a Nomad reservation: old and new share it)."""
    gateway_initial: tuple[tuple[str, int], ...] = ()
    """Replicas serving when HAProxy starts (address, port): they hold the first slots from the configuration on, so
    a new HAProxy answers from its first connection (an ingress upgrade overlaps the old one on the port)."""
    endpoints: EndpointSettings = EndpointSettings()
    """Inference endpoints' part of the configuration (``gateway.endpoints.ingress``)."""
    endpoint_servers: tuple[tuple[int, str, str], ...] = ()
    """Replicas the endpoint backends start with (backend slot, server slot name, ``host:port``):
    ``gateway.planes.prefilled``, with the endpoint maps that route to them."""
    bind: str = "127.0.0.1"
    """The address of the public port and of ``health_port``: 127.0.0.1 on one machine; deployed, the address of
    the ingress' client (``caravan deploy``: Nomad's ``${NOMAD_IP_health}``, or ``ingress.bind``)."""


def gateway_servers(config: IngressConfig) -> list[str]:
    """The ``gateway`` backend's server lines."""
    if not config.gateway_slots:
        return [f"    server gateway 127.0.0.1:{config.gateway_port}"]
    check = "check inter 1s fall 2 rise 1"
    initial = config.gateway_initial[: config.gateway_slots]
    first_free = len(initial) + 1
    return [
        "    option httpchk GET /healthz",
        "    option redispatch 1",
        "    retry-on conn-failure",
        "    balance roundrobin",
        *(f"    server {GATEWAY_SLOT}{slot} {host}:{port} {check}" for slot, (host, port) in enumerate(initial, 1)),
        *(
            [f"    server-template {GATEWAY_SLOT} {first_free}-{config.gateway_slots} 127.0.0.1:1 disabled {check}"]
            if first_free <= config.gateway_slots
            else []
        ),
    ]


GATEWAY_SLOT = "gw"
"""The name of the gateway backend's slots (``gw1``, ``gw2``...) when it has several replicas."""
GATEWAY_BACKENDS = ("gateway", endpoint_ingress.ACTIVATOR_BACKEND)
"""HAProxy's backends that list the gateway replicas (:func:`gateway_servers`), their slots filled alike: GraphQL and
the UI's, and the endpoint activator's."""


def endpoint_servers(config: IngressConfig) -> dict[int, dict[str, str]]:
    """``config.endpoint_servers`` by backend slot."""
    servers: dict[int, dict[str, str]] = {}
    for slot, name, address in config.endpoint_servers:
        servers.setdefault(slot, {})[name] = address
    return servers


def _return(status: int, code: str, message: str, condition: str) -> str:
    body = error_body(code, message).decode().replace("\\", "\\\\").replace('"', '\\"')
    return f'    http-request return status {status} content-type application/json string "{body}" if {condition}'


def _error_file(status: int, code: str | None = None, message: str | None = None) -> str:
    """HAProxy's own answer ``status`` as a JSON error (``ERRORS``' code and message unless given)."""
    if code is None or message is None:
        code, message = ERRORS[status]
    body = error_body(code, message).decode()
    return (
        f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\ncache-control: no-cache\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}"
    )


# The origin rule (domain.apps.cookie_may_pass), step by step, as ACLs on the request's headers.
ORIGIN_RULE = r"""
    # -- the origin rule (domain.apps.cookie_may_pass): txn.cookie_ok --
    acl has_origin req.fhdr(origin) -m found
    acl origin_null req.fhdr(origin) -m str null
    acl origin_scheme req.fhdr(origin) -m reg -i ^https?://
    http-request set-var(txn.origin_host) req.fhdr(origin),lower,regsub(^https?://,) if app
    http-request set-var(txn.host_hdr) req.fhdr(host),lower if app
    acl origin_same var(txn.origin_host),strcmp(txn.host_hdr) eq 0
    http-request set-var(txn.origin_other) bool(1) if app has_origin !origin_null !origin_scheme
    http-request set-var(txn.origin_other) bool(1) if app has_origin !origin_null !origin_same
    acl origin_other var(txn.origin_other) -m bool
    acl has_site req.fhdr(sec-fetch-site) -m found
    acl site_own req.fhdr(sec-fetch-site) -m str same-origin none
    acl site_other req.fhdr(sec-fetch-site) -m str same-site cross-site
    acl navigate req.fhdr(sec-fetch-mode) -m str navigate
    acl document req.fhdr(sec-fetch-dest) -m str document
    acl is_ws req.fhdr(upgrade) -m str -i websocket
    acl safe_method method GET HEAD
    acl get method GET
    http-request set-var(txn.cookie_ok) bool(1) if app !origin_other has_site site_own
    http-request set-var(txn.cookie_ok) bool(1) if app !origin_other has_site site_other !is_ws get navigate document
    http-request set-var(txn.cookie_ok) bool(1) if app !origin_other !has_site !is_ws safe_method
    http-request set-var(txn.cookie_ok) bool(1) if app !origin_other !has_site has_origin !origin_null
    acl cookie_ok var(txn.cookie_ok) -m bool
"""


def _host_pattern(domain: str) -> str:
    """A regular expression of the app host names ``domain.apps.parse_app_host`` accepts (lower case, no port)."""
    app = APP_NAME_RULE.pattern.strip("^$")
    session = SESSION_ID_RULE.pattern.strip("^$")
    return f"{app}{SEPARATOR}{session}" + re.escape("." + domain.strip(".").lower())


def _admission_acls(m: dict[str, str], key: str) -> list[str]:
    """The ACLs of who asks and who may pass (they read the variables :func:`_admission` sets)."""
    return [
        f"    acl public var(txn.info),field(3,'{FIELD}') -m str 1",
        "    acl bearer req.fhdr(authorization) -m reg -i ^bearer\\ ",
        f"    acl has_cookie req.cook_cnt({COOKIE_NAME}) gt 0",
        f"    acl one_cookie req.cook_cnt({COOKIE_NAME}) eq 1",
        f'    acl jwt_valid var(txn.jwt),jwt_verify("HS256","{key}") -m int 1',
        "    acl jwt_here var(txn.jwt_host),strcmp(txn.host) eq 0",
        "    acl jwt_live var(txn.jwt_exp),sub(txn.now) gt 0",
        "    acl jwt_user_sub var(txn.jwt_user),strcmp(txn.jwt_sub) eq 0",
        "    acl has_user var(txn.user) -m found",
        "    acl known var(txn.info) -m found",
        "    acl owner var(txn.user),strcmp(txn.owner) eq 0",
        f"    acl superadmin var(txn.user),map({m['roles']}) -m str SUPERADMIN",
        f"    acl project_admin var(txn.project),concat('{FIELD}',txn.user),map({m['admins']}) -m found",
        "    acl routed var(txn.upstream) -m found",
        f"    acl starting var(txn.upstream),field(3,{FIELD_OF_ROUTE}) -m str {STARTING}",
    ]


def _admission(m: dict[str, str], when: str) -> list[str]:
    """Who asks (a bearer token, else the app cookie, a JWT, from the app's own origin) and what the app's host
    holds, from the maps, into variables; on requests matching ``when``."""
    return [
        f"    http-request set-var(txn.info) var(txn.host),map({m['hosts']}) if {when}",
        f"    http-request set-var(txn.owner) var(txn.info),field(1,'{FIELD}') if {when}",
        f"    http-request set-var(txn.project) var(txn.info),field(2,'{FIELD}') if {when}",
        f"    http-request set-var(txn.upstream) var(txn.host),map({m['routes']}) if {when}",
        f"    http-request set-var(txn.token) http_auth_bearer,sha2(256),hex,lower if {when} bearer",
        f"    http-request set-var(txn.user) var(txn.token),map({m['tokens']}) if {when} bearer",
        f"    http-request set-var(txn.jwt) req.cook({COOKIE_NAME}) if {when} !bearer one_cookie cookie_ok",
        f"    http-request lua.pick_cookie if {when} !bearer has_cookie !one_cookie cookie_ok",
        f"    http-request set-var(txn.jwt_host) var(txn.jwt),jwt_payload_query('$.h') if {when} jwt_valid",
        f"    http-request set-var(txn.jwt_exp) var(txn.jwt),jwt_payload_query('$.exp','int') if {when} jwt_valid",
        f"    http-request set-var(txn.now) date if {when}",
        f"    http-request set-var(txn.jwt_sub) var(txn.jwt),jwt_payload_query('$.sub') if {when} jwt_valid",
        f"    http-request set-var(txn.jwt_user) var(txn.jwt),jwt_payload_query('$.t'),map({m['tokens']}) "
        f"if {when} jwt_valid jwt_here jwt_live",
        f"    http-request set-var(txn.token) var(txn.jwt),jwt_payload_query('$.t') "
        f"if {when} jwt_valid jwt_here jwt_live jwt_user_sub",
        f"    http-request set-var(txn.user) var(txn.jwt_user) if {when} jwt_valid jwt_here jwt_live jwt_user_sub",
    ]


def render(config: IngressConfig, paths: IngressPaths, runtime: Path) -> str:
    """HAProxy's configuration, its runtime API on ``runtime`` (its listeners handed over to the next HAProxy there:
    ``expose-fd listeners``)."""
    m = {name: str(paths.map(name)) for name in MAPS}
    lines = [
        "global",
        "    maxconn 8000",
        # one thread: on two, Debian's HAProxy 2.6.12 corrupted the endpoints' Lua filter state under load ("attempt
        # to index a number value", then a segfault in liblua5.3; docs/production.md)
        "    nbthread 1",
        f"    stats socket {runtime} mode 600 level admin expose-fd listeners",
        "    stats timeout 2m",
        f"    pidfile {paths.pidfile}",
        f"    lua-load {paths.lua}",
        *endpoint_ingress.global_lines(paths.state_dir),
        "    tune.bufsize 32768",
        "",
        "defaults",
        "    mode http",
        # a new connection to the app (or the gateway) per request, closed after its response: one kept for the
        # client's next request may be closing on the app's side (an idle timeout) as that request arrives, and HAProxy
        # 2.6 answers that on a kept-alive connection's later request by closing the client's connection unanswered
        "    option http-server-close",
        # a connect not answered in 100 ms is tried again on a new socket: an app's full accept queue (busybox httpd
        # listens with a backlog of 9) drops the SYN, which the kernel would send again only after a second; 30
        # tries (a refused one waits this timeout before the next) give up after about 3 s: 502, except on a
        # kept-alive connection's later request after timeouts, which HAProxy 2.6 closes unanswered (for the client
        # to retry): so many short tries that a busy app is not given up on (the apps' backend: shorter, more of them)
        f"    timeout connect {CONNECT_TIMEOUT_MS}ms",
        f"    retries {CONNECT_RETRIES}",
        "    timeout client 300s",
        f"    timeout server {int(config.upstream_timeout)}s",
        "    timeout http-request 30s",
        "    timeout tunnel 3600s",
        "    timeout http-keep-alive 10s",
        "    timeout client-fin 5s",
        *(f"    errorfile {status} {paths.error(status)}" for status in sorted(ERRORS)),
        "",
        *(
            ["frontend health", f"    bind {config.bind}:{config.health_port}", "    monitor-uri /healthz", ""]
            if config.health_port
            else []
        ),
        "frontend ingress",
        f"    bind {config.bind}:{config.port}",
        "    http-request set-var(txn.host) req.hdr(host),field(1,:),lower",
        f"    acl app_host var(txn.host) -m reg ^{_host_pattern(config.apps_domain)}$",
        f"    acl launch path {LAUNCH_PATH}",
        "    http-request set-var(txn.app) bool(1) if app_host !launch",
        "    acl app var(txn.app) -m bool",
        f"    acl built str(generation),map({m['meta']}) -m found",
        _return(503, "UNAVAILABLE", "the app routes are being rebuilt: retry in a moment", "app !built"),
        ORIGIN_RULE,
        *_admission_acls(m, config.cookie_key),
        *_admission(m, "app"),
        # a refusal waits one pause and is decided again: a grant that Redis holds since a few milliseconds (a token
        # just issued, an app just made public, a session just started) is in HAProxy's maps by then
        "    http-request set-var(txn.refuse) bool(1) if app !has_user !public || app !known || app !routed",
        "    http-request set-var(txn.refuse) bool(1) if app !public !owner !superadmin !project_admin",
        "    acl refuse var(txn.refuse) -m bool",
        "    http-request lua.await_control if app refuse",
        "    http-request unset-var(txn.user) if app refuse",
        "    http-request unset-var(txn.token) if app refuse",
        *_admission(m, "app refuse"),
        _return(
            403,
            "CROSS_ORIGIN",
            "the app's cookie is accepted only from the app's own pages (Origin, Sec-Fetch-Site): this request came "
            "from another origin",
            "app !has_user !public has_cookie !cookie_ok",
        ),
        _return(
            401,
            "UNAUTHENTICATED",
            "send your API token as 'Authorization: Bearer <token>', or open the app's launchApp url",
            "app !has_user !public",
        ),
        _return(404, "NOT_FOUND", "no such app", "app !known"),
        _return(404, "NOT_FOUND", "no such app", "app !public !owner !superadmin !project_admin"),
        _return(503, "APP_NOT_READY", "the session's app has no address yet: is the session starting?", "app !routed"),
        "    http-request set-dst var(txn.upstream),field(1,:) if app",
        "    http-request set-dst-port var(txn.upstream),field(2,:) if app",
        f"    http-request track-sc0 var(txn.host) table {STATS_TABLE} if app",
        # a WebSocket to an app is kept in a table with who opened it, with which token: the control plane closes it
        # when that token, user or app stops passing (gateway.apps.control); HAProxy logs nothing
        f'    http-request set-var-fmt(txn.ws) "%ci:%cp{FIELD}%[var(txn.host)]{FIELD}%[var(txn.token)]{FIELD}'
        f'%[var(txn.user)]" if app is_ws',
        f"    http-request track-sc1 var(txn.ws) table {WS_TABLE} if app is_ws",
        *endpoint_ingress.frontend_rules(config.endpoints, paths.state_dir, config.apps_domain),
        "    use_backend apps_starting if app starting",
        "    use_backend apps if app",
        "    default_backend gateway",
        "",
        *_app_backend("apps", paths.error(502)),
        *_app_backend("apps_starting", paths.starting),
        "",
        "backend gateway",
        "    http-reuse never",  # uvicorn closes an idle connection after 5 s (http-server-close above)
        # the gateway believes these from HAProxy alone (CARAVAN_TRUSTED_PROXIES): the client's own never pass
        "    http-request del-header x-forwarded-for",
        "    http-request set-header x-forwarded-proto http",
        "    option forwardfor",
        *gateway_servers(config),
        "",
        f"backend {STATS_TABLE}",
        f"    stick-table type string len 128 size 200k expire 1h store {COUNTERS}",
        *endpoint_ingress.sections(
            config.endpoints,
            paths.state_dir,
            gateway_servers(config),
            config.cookie_key,
            paths.error(502),
            endpoint_servers(config),
        ),
        "",
        f"backend {WS_TABLE}",
        "    stick-table type string len 400 size 200k expire 1m store conn_cur",
        "",
    ]
    return "\n".join(line for line in lines if line != "") + "\n"


def _app_backend(name: str, unreachable: Path) -> list[str]:
    """A backend of the apps: every request goes to the address the frontend set (``set-dst``). ``unreachable``: the
    answer when the app refused every connect (HAProxy's own 503 there): ``UPSTREAM_UNREACHABLE`` for a running
    session's app, ``APP_NOT_READY`` for one still starting (``domain.app_routes.STARTING``)."""
    return [
        f"backend {name}",
        "    http-reuse never",  # nor shared between clients (http-server-close above: none is kept anyway)
        # an app refusing the connect (still starting) or dropping the SYN (a full accept queue) is tried again
        # every 25 ms, 120 times: about 3 s, then the ``unreachable`` answer
        f"    timeout connect {APP_CONNECT_TIMEOUT_MS}ms",
        f"    retries {APP_CONNECT_RETRIES}",
        # no L7 retries (retry-on): a request the app may have acted on is never sent twice
        f"    errorfile 503 {unreachable}",
        "    acl names_headers req.fhdr(connection) -m found",
        f"    acl plain_connection req.fhdr(connection) -m reg -i {PLAIN_CONNECTION}",
        "    http-request lua.hop_by_hop_req if names_headers !plain_connection",
        "    acl res_names_headers res.fhdr(connection) -m found",
        f"    acl res_plain_connection res.fhdr(connection) -m reg -i {PLAIN_CONNECTION}",
        "    http-response lua.hop_by_hop_res if res_names_headers !res_plain_connection",
        "    option forwardfor",
        "    http-request del-header authorization",
        "    http-request del-header forwarded",
        "    http-request del-header x-forwarded-proto",
        "    http-request del-header x-forwarded-host",
        "    http-request del-header proxy-authorization",
        "    http-request del-header proxy-connection",
        "    http-request del-header keep-alive",
        "    http-request set-header x-forwarded-proto http",
        "    http-request set-header x-forwarded-host %[req.fhdr(host)]",
        f"    http-request set-var(txn.cookies) \"req.fhdr(cookie),regsub('(^|;) *{COOKIE_NAME}=[^;]*','',g),"
        "regsub('^[; ]+','')\"",
        "    http-request del-header cookie",
        "    http-request set-header cookie %[var(txn.cookies)] if { var(txn.cookies) -m len gt 0 }",
        f"    http-response replace-header set-cookie ^{COOKIE_NAME}=.* caravan_dropped=;Max-Age=0",
        "    http-response del-header keep-alive",
        "    server app 0.0.0.0:0",
        "",
    ]


def write_files(
    config: IngressConfig, paths: IngressPaths, runtime: Path, maps: Mapping[str, Mapping[str, str]] | None = None
) -> None:
    """The configuration (its runtime API on ``runtime``), the maps (empty: fail closed; or ``maps``' content,
    ``gateway.planes.prefilled``) and the JSON error files, under ``paths.state_dir`` (0700)."""
    paths.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths.state_dir.chmod(0o700)
    for folder in (paths.map("x").parent, paths.error(400).parent):
        folder.mkdir(exist_ok=True, mode=0o700)
    for name in MAPS:
        content = (maps or {}).get(name, {})
        paths.map(name).write_text("".join(f"{key} {value}\n" for key, value in content.items()))
    endpoint_ingress.write_files(paths.state_dir, config.endpoints, maps)
    lua = LUA.replace("AWAIT_MS", str(AWAIT_MS)).replace("COOKIE_NAME", COOKIE_NAME)
    lua = lua.replace("MAX_CANDIDATES", str(MAX_COOKIE_CANDIDATES)).replace("COOKIE_KEY", config.cookie_key)
    paths.lua.write_text(lua)
    paths.lua.chmod(0o600)
    for status in ERRORS:
        paths.error(status).write_text(_error_file(status))
    paths.starting.write_text(_error_file(503, "APP_NOT_READY", STARTING_MESSAGE))
    paths.config.touch(mode=0o600)
    paths.config.chmod(0o600)
    paths.config.write_text(render(config, paths, runtime))
