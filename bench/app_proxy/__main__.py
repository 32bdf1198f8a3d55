"""Session apps: Caravan's data plane (HAProxy, its maps kept by the gateway) against the app itself and against
JupyterHub's configurable-http-proxy, in one run on one machine.

Starts a private Redis and Nomad dev agent (ACLs and Redis users on, as the stack runs them) and an in-process
scheduler, then two real sessions: busybox ``httpd`` in an exec kernel (its own network namespace, reached on its Nomad
host port) serving a small page and a 10 MiB file, and a WebSocket echo server in a raw_exec kernel. HAProxy is started
as the stack starts it (``caravan.stack.haproxy``), in front of an in-process gateway that keeps its maps;
configurable-http-proxy
(``bench/app_proxy/chp``, installed by ``ops/install-node``) is started in front of the same kernel port. wrk drives
each target for a fixed time:

- ``small``: ``GET /`` (6 bytes), ``--connections`` at once: requests/s, p50 and p99 in ms;
- ``bulk``: ``GET /big`` (10 MiB), ``--bulk-connections`` at once: MiB/s;

three ways: ``direct`` (the kernel's host port), ``caravan`` (the app's origin on HAProxy, bearer token checked by
HAProxy against its map of token hashes), ``chp`` (configurable-http-proxy, no auth: it has none of its own). Then
WebSocket echo round trips per second over ``--ws-connections`` connections, direct and through Caravan; how long a
route added or removed in Redis takes to be in effect at HAProxy (``--route-changes`` times each); and the small GET
through Caravan again with 10,000 routes loaded (its p99 against the first run's, with a handful). Prints one JSON line
per measurement, and a last line with the ratios, the goal and ``meets_goal``.

Every measure runs ``--rounds`` times, the targets in turn, and counts by its median: the machine's other work
weighs on each target alike. wrk times a request from when it is written, so the connect to busybox ``httpd`` (it
closes every connection) is outside the direct target's latency and inside Caravan's (HAProxy connects per request):
compare the p99s with that in mind.

Usage: .venv/bin/python -m bench.app_proxy [--duration 8] [--connections 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from websockets.asyncio.client import connect

from bench.gateway.__main__ import run_wrk, spawn, stop
from caravan.stack.private_stack import private_stack
from caravan.stack.processes import free_port
from core.settings import Settings
from domain.apps import app_host, published_port
from domain.model import SessionStatus
from gateway.apps.ingress_config import AWAIT_MS
from tests.harness import ADMIN_TOKEN, CREATE, Caravan
from tests.ingress import Ingress, caravan_behind_haproxy, running_app

ROOT = Path(__file__).resolve().parents[2]
CHP = ROOT / "bench" / "app_proxy" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
BIG_MIB = 10
SITE = f"""
mkdir -p /tmp/w && printf 'hello\\n' > /tmp/w/index.html
dd if=/dev/urandom of=/tmp/w/big bs=1048576 count={BIG_MIB} 2>/dev/null
exec httpd -f -p 8080 -h /tmp/w
"""
ECHO = """
import asyncio, os
from websockets.asyncio.server import serve
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with serve(echo, "127.0.0.1", int(os.environ["NOMAD_PORT_p8765"]), compression=None):
        await asyncio.Future()
asyncio.run(main())
"""
GOAL = {
    "small_rps_vs_direct": 0.8,
    "small_rps_vs_chp": 2.0,
    "bulk_vs_direct": 0.8,
    "ws_vs_direct": 0.8,
    "route_change_ms": 50.0,
    "p99_10k_vs_few": 1.1,
}
MANY_ROUTES = 10_000


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    """Where wrk connects (always 127.0.0.1)."""
    headers: dict[str, str]


def headers_script(headers: dict[str, str]) -> str:
    return "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())


async def running_session(caravan: Caravan, token: str, app: dict[str, Any], **fields: Any) -> tuple[str, int]:
    """A RUNNING INTERACTIVE session with one app: its id and the app's Nomad host port."""
    session = {"name": "bench-" + uuid.uuid4().hex[:8], "type": "INTERACTIVE", "apps": [app], **fields}
    data = await caravan.gql(CREATE, {"input": session}, token=token)
    session_id: str = data["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING", timeout=180)
    stored = await caravan.store.get(session_id)
    assert stored is not None
    published = published_port(stored.main_kernel.ports, app["port"])
    assert published is not None, stored.main_kernel.ports
    return session_id, published[1]


