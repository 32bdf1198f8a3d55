"""``caravan deploy``: Caravan itself as Nomad jobs, rendered from a typed configuration and submitted.

Four jobs and a system job, JSON job specs (Nomad's API form: no HCL is parsed, so no operator string can become an
expression), each in the configuration's namespace (``caravan-system`` by default, raw_exec allowed there and nowhere
else it was not):

- ``<name>-gateway``: ``caravan gateway`` replicas (one worker each) on dynamic ports, registered as a Nomad service
  with an HTTP check on ``/healthz``; rolling updates one at a time, each new replica healthy before the next old one
  stops; a stopping replica leaves the service first, then waits ``shutdown_delay`` before its SIGTERM, so the ingress
  takes it out of HAProxy's backend before it drains.
- ``<name>-ingress``: HAProxy (``caravan ingress``), the one public port; its gateway backend lists every replica the
  service has (a template over ``nomadService``, applied through HAProxy's runtime API, no reload). The public port
  is HAProxy's own bind, not a Nomad reservation: an update starts the new allocation as a canary beside the old one,
  given the old one's listening sockets (``caravan.stack.haproxy.start_haproxy``), and stops the old one once the new
  is healthy (HAProxy's ``/healthz`` on a dynamic port, Nomad's check): the port never closes.
- ``<name>-scheduler`` and ``<name>-idle``: two or more each, one leading by its Redis lease; each answers ``/health``
  (``{"leading": ...}``) on a dynamic port, Nomad's HTTP check.
- ``<name>-namespace-keeper``: a system job, one ``caravan namespace-keeper`` on every client with Docker and a session
  network (its node meta ``caravan_session_network``, which ``caravan stack`` sets), in every node pool: it keeps that
  client's pool of network namespaces made ahead (``nomad_jobs.namespace_keeper``) for its node
  (``${node.unique.id}``), with the scheduler's credentials; ``env.CARAVAN_NAMESPACE_POOL`` namespaces (default 2; 0:
  no keeper job, and a running one is stopped), of ``env.CARAVAN_PAUSE_IMAGE`` (unset: no keeper job). On a stop or an
  update it deletes its free namespaces within its kill timeout.

Secrets never appear in a job spec: ``caravan deploy`` writes each job's (its role's Nomad token and Redis password,
the app cookie key, the bootstrap admin token, the Sentinels' client password) into the Nomad Variable
``nomad/jobs/<job id>``, which only that job's tasks may read (Nomad's workload identity), and a ``template`` block
writes them into the task's ``secrets/`` directory (``CARAVAN_SECRETS_DIR``) as the files Caravan already reads.
The configuration's ``env`` is refused when it holds a credential.

The tasks run the configured Python (the project's virtual environment on each client) with the raw_exec driver.
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from caravan.stack.nomad_acl import NomadACLError, NomadAdmin
from core.secrets import (
    Role,
    app_cookie_key_path,
    ensure_app_cookie_key,
    nomad_token_path,
    read_secret,
    redis_password_path,
    redis_sentinel_client_path,
)
from core.settings import NomadSettings, Settings
from nomad_jobs.namespace_keeper import NETWORK_META
from stores.users import bootstrap_admin_token

_T = TypeVar("_T")

SECOND = 1_000_000_000
"""Nomad's JSON durations are nanoseconds."""
REPLICAS_WAIT = 0.2
"""Seconds the ingress' template of the gateway replicas waits before writing a change (Nomad's default for a client,
5 s, is the whole ``shutdown_delay``: a stopping replica left HAProxy's backend as it stopped listening, and a request
sent to it then was cut)."""
NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
FORBIDDEN_ENV = frozenset(
    {"CARAVAN_NOMAD_TOKEN", "CARAVAN_ADMIN_TOKEN", "CARAVAN_REDIS_SENTINEL_PASSWORD", "CARAVAN_SECRETS_DIR"}
)
"""Variables the jobs get from Nomad Variables (or that point at them): never from the configuration."""
OWN_ENV = frozenset(
    {
        "CARAVAN_HOME", "CARAVAN_GATEWAY_HOST", "CARAVAN_GATEWAY_PORT", "CARAVAN_GATEWAY_WORKERS",
        "CARAVAN_INGRESS_PORT", "CARAVAN_INGRESS_DIR", "CARAVAN_INGRESS_BIND", "CARAVAN_HEALTH_PORT",
        "CARAVAN_NODE_ID", "CARAVAN_SESSION_NETWORK_DIR",
    }
)  # fmt: skip
"""Variables ``caravan deploy`` sets itself, from the configuration's typed fields (or Nomad's, for the keeper)."""
MAX_POOL = 10
"""The most namespaces a deployed keeper keeps (``CARAVAN_NAMESPACE_POOL``): on a stop it deletes its free ones within
its kill timeout (:func:`keeper_kill_timeout`), under the Nomad client's ``max_kill_timeout`` (30 s by default)."""
IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:@-]{0,254}$")
"""A Docker image reference (what the keeper passes ``docker run``: never an option)."""


