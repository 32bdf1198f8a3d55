"""Nomad's ACLs for Caravan: one policy per component, a token per component, the bootstrap of a new agent.

The policies below are the only place their text lives: ``caravan stack up`` applies them to the Nomad it starts, and
``caravan stack nomad-policies`` prints them for an operator who runs Caravan on a Nomad of their own.

What each component calls (``nomad_jobs/client.py`` and its callers) and the capability Nomad 1.11 checks for it
(``nomad/*_endpoint.go``, ``client/*_endpoint.go``, ``command/agent/job_endpoint.go``):

=============================================  ==================================  ===========================
call                                           capability                          who
=============================================  ==================================  ===========================
``POST /v1/jobs/parse``                        ``parse-job``                       scheduler
``POST /v1/jobs`` (register)                   ``register-job``                    scheduler
``DELETE /v1/job/:id`` (stop)                  ``deregister-job``                  scheduler
``DELETE /v1/job/:id?purge=true``              ``purge-job``                       scheduler (forced destroy)
``GET /v1/jobs?prefix=``                       ``list-jobs``                       scheduler
``GET /v1/job/:id/allocations``                ``read-job``                        scheduler
``GET /v1/job/:id/evaluations``                ``read-job``                        scheduler
``GET /v1/allocations`` (own namespace)        ``read-job``                        scheduler
``GET /v1/allocations?namespace=*`` (live)     ``read-job`` in every namespace     scheduler, gateway (groups)
``GET /v1/allocation/:id``                     ``read-job``                        gateway (log follows)
``GET /v1/client/allocation/:id/checks``       ``read-job``                        scheduler
``GET /v1/client/allocation/:id/stats``        ``read-job``                        idle
``POST /v1/client/allocation/:id/restart``     ``alloc-lifecycle``                 scheduler (restartSession)
``GET /v1/client/fs/logs/:id``                 ``read-logs``                       gateway
``GET /v1/client/fs/ls/:id`` (log offsets)     ``read-fs``                         gateway
``GET /v1/client/fs/stat/:id`` (SFTP clients)  ``read-fs``                         idle
``GET /v1/client/fs/cat/:id`` (net counters)   ``read-fs``                         idle
``GET /v1/client/allocation/:id/exec`` (WS)  ``alloc-exec``                      gateway (execs, terminals)
``GET /v1/nodes``, ``/v1/node/:id``            ``node { policy = "read" }``        scheduler, gateway (groups)
``GET /v1/event/stream`` Alloc., Eval., Node   ``read-job``; node read             scheduler
``GET /v1/status/leader`` (readiness)          none                                gateway
``PUT /v1/volume/host/create`` (folders)       ``host-volume-create``              scheduler
``DELETE /v1/volume/host/:id``                 ``host-volume-delete``              scheduler
a job mounting a folder (register)             ``host_volume "caravan-folder-*"``  scheduler
=============================================  ==================================  ===========================

The platform's own short jobs (``docker commit``/``docker rmi`` of committed images, ``nomad_jobs.commit_job``) use
the ``raw_exec`` driver, which the users' namespace disables unless the operator runs raw_exec sessions. They go to a
namespace of their own, the platform's (``caravan-platform`` by default, ``CARAVAN_NOMAD_PLATFORM_NAMESPACE``), whose
capabilities enable ``raw_exec`` and no other driver, and where only the scheduler's policy grants anything beyond
reading (``register-job``, ``read-job``, ``purge-job``...): no user's session can land there, since Caravan renders
every session's job into the users' namespace, and no other token can register there.

Only the scheduler writes to Nomad (its job owner, ``scheduler.job_owner``): the gateway and the idle checker ask it
through Redis, so their tokens write no job. The gateway may run commands in kernels (``alloc-exec``: execs and
terminals) but never in ``raw_exec`` tasks, which run on the host (``alloc-node-exec`` is never granted). Node pools
are read from the node list (each node's ``NodePool``); no node-pool endpoint is called, so no ``node_pool`` rule is
given. Nothing may touch ACLs, agents, operators or other namespaces' jobs.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caravan.stack.processes import StartupFailed, wait_until
from core.secrets import COMPONENT_ROLES, Role, ensure_secret, nomad_token_path, read_secret, write_secret
from core.settings import NomadSettings
from domain.storage import VOLUME_PREFIX

POLICY_PREFIX = "caravan-"
PLATFORM_NAMESPACE = NomadSettings.platform_namespace

_NAMESPACE_CAPABILITIES: dict[Role, tuple[str, ...]] = {
    "scheduler": (
        "list-jobs",
        "read-job",
        "parse-job",
        "register-job",
        "deregister-job",
        "purge-job",
        "alloc-lifecycle",
        "host-volume-create",  # storage folders (scheduler.folder_owner)
        "host-volume-read",
        "host-volume-write",  # jobs mounting a folder read-write
        "host-volume-delete",  # a trashed folder purged
    ),
    "gateway": ("read-job", "read-logs", "read-fs", "alloc-exec"),  # never alloc-node-exec: raw_exec runs on the host
    "idle": ("read-job", "read-fs"),  # read-fs: an SFTP session's client-seen file (its time), kernels' net counters
}
_PLATFORM_CAPABILITIES: dict[Role, tuple[str, ...]] = {
    "scheduler": ("read-job", "parse-job", "register-job", "deregister-job", "purge-job"),
}
"""In the platform's namespace: the scheduler registers, reads and purges its short jobs; nobody else writes there."""
PLATFORM_DRIVERS = ("raw_exec",)
"""The task drivers the platform's namespace allows (its jobs run ``/usr/bin/docker`` on the host)."""
_READS_EVERY_NAMESPACE: frozenset[Role] = frozenset({"scheduler", "gateway"})
"""Who counts live allocations of every namespace (a node's occupancy includes jobs that are not Caravan's)."""
_READS_NODES: frozenset[Role] = frozenset({"scheduler", "gateway"})

