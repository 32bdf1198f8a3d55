"""Pooled network namespaces on a Nomad client: made ahead of a launch, bound to one session, deleted after. Not wired.

What a kernel's start costs on the session network is mostly its namespace: Nomad's docker driver starts a pause
container to hold it (0.2-0.3 s) and runs the CNI chain on it (0.06-0.1 s) before the kernel's container
(docs/environments.md). A pooled namespace is the same thing made ahead of time, by the same chain:

- :func:`make`: a pause container with no network of Docker's (``--network none``), then the client's ``caravan``
  conflist run on its namespace (``loopback``, ``bridge``, ``caravan-isolation``) with the CNI arguments of a
  placeholder session of its own (Nomad namespace :data:`~node_plugins.cni_isolation.POOL_NAMESPACE`, job id its
  container's name): alone in that session, it reaches nothing and nothing reaches it, like a session's only kernel.
- :func:`bind`: the isolation plugin's ``bind`` (one nft transaction under the plugin's lock) moves its membership
  record to the session's (Nomad namespace, job id) and publishes the session's ports into it; refused for a
  namespace bound to another session, so each serves one session (bound again to its own, a replacement
  allocation's ports replace the first's). The kernel's docker task then joins it (``network_mode =
  "container:<name>"``).
- :func:`delete`: the chain's DEL (last plugin first: the isolation plugin forgets it and removes its elements,
  host-local frees its address) and the container removed. Never handed out again.

Not wired into Caravan yet: nothing runs a pool, and the scheduler renders every kernel as before
(docs/environments.md, "What remains"). Runs as root on the client's host, like the CNI plugins it calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node_plugins.cni_isolation import POOL_NAMESPACE

PREFIX = "caravan-pool-"
"""Pooled namespaces' container names (and CNI container ids): this, then 12 random hex digits."""
IFNAME = "eth0"
ISOLATION_PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cni_isolation.py")


class PoolError(Exception):
    """A pooled namespace could not be made, bound or deleted (the CNI plugin's or Docker's own words)."""


@dataclass(frozen=True)
class Client:
    """A Nomad client's session network, as its CNI configuration describes it."""

    conflist: Mapping[str, Any]
    """The ``caravan`` network's configuration list (``caravan.stack.session_network.SessionNetwork.conflist``)."""
    cni_path: str
    """Where the plugins are, ``:``-separated (the client's ``cni_path``)."""

    def isolation(self) -> Mapping[str, Any]:
        return next(p for p in self.conflist["plugins"] if p["type"] == "caravan-isolation")


@dataclass(frozen=True)
class Pooled:
    name: str
    """The pause container's name, also its CNI container id and its placeholder session's job id."""
    address: str
    """Its address on the client's session network."""


def placeholder_args(name: str) -> str:
    """The CNI arguments a pooled namespace is made with: a session of its own."""
    return f"IgnoreUnknown=1;NOMAD_NAMESPACE={POOL_NAMESPACE};NOMAD_JOB_ID={name}"


def _docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise PoolError(f"docker {args[0]}: {done.stderr.strip()}")
    return done.stdout.strip()


def _plugin(client: Client, plugin: Mapping[str, Any], env: Mapping[str, str], given: Mapping[str, Any]) -> str:
    for directory in client.cni_path.split(":"):
        binary = os.path.join(directory, str(plugin["type"]))
        if os.access(binary, os.X_OK):
            break
    else:
        raise PoolError(f"no CNI plugin {plugin['type']} in {client.cni_path}")
    config = {"cniVersion": client.conflist["cniVersion"], "name": client.conflist["name"], **plugin, **given}
    done = subprocess.run([binary], input=json.dumps(config), capture_output=True, text=True, env=dict(env))
    if done.returncode != 0:
        raise PoolError(f"CNI {env['CNI_COMMAND']} of {plugin['type']}: {done.stdout.strip()} {done.stderr.strip()}")
    return done.stdout


