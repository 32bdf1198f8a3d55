"""Inference endpoints, every figure of issue 25 against a baseline of the same run, on one machine.

Starts a private Redis and Nomad dev agent (ACLs and Redis users on, as the stack runs them), an in-process scheduler
(with its autoscaler) and gateway behind HAProxy (``caravan.stack.haproxy``), and INFERENCE sessions of the tests'
model server (``tests/e2e/test_inference_endpoints.py``: Python's http.server, HTTP/1.1 keep-alive, in raw_exec
kernels). Then, each printed as JSON lines, the last line with every figure, the goals and ``meets_goal``:

* **routing**: wrk drives, alternately, ``direct`` (replica main1's host port) and ``endpoint`` (the endpoint's host
  on HAProxy, a private endpoint called with an endpoint token), ``--rounds`` times each, ``GET /`` with
  ``--connections`` at once: requests/s, p50 and p99 in ms (the best round of each); then how long a revoked endpoint
  token takes to be refused (``--revocations`` times).
* **cold start from zero** (``--cold-starts`` rounds): an endpoint with ``minReplicas: 0`` left idle until it is at
  zero; a request through HAProxy, from its sending to its first byte. Its baseline, alternating with it while the
  endpoint is at zero: the very job Caravan registered for the replica (its HCL, under another id, parsed and
  registered as the job owner does), from its registration until Nomad's own check of the replica passes (its
  ``/checks``, polled every 20 ms). Each side with its steps (Nomad's allocation created, task started).
* **failed requests during a rolling update, and during a scale-down**, under constant load (wrk, ``--load-connections``
  on ``GET /``): wrk starts half a second before the change and is stopped once it is over (the last old allocation
  stopped); changes follow each other (``updateEndpoint``'s environment v1, v2, …; ``maxReplicas`` 3 → 1, raised
  back to 3 with no load) until ``--min-requests`` were sent during them.
* **scaling reaction**: an endpoint of rules 1-3 replicas, 2 requests in flight per replica (the default windows:
  60 s stable, 6 s panic), idle at 1; wrk steps to ``--step-connections`` connections on a slow path (50 ms a
  request); the time from the step to each new replica routable (HAProxy routes it within milliseconds), and to the
  autoscaler's last decision.

Usage: .venv/bin/python -m bench.inference_serving [--duration 8] [--connections 16] [--rounds 2] [--cold-starts 3]
    [--min-requests 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import re
import shutil
import signal
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2

from bench.app_proxy.__main__ import answering, headers_script
from bench.gateway.__main__ import run_wrk, wrk_figures
from caravan.stack.private_stack import private_stack
from core.clock import from_iso
from core.settings import Settings
from domain.endpoint_routes import endpoint_host
from domain.endpoint_scaling import behind, serving
from domain.inference import endpoints_of
from domain.model import Session
from nomad_jobs.client import TERMINAL_ALLOCATION_STATUSES
from nomad_jobs.meta import TASK_NAME
from tests.e2e.test_inference_endpoints import ISSUE, MODEL, REVOKE
from tests.harness import ADMIN_TOKEN, CREATE, Caravan
from tests.ingress import caravan_behind_haproxy

GOAL = {
    "rps_vs_direct": 0.8,
    "revocation_ms": 1000.0,
    "cold_start_over_nomad_s": 1.0,
    "rolling_update_failed": 0,
    "scale_down_failed": 0,
    "requests_during_each": 5000,
}
UPDATE_ENDPOINT = "mutation($id: ID!, $i: EndpointUpdateInput!) { updateEndpoint(id: $id, input: $i) { revision } }"
SCALE = "mutation($id: ID!, $r: AutoscalingInput) { updateEndpointScaling(id: $id, autoscaling: $r) { revision } }"
DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }"
COLD_STARTS = "query($id: ID!) { session(id: $id) { endpoint { coldStarts { arrivedAt routableAt firstByteAt } } } }"
ANSWER_WITHIN = 10
"""Seconds within which an answer must come under constant load, else wrk counts a timeout: a failed request (wrk's
default, 2 s, is a slow answer on a 2-core machine whose load average is above 30, not a failure)."""
RATE_LIMIT = 1_000_000
"""Requests per second per token: the stack's 1,000 would refuse (429) part of wrk's load, which is one token's."""
QUICK = {"stableWindow": "4s", "panicWindow": "2s", "scaleDownDelay": "0s", "drainTimeout": "3s"}
"""Short windows for the endpoints whose replicas the bench changes itself (a drain under constant load never sees
the endpoint empty: it lasts the drain timeout)."""