_VALID_NAMESPACE = re.compile(r"^[a-zA-Z0-9-]{1,128}$")  # Nomad's own rule (acl/policy.go validNamespace)


def policy_name(role: Role) -> str:
    return POLICY_PREFIX + role


def policy_rules(role: Role, namespace: str, platform: str = PLATFORM_NAMESPACE) -> str:
    """The HCL rules of ``role``'s policy for Caravan's jobs in ``namespace`` and the platform's in ``platform``."""
    for name in (namespace, platform):
        if not _VALID_NAMESPACE.match(name):
            raise ValueError(f"not a Nomad namespace name: {name!r}")
    if namespace == platform:
        raise ValueError(f"the platform's namespace {platform!r} cannot be the users' namespace")
    rules = _namespace_rule(namespace, _NAMESPACE_CAPABILITIES[role])
    if role in _PLATFORM_CAPABILITIES:
        rules += _namespace_rule(platform, _PLATFORM_CAPABILITIES[role])
    if role in _READS_EVERY_NAMESPACE:
        rules += 'namespace "*" {\n  capabilities = ["read-job"]\n}\n'
    if role in _READS_NODES:
        rules += 'node {\n  policy = "read"\n}\n'
    if role == "scheduler":  # jobs mounting storage folders (Nomad checks the volume's name at registration)
        rules += f'host_volume "{VOLUME_PREFIX}*" {{\n  policy = "write"\n}}\n'
    return rules


def _namespace_rule(namespace: str, capabilities: tuple[str, ...]) -> str:
    listed = ", ".join(f'"{c}"' for c in capabilities)
    return f'namespace "{namespace}" {{\n  capabilities = [{listed}]\n}}\n'


def policies(namespace: str, platform: str = PLATFORM_NAMESPACE) -> dict[Role, str]:
    """Every component's policy rules, by role."""
    return {role: policy_rules(role, namespace, platform) for role in COMPONENT_ROLES}