def _chain(client: Client, command: str, name: str, netns: str) -> dict[str, Any]:
    """Run the client's conflist as Nomad's CNI library would: ADD in order (each given the previous result), DEL
    last plugin first. Returns ADD's result."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": name,
        "CNI_NETNS": netns,
        "CNI_IFNAME": IFNAME,
        "CNI_ARGS": placeholder_args(name),
        "CNI_PATH": client.cni_path,
    }
    plugins: Sequence[Mapping[str, Any]] = client.conflist["plugins"]
    result: dict[str, Any] = {}
    for plugin in plugins if command == "ADD" else list(reversed(plugins)):
        given: dict[str, Any] = {"prevResult": result} if result else {}
        if (plugin.get("capabilities") or {}).get("portMappings"):
            given["runtimeConfig"] = {"portMappings": []}  # a pooled namespace publishes nothing until it is bound
        out = _plugin(client, plugin, env, given)
        if command == "ADD":
            result = json.loads(out)
    return result


def labelled(label: str, value: str, *, also: tuple[str, str] | None = None) -> list[str]:
    """The pooled namespaces (their pause containers, running or not) made with the Docker label ``label=value``;
    with ``also=(other, wanted)``, only those whose label ``other`` is ``wanted`` or not set (made before it was)."""
    other, wanted = also or ("", "")
    shown = f'{{{{.Names}}}} {{{{.Label "{other}"}}}}' if also else "{{.Names}}"
    listed = _docker("ps", "--all", "--filter", f"label={label}={value}", "--format", shown)
    found = []
    for line in listed.splitlines():
        name, _, given = line.strip().partition(" ")
        if name.startswith(PREFIX) and (not also or given in ("", wanted)):
            found.append(name)
    return found


def running(names: Collection[str]) -> set[str]:
    """Those of the pooled namespaces ``names`` whose pause container runs. One that stopped (its Docker daemon
    restarted, the container killed) holds no namespace any more: a kernel cannot join it."""
    listed = _docker("ps", "--filter", "label=caravan.pool=1", "--format", "{{.Names}}")
    return set(listed.split()) & set(names)


def make(
    client: Client, pause_image: str, labels: Mapping[str, str] | None = None, *, hostname: str | None = None
) -> Pooled:
    """A new pooled namespace: its pause container started (with Docker ``labels``, and ``hostname``: a container
    joining its network takes its hostname, Docker refusing one of its own there), the chain added under its
    placeholder session."""
    name = PREFIX + uuid.uuid4().hex[:12]
    tags = [f"--label={k}={v}" for k, v in {"caravan.pool": "1", **(labels or {})}.items()]
    named = ["--hostname", hostname] if hostname else []
    _docker("run", "--detach", "--name", name, "--network", "none", *named, *tags, pause_image)
    try:
        pid = _docker("inspect", "--format", "{{.State.Pid}}", name)
        result = _chain(client, "ADD", name, f"/proc/{pid}/ns/net")
    except Exception:
        delete(client, name)
        raise
    address = next(str(ip["address"]).split("/")[0] for ip in result["ips"] if ":" not in str(ip["address"]))
    return Pooled(name, address)


def bind(client: Client, name: str, namespace: str, job_id: str, port_mappings: Sequence[Mapping[str, Any]]) -> None:
    """Hand the pooled namespace ``name`` to the session whose Nomad job is ``job_id`` in ``namespace``, with its
    published ports (CNI's ``portMappings``: ``hostIP``, ``hostPort``, ``containerPort``, ``protocol``)."""
    config = {**client.isolation(), "runtimeConfig": {"portMappings": list(port_mappings)}}
    done = subprocess.run(
        [
            "/usr/bin/python3",
            "-I",
            "-S",
            ISOLATION_PLUGIN,
            "bind",
            name,
            f"NOMAD_NAMESPACE={namespace};NOMAD_JOB_ID={job_id}",
        ],
        input=json.dumps(config),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise PoolError(done.stderr.strip())


def delete(client: Client, name: str) -> None:
    """Delete a pooled namespace, bound or not (idempotent: one gone already is no error). Its container is removed
    even when the chain's DEL fails (raised after)."""
    pid = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True
    ).stdout.strip()
    try:
        _chain(client, "DEL", name, f"/proc/{pid}/ns/net" if pid not in ("", "0") else "")
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, check=False)
