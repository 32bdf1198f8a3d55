"""Caravan's settings, read once from the environment and passed down explicitly.

Every variable is prefixed ``CARAVAN_``; nothing deeper in the code reads ``os.environ``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from core.secrets import Role, nomad_token_path, read_secret, redis_password_path, redis_sentinel_client_path


@dataclass(frozen=True)
class RedisSettings:
    url: str = "redis://127.0.0.1:6390/0"
    """Where Caravan's state and queues live (``CARAVAN_REDIS_URL``)."""
    prefix: str = "caravan"
    """Prefix of every Redis key (``CARAVAN_REDIS_PREFIX``); tests give each test its own."""
    idle_timeout: float = 30.0
    """Seconds a pooled connection may stay idle before it is closed (``CARAVAN_REDIS_IDLE_TIMEOUT``)."""
    sentinels: tuple[tuple[str, int], ...] = ()
    """Redis Sentinels as ``host:port,...`` (``CARAVAN_REDIS_SENTINELS``): when set, the primary is the one they name
    (and follow through a failover); the URL's host and port are then unused, its credentials and database are."""
    sentinel_master: str = "caravan"
    """The name the Sentinels monitor the primary under (``CARAVAN_REDIS_SENTINEL_MASTER``)."""
    sentinel_username: str | None = None
    """User Caravan asks the Sentinels with (``CARAVAN_REDIS_SENTINEL_USERNAME``; the stack's: ``caravan``)."""
    sentinel_password: str | None = None
    """Its password (``CARAVAN_REDIS_SENTINEL_PASSWORD``; else ``redis-sentinel-client.password`` in the secrets
    directory)."""
    wait_replicas: int = 0
    """Replicas that must confirm each transaction (``WAIT``) before Caravan takes it as written
    (``CARAVAN_REDIS_WAIT_REPLICAS``; default 1 with Sentinels, 0 without)."""
    wait_timeout: float = 1.0
    """Seconds a transaction waits for that confirmation before it fails as UNAVAILABLE
    (``CARAVAN_REDIS_WAIT_TIMEOUT``)."""


@dataclass(frozen=True)
class NomadSettings:
    addr: str = "http://127.0.0.1:4646"
    """Nomad HTTP API (``CARAVAN_NOMAD_ADDR``)."""
    token: str | None = None
    """Nomad ACL token, if ACLs are on (``CARAVAN_NOMAD_TOKEN``)."""
    job_prefix: str = "caravan"
    """Every Caravan job id starts with ``<job_prefix>-`` (``CARAVAN_NOMAD_JOB_PREFIX``)."""
    datacenter: str = "dc1"
    """Datacenter jobs are placed in (``CARAVAN_NOMAD_DATACENTER``)."""
    namespace: str = "default"
    """Nomad namespace of Caravan's jobs (``CARAVAN_NOMAD_NAMESPACE``)."""
    platform_namespace: str = "caravan-platform"
    """Nomad namespace of the platform's own short jobs (``docker commit``/``rmi``, ``nomad_jobs.commit_job``):
    raw_exec only, written by the scheduler's token alone (``CARAVAN_NOMAD_PLATFORM_NAMESPACE``)."""
    restart_delay: float = 15.0
    """Seconds Nomad waits before it restarts the failed task of a long-running session (INTERACTIVE, SYSTEM: not a
    BATCH kernel, which runs once, nor an inference replica, ``nomad_jobs.replica_service``). It restarts it twice in
    30 minutes, then fails the allocation and the session ends (``CARAVAN_NOMAD_RESTART_DELAY``; Nomad's own default
    for a service job, which the jobs relied on before it was written in them)."""


