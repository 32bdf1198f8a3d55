"""Seconds from launch to Jupyter answering: through Caravan (createSession of the Jupyter environment, then Jupyter's
``/api/status`` through HAProxy on the app's origin, bearer token) against the same image started by a bare Nomad job
(registered straight to Nomad's API, docker driver, host network, Jupyter on a Nomad port, polled directly), in the
same run, alternating (Caravan first, then bare, ``--runs`` times), each torn down before the next.

What Caravan adds: the GraphQL creation and its checks, the scheduler's pass and job rendering, the session's own
network namespace, the control plane pushing the route to HAProxy, and the hop through it. Both poll every 50 ms.
Caravan runs with the client's namespace keeper (``nomad_jobs.namespace_keeper``, a pool of ``--pool``, default 2): its
session joins a namespace made ahead when one is free (``steps["in-pooled-namespace"]``), else one made at launch.
Two more bare jobs show what the namespace costs: in the sessions' network (made at launch), and in a namespace made
ahead by the same chain and bound at launch (``node_plugins.namespace_pool``).

Prints one JSON line per launch with its ``steps``, in seconds after the creation (Caravan: each status change's
reason, and when Jupyter first answered on the kernel's host port; both: Nomad's own moments, ``nomad_steps``), and
a last line with the medians, their ratio, the goal (Caravan within 1.2x of bare Nomad), ``meets_goal``, each
namespace's bare job over the host-network one, and the load average.

Usage: .venv/bin/python -m bench.jupyter_launch [--runs 3] [--pool 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
import uuid
from typing import Any

import httpx2

from caravan.stack.private_stack import private_stack, stack_env
from caravan.stack.session_network import recorded_network
from core.settings import Settings
from domain.apps import app_host, published_port
from node_plugins.namespace_pool import Client, bind, delete, make
from nomad_jobs.namespace_keeper import NamespaceKeeper
from tests.harness import ADMIN_TOKEN, CREATE, Caravan
from tests.ingress import caravan_behind_haproxy

GOAL_RATIO = 1.2
JUPYTER_PORT = 8888
POLL = 0.05
TIMEOUT = 300.0
REGISTER = "mutation Register($i: String!) { registerEnvironment(image: $i) { image } }"
DESTROY = "mutation Destroy($ids: [ID!]!) { destroySession(ids: $ids) { id } }"
BARE_JOB = """
job "%(id)s" {
  type = "service"
  group "g" {
    network {
%(network)s
    }
    restart {
      attempts = 0
      mode = "fail"
    }
    reschedule {
      attempts = 0
      unlimited = false
    }
    task "jupyter" {
      driver = "docker"
      config {
        image = "%(image)s"
%(config)s
      }
      resources {
        cpu = %(mhz)d
        memory = 1024
      }
    }
  }
}
"""
HOST_NETWORK = {
    "network": '      port "jupyter" {}',
    "config": """        network_mode = "host"
        command = "python3"
        args = ["-m", "notebook", "--no-browser", "--allow-root", "--ip=127.0.0.1", "--port=${NOMAD_PORT_jupyter}",
                "--port-retries=0", "--notebook-dir=/home/work", "--NotebookApp.token=", "--NotebookApp.password="]""",
}
"""The bare baseline: the host's network, Jupyter straight on a Nomad port (no namespace, no pause container)."""
SESSION_NETWORK = {
    "network": """      mode = "cni/caravan"
      port "jupyter" {
        to = 8888
      }""",
    "config": '        command = "/usr/local/bin/caravan-env-start"',
}
"""The same job in the network Caravan gives sessions (a namespace of its own through the stack's CNI configuration,
a pause container holding it, the isolation plugin publishing its port): what isolation costs, apart from Caravan's
own work."""
POOLED_NETWORK = {
    "network": '      port "jupyter" {}',
    "config": '        network_mode = "container:%(pooled)s"\n        command = "/usr/local/bin/caravan-env-start"',
}
"""The same job in a namespace made ahead by the same chain (``node_plugins.namespace_pool``, not wired into Caravan
yet): the docker task joins it, and it is bound to the job (membership, the published port) once Nomad has given the
job its host port. Made before the clock starts, deleted after: what a namespace pool would save."""
TARGETS = {
    "caravan": None,
    "bare_nomad": HOST_NETWORK,
    "bare_nomad_session_network": SESSION_NETWORK,
    "bare_nomad_pooled_namespace": POOLED_NETWORK,
}


