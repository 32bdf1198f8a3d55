"""Tenant escape: a USER's session, whatever it runs, reaches nothing of the platform and nothing of other tenants.

A probe runs as an ordinary USER's BATCH session in a docker, an exec and a qemu kernel and tries what a hostile user
would: Nomad's HTTP API (list jobs, read the agent, register a raw_exec job), Redis (PING, KEYS, GET), the gateway,
each at the kernel's own loopback and at the host's address on the session network; another user's app, by its
session-network address and by its published port; Docker's socket; the stack's state directory; and the
environment of its own PID 1 and of itself, which must hold no secret. Traffic goes only to loopback and to the
stack's own session networks, and only to the stack's own listeners.

The control test runs the same probe with isolation turned off (``CARAVAN_SESSION_NETWORK=host``): then the probe
does reach the other tenant's app and the control plane's ports, which shows that the escape tests can fail.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlparse

import pytest

from caravan.stack.nomad_agent import NomadAgent
from caravan.stack.nomad_cluster import NomadCluster
from caravan.stack.session_network import SESSION_SUPERNET
from core.replies import text
from core.settings import Settings
from tests.cluster_fixtures import OnCluster
from tests.conftest import DEFAULT_IMAGE
from tests.harness import ADMIN_TOKEN, CREATE, Caravan
from tests.ingress import caravan_behind_haproxy
from tests.namespace_keeping import keeping

OTHER_PORT = 8080
OTHER_APP = (
    f'mkdir -p /tmp/w && echo "secret of the other tenant" > /tmp/w/index.html && '
    f'exec httpd -f -p "${{NOMAD_PORT_p{OTHER_PORT}}}" -h /tmp/w'
)
"""The other tenant's app: serves a page on its preopened port (its own port on the session network; the Nomad
host port on the host's network)."""


def http(method: str, path: str, body: str = "") -> str:
    head = f"{method} {path} HTTP/1.0\\r\\nHost: x\\r\\n"
    if body:
        head += f"Content-Type: application/json\\r\\nContent-Length: {len(body)}\\r\\n"
    return head + "\\r\\n" + body.replace('"', '\\"')


def probe_script(ports: dict[str, int], other: dict[str, str], state_dir: str, job_id: str) -> str:
    """The probe as a shell script for busybox: one line per attempt, ``<name> <target> => <what came back>``."""
    job = json.dumps(
        {
            "Job": {
                "ID": job_id,
                "Name": job_id,
                "Type": "batch",
                "Datacenters": ["dc1"],
                "TaskGroups": [
                    {"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}
                ],
            }
        },
        separators=(",", ":"),
    )
    attempts = [
        ("nomad-jobs", "{host}", ports["nomad"], http("GET", "/v1/jobs")),
        ("nomad-agent-self", "{host}", ports["nomad"], http("GET", "/v1/agent/self")),
        ("nomad-register", "{host}", ports["nomad"], http("PUT", "/v1/jobs", job)),
        ("redis", "{host}", ports["redis"], "PING\\r\\nKEYS *\\r\\nGET x\\r\\nQUIT\\r\\n"),
        ("gateway", "{host}", ports["gateway"], http("GET", "/healthz")),
        ("haproxy", "{host}", ports["haproxy"], http("GET", "/healthz")),
        ("other-published", "{host}", int(other["published"]), http("GET", "/")),
    ]
    lines = [
        "gw=$(ip route 2>/dev/null | awk '/^default/ {print $3}')",
        # only the host's end of a session network (the stack's own): never the host's own default gateway
        f'case "$gw" in {SESSION_SUPERNET.network_address.exploded.rsplit(".", 2)[0]}.*) ;; *) gw= ;; esac',
        'probe() { out=$(printf "%b" "$4" | timeout 6 nc -w 2 "$2" "$3" 2>&1 | head -c 300 | tr "\\r\\n" "  ");'
        ' echo "NET $1 $2:$3 => $out"; }',
        # all at once, each into a file of its own (a dropped connection waits out nc's 2 s), then in their order
        "probes=/tmp/probes.$$; mkdir -p $probes",
    ]
    calls = [
        f'[ -n "{host}" ] && probe {name} "{target.format(host=host)}" {port} "{payload}"'
        for host in ("127.0.0.1", "$gw")
        for name, target, port, payload in attempts
    ]
    if other.get("address"):
        calls.append(f'probe other-direct "{other["address"]}" {OTHER_PORT} "{http("GET", "/")}"')
    lines += [f'( {call} ) > "$probes/{n:03d}" &' for n, call in enumerate(calls)]
    lines += [
        'wait; cat "$probes"/*',
        'for f in /var/run/docker.sock /run/docker.sock; do [ -e "$f" ] && echo "FILE $f exists"; done',
        f'ls "{state_dir}" >/dev/null 2>&1 && echo "FILE {state_dir} readable"',
        'echo "ENVIRON $(cat /proc/1/environ 2>/dev/null | base64 | tr -d "\\n")"',
        'echo "ENVIRON $(env | base64 | tr -d "\\n")"',
        "echo PROBE-DONE",
    ]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    name: str
    text: str


def findings(stdout: str) -> list[Finding]:
    found = []
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "NET":
            attempt, _, answer = rest.partition(" => ")
            found.append(Finding(kind, attempt.split(" ", 1)[0], answer.strip()))
        elif kind in ("FILE", "ENVIRON"):
            found.append(
                Finding(
                    kind,
                    rest.split(" ", 1)[0],
                    base64.b64decode(rest).decode(errors="replace") if kind == "ENVIRON" else rest,
                )
            )
    return found


def answered(finding: Finding) -> bool:
    """Something listened and spoke: an HTTP status line, a Redis reply, a page."""
    return finding.text.startswith(("HTTP/", "+", "-", "$", "*", ":", "secret"))


async def other_tenant_app(caravan: Caravan) -> tuple[str, dict[str, str]]:
    """Another USER's INTERACTIVE session serving a page; its session-network address (if any) and published port."""
    bob = await caravan.user("bob-" + uuid.uuid4().hex[:6])
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "name": "bobs-app",
                "type": "INTERACTIVE",
                "driver": "EXEC",
                "preopenPorts": [OTHER_PORT],
                "startupCommand": OTHER_APP,
            }
        },
        token=bob,
    )
    [session] = data["createSession"]["sessions"]
    await caravan.wait_for(session["id"], "RUNNING")
    stored = await caravan.store.get(session["id"])
    assert stored is not None and stored.main_kernel.alloc_id
    [published] = stored.main_kernel.ports
    alloc = await caravan.nomad.allocation(stored.main_kernel.alloc_id)
    address = ((alloc.get("NetworkStatus") or {}).get("Address")) or ""
    port = published.rsplit(":", 1)[1]
    for _ in range(100):  # the app answers on its published port before anyone probes it
        try:
            if "secret" in (await caravan.http.get(f"http://127.0.0.1:{port}/", timeout=2)).text:
                break
        except Exception:
            pass
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("the other tenant's app never answered on its published port")
    return session["id"], {"address": address, "published": port}