@dataclasses.dataclass
class Bench:
    caravan: Caravan
    settings: Settings
    port: int
    model: Path
    work: Path

    def url(self, session_id: str) -> tuple[str, dict[str, str]]:
        host = f"{endpoint_host(session_id, self.settings.gateway.apps_domain)}:{self.port}"
        return f"http://127.0.0.1:{self.port}/", {"Host": host, "Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def endpoint(self, replicas: int, **fields: Any) -> str:
        """A RUNNING INFERENCE session with ``replicas`` routable: its id."""
        request = {
            "name": "bench-" + uuid.uuid4().hex[:8],
            "type": "INFERENCE",
            "driver": "RAW_EXEC",
            "servicePort": 8000,
            "replicas": replicas,
            "healthCheckPath": "/",
            "startupCommand": f"exec {sys.executable} {self.model} -",
            "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "128m"}],
            **fields,
        }
        [session] = (await self.caravan.gql(CREATE, {"input": request}))["createSession"]["sessions"]
        await self.until(lambda s: len(endpoints_of(s)) == replicas, session["id"], f"{replicas} replicas routable")
        return str(session["id"])

    async def destroy(self, session_id: str) -> None:
        """Ended, its replicas' slots free for the next measure."""
        await self.caravan.gql(DESTROY, {"ids": [session_id]})
        await self.caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=120)

    async def until(self, done: Callable[[Session], bool], session_id: str, what: str, timeout: float = 300) -> Session:
        deadline = time.monotonic() + timeout
        while True:
            stored = await self.caravan.store.get(session_id)
            if stored is not None and done(stored):
                return stored
            if time.monotonic() > deadline:
                raise SystemExit(f"not within {timeout:g} s: {what}")
            await asyncio.sleep(0.02)

    async def settled(self, session_id: str, replicas: int) -> Session:
        """The endpoint once exactly ``replicas`` serve, routable and at its revision, none drains, and every other
        allocation of its job has stopped."""

        def steady(s: Session) -> bool:
            kernels = [k for k in s.kernels if not k.parked]
            return len(endpoints_of(s)) == len(serving(s)) == len(kernels) == replicas and not behind(s)

        session = await self.until(steady, session_id, f"{replicas} replicas settled")
        kept = {k.alloc_id for k in session.kernels}
        deadline = time.monotonic() + 120
        while True:
            allocs = await self.caravan.nomad.job_allocations(session.nomad_job_id or "")
            if all(a["ID"] in kept or a["ClientStatus"] in TERMINAL_ALLOCATION_STATUSES for a in allocs):
                return session
            if time.monotonic() > deadline:
                raise SystemExit("the old allocations never stopped")
            await asyncio.sleep(0.05)


# -- wrk for as long as a change lasts --


