"""Caravan deployed by ``caravan deploy`` on the tests' Nomad agent: its jobs in a namespace of the test's own, its
Redis keys and session jobs under the test's prefix, HAProxy on a free port; purged at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from caravan.deploy import JOBS, DeployConfig, gateway_service, job_id
from caravan.stack.nomad_acl import NomadAdmin
from caravan.stack.processes import free_port
from core.keys import Keys
from core.redis import client as redis_client
from core.replies import text_set
from core.settings import Settings
from gateway.apps.ingress_config import IngressPaths
from nomad_jobs.namespace_keeper import LABEL
from tests.harness import ADMIN_TOKEN


def plain_url(url: str) -> str:
    """``url`` without its credentials (each deployed role gets its own from Nomad Variables)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))


@dataclass
class Deployed:
    settings: Settings
    config: DeployConfig
    nomad: NomadAdmin
    url: str
    """GraphQL through the deployed HAProxy."""
    output: str

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = httpx2.post(
            self.url,
            json={"query": query, "variables": variables or {}},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=10,
        )
        body = response.json()
        assert "errors" not in body, body
        return body["data"]  # type: ignore[no-any-return]

    def get(self, path: str) -> Any:
        sep = "&" if "?" in path else "?"
        return self.nomad.call("GET", f"{path}{sep}namespace={urllib.parse.quote(self.config.namespace)}")

    def allocations(self, job: str) -> list[dict[str, Any]]:
        """The job's running allocations."""
        found = self.get(f"/v1/job/{job_id(self.config, job)}/allocations")  # type: ignore[arg-type]
        return [a for a in found if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"]

    def services(self, name: str) -> list[dict[str, Any]]:
        return list(self.get(f"/v1/service/{name}"))

    def health(self, job: str) -> dict[str, bool | None]:
        """Each replica's answer to its health check, by allocation id (scheduler, idle)."""
        found: dict[str, bool | None] = {}
        for service in self.services(f"{self.config.name}-{job}"):
            try:
                answer = httpx2.get(f"http://{service['Address']}:{service['Port']}/health", timeout=2).json()
            except httpx2.TransportError:
                continue
            found[service["AllocID"]] = answer["leading"]
        return found

    def backend(self) -> list[tuple[str, int]]:
        """The gateway backend's servers HAProxy has in service (address, port), from its runtime API."""
        servers = []
        for line in self.runtime("show servers state gateway").splitlines():
            fields = line.split()
            # be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state ... srv_port at 18; running (2) and
            # in no maintenance but the configuration's (0x04: the slot was declared disabled)
            if len(fields) > 18 and fields[1] == "gateway" and fields[5] == "2" and not int(fields[6]) & ~0x04:
                servers.append((fields[4], int(fields[18])))
        return sorted(servers)

    def runtime(self, command: str) -> str:
        """What HAProxy's runtime API answers ``command``."""
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(5)
            client.connect(str(IngressPaths(Path(self.config.home) / "haproxy").socket))
            client.sendall(command.encode() + b"\n")
            text = b""
            while chunk := client.recv(65536):
                text += chunk
        return text.decode()

    def map_values(self, name: str) -> list[str]:
        """The values of HAProxy's map ``name`` (``tokens``: user ids)."""
        return list(self.map_entries(name).values())

    def map_entries(self, name: str) -> dict[str, str]:
        """HAProxy's map ``name``: key -> value (``show map``'s lines: ``<entry id> <key> <value>``)."""
        path = IngressPaths(Path(self.config.home) / "haproxy").map(name)
        lines = [line.split() for line in self.runtime(f"show map {path}").splitlines() if line.strip()]
        return {fields[1]: fields[-1] for fields in lines}

    def map_keepers(self) -> dict[str, str]:
        """Each control plane's lock in HAProxy's state directory -> the command line of the process holding it
        (``/proc/locks``: the holder of a ``flock`` on the file's inode)."""
        state = Path(self.config.home) / "haproxy"
        inodes = {(path.stat().st_ino): path.name for path in state.glob("*.lock")}
        held: dict[str, str] = {}
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()  # 1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF
            if len(fields) >= 6 and fields[1] == "FLOCK" and (inode := int(fields[5].rsplit(":", 1)[1])) in inodes:
                with contextlib.suppress(FileNotFoundError):
                    held[inodes[inode]] = Path(f"/proc/{fields[4]}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return held

    def gateway_replicas(self) -> list[tuple[str, int]]:
        return sorted((s["Address"], int(s["Port"])) for s in self.services(gateway_service(self.config)))


def free_namespaces(settings: Settings, node_id: str) -> set[str]:
    """The free set of ``node_id``'s pool of network namespaces (``Keys.namespace_pool``), in the deployment's Redis."""

    async def read() -> set[str]:
        redis = redis_client(settings.for_role("admin").redis)
        try:
            return text_set(await redis.smembers(Keys(settings.redis.prefix).namespace_pool(node_id)))
        finally:
            await redis.aclose()

    return asyncio.run(read())


def pause_containers(node_id: str) -> set[str]:
    """The pooled namespaces' pause containers of ``node_id`` on this machine's Docker, running or not (the label
    its keeper gives them)."""
    listed = ["docker", "ps", "--all", "--filter", f"label={LABEL}={node_id}", "--format", "{{.Names}}"]
    return set(subprocess.run(listed, capture_output=True, text=True, check=True).stdout.split())


def deploy_command(settings: Settings, config_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "caravan.cli", "deploy", "--config", str(config_path), *extra],
        env={
            **os.environ,
            "CARAVAN_HOME": str(settings.home / "operator"),
            "CARAVAN_SECRETS_DIR": str(settings.secrets),
            "CARAVAN_NOMAD_ADDR": settings.nomad.addr,
            "CARAVAN_ADMIN_TOKEN": ADMIN_TOKEN,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


def config_for(settings: Settings, extra_env: dict[str, str] | None = None, **fields: Any) -> DeployConfig:
    prefix = settings.redis.prefix
    env = {
        **(extra_env or {}),
        "CARAVAN_REDIS_URL": plain_url(settings.redis.url),
        "CARAVAN_REDIS_PREFIX": prefix,
        "CARAVAN_NOMAD_ADDR": settings.nomad.addr,
        "CARAVAN_NOMAD_JOB_PREFIX": settings.nomad.job_prefix,
        "CARAVAN_RECONCILE_INTERVAL": "2",
    }
    if settings.default_image:
        env["CARAVAN_DEFAULT_IMAGE"] = settings.default_image
    return DeployConfig(
        name=prefix,
        namespace=f"{prefix}-sys",
        home=str(settings.home / "deployed"),
        ingress=fields.pop("ingress", None) or DeployConfig().ingress.__class__(port=free_port()),
        env=env,
        **fields,
    )


@contextlib.contextmanager
def deployed(settings: Settings, config: DeployConfig, *, wait: float = 180) -> Iterator[Deployed]:
    path = settings.home / "deploy.json"
    path.write_text(json.dumps({**_as_json(config)}))
    nomad = NomadAdmin(settings.nomad.addr, settings.nomad.token)
    try:
        done = deploy_command(settings, path, "--wait", str(wait))
        assert done.returncode == 0, done.stdout + done.stderr + logs(settings, config)
        yield Deployed(settings, config, nomad, f"http://127.0.0.1:{config.ingress.port}/graphql", done.stdout)
    finally:
        purge(nomad, config)


def _as_json(config: DeployConfig) -> dict[str, Any]:
    import msgspec

    return msgspec.to_builtins(config)  # type: ignore[no-any-return]


def logs(settings: Settings, config: DeployConfig) -> str:
    """The deployed tasks' stderr, for a failure's message."""
    nomad = NomadAdmin(settings.nomad.addr, settings.nomad.token)
    text = []
    ns = urllib.parse.quote(config.namespace)
    for job in JOBS:
        with contextlib.suppress(Exception):
            for alloc in nomad.call("GET", f"/v1/job/{job_id(config, job)}/allocations?namespace={ns}")[:3]:
                request = f"/v1/client/fs/logs/{alloc['ID']}?task={job}&type=stderr&plain=true&origin=end&offset=3000"
                with contextlib.suppress(Exception):
                    text.append(f"--- {job} {alloc['ID'][:8]} {alloc['ClientStatus']}\n{_raw(nomad, request)}")
    return "\n".join(text)


def _raw(nomad: NomadAdmin, path: str) -> str:
    import urllib.request

    request = urllib.request.Request(f"{nomad.addr}{path}")
    request.add_header("X-Nomad-Token", str(nomad.token))
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(response.read().decode(errors="replace"))


def purge(nomad: NomadAdmin, config: DeployConfig) -> None:
    """Stop the deployed jobs, wait for their allocations to stop (their processes gone: a keeper releases its free
    namespaces on the SIGTERM), then purge them. Purged at once, a job's allocations left the servers' state before
    every client had stopped them: on the multi-host cluster one host's keeper ran on, its namespaces with it."""
    ns = urllib.parse.quote(config.namespace)
    jobs = ("gateway", "scheduler", "idle", "ingress", "namespace-keeper")
    for job in jobs:
        with contextlib.suppress(Exception):
            nomad.call("DELETE", f"/v1/job/{job_id(config, job)}?namespace={ns}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        allocs = nomad.call("GET", f"/v1/allocations?namespace={ns}")
        if all(a["ClientStatus"] not in ("running", "pending") for a in allocs):
            break
        time.sleep(0.5)
    for job in jobs:
        with contextlib.suppress(Exception):
            nomad.call("DELETE", f"/v1/job/{job_id(config, job)}?purge=true&namespace={ns}")