async def run_probe(caravan: Caravan, driver: str, other: dict[str, str]) -> tuple[list[Finding], list[str], str]:
    """The probe's findings in a USER's session of ``driver``, the secrets it must not have seen, and its job."""
    alice = await caravan.user("alice-" + uuid.uuid4().hex[:6])
    settings = caravan.settings
    ports = {
        "nomad": urlparse(settings.nomad.addr).port or 4646,
        "redis": urlparse(settings.redis.url).port or 6379,
        "gateway": urlparse(caravan.url).port or 80,
        "haproxy": settings.public_port,  # the stack's ingress (its runtime API is a unix socket: no port at all)
    }
    script = probe_script(ports, other, str(settings.home), f"{settings.nomad.job_prefix}-escape-{driver.lower()}")
    request: dict[str, Any] = {
        "name": f"probe-{driver.lower()}",
        "type": "BATCH",
        "driver": driver,
        "startupCommand": script,
        "batchTimeout": "5m",
    }
    if driver == "DOCKER":
        request["image"] = DEFAULT_IMAGE
    if driver == "QEMU":
        request["resources"] = [{"slot": "mem", "amount": "256m"}]
    data = await caravan.gql(CREATE, {"input": request}, token=alice)
    [session] = data["createSession"]["sessions"]
    ended = await caravan.wait_for(session["id"], "TERMINATED", "ERROR", timeout=240)
    stdout = ended["mainKernel"]["logs"]["stdout"]
    assert "PROBE-DONE" in stdout, ended
    secrets = [s for s in (ADMIN_TOKEN, alice, settings.nomad.token, urlparse(settings.redis.url).password) if s]
    return findings(stdout), secrets, str(ended["jobHcl"])


@pytest.fixture
async def isolated(settings: Settings) -> AsyncIterator[Caravan]:
    async with caravan_behind_haproxy(settings) as (caravan, _):
        yield caravan


DRIVERS = [
    pytest.param("EXEC", id="exec"),
    pytest.param("DOCKER", id="docker", marks=pytest.mark.docker),
    pytest.param("QEMU", id="qemu", marks=pytest.mark.qemu),
]


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_session_reaches_nothing_of_the_platform_or_other_tenants(isolated: Caravan, driver: str) -> None:
    _, other = await other_tenant_app(isolated)
    found, secrets, _ = await run_probe(isolated, driver, other)
    reached_nothing(found, secrets)


@pytest.mark.docker
async def test_a_pooled_session_reaches_nothing_either(isolated: Caravan, nomad_agent: NomadAgent) -> None:
    """The same probe in a docker session placed while its node's pool had a free namespace (made ahead by the same
    CNI chain, bound to the session by ``nomad_jobs.namespace_keeper``): isolated exactly as in one of its own."""
    async with keeping(isolated, nomad_agent, 1) as keeper:
        [offered] = await isolated.store.redis.smembers(keeper.key)
        _, other = await other_tenant_app(isolated)
        found, secrets, job_hcl = await run_probe(isolated, "DOCKER", other)
        assert re.search(f'network_mode += "container:{text(offered)}"', job_hcl), job_hcl  # it ran in the pooled one
        reached_nothing(found, secrets)


