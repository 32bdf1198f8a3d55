"""Inference endpoints: requests through an endpoint (HAProxy, its routes kept by the gateway's endpoint control
plane) against the same requests sent straight to one replica, in one run on one machine.

Starts a private Redis and Nomad dev agent (ACLs and Redis users on, as the stack runs them), an in-process scheduler
and gateway behind HAProxy (``caravan.stack.haproxy``), and one INFERENCE session of two replicas of the tests' model
server (``tests/e2e/test_inference_endpoints.py``: Python's http.server, HTTP/1.1 keep-alive, in raw_exec kernels).
wrk drives, alternately, ``direct`` (replica main1's host port) and ``endpoint`` (the endpoint's host on HAProxy, a
private endpoint called with an endpoint token), ``--rounds`` times each, ``GET /`` with ``--connections`` at once:
requests/s, p50 and p99 in ms (the best round of each). Then how long a revoked endpoint token takes to be refused
(``--revocations`` times). Prints one JSON line per measurement, and a last line with the ratio, the goal and
``meets_goal``. Cold start from zero, rolling updates and scale-down are not measured here (yet): the last line says so.

Usage: .venv/bin/python -m bench.inference_serving [--duration 8] [--connections 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx2

from bench.app_proxy.__main__ import answering, headers_script
from bench.gateway.__main__ import run_wrk
from caravan.stack.private_stack import private_stack
from core.settings import Settings
from domain.endpoint_routes import endpoint_host
from domain.inference import endpoints_of
from tests.e2e.test_inference_endpoints import ISSUE, MODEL, REVOKE
from tests.harness import CREATE, Caravan
from tests.ingress import caravan_behind_haproxy

GOAL = {"rps_vs_direct": 0.8, "revocation_ms": 1000.0}
NOT_MEASURED = ["cold_start_vs_nomad", "rolling_update_failed", "scale_down_failed", "scaling_reaction_s"]


async def serving(caravan: Caravan, model: Path) -> tuple[str, str]:
    """A RUNNING INFERENCE session of two replicas, both routable: its id and replica main1's address."""
    request = {
        "name": "bench-" + uuid.uuid4().hex[:8],
        "type": "INFERENCE",
        "driver": "RAW_EXEC",
        "servicePort": 8000,
        "replicas": 2,
        "healthCheckPath": "/",
        "startupCommand": f"exec {sys.executable} {model} -",
        "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "128m"}],
    }
    [session] = (await caravan.gql(CREATE, {"input": request}))["createSession"]["sessions"]
    deadline = time.monotonic() + 180
    while True:
        stored = await caravan.store.get(session["id"])
        routable = endpoints_of(stored) if stored is not None else ()
        if len(routable) == 2:
            return str(session["id"]), routable[0]
        if time.monotonic() > deadline:
            raise SystemExit("the replicas never became routable")
        await asyncio.sleep(0.5)


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
        session_id, replica = await serving(caravan, model)
        issued = (await caravan.gql(ISSUE, {"s": session_id, "n": "bench"}))["issueEndpointToken"]
        host = f"{endpoint_host(session_id, settings.gateway.apps_domain)}:{ingress.port}"
        targets = {
            "direct": (f"http://{replica}", {}),
            "endpoint": (
                f"http://127.0.0.1:{ingress.port}",
                {"Host": host, "Authorization": f"Bearer {issued['secret']}"},
            ),
        }
        for url, headers in targets.values():
            await answering(url + "/", headers)
        best: dict[str, dict[str, Any]] = {}
        for round_ in range(args.rounds):
            for name, (url, headers) in targets.items():
                figures = await asyncio.to_thread(
                    run_wrk, url + "/", headers_script(headers), work,
                    duration=args.duration, connections=args.connections, threads=1,
                )  # fmt: skip
                if figures["non_2xx"] or figures.get("socket_errors"):
                    raise SystemExit(f"{name}: failed requests: {figures}")
                print(json.dumps({"measure": "get", "target": name, "round": round_, **figures}), flush=True)
                if name not in best or figures["rps"] > best[name]["rps"]:
                    best[name] = figures
        revocations = await revocation_ms(
            caravan, session_id, f"http://127.0.0.1:{ingress.port}/", host, args.revocations
        )
        print(json.dumps({"measure": "revocation_ms", "each": [round(r, 1) for r in revocations]}))
        ratio = best["endpoint"]["rps"] / best["direct"]["rps"]
        figures = {
            "rps_direct": best["direct"]["rps"],
            "rps_endpoint": best["endpoint"]["rps"],
            "rps_vs_direct": round(ratio, 3),
            "p99_ms_direct": best["direct"]["p99_ms"],
            "p99_ms_endpoint": best["endpoint"]["p99_ms"],
            "revocation_ms": round(max(revocations), 1),
        }
        meets = ratio >= GOAL["rps_vs_direct"] and figures["revocation_ms"] <= GOAL["revocation_ms"]
        print(json.dumps({**figures, "not_measured": NOT_MEASURED, "goal": GOAL, "meets_goal": meets}), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="alternate runs of each target")
    parser.add_argument("--revocations", type=int, default=10)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (ops/install installs Debian's wrk)")
    with private_stack() as stack:
        settings = dataclasses.replace(
            stack.settings, scheduler=dataclasses.replace(stack.settings.scheduler, reconcile_interval=1.0)
        )
        await measure(settings, stack.home, args)


if __name__ == "__main__":
    asyncio.run(main())