def describe_policies(namespace: str, platform: str = PLATFORM_NAMESPACE) -> str:
    """The policies as an operator applies them to a Nomad of their own (``caravan stack nomad-policies``)."""
    drivers = ", ".join(f'"{d}"' for d in PLATFORM_DRIVERS)
    lines = [
        f"# Caravan's Nomad ACL policies for namespace {namespace!r} (CARAVAN_NOMAD_NAMESPACE) and the platform's",
        f"# namespace {platform!r} (CARAVAN_NOMAD_PLATFORM_NAMESPACE), which runs the docker commit/rmi jobs:",
        f'#   nomad namespace apply {platform}.hcl, with: name = "{platform}"',
        f"#     capabilities {{ enabled_task_drivers = [{drivers}] }}",
        '# and, unless you run raw_exec sessions, capabilities { disabled_task_drivers = ["raw_exec"] } on the',
        "# users' namespace. Every Nomad client that runs docker kernels needs the raw_exec plugin enabled.",
        "# Apply each one and give each component a client token of its own:",
        "#   nomad acl policy apply -description 'Caravan <role>' caravan-<role> caravan-<role>.hcl",
        "#   nomad acl token create -type client -name caravan-<role> -policy caravan-<role>",
        "# then run the component with CARAVAN_NOMAD_TOKEN=<secret id>, or put the secret id in",
        "# $CARAVAN_SECRETS_DIR/nomad-<role>.token (mode 0600).",
        "",
    ]
    for role, rules in policies(namespace, platform).items():
        lines += [f"# ---- {policy_name(role)}.hcl", rules]
    return "\n".join(lines)


class NomadACLError(RuntimeError):
    pass


class ForeignNomad(StartupFailed):
    """The Nomad answering was bootstrapped with a secret that is not ours: not a Nomad this stack started."""


@dataclass(frozen=True)
class NomadAdmin:
    """The few ACL calls the stack makes, with the management token (urllib: no event loop in stack code)."""

    addr: str
    token: str | None

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.addr}{path}", data=data, method=method)
        if (token or self.token) is not None:
            request.add_header("X-Nomad-Token", str(token or self.token))
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise NomadACLError(
                f"Nomad {method} {path}: {exc.code} {exc.read().decode(errors='replace').strip()}"
            ) from exc
        return json.loads(text) if text.strip() else None


def bootstrap(addr: str, secrets_dir: Path) -> str:
    """Bootstrap the ACL system of the Nomad at ``addr`` with a secret Caravan generated once (kept as
    ``nomad-admin.token``); returns that management token.

    Bootstrapping a second time is refused by Nomad: fine when our token is the one it knows (a restarted agent with
    its state), an error otherwise (a Nomad bootstrapped by someone else)."""
    secret = ensure_secret(nomad_token_path(secrets_dir, "admin"), lambda: str(uuid.uuid4()))  # Nomad wants a UUID
    admin = NomadAdmin(addr, None)
    try:
        admin.call("POST", "/v1/acl/bootstrap", {"BootstrapSecret": secret})
    except NomadACLError as exc:
        if "already done" not in str(exc):
            raise
        try:
            self_token = admin.call("GET", "/v1/acl/token/self", token=secret)
        except NomadACLError as refused:
            raise ForeignNomad(
                f"the Nomad at {addr} was bootstrapped with another secret than "
                f"{nomad_token_path(secrets_dir, 'admin')}: {refused}"
            ) from refused
        if self_token.get("Type") != "management":
            raise ForeignNomad(f"{nomad_token_path(secrets_dir, 'admin')} is not a management token of {addr}") from exc
    return secret