def reached_nothing(found: list[Finding], secrets: list[str]) -> None:
    network = [f for f in found if f.kind == "NET"]
    assert len(network) >= 7, found  # every attempt ran (at least those at 127.0.0.1, and the other tenant)
    assert [f for f in network if answered(f)] == [], "the session reached something it must not"
    assert [f for f in found if f.kind == "FILE"] == []
    environs = [f.text for f in found if f.kind == "ENVIRON"]
    assert len(environs) == 2 and any("CARAVAN_SESSION_ID=" in e for e in environs)
    assert [s for s in secrets if any(s in e for e in environs)] == []


@pytest.fixture
async def unisolated(settings: Settings) -> AsyncIterator[Caravan]:
    async with caravan_behind_haproxy(dataclasses.replace(settings, session_network="host")) as (caravan, _):
        yield caravan


async def test_without_isolation_the_probe_does_reach_them(unisolated: Caravan) -> None:
    """The control: the same probe on the host's network reaches the other tenant's app and the control plane's
    listeners, so the escape test above would fail; Nomad and Redis then refuse it everything (no credentials)."""
    _, other = await other_tenant_app(unisolated)
    found, _, _ = await run_probe(unisolated, "EXEC", other)
    reached = {f.name: f.text for f in found if f.kind == "NET" and answered(f)}
    assert {"other-published", "nomad-jobs", "nomad-register", "redis", "gateway", "haproxy"} <= set(reached), found
    # ... and the control plane, reached, gives nothing without its secrets: ACLs on Nomad, users on Redis
    assert reached["nomad-jobs"].startswith("HTTP/1.0 403") and reached["nomad-register"].startswith("HTTP/1.0 403")
    assert reached["redis"].startswith("-NOAUTH")


async def test_kernels_of_a_multi_node_session_reach_each_other_across_clients_by_hostname(
    on_cluster: OnCluster, nomad_cluster: NomadCluster
) -> None:
    """Each client of the test cluster has a bridge and subnet of its own; the session's kernels land on two of them
    (concentrated: main1 fills small, sub1 goes to medium) and still talk by hostname, while another session's
    kernel, on a third client (large), cannot reach them: traffic routed between bridges is checked too (placing
    the intruder on a chosen client takes an admin: isolation is per session, whoever owns it)."""
    serve = (
        'mkdir -p /tmp/w && echo "from $CARAVAN_CLUSTER_HOST" > /tmp/w/index.html && httpd -p 7000 -h /tmp/w; '
        'if [ "$CARAVAN_CLUSTER_ROLE" = main ]; then for i in $(seq 100); do '
        'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 2 sub1 7000 | tail -1 | grep . && break; sleep 0.2; done; '
        'echo "me=$CARAVAN_CLUSTER_ADDR"; fi; exec sleep 3600'
    )
    async with on_cluster('default {\n  agent_selector = "concentrated"\n}') as caravan:
        data = await caravan.gql(
            CREATE,
            {
                "input": {
                    "name": "multi",
                    "type": "INTERACTIVE",
                    "driver": "EXEC",
                    "clusterSize": 2,
                    "clusterMode": "MULTI_NODE",
                    "resources": [{"slot": "cpu", "amount": "2"}, {"slot": "mem", "amount": "256m"}],
                    "startupCommand": serve,
                }
            },
        )
        [session] = data["createSession"]["sessions"]
        await caravan.wait_for(session["id"], "RUNNING", timeout=120)
        stored = await caravan.store.get(session["id"])
        assert stored is not None
        names = nomad_cluster.node_names
        assert {k.hostname: names[k.agent or ""] for k in stored.kernels} == {"main1": "small", "sub1": "medium"}
        sub1 = next(k for k in stored.kernels if k.hostname == "sub1")
        address = (await caravan.nomad.allocation(sub1.alloc_id or ""))["NetworkStatus"]["Address"]
        intruder = await caravan.gql(
            CREATE,
            {
                "input": {
                    "name": "intruder",
                    "type": "BATCH",
                    "driver": "EXEC",
                    "designatedAgent": nomad_cluster.node_ids["large"],
                    "startupCommand": f'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 3 {address} 7000; echo "rc=$?"',
                }
            },
        )
        [probe] = intruder["createSession"]["sessions"]
        probed = await caravan.wait_for(probe["id"], "TERMINATED", "ERROR", timeout=120)
        assert "from sub1" not in probed["mainKernel"]["logs"]["stdout"]
        assert "rc=1" in probed["mainKernel"]["logs"]["stdout"], probed
        for _ in range(100):
            logs = (await caravan.gql(SESSION_LOGS, {"id": session["id"]}))["session"]["mainKernel"]["logs"]["stdout"]
            if "me=" in logs:
                break
            await asyncio.sleep(0.2)
        lines = logs.splitlines()
        assert lines[0] == "from sub1" and lines[1].startswith(f"me={SESSION_SUPERNET.network_address.exploded[:7]}")


SESSION_LOGS = "query($id: ID!) { session(id: $id) { mainKernel { logs { stdout } } } }"
