"""Nomad as the stack starts it has ACLs on: nobody without a token gets anything, each component's token only what
its policy grants, and the secrets live in files only their owner can read.

The agent here is the dev stack's kind (``start_nomad_single_node``: state on disk), started for this module as the
dev stack runs when the operator has not enabled ``raw_exec`` for sessions: the users' namespace disables it, the
client runs it for the platform's namespace, where only the scheduler writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from caravan.stack.nomad_acl import PLATFORM_NAMESPACE, describe_policies, policies, policy_rules
from caravan.stack.nomad_agent import NomadAgent
from caravan.stack.nomad_cluster import SingleNodeNomad, start_nomad_single_node
from caravan.stack.processes import unmount_under
from core.secrets import COMPONENT_ROLES, ROLES, nomad_token_path, read_secret
from core.settings import NomadSettings
from nomad_jobs.client import NomadClient, NomadRejected
from tests.conftest import STACK

pytestmark = [
    pytest.mark.skipif("CARAVAN_NOMAD_HOME" not in STACK, reason="ops/install-nomad builds Nomad"),
    pytest.mark.nomad,
]  # its own single-node agent

JOB = """
job "{name}" {{
  datacenters = ["dc1"]
  type        = "batch"
  group "g" {{
    task "t" {{
      driver = "{driver}"
      config {{
        command = "/bin/true"
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"""


@pytest.fixture(scope="module")
def single_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SingleNodeNomad]:
    state = tmp_path_factory.mktemp("acl-single")
    agent = start_nomad_single_node(
        state / "nomad",
        nomad_home=Path(STACK["CARAVAN_NOMAD_HOME"]),
        rootfs=Path(STACK["CARAVAN_ROOTFS"]),
        want_drivers=("exec",),
        secrets_dir=state / "secrets",
    )
    yield agent
    agent.stop()
    unmount_under(state)  # allocations' secrets/private tmpfs (the platform's raw_exec job's too), as NomadAgent.stop


def status_of(addr: str, method: str, path: str, *, token: str | None = None, body: Any = None) -> int:
    request = urllib.request.Request(
        addr + path, method=method, data=None if body is None else json.dumps(body).encode()
    )
    if token:
        request.add_header("X-Nomad-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def token(agent: SingleNodeNomad, role: str) -> str:
    assert agent.secrets_dir is not None
    found = read_secret(nomad_token_path(agent.secrets_dir, role))  # type: ignore[arg-type]
    assert found
    return found


ANONYMOUS_REFUSED = [
    ("GET", "/v1/jobs?namespace=*"),
    ("GET", "/v1/nodes"),
    ("GET", "/v1/agent/self"),
    ("GET", "/v1/allocations"),
    ("GET", "/v1/acl/tokens"),
    ("GET", "/v1/operator/keyring/keys"),
]


@pytest.mark.parametrize(("method", "path"), ANONYMOUS_REFUSED)
def test_anonymous_requests_are_refused(single_node: SingleNodeNomad, method: str, path: str) -> None:
    assert status_of(single_node.addr, method, path) == 403
    assert status_of(single_node.addr, method, path, token=token(single_node, "admin")) == 200


async def test_anonymous_cannot_register_a_job_on_the_test_agent_either(nomad_agent: NomadAgent) -> None:
    admin = NomadClient(NomadSettings(addr=nomad_agent.addr, token=nomad_agent.token))
    job = await admin.parse(JOB.format(name="anon", driver="raw_exec"))  # valid: Nomad validates before the ACL check
    await admin.aclose()
    assert status_of(nomad_agent.addr, "POST", "/v1/jobs", body={"Job": job}) == 403
    assert status_of(nomad_agent.addr, "POST", "/v1/jobs/parse", body={"JobHCL": JOB}) == 403
    assert status_of(nomad_agent.addr, "GET", "/v1/jobs") == 403


def test_secrets_are_readable_by_their_owner_only(single_node: SingleNodeNomad) -> None:
    assert single_node.secrets_dir is not None
    assert stat.S_IMODE(single_node.secrets_dir.stat().st_mode) == 0o700
    files = {path.name: stat.S_IMODE(path.stat().st_mode) for path in single_node.secrets_dir.iterdir()}
    assert files == {f"nomad-{role}.token": 0o600 for role in ROLES}
    assert token(single_node, "admin") == single_node.token


@pytest.mark.parametrize("role", COMPONENT_ROLES)
def test_no_component_token_manages_acls_agents_or_operators(single_node: SingleNodeNomad, role: str) -> None:
    secret = token(single_node, role)
    for method, path, body in [
        ("GET", "/v1/acl/tokens", None),
        ("GET", f"/v1/acl/policy/{'caravan-gateway' if role != 'gateway' else 'caravan-idle'}", None),
        ("POST", "/v1/acl/policy/mine", {"Name": "mine", "Rules": 'namespace "*" { policy = "write" }'}),
        ("POST", "/v1/acl/token", {"Type": "management"}),
        ("POST", "/v1/acl/bootstrap", {}),
        ("GET", "/v1/agent/self", None),
        ("GET", "/v1/operator/keyring/keys", None),
        ("POST", "/v1/namespace/other", {"Name": "other"}),
    ]:
        assert status_of(single_node.addr, method, path, token=secret, body=body) in (400, 403), (role, path)
    assert status_of(single_node.addr, "GET", "/v1/acl/token/self", token=secret) == 200  # the token itself is valid
    request = urllib.request.Request(f"{single_node.addr}/v1/acl/policies", headers={"X-Nomad-Token": secret})
    with urllib.request.urlopen(request, timeout=10) as response:  # a client token lists its own policies only
        assert [p["Name"] for p in json.loads(response.read())] == [f"caravan-{role}"]


@pytest.mark.parametrize("role", ["gateway", "idle"])
async def test_the_gateway_and_idle_tokens_write_nothing_to_nomad(single_node: SingleNodeNomad, role: str) -> None:
    """Only the scheduler writes to Nomad (its job owner): the others cannot register, parse, stop or restart."""
    admin = NomadClient(NomadSettings(addr=single_node.addr, token=single_node.token))
    job = await admin.parse(JOB.format(name=f"by-{role}", driver="exec"))
    await admin.register(job)
    nomad = NomadClient(NomadSettings(addr=single_node.addr, token=token(single_node, role)))
    try:
        with pytest.raises(NomadRejected, match="Permission denied"):
            await nomad.register({**job, "ID": f"by-{role}-2", "Name": f"by-{role}-2"})
        with pytest.raises(NomadRejected, match="Permission denied"):
            await nomad.parse(JOB.format(name=f"by-{role}", driver="exec"))
        for purge in (False, True):
            with pytest.raises(NomadRejected, match="Permission denied"):
                await nomad.deregister(f"by-{role}", purge=purge)
        for _ in range(100):  # an allocation of the job, to restart
            if allocs := await admin.job_allocations(f"by-{role}"):
                break
            await asyncio.sleep(0.1)
        with pytest.raises(NomadRejected, match="Permission denied"):
            await nomad.restart_allocation(str(allocs[0]["ID"]), "t")
    finally:
        await nomad.aclose()
        await admin.deregister(f"by-{role}", purge=True)
        await admin.aclose()


async def test_the_scheduler_registers_exec_jobs_but_raw_exec_is_off_in_the_namespace(
    single_node: SingleNodeNomad,
) -> None:
    nomad = NomadClient(NomadSettings(addr=single_node.addr, token=token(single_node, "scheduler")))
    try:
        exec_job = await nomad.parse(JOB.format(name="acl-exec", driver="exec"))
        await nomad.register(exec_job)
        await nomad.deregister("acl-exec", purge=True)
        raw = await nomad.parse(JOB.format(name="acl-raw", driver="raw_exec"))
        with pytest.raises(NomadRejected, match='task driver "raw_exec" is not allowed'):
            await nomad.register(raw)
    finally:
        await nomad.aclose()


async def test_only_the_scheduler_writes_to_the_platform_namespace_and_only_raw_exec_jobs(
    single_node: SingleNodeNomad,
) -> None:
    """The platform's namespace (docker commit jobs): raw_exec there runs on the node; no other driver is allowed
    there, and neither the gateway's nor the idle checker's token may parse, register or stop anything there."""
    platform = NomadSettings(addr=single_node.addr, namespace=PLATFORM_NAMESPACE)
    scheduler = NomadClient(dataclasses.replace(platform, token=token(single_node, "scheduler")))
    others = [NomadClient(dataclasses.replace(platform, token=token(single_node, r))) for r in ("gateway", "idle")]
    try:
        raw = {
            **await scheduler.parse(JOB.format(name="platform-raw", driver="raw_exec")),
            "Namespace": PLATFORM_NAMESPACE,
        }
        for other in others:
            with pytest.raises(NomadRejected, match="Permission denied"):
                await other.parse(JOB.format(name="platform-raw", driver="raw_exec"))
            with pytest.raises(NomadRejected, match="Permission denied"):
                await other.register({**raw, "ID": "by-other", "Name": "by-other"})
        await scheduler.register(raw)
        for _ in range(300):  # the client runs it: raw_exec is on for the platform
            if [a["ClientStatus"] for a in await scheduler.job_allocations("platform-raw")] == ["complete"]:
                break
            await asyncio.sleep(0.1)
        assert [a["ClientStatus"] for a in await scheduler.job_allocations("platform-raw")] == ["complete"]
        for other in others:
            with pytest.raises(NomadRejected, match="Permission denied"):
                await other.deregister("platform-raw", purge=True)
        exec_job = {
            **await scheduler.parse(JOB.format(name="platform-exec", driver="exec")),
            "Namespace": PLATFORM_NAMESPACE,
        }
        with pytest.raises(NomadRejected, match='task driver "exec" is not allowed'):
            await scheduler.register(exec_job)
        await scheduler.deregister("platform-raw", purge=True)
    finally:
        for client in (scheduler, *others):
            await client.aclose()


def test_a_restarted_agent_keeps_its_acls_and_tokens(single_node: SingleNodeNomad) -> None:
    assert single_node.secrets_dir is not None
    before = {path.name: path.read_text() for path in single_node.secrets_dir.iterdir()}
    single_node.kill()
    single_node.restart()
    assert {path.name: path.read_text() for path in single_node.secrets_dir.iterdir()} == before
    assert status_of(single_node.addr, "GET", "/v1/jobs") == 403
    for role in COMPONENT_ROLES:
        assert status_of(single_node.addr, "GET", "/v1/acl/token/self", token=token(single_node, role)) == 200
    assert status_of(single_node.addr, "GET", "/v1/acl/tokens", token=single_node.token) == 200


def test_the_policies_printed_for_operators_are_the_ones_applied(single_node: SingleNodeNomad) -> None:
    printed = describe_policies("default")
    for role, rules in policies("default").items():
        assert rules in printed
        request = urllib.request.Request(f"{single_node.addr}/v1/acl/policy/caravan-{role}")
        request.add_header("X-Nomad-Token", str(single_node.token))
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["Rules"] == rules
    assert not {"register-job", "deregister-job", "purge-job", "alloc-lifecycle", "submit-job"} & (
        set(re.findall(r'"([a-z-]+)"', policy_rules("gateway", "default") + policy_rules("idle", "default")))
    )
    # the gateway execs into kernels (execs, terminals) but never into tasks that run on the host (raw_exec)
    assert '"alloc-exec"' in policy_rules("gateway", "default")
    assert all("alloc-node-exec" not in rules for rules in policies("default").values())
    assert "alloc-exec" not in policy_rules("idle", "default")
    # nobody but the scheduler has anything of its own in the platform's namespace (all read every namespace's jobs)
    assert f'namespace "{PLATFORM_NAMESPACE}"' in policy_rules("scheduler", "default")
    assert all(PLATFORM_NAMESPACE not in policy_rules(role, "default") for role in ("gateway", "idle"))
    assert PLATFORM_NAMESPACE in printed and '"raw_exec"' in printed
    with pytest.raises(ValueError, match="platform"):
        policy_rules("scheduler", PLATFORM_NAMESPACE)
    with pytest.raises(ValueError, match="namespace"):
        policy_rules("gateway", 'x" { policy = "write" } namespace "y')