@contextlib.asynccontextmanager
async def wrk(url: str, headers: dict[str, str], work: Path, connections: int) -> AsyncIterator[dict[str, Any]]:
    """wrk running until the block ends (then stopped with SIGINT: it prints its figures), which fill the dict."""
    script = work / f"wrk-{uuid.uuid4().hex[:6]}.lua"
    script.write_text(headers_script(headers))
    argv = [
        "wrk",
        "-t1",
        f"-c{connections}",
        "-d3600s",
        f"--timeout={ANSWER_WITHIN}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    figures: dict[str, Any] = {}
    started = time.monotonic()
    try:
        yield figures
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = await process.communicate()
        figures.update(wrk_figures(out.decode()), seconds=round(time.monotonic() - started, 2))
        figures["failed"] = figures["non_2xx"] + sum(map(int, re.findall(r"\d+", figures.get("socket_errors", ""))))


async def changes_under_load(
    bench: Bench,
    session_id: str,
    args: argparse.Namespace,
    change: Callable[[int], Awaitable[None]],
    done: Callable[[int], Awaitable[None]],
    name: str,
    reset: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """``change`` under constant load, then ``done`` waited for, until ``args.min_requests`` were sent during them."""
    url, headers = bench.url(session_id)
    rounds: list[dict[str, Any]] = []
    while sum(r["requests"] for r in rounds) < args.min_requests and len(rounds) < args.max_changes:
        n = len(rounds) + 1
        async with wrk(url, headers, bench.work, args.load_connections) as figures:
            await asyncio.sleep(0.5)
            start = time.monotonic()
            await change(n)
            await done(n)
            took = time.monotonic() - start
        rounds.append({**figures, "change_s": round(took, 2)})
        print(json.dumps({"measure": name, "round": n, **rounds[-1]}), flush=True)
        if reset is not None:
            await reset(n)
    return {
        "requests": sum(r["requests"] for r in rounds),
        "failed": sum(r["failed"] for r in rounds),
        "changes": len(rounds),
        "change_s": [r["change_s"] for r in rounds],
        "rps": round(statistics.mean(r["rps"] for r in rounds), 1),
    }


async def rolling_updates(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    rules = {"minReplicas": 2, "maxReplicas": 2, "target": 1000, **QUICK}
    session_id = await bench.endpoint(2, autoscaling=rules, environ=[{"name": "VERSION", "value": "v0"}])

    async def update(n: int) -> None:
        given = {"environ": [{"name": "VERSION", "value": f"v{n}"}]}
        await bench.caravan.gql(UPDATE_ENDPOINT, {"id": session_id, "i": given})

    async def over(n: int) -> None:
        session = await bench.settled(session_id, 2)
        assert session.revision == n and all(k.revision == n for k in session.kernels)

    found = await changes_under_load(bench, session_id, args, update, over, "rolling_update")
    await bench.destroy(session_id)
    return found


async def scale_downs(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    rules = {"minReplicas": 3, "maxReplicas": 3, "target": 1000, **QUICK}
    session_id = await bench.endpoint(3, autoscaling=rules)

    async def lower(_: int) -> None:
        await bench.caravan.gql(SCALE, {"id": session_id, "r": {**rules, "minReplicas": 1, "maxReplicas": 1}})

    async def lowered(_: int) -> None:
        await bench.settled(session_id, 1)

    async def raise_again(_: int) -> None:
        await bench.caravan.gql(SCALE, {"id": session_id, "r": rules})
        await bench.settled(session_id, 3)

    found = await changes_under_load(bench, session_id, args, lower, lowered, "scale_down", reset=raise_again)
    await bench.destroy(session_id)
    return found


# -- cold start from zero, against Nomad alone --


def _nomad_moment(raw: str | None) -> float | None:
    return from_iso(raw).timestamp() if raw and not raw.startswith("0001") else None


def _steps(alloc: dict[str, Any], since: float) -> dict[str, float | None]:
    """When Nomad created the allocation and started its task, in seconds since ``since`` (unix)."""
    state = (alloc.get("TaskStates") or {}).get(TASK_NAME) or {}
    started = _nomad_moment(state.get("StartedAt"))
    return {
        "alloc_created_s": round(alloc["CreateTime"] / 1e9 - since, 3),
        "task_started_s": round(started - since, 3) if started else None,
    }


async def nomad_alone(bench: Bench, job_id: str, hcl: str) -> dict[str, Any]:
    """The replica's job, as Caravan registered it, under another id: registration to its check passing."""
    nomad = bench.caravan.nomad
    stanza = f'job "{job_id}"'
    assert hcl.count(stanza) == 1, "the job stanza of Caravan's job"
    bare = "bare-" + uuid.uuid4().hex[:8]  # outside Caravan's job prefix: the scheduler leaves it alone
    copy = hcl.replace(stanza, f'job "{bare}"', 1)
    sent = time.time()
    start = time.monotonic()
    await nomad.register(await nomad.parse(copy), source_hcl=copy)
    try:
        while True:
            allocs = await nomad.job_allocations(bare)
            running = [a for a in allocs if a.get("ClientStatus") == "running"]
            if running:
                checks = await nomad.allocation_checks(running[0]["ID"])
                if checks and all(c.get("Status") == "success" for c in checks.values()):
                    healthy = time.monotonic() - start
                    alloc = await nomad.allocation(running[0]["ID"])
                    return {"healthy_s": round(healthy, 3), **_steps(alloc, sent)}
            if time.monotonic() - start > 120:
                raise SystemExit("Nomad alone: the replica never passed its check")
            await asyncio.sleep(0.02)
    finally:
        await nomad.deregister(bare, purge=True)
        while any(a["ClientStatus"] not in TERMINAL_ALLOCATION_STATUSES for a in await nomad.job_allocations(bare)):
            await asyncio.sleep(0.1)


async def through_caravan(bench: Bench, session_id: str) -> dict[str, Any]:
    """One request to the endpoint at zero: sent to its first byte, with the steps on the way."""
    url, headers = bench.url(session_id)
    async with httpx2.AsyncClient(timeout=120) as client:
        sent = time.time()
        start = time.monotonic()
        async with client.stream("GET", url, headers=headers) as response:
            first_byte = time.monotonic() - start
            await response.aread()
    if response.status_code != 200:
        raise SystemExit(f"cold start: {response.status_code} {response.text[:200]}")
    session = await bench.caravan.store.get(session_id)
    assert session is not None
    main = next(k for k in session.kernels if not k.parked)
    alloc = await bench.caravan.nomad.allocation(main.alloc_id or "")
    found = (await bench.caravan.gql(COLD_STARTS, {"id": session_id}))["session"]["endpoint"]["coldStarts"]
    cold = max(found, key=lambda c: from_iso(c["arrivedAt"]).timestamp())
    routable = from_iso(cold["routableAt"]).timestamp() - sent if cold["routableAt"] else None
    return {"first_byte_s": round(first_byte, 3), **_steps(alloc, sent), "routable_s": round(routable or -1, 3)}


async def at_zero(bench: Bench, session_id: str) -> Session:
    session = await bench.until(lambda s: all(k.parked for k in s.kernels), session_id, "the endpoint at zero")
    while any(
        a["ClientStatus"] not in TERMINAL_ALLOCATION_STATUSES
        for a in await bench.caravan.nomad.job_allocations(session.nomad_job_id or "")
    ):
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # the ingress routes the endpoint to the activator (within milliseconds)
    return session


async def cold_starts(bench: Bench, rounds: int) -> dict[str, Any]:
    rules = {"minReplicas": 0, "maxReplicas": 1, "target": 1000, "scaleToZeroAfter": "2s", **QUICK}
    session_id = await bench.endpoint(1, autoscaling=rules)
    running = await bench.caravan.store.get(session_id)
    assert running is not None and running.job_hcl and running.nomad_job_id
    job_id, hcl = running.nomad_job_id, running.job_hcl  # the job of one running replica, as Caravan registered it
    sides: dict[str, list[dict[str, Any]]] = {"caravan": [], "nomad": []}
    for n in range(rounds):
        await at_zero(bench, session_id)
        sides["nomad"].append(await nomad_alone(bench, job_id, hcl))
        print(json.dumps({"measure": "cold_start", "side": "nomad", "round": n, **sides["nomad"][-1]}), flush=True)
        await at_zero(bench, session_id)
        sides["caravan"].append(await through_caravan(bench, session_id))
        print(json.dumps({"measure": "cold_start", "side": "caravan", "round": n, **sides["caravan"][-1]}), flush=True)
    await bench.destroy(session_id)
    caravan = statistics.median(r["first_byte_s"] for r in sides["caravan"])
    nomad = statistics.median(r["healthy_s"] for r in sides["nomad"])
    return {"caravan_first_byte_s": round(caravan, 3), "nomad_healthy_s": round(nomad, 3),
            "over_nomad_s": round(caravan - nomad, 3)}  # fmt: skip


# -- scaling reaction --


async def scaling_reaction(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    rules = {"minReplicas": 1, "maxReplicas": 3, "target": 2}
    session_id = await bench.endpoint(1, autoscaling=rules)
    url, headers = bench.url(session_id)
    await asyncio.sleep(3)  # a few idle samples
    reached: dict[int, float] = {}
    async with wrk(url + "slow?s=0.05", headers, bench.work, args.step_connections):
        stepped = time.time()
        start = time.monotonic()
        while len(reached) < 2 and time.monotonic() - start < 120:
            session = await bench.caravan.store.get(session_id)
            routable = len(endpoints_of(session)) if session is not None else 0
            for count in range(2, routable + 1):
                reached.setdefault(count, round(time.monotonic() - start, 2))
            await asyncio.sleep(0.02)
    session = await bench.caravan.store.get(session_id)
    assert session is not None
    figures: dict[str, Any] = {
        "to_2_replicas_s": reached.get(2),
        "to_3_replicas_s": reached.get(3),
        "decided_s": round(session.scaling.at.timestamp() - stepped, 2) if session.scaling is not None else None,
        "reason": session.scaling.reason if session.scaling is not None else None,
    }
    if len(reached) < 2:
        figures["replicas"] = [
            f"{k.hostname} {k.status.value} {k.status_info} {k.status_detail}" for k in session.kernels
        ]
    print(json.dumps({"measure": "scaling_reaction", **figures}), flush=True)
    await bench.destroy(session_id)
    return figures


# -- routing, against one replica directly --


async def routing(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    caravan = bench.caravan
    session_id = await bench.endpoint(2)
    stored = await caravan.store.get(session_id)
    assert stored is not None
    replica = endpoints_of(stored)[0]
    issued = (await caravan.gql(ISSUE, {"s": session_id, "n": "bench"}))["issueEndpointToken"]
    url, headers = bench.url(session_id)
    targets = {
        "direct": (f"http://{replica}", {}),
        "endpoint": (url.rstrip("/"), {**headers, "Authorization": f"Bearer {issued['secret']}"}),
    }
    for target, target_headers in targets.values():
        await answering(target + "/", target_headers)
    best: dict[str, dict[str, Any]] = {}
    for round_ in range(args.rounds):
        for name, (target, target_headers) in targets.items():
            figures = await asyncio.to_thread(
                run_wrk, target + "/", headers_script(target_headers), bench.work,
                duration=args.duration, connections=args.connections, threads=1,
            )  # fmt: skip
            if figures["non_2xx"] or figures.get("socket_errors"):
                raise SystemExit(f"{name}: failed requests: {figures}")
            print(json.dumps({"measure": "get", "target": name, "round": round_, **figures}), flush=True)
            if name not in best or figures["rps"] > best[name]["rps"]:
                best[name] = figures
    revocations = await revocation_ms(caravan, session_id, url, headers["Host"], args.revocations)
    print(json.dumps({"measure": "revocation_ms", "each": [round(r, 1) for r in revocations]}))
    await bench.destroy(session_id)
    return {
        "rps_direct": best["direct"]["rps"],
        "rps_endpoint": best["endpoint"]["rps"],
        "rps_vs_direct": round(best["endpoint"]["rps"] / best["direct"]["rps"], 3),
        "p99_ms_direct": best["direct"]["p99_ms"],
        "p99_ms_endpoint": best["endpoint"]["p99_ms"],
        "revocation_ms": round(max(revocations), 1),
    }


async def revocation_ms(caravan: Caravan, session_id: str, url: str, host: str, times: int) -> list[float]:
    """Per token: issued, used once, revoked; the time from the revoke's answer to HAProxy's first refusal."""
    found = []
    async with httpx2.AsyncClient(timeout=10) as client:
        for _ in range(times):
            issued = (await caravan.gql(ISSUE, {"s": session_id, "n": "bench"}))["issueEndpointToken"]
            headers = {"Host": host, "Authorization": f"Bearer {issued['secret']}"}
            while (await client.get(url, headers=headers)).status_code != 200:
                await asyncio.sleep(0.005)
            await caravan.gql(REVOKE, {"s": session_id, "t": issued["token"]["id"]})
            start = time.monotonic()
            while (await client.get(url, headers=headers)).status_code != 401:
                pass
            found.append((time.monotonic() - start) * 1000)
    return found


async def measure(settings: Settings, work: Path, args: argparse.Namespace) -> None:
    model = work / "model.py"
    model.write_text(MODEL)
    async with caravan_behind_haproxy(settings) as (caravan, ingress):
        bench = Bench(caravan, settings, ingress.port, model, work)
        figures = await routing(bench, args)
        cold = await cold_starts(bench, args.cold_starts)
        updates = await rolling_updates(bench, args)
        downs = await scale_downs(bench, args)
        reaction = await scaling_reaction(bench, args)
    least = GOAL["requests_during_each"]
    meets = {
        "rps_vs_direct": figures["rps_vs_direct"] >= GOAL["rps_vs_direct"],
        "revocation_ms": figures["revocation_ms"] <= GOAL["revocation_ms"],
        "cold_start": cold["over_nomad_s"] <= GOAL["cold_start_over_nomad_s"],
        "rolling_update": updates["failed"] == 0 and updates["requests"] >= least,
        "scale_down": downs["failed"] == 0 and downs["requests"] >= least,
    }
    print(json.dumps({
        **figures,
        "cold_start": cold,
        "rolling_update": updates,
        "scale_down": downs,
        "scaling_reaction": reaction,
        "goal": GOAL,
        "meets": meets,
        "meets_goal": all(meets.values()),
    }), flush=True)  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="alternate runs of each target")
    parser.add_argument("--revocations", type=int, default=10)
    parser.add_argument("--cold-starts", type=int, default=3, help="alternate cold starts of each side")
    parser.add_argument("--min-requests", type=int, default=GOAL["requests_during_each"])
    parser.add_argument("--max-changes", type=int, default=10, help="at most this many updates (scale-downs)")
    parser.add_argument("--load-connections", type=int, default=8, help="wrk's during updates and scale-downs")
    parser.add_argument("--step-connections", type=int, default=8, help="the load step of the scaling reaction")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (ops/install installs Debian's wrk)")
    with private_stack() as stack:
        settings = dataclasses.replace(
            stack.settings,
            scheduler=dataclasses.replace(stack.settings.scheduler, reconcile_interval=1.0),
            endpoints=dataclasses.replace(stack.settings.endpoints, rate_limit=RATE_LIMIT),
        )
        await measure(settings, stack.home, args)


if __name__ == "__main__":
    asyncio.run(main())