async def answering(url: str, headers: dict[str, str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            response = await asyncio.to_thread(_get, url, headers)
            if response == 200:
                return
        except httpx2.TransportError:  # not listening yet (httpd, configurable-http-proxy)
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} never answered 200")
        await asyncio.sleep(0.3)


def _get(url: str, headers: dict[str, str]) -> int:
    return httpx2.get(url, headers=headers, timeout=10).status_code


def http_runs(targets: list[Target], work: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each kind of request against each target, the targets in turn, ``--rounds`` times: the median of each figure
    per target (other work on the machine then weighs on every target alike)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for kind, path, connections in (("small", "/", args.connections), ("bulk", "/big", args.bulk_connections)):
        for round_ in range(args.rounds):
            for target in targets:
                figures = run_wrk(
                    target.url + path,
                    headers_script(target.headers),
                    work,
                    duration=args.duration,
                    connections=connections,
                    threads=1,
                )
                if target.name == "caravan" and (figures["non_2xx"] or figures.get("socket_errors")):
                    raise SystemExit(f"{target.name} {kind}: failed requests: {figures}")  # the anchors' are shown
                if kind == "bulk":
                    figures = {"mib_per_s": round(figures["rps"] * BIG_MIB, 1), **figures}
                runs.setdefault(f"{kind}:{target.name}", []).append(figures)
                line = {"measure": kind, "target": target.name, "round": round_, "connections": connections}
                print(json.dumps({**line, **figures, "loadavg_1m": os.getloadavg()[0]}), flush=True)
    return {key: medians(figures) for key, figures in runs.items()}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each numeric figure of several runs."""
    return {
        key: round(statistics.median(run[key] for run in runs), 2)
        for key, value in runs[0].items()
        if isinstance(value, int | float)
    }


async def ws_rate(url: str, headers: dict[str, str], connections: int, seconds: float) -> float:
    """Echo round trips per second: each connection sends a 64-byte message and waits for it, for ``seconds``."""
    message = b"x" * 64
    counts = [0] * connections

    async def one(index: int) -> None:
        async with connect(url, host="127.0.0.1", additional_headers=headers, compression=None) as ws:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await ws.send(message)
                assert await ws.recv() == message
                counts[index] += 1

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(connections)))
    return sum(counts) / (time.monotonic() - started)


async def in_effect(url: str, headers: dict[str, str], passing: bool) -> float:
    """The send time of the first request HAProxy decided as ``passing`` (routed, or refused) at once, probing every
    2 ms with requests in flight together. A refusal is decided again after a pause (``ingress_config.AWAIT_MS``), so
    a request that passes only after it does not count: it was sent before the change took effect."""
    found: list[float] = []
    pause = AWAIT_MS / 1000
    limits = httpx2.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx2.AsyncClient(timeout=10, limits=limits) as client:

        async def probe() -> None:
            sent = time.perf_counter()
            status = (await client.get(url, headers=headers)).status_code
            took = time.perf_counter() - sent
            if (status == 200 and took < pause) if passing else status != 200:
                found.append(sent)

        tasks: list[asyncio.Task[None]] = []
        while not found:
            tasks.append(asyncio.create_task(probe()))
            await asyncio.sleep(0.002)
        await asyncio.gather(*tasks, return_exceptions=True)
    return min(found)


def probing(url: str, headers: dict[str, str], passing: bool) -> float:
    """:func:`in_effect` on an event loop of its own (a thread): not the one the control plane under test runs on."""
    return asyncio.run(in_effect(url, headers, passing))


async def route_changes(caravan: Caravan, ingress: Ingress, token: str, port: int, times: int) -> dict[str, float]:
    """Milliseconds from a RUNNING session's write to Redis to the first request HAProxy routes to its app (added),
    and from its end to the first it refuses (removed): the worst and the median of ``times`` each."""
    added, removed = [], []
    for _ in range(times):
        session = running_app("alice", port)
        host = app_host("web", session.id, caravan.settings.gateway.apps_domain)
        url, headers = f"http://127.0.0.1:{ingress.port}/", {"Host": host, "Authorization": f"Bearer {token}"}
        probe = asyncio.create_task(asyncio.to_thread(probing, url, headers, True))
        await asyncio.sleep(0.05)  # the prober is up, refused meanwhile
        started = time.perf_counter()
        await caravan.store.create([session])
        added.append((await probe - started) * 1000)
        probe = asyncio.create_task(asyncio.to_thread(probing, url, headers, False))
        await asyncio.sleep(0.05)  # routed meanwhile
        started = time.perf_counter()
        await caravan.store.update(session.id, lambda s: dataclasses.replace(s, status=SessionStatus.TERMINATED))
        removed.append((await probe - started) * 1000)
    return {
        "added_ms_median": round(statistics.median(added), 1),
        "added_ms_max": round(max(added), 1),
        "removed_ms_median": round(statistics.median(removed), 1),
        "removed_ms_max": round(max(removed), 1),
    }


async def load_routes(caravan: Caravan, ingress: Ingress, port: int, count: int) -> None:
    sessions = [running_app("bob", port) for _ in range(count)]
    for start in range(0, count, 500):
        await caravan.store.create(sessions[start : start + 500])
    while len(await ingress.api.show_map(ingress.paths.map("routes"))) < count:
        await asyncio.sleep(0.2)


def summary(
    results: dict[str, dict[str, Any]], ws: dict[str, float], routes: dict[str, float], many: dict[str, Any]
) -> dict[str, Any]:
    small = {t: results[f"small:{t}"]["rps"] for t in ("direct", "caravan", "chp")}
    bulk = {t: results[f"bulk:{t}"]["mib_per_s"] for t in ("direct", "caravan", "chp")}
    ratios = {
        "small_rps_caravan_vs_direct": round(small["caravan"] / small["direct"], 3),
        "small_rps_chp_vs_direct": round(small["chp"] / small["direct"], 3),
        "small_rps_caravan_vs_chp": round(small["caravan"] / small["chp"], 3),
        "small_p99_caravan_vs_direct": round(results["small:caravan"]["p99_ms"] / results["small:direct"]["p99_ms"], 2),
        "bulk_caravan_vs_direct": round(bulk["caravan"] / bulk["direct"], 3),
        "bulk_chp_vs_direct": round(bulk["chp"] / bulk["direct"], 3),
        "bulk_caravan_vs_chp": round(bulk["caravan"] / bulk["chp"], 3),
        "ws_caravan_vs_direct": round(ws["caravan"] / ws["direct"], 3),
        "small_p99_10k_routes_vs_few": round(many["p99_ms"] / results["small:caravan"]["p99_ms"], 3),
    }
    met = {
        "small_vs_direct": ratios["small_rps_caravan_vs_direct"] >= GOAL["small_rps_vs_direct"],
        "small_vs_chp": ratios["small_rps_caravan_vs_chp"] >= GOAL["small_rps_vs_chp"],
        "bulk_vs_direct": ratios["bulk_caravan_vs_direct"] >= GOAL["bulk_vs_direct"],
        "ws_vs_direct": ratios["ws_caravan_vs_direct"] >= GOAL["ws_vs_direct"],
        "route_added": routes["added_ms_max"] <= GOAL["route_change_ms"],
        "route_removed": routes["removed_ms_max"] <= GOAL["route_change_ms"],
        "p99_10k_routes": ratios["small_p99_10k_routes_vs_few"] <= GOAL["p99_10k_vs_few"],
    }
    return {
        "small_rps": small,
        "bulk_mib_per_s": bulk,
        "ws_round_trips_per_s": {k: round(v) for k, v in ws.items()},
        "route_changes": routes,
        "small_10k_routes": {"rps": many["rps"], "p99_ms": many["p99_ms"]},
        "ratios": ratios,
        "caravan_auth": "bearer token each request, its SHA-256 looked up by HAProxy in the control plane's map",
        "goal": "Caravan >= 0.8x direct and >= 2x configurable-http-proxy requests/s (small GET); >= 0.8x direct "
        "bytes/s (10 MiB) and WebSocket round trips; a route added or removed in effect within 50 ms; p99 of the "
        "small GET with 10,000 routes within 1.1x of a handful",
        "met": met,
        "loadavg_1m": os.getloadavg()[0],
        "meets_goal": all(met.values()),
    }


async def measure(settings: Settings, work: Path, args: argparse.Namespace) -> None:
    processes = []
    async with caravan_behind_haproxy(settings) as (caravan, ingress):
        token = await caravan.user("alice")
        await caravan.user("bob")
        web_id, web_port = await running_session(
            caravan, token, {"name": "web", "port": 8080}, driver="EXEC", startupCommand=SITE
        )
        echo_app = {"name": "echo", "port": 8765, "protocol": "WEBSOCKET"}
        command = f"exec {sys.executable} -c '{ECHO}'"
        echo_id, echo_port = await running_session(
            caravan, ADMIN_TOKEN, echo_app, driver="RAW_EXEC", startupCommand=command
        )
        try:
            chp_port = free_port()
            chp_argv = [str(CHP), "--ip", "127.0.0.1", "--port", str(chp_port), "--api-ip", "127.0.0.1"]
            chp_argv += ["--api-port", str(free_port()), "--default-target", f"http://127.0.0.1:{web_port}"]
            chp_argv += ["--log-level", "warn"]
            processes.append(spawn(chp_argv, {"CONFIGPROXY_AUTH_TOKEN": uuid.uuid4().hex}, work / "chp.log"))
            domain = settings.gateway.apps_domain
            web_host = f"{app_host('web', web_id, domain)}:{ingress.port}"
            caravan_target = Target(
                "caravan", f"http://127.0.0.1:{ingress.port}", {"Host": web_host, "Authorization": f"Bearer {token}"}
            )
            targets = [Target("direct", f"http://127.0.0.1:{web_port}", {}), caravan_target]
            targets.append(Target("chp", f"http://127.0.0.1:{chp_port}", {}))
            for target in targets:
                await answering(target.url + "/", target.headers)
            results = await asyncio.to_thread(http_runs, targets, work, args)

            echo_host = f"{app_host('echo', echo_id, domain)}:{ingress.port}"
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            ws_targets = {"direct": (f"ws://127.0.0.1:{echo_port}/", {}), "caravan": (f"ws://{echo_host}/", admin)}
            ws_rates: dict[str, list[float]] = {name: [] for name in ws_targets}
            for round_ in range(args.rounds):
                for name, (url, headers) in ws_targets.items():
                    ws_rates[name].append(await ws_rate(url, headers, args.ws_connections, args.duration))
                    line = {"measure": "websocket", "target": name, "round": round_}
                    print(json.dumps({**line, "round_trips_per_s": round(ws_rates[name][-1])}), flush=True)
            ws = {name: statistics.median(rates) for name, rates in ws_rates.items()}
            routes = await route_changes(caravan, ingress, token, web_port, args.route_changes)
            print(json.dumps({"measure": "route_changes", **routes}))
            await load_routes(caravan, ingress, web_port, MANY_ROUTES)
            many_runs = []
            for round_ in range(args.rounds):
                many_runs.append(
                    await asyncio.to_thread(
                        run_wrk,
                        caravan_target.url + "/",
                        headers_script(caravan_target.headers),
                        work,
                        duration=args.duration,
                        connections=args.connections,
                        threads=1,
                    )
                )
                line = {"measure": "small", "target": "caravan", "routes": MANY_ROUTES, "round": round_}
                print(json.dumps({**line, **many_runs[-1]}), flush=True)
            many = medians(many_runs)
            print(json.dumps(summary(results, ws, routes, many)), flush=True)
        finally:
            for process in processes:
                stop(process)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run and per WebSocket run")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections for the small GET")
    parser.add_argument("--bulk-connections", type=int, default=4, help="wrk connections for the 10 MiB GET")
    parser.add_argument("--ws-connections", type=int, default=8)
    parser.add_argument("--route-changes", type=int, default=20, help="routes added and removed, one at a time")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each measure, the targets in turn (medians)")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (ops/install installs Debian's wrk)")
    if not CHP.exists():
        raise SystemExit(f"{CHP} is missing: run ./ops/install-node")
    with private_stack() as stack:
        await measure(stack.settings, stack.home, args)


if __name__ == "__main__":
    asyncio.run(main())