def configure(
    addr: str,
    management: str,
    secrets_dir: Path,
    *,
    namespace: str = "default",
    allow_raw_exec: bool = True,
    platform: str = PLATFORM_NAMESPACE,
) -> dict[Role, str]:
    """Apply Caravan's namespaces and policies to the Nomad at ``addr`` and make sure each component has a valid client
    token of its policy in ``secrets_dir`` (``nomad-<role>.token``, 0600). Returns the tokens by role.

    Without ``allow_raw_exec`` the users' namespace disables the ``raw_exec`` task driver: Nomad then refuses any job
    there that uses it, whoever registers it (the scheduler's token included). The platform's namespace enables
    :data:`PLATFORM_DRIVERS` only, whatever ``allow_raw_exec`` says."""
    admin = NomadAdmin(addr, management)
    capabilities = None if allow_raw_exec else {"DisabledTaskDrivers": ["raw_exec"]}
    description = "Default shared namespace" if namespace == "default" else "Caravan's sessions"
    for name, about, allowed in (
        (namespace, description, capabilities),
        (platform, "Caravan's platform jobs (docker commit, rmi)", {"EnabledTaskDrivers": list(PLATFORM_DRIVERS)}),
    ):
        admin.call(
            "POST",
            f"/v1/namespace/{urllib.parse.quote(name)}",
            {"Name": name, "Description": about, "Capabilities": allowed},
        )
    tokens: dict[Role, str] = {}
    for role, rules in policies(namespace, platform).items():
        name = policy_name(role)
        admin.call("POST", f"/v1/acl/policy/{name}", {"Name": name, "Description": f"Caravan {role}", "Rules": rules})
        tokens[role] = _ensure_token(admin, secrets_dir, role)
    return tokens


def _ensure_token(admin: NomadAdmin, secrets_dir: Path, role: Role) -> str:
    """The role's token from its file if Nomad still knows it with the role's policy, else a new one written there."""
    path = nomad_token_path(secrets_dir, role)
    existing = read_secret(path)
    if existing is not None:
        try:
            known = admin.call("GET", "/v1/acl/token/self", token=existing)
            if known.get("Policies") == [policy_name(role)]:
                return existing
        except NomadACLError:
            pass  # an agent whose state is gone (a -dev agent) or a token revoked: make a new one
    created = admin.call(
        "POST", "/v1/acl/token", {"Name": policy_name(role), "Type": "client", "Policies": [policy_name(role)]}
    )
    secret = str(created["SecretID"])
    write_secret(path, secret)
    return secret


def lock_down(
    addr: str,
    secrets_dir: Path,
    *,
    namespace: str = "default",
    allow_raw_exec: bool = True,
    platform: str = PLATFORM_NAMESPACE,
    timeout: float = 60.0,
    log: Path | None = None,
) -> str:
    """Bootstrap (retried while the new server settles) and :func:`configure` the Nomad at ``addr``; returns the
    management token. Anonymous requests stay denied: no ``anonymous`` policy is ever written."""
    management: list[str] = []

    def bootstrapped() -> bool:
        management.append(bootstrap(addr, secrets_dir))
        return True

    wait_until(bootstrapped, what=f"the ACL bootstrap of the Nomad at {addr}", timeout=timeout, log=log)
    configure(addr, management[0], secrets_dir, namespace=namespace, allow_raw_exec=allow_raw_exec, platform=platform)
    return management[0]


SESSION_PEERS_POLICY = POLICY_PREFIX + "session-peers"
SESSION_PEERS_RULES = 'namespace "*" {\n  capabilities = ["read-job"]\n}\nnode {\n  policy = "read"\n}\n'
"""The session-peers daemon on each host (``nomad_jobs.session_peers``): it reads nodes (their meta) and live
allocations of every namespace (their addresses), and nothing else; it writes nothing to Nomad."""


def session_peers_token(addr: str, management: str, path: Path) -> str:
    """Apply the session-peers policy and write a client token of it to ``path`` (0600); returns the token."""
    admin = NomadAdmin(addr, management)
    description = "Caravan session-peers daemons (read nodes and allocations)"
    admin.call(
        "POST",
        f"/v1/acl/policy/{SESSION_PEERS_POLICY}",
        {"Name": SESSION_PEERS_POLICY, "Description": description, "Rules": SESSION_PEERS_RULES},
    )
    created = admin.call(
        "POST", "/v1/acl/token", {"Name": SESSION_PEERS_POLICY, "Type": "client", "Policies": [SESSION_PEERS_POLICY]}
    )
    secret = str(created["SecretID"])
    write_secret(path, secret)
    return secret