@dataclass(frozen=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 8420
    admin_token: str | None = None
    """Bootstrap admin token (``CARAVAN_ADMIN_TOKEN``); else generated once into the state directory."""
    workers: int = 1
    """Processes ``caravan gateway`` serves with (``CARAVAN_GATEWAY_WORKERS``, default: one per CPU); they share
    the port and all state is in Redis. ``caravan dev`` always runs one, in its own process."""
    max_tokens_per_user: int = 50
    """Live API tokens one user may hold (``CARAVAN_MAX_TOKENS_PER_USER``); issuing more is ``QUOTA_EXCEEDED``."""
    apps_domain: str = "apps.localhost"
    """Parent domain of the apps' origins, ``<app>--<session id>.<apps_domain>`` (``CARAVAN_APPS_DOMAIN``; see
    ``domain/apps.py``): a wildcard DNS name pointing at the gateway (``*.localhost`` is the loopback already)."""
    app_cookie_ttl: int = 3600
    """Seconds an app cookie (a browser's pass to one app, ``stores/app_access.py``) is valid
    (``CARAVAN_APP_COOKIE_TTL``)."""
    app_upstream_timeout: float = 300.0
    """Seconds the app proxy waits for an app to answer, or for the next bytes of its body, before giving up: 504
    before the response started, a cut stream after (``CARAVAN_APP_UPSTREAM_TIMEOUT``)."""
    ingress_port: int | None = None
    """HAProxy's port (``CARAVAN_INGRESS_PORT``): the apps' data plane and the stack's ingress, in front of this
    gateway (``gateway.apps.ingress_config``). App URLs name it; the gateway then keeps HAProxy's maps
    (``gateway.apps.control``) and signs app cookies HAProxy checks itself. None: no HAProxy."""
    keeps_maps: bool = True
    """With ``ingress_port``: this gateway keeps HAProxy's maps (``gateway.planes``; ``CARAVAN_GATEWAY_KEEPS_MAPS``,
    ``0`` to leave them to ``caravan ingress --keep-maps``, as ``caravan deploy`` does)."""
    backend_port: int | None = None
    """In the dev stack (``./ops/dev``), where the gateway process listens behind HAProxy, which takes ``port``
    (``CARAVAN_GATEWAY_BACKEND_PORT``; default: ``port`` + 1)."""
    ingress_bind: str = "127.0.0.1"
    """The address HAProxy's public port binds (``CARAVAN_INGRESS_BIND``): 127.0.0.1 on one machine; deployed, the
    ingress' client's (``caravan deploy``)."""
    ingress_dir: Path | None = None
    """HAProxy's state directory: its configuration, maps and runtime socket (``CARAVAN_INGRESS_DIR``; default
    ``<home>/haproxy``)."""
    trusted_proxies: tuple[str, ...] = ()
    """Addresses or networks of the ingress in front of the gateway (``CARAVAN_TRUSTED_PROXIES``, comma-separated):
    only a connection from one of them may name the client with ``X-Forwarded-For`` and the scheme with
    ``X-Forwarded-Proto``. None by default: every client is its connection's address (the per-address rate limit
    counts it), whatever it sends."""


@dataclass(frozen=True)
class EndpointSettings:
    """Inference endpoints on the ingress (``gateway.endpoints``; README "Inference endpoints")."""

    backends: int = 64
    """HAProxy backends declared for endpoints (``CARAVAN_ENDPOINT_BACKENDS``): live INFERENCE sessions beyond
    this many get no endpoint (their url answers 404) until one ends."""
    max_body: int = 64 << 20
    """Largest request body an endpoint accepts, in bytes, by its ``Content-Length`` (``CARAVAN_ENDPOINT_MAX_BODY``):
    413 above."""
    rate_limit: int = 1000
    """Requests per second one token (or, on a public endpoint without one, one client address) may send to
    endpoints (``CARAVAN_ENDPOINT_RATE_LIMIT``): 429 above, with ``Retry-After: 1``."""
    hold_timeout: float = 60.0
    """Seconds the activator holds a request for an endpoint with no routable replica before answering 503
    (``CARAVAN_ENDPOINT_HOLD_TIMEOUT``)."""
    hold_max: int = 100
    """Requests the activator holds per endpoint and gateway process (``CARAVAN_ENDPOINT_HOLD_MAX``): 503 beyond."""


@dataclass(frozen=True)
class SchedulerSettings:
    reconcile_interval: float = 10.0
    """Seconds between full reconciliations with Nomad, the safety net behind the event stream."""
    lease_ttl: float = 10.0
    """Seconds a scheduler's leadership lease lives without renewal (``CARAVAN_SCHEDULER_LEASE_TTL``): a scheduler
    killed leaves it held that long, before another may lead."""
    config_path: Path | None = None
    """Per-resource-group scheduling configuration, HCL or JSON (``CARAVAN_SCHEDULER_CONFIG``, see
    ``domain/scheduling_config.py``); None = the defaults (FIFO, strict head-of-line, dispersed)."""
    pass_interval: float = 1.0
    """Seconds between scheduling passes when no event (session created or ended, node changed) comes first."""
    schedule_history: int = 20
    """Run records kept per recurring schedule (``CARAVAN_SCHEDULE_HISTORY``); older ones are dropped."""


@dataclass(frozen=True)
class IdleSettings:
    policy_path: Path | None = None
    """The idle policy file (``CARAVAN_IDLE_POLICY``, HCL, see ``idle/policy.example.hcl``); None = the
    built-in defaults, under which nothing is reclaimed (:mod:`idle.reload`)."""
    lease_ttl: float = 10.0
    """Seconds the idle checker's leadership lease lives without renewal."""
    stats_concurrency: int = 32
    """Nomad requests in flight at once during a sweep: allocation stats, and the SFTP servers' activity file."""
    window_persist_interval: float = 60.0
    """Seconds between saves of the utilization windows to Redis: a new leader resumes from them."""


@dataclass(frozen=True)
class StorageSettings:
    """Storage folders (``domain/storage.py``): where new ones go, their quotas, their trash."""

    node: str | None = None
    """Nomad node (id or name) holding new folders (``CARAVAN_STORAGE_NODE``); None = the first ready node."""

    max_per_user: int = 20
    """Folders one user may own (trashed ones count until purged)."""
    max_per_project: int = 200
    """Folders of one project."""
    max_bytes_per_user: int = 10 * 1024**3
    """Bytes in all of one user's folders."""
    max_bytes_per_project: int = 100 * 1024**3
    """Bytes in all of one project's folders."""
    trash_grace: float = 7 * 24 * 3600.0
    """Seconds a deleted folder stays in the trash (restorable) before its data is purged."""
    recount_interval: float = 60.0
    """Seconds between recounts of each folder's bytes on the storage node (``CARAVAN_FOLDER_RECOUNT_INTERVAL``), so
    that what sessions write through a mount shows in its usage and counts against the bytes quotas."""


@dataclass(frozen=True)
class Settings:
    home: Path = Path(".caravan")
    """State directory: Redis AOF, Nomad data, logs, the bootstrap token (``CARAVAN_HOME``)."""
    secrets_dir: Path | None = None
    """Per-role credentials (``CARAVAN_SECRETS_DIR``; None = ``<home>/secrets``): ``nomad-<role>.token`` and
    ``redis-<role>.password``, written by ``caravan stack up`` (see :mod:`core.secrets`)."""
    redis: RedisSettings = field(default_factory=RedisSettings)
    nomad: NomadSettings = field(default_factory=NomadSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    idle: IdleSettings = field(default_factory=IdleSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    endpoints: EndpointSettings = field(default_factory=EndpointSettings)
    default_image: str | None = None
    """Image for sessions that name none (``CARAVAN_DEFAULT_IMAGE``; ops/ builds caravan/busybox)."""
    session_network: str = "cni/caravan"
    """Nomad network mode of docker and exec kernels (``CARAVAN_SESSION_NETWORK``): ``cni/caravan``, each kernel in a
    network namespace of its own that reaches only its session's kernels (``nomad_jobs/kernel_network.py``; the Nomad
    clients need the ``caravan`` CNI network, see ``caravan/stack/session_network.py``), or ``host``: the host's
    network, no isolation between sessions or from the host's loopback services."""
    namespace_pool: int = 2
    """Network namespaces made ahead that a namespace keeper keeps free on its client (``CARAVAN_NAMESPACE_POOL``; 0:
    no keeper, every kernel's namespace made at launch; ``nomad_jobs.namespace_keeper``): ``caravan dev``'s on the
    stack's client, ``caravan deploy``'s on every client with Docker and a session network."""
    pause_image: str | None = None
    """The pooled namespaces' pause container image (``CARAVAN_PAUSE_IMAGE``; the clients' docker ``infra_image``):
    without it, no keeper."""
    node_id: str | None = None
    """The Nomad node a keeper serves (``CARAVAN_NODE_ID``: ``caravan deploy`` sets Nomad's ``${node.unique.id}``);
    unset, the one node whose meta names the keeper's session network (``session_network_dir``)."""
    session_network_dir: Path | None = None
    """Where the keeper's client records its session network (``CARAVAN_SESSION_NETWORK_DIR``: ``caravan deploy``
    sets the node's ``caravan_session_network`` meta); unset, ``<home>/nomad``, the stack's client."""
    docker_images: tuple[str, ...] = ("caravan/*",)
    """Glob patterns of the Docker images sessions may name (``CARAVAN_DOCKER_IMAGES``, comma-separated), matched
    against the reference as written; default: the namespace ops/ builds locally. See ``domain/docker_images.py``."""
    health_port: int | None = None
    """``CARAVAN_HEALTH_PORT``: where a scheduler or idle checker answers its health check (``{"leading": ...}``, on
    ``CARAVAN_GATEWAY_HOST``); unset, nowhere. ``caravan deploy`` sets it to a port Nomad hands out."""
    usage_raw_retention: float = 90 * 86400.0
    """Seconds each ended session's raw usage record is kept (``CARAVAN_USAGE_RAW_RETENTION``, default 90 days);
    daily rollups are kept forever (``stores.usage``)."""
    sftp_image: str | None = None
    """Image of SFTP system sessions (``CARAVAN_SFTP_IMAGE``; ops/build-sftp-image builds caravan/sftp and records it);
    None: requestSftp is UNAVAILABLE."""
    qemu_images: Mapping[str, str] = field(default_factory=dict)
    """The qemu driver's VM image allowlist, name → image directory (``CARAVAN_QEMU_IMAGES`` as
    ``name=/dir,name2=/dir2``; else the image ops/build-vm-image built, ``CARAVAN_VM_IMAGE`` at
    ``CARAVAN_VM_IMAGE_DIR``). The Nomad clients' qemu ``image_paths`` must contain the directories."""

    @property
    def secrets(self) -> Path:
        """The secrets directory in force."""
        return self.secrets_dir if self.secrets_dir is not None else self.home / "secrets"

    @property
    def public_port(self) -> int:
        """The port users reach: HAProxy's when it is in front, else the gateway's."""
        return self.gateway.ingress_port or self.gateway.port

    @property
    def ingress_dir(self) -> Path:
        return self.gateway.ingress_dir or self.home / "haproxy"

    def for_role(self, role: Role) -> Settings:
        """The settings a component running as ``role`` connects with: the role's Nomad token and Redis user from
        the secrets directory when it holds them, else the configured ``CARAVAN_NOMAD_TOKEN`` and credentials in
        ``CARAVAN_REDIS_URL`` (for operators who give each process its own)."""
        token = read_secret(nomad_token_path(self.secrets, role))
        password = read_secret(redis_password_path(self.secrets, role))
        redis = replace(self.redis, url=with_credentials(self.redis.url, role, password)) if password else self.redis
        if redis.sentinels and redis.sentinel_password is None:
            sentinel_password = read_secret(redis_sentinel_client_path(self.secrets))
            redis = replace(
                redis, sentinel_password=sentinel_password, sentinel_username=redis.sentinel_username or "caravan"
            )
        return replace(self, nomad=replace(self.nomad, token=token) if token else self.nomad, redis=redis)

    def with_prefix(self, prefix: str) -> Settings:
        """The same settings isolated under another Redis key prefix and Nomad job prefix."""
        return replace(
            self,
            redis=replace(self.redis, prefix=prefix),
            nomad=replace(self.nomad, job_prefix=prefix),
        )


REMOVED = {
    "CARAVAN_ALLOW_RAW_EXEC_FOR_USERS": "raw_exec runs as root on the host: only a SUPERADMIN creates raw_exec "
    "sessions (for another user too, with createSession(input: {owner}))",
}
"""Variables that no longer exist, and why: a start with one of them set fails rather than silently ignoring it."""


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    for name, why in REMOVED.items():
        if env.get(name):
            raise ValueError(f"{name} was removed: {why}. Unset it.")
    home = Path(env.get("CARAVAN_HOME", ".caravan")).absolute()
    return Settings(
        home=home,
        secrets_dir=Path(env["CARAVAN_SECRETS_DIR"]).absolute() if env.get("CARAVAN_SECRETS_DIR") else None,
        redis=redis_settings_of(env),
        nomad=NomadSettings(
            addr=env.get("CARAVAN_NOMAD_ADDR", NomadSettings.addr),
            token=env.get("CARAVAN_NOMAD_TOKEN") or None,
            job_prefix=env.get("CARAVAN_NOMAD_JOB_PREFIX", NomadSettings.job_prefix),
            datacenter=env.get("CARAVAN_NOMAD_DATACENTER", NomadSettings.datacenter),
            namespace=env.get("CARAVAN_NOMAD_NAMESPACE", NomadSettings.namespace),
            platform_namespace=env.get("CARAVAN_NOMAD_PLATFORM_NAMESPACE", NomadSettings.platform_namespace),
            restart_delay=_restart_delay(env),
        ),
        gateway=GatewaySettings(
            host=env.get("CARAVAN_GATEWAY_HOST", GatewaySettings.host),
            port=int(env.get("CARAVAN_GATEWAY_PORT", GatewaySettings.port)),
            admin_token=env.get("CARAVAN_ADMIN_TOKEN") or None,
            workers=max(1, int(env.get("CARAVAN_GATEWAY_WORKERS") or os.cpu_count() or 1)),
            max_tokens_per_user=_at_least_one(env, "CARAVAN_MAX_TOKENS_PER_USER", GatewaySettings.max_tokens_per_user),
            apps_domain=(env.get("CARAVAN_APPS_DOMAIN") or GatewaySettings.apps_domain).strip(".").lower(),
            ingress_port=int(env["CARAVAN_INGRESS_PORT"]) if env.get("CARAVAN_INGRESS_PORT") else None,
            ingress_dir=Path(env["CARAVAN_INGRESS_DIR"]) if env.get("CARAVAN_INGRESS_DIR") else None,
            ingress_bind=_address(env, "CARAVAN_INGRESS_BIND", GatewaySettings.ingress_bind),
            keeps_maps=_switch(env, "CARAVAN_GATEWAY_KEEPS_MAPS", GatewaySettings.keeps_maps),
            backend_port=int(env["CARAVAN_GATEWAY_BACKEND_PORT"]) if env.get("CARAVAN_GATEWAY_BACKEND_PORT") else None,
            app_cookie_ttl=_at_least_one(env, "CARAVAN_APP_COOKIE_TTL", GatewaySettings.app_cookie_ttl),
            app_upstream_timeout=_positive_seconds(
                env, "CARAVAN_APP_UPSTREAM_TIMEOUT", GatewaySettings.app_upstream_timeout
            ),
            trusted_proxies=_networks(env, "CARAVAN_TRUSTED_PROXIES"),
        ),
        scheduler=SchedulerSettings(
            reconcile_interval=float(env.get("CARAVAN_RECONCILE_INTERVAL", SchedulerSettings.reconcile_interval)),
            lease_ttl=_positive_seconds(env, "CARAVAN_SCHEDULER_LEASE_TTL", SchedulerSettings.lease_ttl),
            config_path=Path(env["CARAVAN_SCHEDULER_CONFIG"]) if env.get("CARAVAN_SCHEDULER_CONFIG") else None,
            schedule_history=_at_least_one(env, "CARAVAN_SCHEDULE_HISTORY", SchedulerSettings.schedule_history),
        ),
        idle=IdleSettings(policy_path=Path(env["CARAVAN_IDLE_POLICY"]) if env.get("CARAVAN_IDLE_POLICY") else None),
        storage=StorageSettings(
            node=env.get("CARAVAN_STORAGE_NODE") or None,
            max_per_user=_at_least_one(env, "CARAVAN_FOLDER_MAX_PER_USER", StorageSettings.max_per_user),
            max_per_project=_at_least_one(env, "CARAVAN_FOLDER_MAX_PER_PROJECT", StorageSettings.max_per_project),
            max_bytes_per_user=_at_least_one(
                env, "CARAVAN_FOLDER_MAX_BYTES_PER_USER", StorageSettings.max_bytes_per_user
            ),
            max_bytes_per_project=_at_least_one(
                env, "CARAVAN_FOLDER_MAX_BYTES_PER_PROJECT", StorageSettings.max_bytes_per_project
            ),
            trash_grace=_positive_seconds(env, "CARAVAN_FOLDER_TRASH_GRACE", StorageSettings.trash_grace),
            recount_interval=_positive_seconds(
                env, "CARAVAN_FOLDER_RECOUNT_INTERVAL", StorageSettings.recount_interval
            ),
        ),
        endpoints=EndpointSettings(
            backends=_at_least_one(env, "CARAVAN_ENDPOINT_BACKENDS", EndpointSettings.backends),
            max_body=_at_least_one(env, "CARAVAN_ENDPOINT_MAX_BODY", EndpointSettings.max_body),
            rate_limit=_at_least_one(env, "CARAVAN_ENDPOINT_RATE_LIMIT", EndpointSettings.rate_limit),
            hold_timeout=_positive_seconds(env, "CARAVAN_ENDPOINT_HOLD_TIMEOUT", EndpointSettings.hold_timeout),
            hold_max=_at_least_one(env, "CARAVAN_ENDPOINT_HOLD_MAX", EndpointSettings.hold_max),
        ),
        default_image=env.get("CARAVAN_DEFAULT_IMAGE") or None,
        session_network=env.get("CARAVAN_SESSION_NETWORK") or Settings.session_network,
        namespace_pool=int(env.get("CARAVAN_NAMESPACE_POOL") or Settings.namespace_pool),
        pause_image=env.get("CARAVAN_PAUSE_IMAGE") or None,
        node_id=env.get("CARAVAN_NODE_ID") or None,
        session_network_dir=Path(env["CARAVAN_SESSION_NETWORK_DIR"])
        if env.get("CARAVAN_SESSION_NETWORK_DIR")
        else None,
        docker_images=tuple(p.strip() for p in env.get("CARAVAN_DOCKER_IMAGES", "").split(",") if p.strip())
        or Settings.docker_images,
        qemu_images=qemu_images_of(env),
        sftp_image=env.get("CARAVAN_SFTP_IMAGE") or None,
        usage_raw_retention=_positive_seconds(env, "CARAVAN_USAGE_RAW_RETENTION", Settings.usage_raw_retention),
        health_port=int(env["CARAVAN_HEALTH_PORT"]) if env.get("CARAVAN_HEALTH_PORT") else None,
    )


def redis_settings_of(env: Mapping[str, str]) -> RedisSettings:
    sentinels = _host_ports(env, "CARAVAN_REDIS_SENTINELS")
    wait = env.get("CARAVAN_REDIS_WAIT_REPLICAS") or ("1" if sentinels else "0")
    if not wait.isdigit():
        raise ValueError(f"CARAVAN_REDIS_WAIT_REPLICAS must be a whole number, not {wait!r}")
    return RedisSettings(
        url=env.get("CARAVAN_REDIS_URL", RedisSettings.url),
        prefix=env.get("CARAVAN_REDIS_PREFIX", RedisSettings.prefix),
        idle_timeout=_positive_seconds(env, "CARAVAN_REDIS_IDLE_TIMEOUT", RedisSettings.idle_timeout),
        sentinels=sentinels,
        sentinel_master=env.get("CARAVAN_REDIS_SENTINEL_MASTER") or RedisSettings.sentinel_master,
        sentinel_username=env.get("CARAVAN_REDIS_SENTINEL_USERNAME") or None,
        sentinel_password=env.get("CARAVAN_REDIS_SENTINEL_PASSWORD") or None,
        wait_replicas=int(wait),
        wait_timeout=_positive_seconds(env, "CARAVAN_REDIS_WAIT_TIMEOUT", RedisSettings.wait_timeout),
    )


def _host_ports(env: Mapping[str, str], name: str) -> tuple[tuple[str, int], ...]:
    """A comma-separated list of ``host:port``."""
    pairs = []
    for entry in filter(None, (e.strip() for e in env.get(name, "").split(","))):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{name} must list host:port pairs, not {entry[:60]!r}")
        pairs.append((host.strip("[]"), int(port)))
    return tuple(pairs)


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or ("1" if default else "0")).strip().lower()
    if raw not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), not {raw!r}")
    return raw in ("1", "true", "yes", "on")


def _at_least_one(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name) or str(default)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, not {raw!r}")
    return int(raw)


def _networks(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of IP addresses or networks (``10.0.0.5``, ``10.0.0.0/24``, ``::1``)."""
    entries = tuple(e.strip() for e in env.get(name, "").split(",") if e.strip())
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"{name} must list IP addresses or networks, not {entry[:60]!r}") from None
    return entries


def _address(env: Mapping[str, str], name: str, default: str) -> str:
    """One IP address."""
    raw = (env.get(name) or default).strip()
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise ValueError(f"{name} must be an IP address, not {raw[:60]!r}") from None


def _positive_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name) or str(default)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{name} must be a number of seconds > 0, not {raw!r}")
    return seconds


MAX_RESTART_DELAY = 900.0
"""Two restarts must fit in the restart policy's 30 minutes (Nomad refuses a job whose attempts x delay exceed it)."""


def _restart_delay(env: Mapping[str, str]) -> float:
    seconds = _positive_seconds(env, "CARAVAN_NOMAD_RESTART_DELAY", NomadSettings.restart_delay)
    if seconds > MAX_RESTART_DELAY:
        raise ValueError(f"CARAVAN_NOMAD_RESTART_DELAY must be at most {MAX_RESTART_DELAY:g} seconds, not {seconds:g}")
    return seconds


def with_credentials(url: str, username: str, password: str) -> str:
    """``url`` (``redis://host:port/db``) authenticating as ``username`` with ``password``, replacing any given."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(username, safe='')}:{quote(password, safe='')}@{host}"))


def qemu_images_of(env: Mapping[str, str]) -> dict[str, str]:
    """``CARAVAN_QEMU_IMAGES`` (``name=/dir,...``), else the one built image ops/ recorded."""
    listed = env.get("CARAVAN_QEMU_IMAGES", "").strip()
    if listed:
        images = {}
        for entry in filter(None, (e.strip() for e in listed.split(","))):
            name, _, directory = entry.partition("=")
            if not name.strip() or not directory.strip().startswith("/"):
                raise ValueError(f"CARAVAN_QEMU_IMAGES: {entry!r} is not name=/absolute/directory")
            images[name.strip()] = directory.strip()
        return images
    if env.get("CARAVAN_VM_IMAGE") and env.get("CARAVAN_VM_IMAGE_DIR"):
        return {env["CARAVAN_VM_IMAGE"]: env["CARAVAN_VM_IMAGE_DIR"]}
    return {}