async def until_ok(http: httpx2.AsyncClient, url: str, headers: dict[str, str], started: float) -> float:
    while time.monotonic() - started < TIMEOUT:
        try:
            if (await http.get(url, headers=headers, timeout=5)).status_code == 200:
                return time.monotonic() - started
        except httpx2.TransportError:
            pass
        await asyncio.sleep(POLL)
    raise SystemExit(f"{url} did not answer within {TIMEOUT} s")


async def through_caravan(caravan: Caravan, image: str, token: str, port: int) -> tuple[float, dict[str, float]]:
    spec: dict[str, Any] = {"name": f"bench-{uuid.uuid4().hex[:8]}", "type": "INTERACTIVE", "driver": "DOCKER"}
    spec["image"] = image
    spec["resources"] = [{"slot": "cpu", "amount": "1"}, {"slot": "mem", "amount": "1g"}]
    started = time.monotonic()
    [session] = (await caravan.gql(CREATE, {"input": spec}, token=token))["createSession"]["sessions"]
    host = f"{app_host('jupyter', session['id'], caravan.settings.gateway.apps_domain)}:{port}"
    headers = {"Host": host, "Authorization": f"Bearer {token}"}
    seconds, direct = await asyncio.gather(
        until_ok(caravan.http, f"http://127.0.0.1:{port}/api/status", headers, started),
        on_its_host_port(caravan, session["id"], started),
    )
    stored = await caravan.store.get(session["id"])
    assert stored is not None
    # where the time went: each status change's reason, seconds after the creation, and when Jupyter first answered
    # on the kernel's Nomad host port (no HAProxy), polled at the same time
    steps = {c.reason: round((c.at - stored.created_at).total_seconds(), 3) for c in stored.status_history}
    steps |= await nomad_steps(caravan, stored.nomad_job_id or "", stored.created_at.timestamp())
    steps["jupyter-answered-on-host-port"] = round(direct, 3)
    steps["in-pooled-namespace"] = 'network_mode = "container:' in (stored.job_hcl or "")
    await caravan.gql(DESTROY, {"ids": [session["id"]]}, token=token)
    await caravan.wait_for(session["id"], "TERMINATED", timeout=120)
    return seconds, steps


async def nomad_steps(caravan: Caravan, job_id: str, since: float) -> dict[str, float]:
    """Nomad's own moments of the job's allocation, in seconds after ``since`` (unix time; one machine, one clock):
    ``nomad-alloc-created`` (placed), ``nomad-task-setup`` (the group's network is up: the pause container started
    and the CNI plugins ran), ``nomad-task-started`` (the container runs)."""
    names = {"Task Setup": "nomad-task-setup", "Started": "nomad-task-started"}
    steps: dict[str, float] = {}
    for _ in range(20):  # the client reports its task events to the servers in batches, up to 0.2 s late
        for alloc in await caravan.nomad.job_allocations(job_id):
            full = await caravan.nomad.allocation(alloc["ID"])
            steps["nomad-alloc-created"] = round(full["CreateTime"] / 1e9 - since, 3)
            for state in (full.get("TaskStates") or {}).values():
                for event in state.get("Events") or []:
                    if event["Type"] in names:
                        steps.setdefault(names[event["Type"]], round(event["Time"] / 1e9 - since, 3))
        if "nomad-task-started" in steps:
            break
        await asyncio.sleep(0.1)
    return steps


async def on_its_host_port(caravan: Caravan, session_id: str, started: float) -> float:
    """Seconds from ``started`` until Jupyter answers on the session kernel's Nomad host port, polled directly."""
    while True:
        stored = await caravan.store.get(session_id)
        address = published_port(stored.kernels[0].ports, JUPYTER_PORT) if stored and stored.kernels else None
        if address is not None:
            return await until_ok(caravan.http, f"http://{address[0]}:{address[1]}/api/status", {}, started)
        assert time.monotonic() - started < TIMEOUT, "the kernel's port was never published"
        await asyncio.sleep(POLL)