class DeployError(ValueError):
    """A configuration ``caravan deploy`` refuses, or a Nomad that refused a step."""


class Replicas(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    count: int = 2


class IngressSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    port: int = 8420
    """HAProxy's static port on its node (the one public port)."""
    gateway_slots: int = 16
    """The most gateway replicas the backend can list at once (a rolling update briefly runs one more)."""
    bind: str | None = None
    """The address the public port binds: unset, the ingress' client's (Nomad's ``${NOMAD_IP_health}``: its
    ``network_interface``); or an address of that client's (``0.0.0.0`` for all of them)."""


class DeployConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What ``caravan deploy --config <file.json>`` reads: a JSON object with these fields (all optional)."""

    name: str = "caravan"
    """Prefix of the job ids (``<name>-gateway`` ...) and of the gateway's Nomad service."""
    namespace: str = "caravan-system"
    datacenters: list[str] = msgspec.field(default_factory=lambda: ["dc1"])
    python: str = sys.executable
    """The Python of Caravan's virtual environment, at the same path on every client that runs Caravan's jobs."""
    home: str = "/var/lib/caravan"
    """Caravan's state directory on the clients (HAProxy's files under ``haproxy/``)."""
    host: str = "127.0.0.1"
    """The ingress' address as the gateways see its connections: they believe it when it names a client
    (``X-Forwarded-For``). The gateways and the health endpoints listen where Nomad registers them (their client's
    ``network_interface``), and so does HAProxy (``ingress.bind``)."""
    gateway: Replicas = Replicas()
    scheduler: Replicas = Replicas()
    idle: Replicas = Replicas()
    ingress: IngressSpec = IngressSpec()
    distinct_hosts: bool = False
    ingress_node: str | None = None
    """The client (its Nomad node name) that runs HAProxy, with its control planes (``caravan ingress
    --keep-maps``): the edge whose address clients reach. Unset: any client, or a constraint of your own. The gateways
    run anywhere (``distinct_hosts`` spreads them too)."""
    """Put the replicas of each job on different clients (a real cluster; one machine has one client)."""
    shutdown_delay: float = 5.0
    """Seconds a stopping gateway replica keeps serving after leaving the service (the ingress drops it meanwhile)."""
    memory_mb: int = 512
    """Memory each task asks Nomad for, in MB (a keeper asks at most 256)."""
    kill_timeout: float = 15.0
    """Seconds a task has between SIGTERM and SIGKILL (the gateway drains its requests within 5 s)."""
    version: str = ""
    """The release deployed (each job's ``caravan_version`` meta): a new one rolls the jobs (``--only gateway``...)."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """``CARAVAN_*`` settings of every job (``CARAVAN_REDIS_URL``, ``CARAVAN_NOMAD_ADDR`` ...), without credentials."""


Job = Literal["gateway", "scheduler", "idle", "ingress", "namespace-keeper"]
JOBS: tuple[Job, ...] = ("namespace-keeper", "ingress", "gateway", "scheduler", "idle")
"""In the order they are registered: the keepers first, so that each client is likelier to keep room for its own (a
system job is not placed on a client that the others filled, and its deployment still succeeds: on the multi-host test
cluster a host running the four others had no memory left for it, and its docker sessions took today's path)."""
ROLE_OF: dict[Job, Role] = {
    "gateway": "gateway",
    "scheduler": "scheduler",
    "idle": "idle",
    "ingress": "gateway",
    "namespace-keeper": "scheduler",
}
"""Whose credentials a job's tasks run with (HAProxy needs only the app cookie key; the keeper reads its node's
allocations and writes the pool's set, as the scheduler does)."""


def jobs_named(text: str) -> tuple[Job, ...]:
    """``--only``'s comma-separated job names, checked."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in JOBS]
    if unknown or not names:
        raise DeployError(f"--only: {', '.join(unknown) or 'nothing'}: the jobs are {', '.join(JOBS)}")
    return tuple(job for job in JOBS if job in names)


def namespace_pool(config: DeployConfig) -> int:
    """The namespaces each client's keeper keeps (``env.CARAVAN_NAMESPACE_POOL``, default 2); 0: no keeper job,
    and none either without ``env.CARAVAN_PAUSE_IMAGE``."""
    text = config.env.get("CARAVAN_NAMESPACE_POOL")
    try:
        size = Settings.namespace_pool if text is None else int(text)
    except ValueError:
        raise DeployError(f"env.CARAVAN_NAMESPACE_POOL: {text!r} is not a number") from None
    if not 0 <= size <= MAX_POOL:
        raise DeployError(f"env.CARAVAN_NAMESPACE_POOL: {size} is not between 0 and {MAX_POOL}")
    image = config.env.get("CARAVAN_PAUSE_IMAGE")
    if image is not None and not IMAGE.match(image):
        raise DeployError(f"env.CARAVAN_PAUSE_IMAGE: {image!r} is not an image reference")
    if image is None and text is not None and size > 0:
        raise DeployError(
            "env.CARAVAN_NAMESPACE_POOL: the keepers need env.CARAVAN_PAUSE_IMAGE, the clients' pause image "
            "(their docker infra_image); 0 for no keeper"
        )
    return size if image else 0


def deployed_jobs(config: DeployConfig) -> tuple[Job, ...]:
    """The jobs this configuration deploys: the namespace keepers only with a pool."""
    return tuple(job for job in JOBS if job != "namespace-keeper" or namespace_pool(config) > 0)


def keeper_kill_timeout(config: DeployConfig) -> float:
    """Seconds a stopping keeper has to delete its free namespaces (a CNI DEL and a ``docker rm`` each, well under a
    second), never under the configuration's ``kill_timeout``."""
    return max(config.kill_timeout, 10.0 + 2.0 * namespace_pool(config))


def load_config(path: Path) -> DeployConfig:
    try:
        config = msgspec.json.decode(path.read_bytes(), type=DeployConfig)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DeployError(f"{path}: {exc}") from exc
    check(config)
    return config


def check(config: DeployConfig) -> None:
    """Refuse what would not make a working, secret-free deployment."""
    for field, value in (("name", config.name), ("namespace", config.namespace)):
        if not NAME.match(value):
            raise DeployError(f"{field}: {value!r} is not a name (a-z, 0-9, '-', 40 at most, a letter first)")
    theirs = (
        config.env.get("CARAVAN_NOMAD_NAMESPACE", NomadSettings.namespace),
        config.env.get("CARAVAN_NOMAD_PLATFORM_NAMESPACE", NomadSettings.platform_namespace),
    )
    if config.namespace in theirs:
        raise DeployError(
            f"namespace: {config.namespace!r} is the sessions' or the platform's; Caravan's own jobs "
            "need one of their own (it allows raw_exec)"
        )
    for field, replicas in (("gateway", config.gateway), ("scheduler", config.scheduler), ("idle", config.idle)):
        if not 1 <= replicas.count <= 64:
            raise DeployError(f"{field}.count: {replicas.count} is not between 1 and 64")
    if not config.gateway.count < config.ingress.gateway_slots <= 256:
        raise DeployError(
            "ingress.gateway_slots: more than gateway.count (a rolling update runs one more), 256 at most"
        )
    if not 64 <= config.memory_mb <= 65536:
        raise DeployError(f"memory_mb: {config.memory_mb} is not between 64 and 65536")
    if not 1 <= config.ingress.port <= 65535:
        raise DeployError(f"ingress.port: {config.ingress.port} is not a port")
    if config.ingress.bind is not None:
        try:
            ipaddress.ip_address(config.ingress.bind)
        except ValueError:
            raise DeployError(f"ingress.bind: {config.ingress.bind!r} is not an IP address") from None
    if not Path(config.python).is_absolute() or not Path(config.home).is_absolute():
        raise DeployError("python and home are absolute paths on the clients")
    _check_env(config)
    namespace_pool(config)


def _check_env(config: DeployConfig) -> None:
    """No credential, nothing ``caravan deploy`` sets itself, no expression: values only."""
    for key, value in config.env.items():
        if not re.match(r"^CARAVAN_[A-Z0-9_]+$", key):
            raise DeployError(f"env.{key}: only CARAVAN_* settings")
        if key in FORBIDDEN_ENV:
            raise DeployError(f"env.{key}: a credential; caravan deploy puts it in Nomad Variables itself")
        if key in OWN_ENV:
            raise DeployError(f"env.{key}: set from the configuration's own fields")
        if key == "CARAVAN_REDIS_URL" and urllib.parse.urlsplit(value).password:
            raise DeployError("env.CARAVAN_REDIS_URL: carries a password; each role's comes from Nomad Variables")
    values = (config.python, config.home, config.host, config.version, config.ingress_node or "")
    for text in (*values, *config.datacenters, *config.env.values()):
        if "${" in text or "{{" in text:
            raise DeployError(f"{text!r}: no interpolation (${{...}}) or template ({{{{...}}}}) in a value")


def job_id(config: DeployConfig, job: Job) -> str:
    return f"{config.name}-{job}"


def gateway_service(config: DeployConfig) -> str:
    return f"{config.name}-gateway"


def variable_path(config: DeployConfig, job: Job) -> str:
    """The Nomad Variable only ``job``'s tasks read (workload identity's implicit access to ``nomad/jobs/<id>``)."""
    return f"nomad/jobs/{job_id(config, job)}"


def _secrets(job: Job, secrets: Path) -> dict[str, Path]:
    """Variable item -> its file in the ``secrets`` directory: the operator's, read by ``caravan deploy``; the file's
    name is the one the task finds in its own ``secrets/`` (the files Caravan reads anyway)."""
    role = ROLE_OF[job]
    files = {
        "app_cookie_key": app_cookie_key_path(secrets),
        "redis_password": redis_password_path(secrets, role),
        "sentinel_password": redis_sentinel_client_path(secrets),
    }
    if job != "ingress":  # HAProxy's control planes read Redis only
        files["nomad_token"] = nomad_token_path(secrets, role)
    if job == "namespace-keeper":  # no app of its own
        del files["app_cookie_key"]
    return files


def variables(config: DeployConfig, settings: Settings) -> dict[Job, dict[str, str]]:
    """Each job's secrets, read from the operator's secrets directory (``CARAVAN_SECRETS_DIR``)."""
    secrets = settings.secrets
    ensure_app_cookie_key(secrets)
    found: dict[Job, dict[str, str]] = {}
    for job in deployed_jobs(config):
        items = {item: value for item, path in _secrets(job, secrets).items() if (value := read_secret(path))}
        if job == "gateway":
            items["admin_token"] = bootstrap_admin_token(settings.gateway.admin_token, settings.home)
        found[job] = items
    return found


def _templates(config: DeployConfig, job: Job, items: set[str]) -> list[dict[str, Any]]:
    """Template blocks writing each secret the job's Variable holds into ``secrets/`` (and the admin token into the
    gateway's environment); a changed Variable restarts the task with it."""
    path = variable_path(config, job)
    templates: list[dict[str, Any]] = [
        {
            "EmbeddedTmpl": f'{{{{ with nomadVar "{path}" }}}}{{{{ .{item} }}}}{{{{ end }}}}',
            "DestPath": f"secrets/{file.name}",
            "Perms": "0600",
            "ChangeMode": "restart",
        }
        for item, file in _secrets(job, Path()).items()
        if item in items
    ]
    if "admin_token" in items:
        templates.append(
            {
                "EmbeddedTmpl": (
                    f'{{{{ with nomadVar "{path}" }}}}CARAVAN_ADMIN_TOKEN={{{{ .admin_token }}}}{{{{ end }}}}'
                ),
                "DestPath": "secrets/admin.env",
                "Perms": "0600",
                "Envvars": True,
                "ChangeMode": "restart",
            }
        )
    return templates


def _task(config: DeployConfig, job: Job, args: list[str], env: Mapping[str, str], items: set[str]) -> dict[str, Any]:
    return {
        "Name": job,
        "Driver": "raw_exec",
        "Config": {"command": config.python, "args": ["-m", "caravan.cli", *args]},
        "Env": {
            **config.env,
            "CARAVAN_HOME": config.home,
            "CARAVAN_SECRETS_DIR": "${NOMAD_SECRETS_DIR}",
            "PYTHONUNBUFFERED": "1",
            **env,
        },
        "Templates": _templates(config, job, items),
        "KillSignal": "SIGTERM",
        "KillTimeout": int(config.kill_timeout * SECOND),
        "Resources": {"CPU": 200, "MemoryMB": config.memory_mb},
    }


def _check(kind: Literal["http", "tcp"], path: str | None = None) -> dict[str, Any]:
    check: dict[str, Any] = {"Name": kind, "Type": kind, "Interval": SECOND, "Timeout": SECOND}
    if path:
        check["Path"] = path
    return check


def _job(config: DeployConfig, job: Job, group: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "ID": job_id(config, job),
        "Name": job_id(config, job),
        "Namespace": config.namespace,
        "Type": "service",
        "Datacenters": list(config.datacenters),
        "Meta": {"caravan_role": job, "caravan_version": config.version},
        "Update": {
            "MaxParallel": 1,
            "HealthCheck": "checks",
            "MinHealthyTime": 2 * SECOND,
            "HealthyDeadline": 60 * SECOND,
            "ProgressDeadline": 120 * SECOND,
            "AutoRevert": True,
        },
        "TaskGroups": [
            {
                "Name": job,
                "RestartPolicy": {"Attempts": 10, "Interval": 300 * SECOND, "Delay": SECOND, "Mode": "delay"},
                "ReschedulePolicy": {"Unlimited": True, "Delay": 5 * SECOND, "DelayFunction": "constant"},
                **group,
            }
        ],
    }
    if job == "ingress":
        # the new HAProxy starts beside the old one (a canary: a replacement on the same client would wait for the old
        # one to end) and takes over its listening sockets; once healthy it is promoted, the old one stops
        spec["Update"] |= {"Canary": 1, "AutoPromote": True}
    if config.ingress_node and job == "ingress":
        spec["Constraints"] = [{"LTarget": "${node.unique.name}", "Operand": "=", "RTarget": config.ingress_node}]
    elif config.distinct_hosts and job not in ("ingress", "namespace-keeper"):
        spec["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    return spec


def _keeper(config: DeployConfig, items: set[str]) -> dict[str, Any]:
    """The system job of the namespace keepers: one allocation on every client, of every node pool, that has the
    docker driver and advertises where its session network is recorded (node meta :data:`NETWORK_META`); each keeper
    is told its node and that directory by Nomad itself."""
    task = _task(
        config,
        "namespace-keeper",
        ["namespace-keeper"],
        {"CARAVAN_NODE_ID": "${node.unique.id}", "CARAVAN_SESSION_NETWORK_DIR": f"${{meta.{NETWORK_META}}}"},
        items,
    )
    task["KillTimeout"] = int(keeper_kill_timeout(config) * SECOND)
    # on every client: 100 MB resident, and its docker commands
    task["Resources"] = {"CPU": 100, "MemoryMB": min(256, config.memory_mb)}
    spec = _job(config, "namespace-keeper", {"Count": 1, "Tasks": [task]})
    del spec["TaskGroups"][0]["ReschedulePolicy"]  # a system job's allocation stays on its node
    spec["Update"] = {"MaxParallel": 1, "HealthCheck": "task_states", "MinHealthyTime": 2 * SECOND}
    return spec | {
        "Type": "system",
        "NodePool": "all",
        "Constraints": [
            {"LTarget": "${attr.driver.docker}", "Operand": "=", "RTarget": "1"},
            {"LTarget": f"${{meta.{NETWORK_META}}}", "Operand": "is_set"},
        ],
    }


def render(config: DeployConfig, items: Mapping[Job, set[str]]) -> dict[Job, dict[str, Any]]:
    """The job specs (JSON, Nomad's API form) of :func:`deployed_jobs`. ``items``: the names (never the values) of
    each job's secrets."""
    check(config)
    haproxy_dir = str(Path(config.home) / "haproxy")
    gateway_env = {
        "CARAVAN_GATEWAY_HOST": "${NOMAD_IP_http}",  # where Nomad registers it: the client's address
        "CARAVAN_GATEWAY_PORT": "${NOMAD_PORT_http}",
        "CARAVAN_GATEWAY_WORKERS": "1",
        "CARAVAN_INGRESS_PORT": str(config.ingress.port),
        "CARAVAN_GATEWAY_KEEPS_MAPS": "0",  # the ingress job keeps HAProxy's maps: the gateways go on any client
        "CARAVAN_TRUSTED_PROXIES": config.host,
    }
    gateways = (
        f'{{{{ range nomadService "{gateway_service(config)}" }}}}{{{{ .Address }}}}:{{{{ .Port }}}}\n{{{{ end }}}}'
    )
    jobs: dict[Job, dict[str, Any]] = {
        "gateway": _job(
            config,
            "gateway",
            {
                "Count": config.gateway.count,
                "Networks": [{"DynamicPorts": [{"Label": "http", "HostNetwork": "default"}]}],
                "Services": [
                    {
                        "Name": gateway_service(config),
                        "Provider": "nomad",
                        "PortLabel": "http",
                        "Checks": [_check("http", "/healthz")],
                    }
                ],
                "ShutdownDelay": int(config.shutdown_delay * SECOND),
                "Tasks": [_task(config, "gateway", ["gateway"], gateway_env, items["gateway"])],
            },
        ),
        "ingress": _job(
            config,
            "ingress",
            {
                "Count": 1,
                "Networks": [{"DynamicPorts": [{"Label": "health"}]}],
                "Services": [
                    {
                        "Name": f"{config.name}-ingress",
                        "Provider": "nomad",
                        "PortLabel": "health",
                        "Checks": [_check("http", "/healthz")],
                    }
                ],
                "Tasks": [
                    {
                        **_task(
                            config,
                            "ingress",
                            [
                                "ingress",
                                "--gateways",
                                "${NOMAD_TASK_DIR}/gateways.txt",
                                "--slots",
                                str(config.ingress.gateway_slots),
                                "--health-port",
                                "${NOMAD_PORT_health}",
                                "--keep-maps",
                            ],
                            {
                                "CARAVAN_INGRESS_PORT": str(config.ingress.port),
                                "CARAVAN_INGRESS_DIR": haproxy_dir,
                                # the client's address (its network_interface), where Nomad checks the health port
                                "CARAVAN_INGRESS_BIND": config.ingress.bind or "${NOMAD_IP_health}",
                            },
                            items["ingress"],
                        ),
                        "Templates": [
                            *_templates(config, "ingress", items["ingress"]),
                            # the replicas as Nomad's service registry has them; caravan ingress applies each change
                            {
                                "EmbeddedTmpl": gateways,
                                "DestPath": "local/gateways.txt",
                                "ChangeMode": "noop",
                                "Wait": {"Min": 0, "Max": int(REPLICAS_WAIT * SECOND)},
                            },
                        ],
                    }
                ],
            },
        ),
    }
    for leader in ("scheduler", "idle"):
        replicas = config.scheduler if leader == "scheduler" else config.idle
        jobs[leader] = _job(
            config,
            leader,
            {
                "Count": replicas.count,
                "Networks": [{"DynamicPorts": [{"Label": "health"}]}],
                "Services": [
                    {
                        "Name": f"{config.name}-{leader}",
                        "Provider": "nomad",
                        "PortLabel": "health",
                        "Checks": [_check("http", "/health")],
                    }
                ],
                "Tasks": [
                    _task(
                        config,
                        leader,
                        [leader],
                        {"CARAVAN_HEALTH_PORT": "${NOMAD_PORT_health}", "CARAVAN_GATEWAY_HOST": "${NOMAD_IP_health}"},
                        items[leader],
                    )
                ],
            },
        )
    if "namespace-keeper" in items:
        jobs["namespace-keeper"] = _keeper(config, items["namespace-keeper"])
    return {job: jobs[job] for job in deployed_jobs(config)}


def deploy(
    config: DeployConfig,
    settings: Settings,
    *,
    wait: float = 0.0,
    only: tuple[Job, ...] = JOBS,
    out: Any = sys.stdout,
) -> int:
    """Write the secrets into Nomad Variables, the namespace (raw_exec allowed), and register the jobs (``only``
    those); with ``wait`` > 0, wait that many seconds for each job's deployment to succeed. Uses the operator's
    token (the secrets directory's ``nomad-admin.token`` or ``CARAVAN_NOMAD_TOKEN``)."""
    admin_settings = settings.for_role("admin")
    nomad = NomadAdmin(admin_settings.nomad.addr, admin_settings.nomad.token)
    secrets = variables(config, settings)
    nomad.call(
        "POST",
        f"/v1/namespace/{config.namespace}",
        {
            "Name": config.namespace,
            "Description": "Caravan's own jobs",
            "Capabilities": {"EnabledTaskDrivers": ["raw_exec"]},
        },
    )
    ns = urllib.parse.quote(config.namespace)
    for job, items in secrets.items():
        path = variable_path(config, job)
        nomad.call(
            "PUT", f"/v1/var/{path}?namespace={ns}", {"Namespace": config.namespace, "Path": path, "Items": items}
        )
    specs = render(config, {job: set(items) for job, items in secrets.items()})
    evaluations: dict[Job, int] = {}
    for job, spec in specs.items():
        if job not in only:
            continue
        answer = nomad.call("POST", f"/v1/jobs?namespace={ns}", {"Job": spec})
        evaluations[job] = int(answer.get("JobModifyIndex", 0))
        print(f"caravan deploy: registered {spec['ID']} in {config.namespace}", file=out)
    if "namespace-keeper" in only and "namespace-keeper" not in specs:
        _stop_keepers(nomad, config, out)
    if wait <= 0:
        return 0
    deadline = time.monotonic() + wait
    for job, index in evaluations.items():
        status = _await_deployment(nomad, config, job, index, deadline)
        print(f"caravan deploy: {job_id(config, job)}: {status}", file=out)
        if status != "successful":
            return 1
        if unplaced := unplaced_because(nomad, config, job, deadline):
            # a system job's deployment succeeds with the nodes that had no room left out (Nomad 1.11)
            print(f"caravan deploy: {job_id(config, job)}: warning: {unplaced}", file=out)
    return 0


def unplaced_because(nomad: NomadAdmin, config: DeployConfig, job: Job, deadline: float) -> str | None:
    """Why some of the job's allocations are not placed (its blocked evaluation's failures), once none of its
    evaluations is pending; None when every one is."""

    def evaluations() -> list[Any]:
        found = nomad.call("GET", _job_path(config, job, "evaluations"))
        return found if isinstance(found, list) else []

    settled = _polled(deadline, evaluations, lambda found: not any(e.get("Status") == "pending" for e in found))
    blocked = [e for e in settled if e.get("Status") == "blocked"]
    return placement_failures(max(blocked, key=lambda e: int(e.get("ModifyIndex", 0)))) if blocked else None


def placement_failures(evaluation: Mapping[str, Any]) -> str:
    """What a blocked evaluation says of its task groups' failed placements, in a line: the nodes that had no room
    (and which resource ran out), those filtered out by constraints."""
    said = []
    for group, metrics in sorted((evaluation.get("FailedTGAllocs") or {}).items()):
        exhausted = ", ".join(f"{d} on {n}" for d, n in sorted((metrics.get("DimensionExhausted") or {}).items()))
        filtered = ", ".join(f"{c} on {n}" for c, n in sorted((metrics.get("ConstraintFiltered") or {}).items()))
        parts = [f"{metrics.get('NodesExhausted', 0)} node(s) without room" + (f" ({exhausted})" if exhausted else "")]
        if filtered:
            parts.append(f"filtered: {filtered}")
        said.append(f"group {group} not placed everywhere: {'; '.join(parts)}")
    return "; ".join(said) or "some allocations are not placed (no reason given)"


def _stop_keepers(nomad: NomadAdmin, config: DeployConfig, out: Any) -> None:
    """No pool configured: a keeper job deployed before is stopped (each keeper deletes its free namespaces)."""
    keepers = job_id(config, "namespace-keeper")
    path = f"/v1/job/{urllib.parse.quote(keepers)}?namespace={urllib.parse.quote(config.namespace)}"
    try:
        if nomad.call("GET", path).get("Stop"):
            return
    except NomadACLError:  # none deployed
        return
    nomad.call("DELETE", path)
    print(f"caravan deploy: stopped {keepers} (no namespace pool)", file=out)


def _job_path(config: DeployConfig, job: Job, what: str) -> str:
    """The API path of one of the job's lists (``deployment``, ``evaluations``) in the deployment's namespace."""
    return f"/v1/job/{urllib.parse.quote(job_id(config, job))}/{what}?namespace={urllib.parse.quote(config.namespace)}"


_UNDECIDED = frozenset({"none", "running", "pending", "initializing", "blocked", "paused"})
"""Deployment statuses that are no outcome yet ("none": no deployment of that version seen yet)."""


def _await_deployment(nomad: NomadAdmin, config: DeployConfig, job: Job, index: int, deadline: float) -> str:
    """The status of the job's deployment for the version registered at ``index`` (``successful``, ``failed`` ...)."""

    def status() -> str:
        found = nomad.call("GET", _job_path(config, job, "deployment"))
        ours = isinstance(found, dict) and int(found.get("JobModifyIndex", 0)) >= index
        return str(found.get("Status")) if ours else "none"

    last = _polled(deadline, status, lambda found: found not in _UNDECIDED)
    return last if last not in _UNDECIDED else f"not done after the wait ({last})"


def _polled(deadline: float, read: Callable[[], _T], settled: Callable[[_T], bool]) -> _T:
    """``read()`` every half second until what it reads is ``settled`` or ``deadline`` (monotonic) has passed: the
    last reading."""
    while True:
        found = read()
        if settled(found) or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def show(config: DeployConfig, settings: Settings) -> str:
    """The rendered job specs as ``caravan deploy --render`` prints them (the secrets' names, never their values)."""
    items = {job: set(found) for job, found in variables(config, settings).items()}
    return json.dumps({job: {"Job": spec} for job, spec in render(config, items).items()}, indent=2)