async def bare_nomad(
    caravan: Caravan, image: str, mhz: int, shape: dict[str, str], pool: Client | None
) -> tuple[float, dict[str, float]]:
    job_id = f"bench-bare-{uuid.uuid4().hex[:8]}"
    pooled = None
    if shape is POOLED_NETWORK:
        assert pool is not None
        pooled = make(pool, pause_image())  # ahead of the launch, as a pool would have it
        shape = shape | {"config": shape["config"] % {"pooled": pooled.name}}
    since, started = time.time(), time.monotonic()
    job = await caravan.nomad.parse(BARE_JOB % {"id": job_id, "image": image, "mhz": mhz, **shape})
    await caravan.nomad.register(job)
    port = 0
    while not port:
        assert time.monotonic() - started < TIMEOUT, "the bare job was never placed"
        for alloc in await caravan.nomad.job_allocations(job_id):
            full = await caravan.nomad.allocation(alloc["ID"])
            ports = (full.get("AllocatedResources") or {}).get("Shared", {}).get("Ports") or []
            port = next((p["Value"] for p in ports if p["Label"] == "jupyter"), 0)
        if not port:
            await asyncio.sleep(POLL)
    if pooled is not None and pool is not None:
        mapping = {"hostIP": "127.0.0.1", "hostPort": port, "containerPort": JUPYTER_PORT, "protocol": "tcp"}
        await asyncio.to_thread(bind, pool, pooled.name, "default", job_id, [mapping])
        bound = time.monotonic() - started
    seconds = await until_ok(caravan.http, f"http://127.0.0.1:{port}/api/status", {}, started)
    steps = await nomad_steps(caravan, job_id, since)
    if pooled is not None:
        steps["pool-bound"] = round(bound, 3)
    await caravan.nomad.deregister(job_id, purge=False)
    while any(a["ClientStatus"] == "running" for a in await caravan.nomad.job_allocations(job_id)):
        await asyncio.sleep(0.2)
    await caravan.nomad.deregister(job_id, purge=True)
    if pooled is not None and pool is not None:
        delete(pool, pooled.name)
    return seconds, steps


def pause_image() -> str:
    return stack_env()["CARAVAN_PAUSE_IMAGE"]


async def measure(settings: Settings, image: str, runs: int, pool: Client | None, pool_size: int = 2) -> dict[str, Any]:
    async with caravan_behind_haproxy(settings) as (caravan, ingress):
        await caravan.gql(REGISTER, {"i": image}, token=ADMIN_TOKEN)
        token = await caravan.user("alice")
        [node] = [n for n in await caravan.nomad.nodes() if n["Status"] == "ready"]
        detail = await caravan.nomad._json("GET", f"/v1/node/{node['ID']}")
        mhz = int(detail["Attributes"].get("cpu.frequency", "1000"))  # one core, as Caravan asks for cpu 1
        keeper = None
        if pool is not None and pool_size > 0:  # the client's namespace keeper, as a host running Caravan's pool has it
            keeper = NamespaceKeeper(
                pool, caravan.nomad, caravan.store.redis, caravan.store.keys, node["ID"], pool_size, pause_image()
            )
            keeping = asyncio.create_task(keeper.run_forever())
            while await caravan.store.redis.scard(keeper.key) < pool_size:
                await asyncio.sleep(0.1)
        times: dict[str, list[float]] = {name: [] for name in TARGETS}
        for run in range(runs):
            for name, shape in TARGETS.items():
                if shape is None:
                    seconds, steps = await through_caravan(caravan, image, token, ingress.port)
                else:
                    seconds, steps = await bare_nomad(caravan, image, mhz, shape, pool)
                times[name].append(seconds)
                line = {"measure": "launch_to_jupyter", "target": name, "run": run, "seconds": round(seconds, 3)}
                print(json.dumps(line | {"steps": steps}), flush=True)
        if keeper is not None:
            keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeping
            await keeper.delete_all()
        medians = {k: round(statistics.median(v), 3) for k, v in times.items()}
        ratio = round(medians["caravan"] / medians["bare_nomad"], 3)
        isolation = round(medians["bare_nomad_session_network"] / medians["bare_nomad"], 3)
        pooled = round(medians["bare_nomad_pooled_namespace"] / medians["bare_nomad"], 3)
        return {
            "measure": "summary",
            "median_seconds": medians,
            "max_seconds": {k: round(max(v), 3) for k, v in times.items()},
            "ratio": ratio,
            "session_network_vs_bare": isolation,
            "pooled_namespace_vs_bare": pooled,
            "goal": f"Caravan (createSession to Jupyter answering through HAProxy) within {GOAL_RATIO}x of the same "
            "image started by a bare Nomad job and polled directly (medians)",
            "loadavg_1m": os.getloadavg()[0],
            "meets_goal": ratio <= GOAL_RATIO,
        }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="launches of each, alternating")
    parser.add_argument("--pool", type=int, default=2, help="pooled namespaces kept for Caravan's sessions (0: none)")
    args = parser.parse_args()
    image = stack_env().get("CARAVAN_JUPYTER_IMAGE", "")
    if not image:
        raise SystemExit("no Jupyter image: run ops/build-env-images")
    with private_stack(want_drivers=("raw_exec", "exec", "docker")) as stack:
        network = recorded_network(stack.home / "nomad")
        pool = Client(network.conflist(), network.cni_path) if network is not None else None
        print(json.dumps(await measure(stack.settings, image, args.runs, pool, args.pool)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
