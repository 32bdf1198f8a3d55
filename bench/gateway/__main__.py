"""Gateway load: ``sessions(first: 50)`` over 10,000 stored sessions and ``createSession``, driven by wrk.

Starts a private Redis (like the tests), seeds the sessions in a fresh namespace, then serves

- the real gateway exactly as production runs it (``caravan gateway``, ``CARAVAN_GATEWAY_WORKERS`` processes;
  the rate limiter stays on, with a limit too high to refuse, so its Redis round trip is counted), twice:
  with the result cache (``CARAVAN_GRAPHQL_RESULT_CACHE=1``, the default) and without it (``=0``), and
- a bare Starlette endpoint (``bench/gateway/bare.py``) reading the same page (ZREVRANGE + MGET → JSON)
  with as many uvicorn workers,

and drives each with wrk for a fixed time: the bare page, the page without the cache, the page with it
(repeats: hits), the page with it while a writer renames one of the page's sessions through ``SessionStore``
every ``--churn-ms`` (each rename invalidates every stored answer), then ``createSession``. Prints one JSON
line per target (requests/s, p50 and p99 latency in ms, and ``executed``: the share of requests that ran the
listing, counted as MGET calls on the Redis server) and a ratio line. Nomad is not needed: neither the page
nor a creation calls it.

Usage: .venv/bin/python -m bench.gateway [--sessions 10000] [--duration 10] [--connections 32] [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
from redis.asyncio import Redis

from bench.gateway.bare import ADMIN_ID, PROJECTS, VARIANTS
from caravan.stack.processes import Service, free_port
from caravan.stack.redis_server import start_redis
from core.keys import Keys
from core.settings import RedisSettings, Settings
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from domain.users import Role, User
from stores.sessions import SessionStore
from stores.users import UserStore

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-admin-token"


def page_query(graphql_filter: str | None = None) -> str:
    """The page the bench reads: ``sessions(first: 50)`` with ``totalCount``, cursors and six fields per session."""
    arguments = "first: 50" + (f", filter: {graphql_filter}" if graphql_filter else "")
    return (
        f"{{ sessions({arguments}) {{ totalCount pageInfo {{ hasNextPage endCursor }} "
        "edges { cursor node { id name status type createdAt ownerId } } } }"
    )


PAGE_QUERY = page_query()
CREATE_MUTATION = "mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id status } } }"
OWNERS = 100
T0 = datetime(2026, 1, 1, tzinfo=UTC)


# -- data ---------------------------------------------------------------------------------------------


def stored_session(i: int) -> Session:
    resources = {"cpu": "1", "mem": str(256 << 20)}
    kernel = Kernel(role="main", index=1, hostname="main1", image="caravan/busybox:1", resources=resources)
    return Session(
        id=uuid.uuid4().hex,
        name=f"bench-{i:06d}",
        owner_id=f"user-{i % OWNERS:03d}",
        type=[SessionType.BATCH, SessionType.INTERACTIVE][i % 2],
        driver=Driver.DOCKER,
        image="caravan/busybox:1",
        resources=resources,
        kernels=(kernel,),
        created_at=T0 + timedelta(seconds=i),
        status=SessionStatus.PENDING,
        project=["default", "research"][i % 2],
        startup_command="sleep 60" if i % 2 == 0 else None,
        environ={"OMP_NUM_THREADS": "1"},
    )


async def seed(redis_url: str, prefix: str, count: int) -> str:
    """Store ``count`` sessions, and the ADMIN of the ``admin`` page; that admin's API token."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    store = SessionStore(redis, Keys(prefix))
    users = UserStore(redis, Keys(prefix))
    await users.create(User(id=ADMIN_ID, name="project admin", role=Role.ADMIN, projects=PROJECTS))
    admin_token = await users.issue_token(ADMIN_ID, label="bench")
    by_owner: dict[str, list[Session]] = {}
    for i in range(count):
        session = stored_session(i)
        by_owner.setdefault(session.owner_id, []).append(session)
    for sessions in by_owner.values():
        for start in range(0, len(sessions), 500):
            await store.create(sessions[start : start + 500])
    await redis.aclose()
    return admin_token


# -- servers ------------------------------------------------------------------------------------------


def spawn(argv: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{url} exited early:\n{log.read_text()[-3000:]}")
        try:
            httpx2.get(url, timeout=1)
            return
        except httpx2.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up:\n{log.read_text()[-3000:]}")


# -- wrk ----------------------------------------------------------------------------------------------


def lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


def page_script(body: dict[str, Any], token: str | None) -> str:
    headers = f'wrk.headers["Authorization"] = "Bearer {token}"\n' if token else ""
    return (
        f'wrk.method = "POST"\nwrk.body = {lua_string(json.dumps(body))}\n'
        f'wrk.headers["Content-Type"] = "application/json"\n{headers}'
    )


def create_script(token: str) -> str:
    """Each request a new name (names are unique per owner among live sessions): thread number and counter."""
    template = json.dumps(
        {
            "query": CREATE_MUTATION,
            "variables": {
                "input": {
                    "name": "load-%d-%d",
                    "type": "BATCH",
                    "driver": "RAW_EXEC",
                    "startupCommand": "true",
                    "resources": [{"slot": "cpu", "amount": "0.1"}, {"slot": "mem", "amount": "64m"}],
                }
            },
        }
    )
    return f"""
local threads, thread_id, counter = 0, 0, 0
local headers = {{["Content-Type"] = "application/json", ["Authorization"] = "Bearer {token}"}}
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end
function request()
  counter = counter + 1
  return wrk.format("POST", nil, headers, string.format({lua_string(template)}, thread_id, counter))
end
"""


UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def run_wrk(url: str, script: str, workdir: Path, *, duration: int, connections: int, threads: int) -> dict[str, Any]:
    path = workdir / f"wrk-{uuid.uuid4().hex[:6]}.lua"
    path.write_text(script)
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(path), url]
    return wrk_figures(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def wrk_figures(out: str) -> dict[str, Any]:
    """What wrk printed: requests/s, p50 and p99 in ms, requests, non-2xx answers and socket errors (if any)."""
    latency = {m[1]: float(m[2]) * UNITS[m[3]] for m in re.finditer(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    requests = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]),  # type: ignore[index]
        "p50_ms": round(latency["50"], 2),
        "p99_ms": round(latency["99"], 2),
        "requests": int(requests[1]) if requests else None,
        "non_2xx": int(bad[1]) if bad else 0,
        **({"socket_errors": errors[1]} if errors else {}),
    }


# -- churn: a writer renaming one session of the page ------------------------------------------------


class Renamer:
    """Renames the newest session through ``SessionStore`` every ``interval`` seconds, on its own thread and loop,
    as the scheduler or a user would: every rename increments the sessions version, so every stored answer goes."""

    def __init__(self, redis_url: str, prefix: str, interval: float) -> None:
        self.redis_url, self.prefix, self.interval = redis_url, prefix, interval
        self.renames = 0
        self.last_name: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Renamer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    async def _run(self) -> None:
        redis = Redis.from_url(self.redis_url, decode_responses=True)
        store = SessionStore(redis, Keys(self.prefix))
        try:
            [newest] = await redis.zrevrange(store.keys.sessions_by_created, 0, 0)
            next_at = time.monotonic()
            while not self._stop.is_set():
                name = f"churn-{self.renames:06d}"
                await store.update(newest, lambda s, name=name: dataclasses.replace(s, name=name))
                self.renames, self.last_name = self.renames + 1, name
                next_at += self.interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            await redis.aclose()


# -- main ---------------------------------------------------------------------------------------------


def page_of(url: str, query: str = PAGE_QUERY, token: str = TOKEN) -> dict[str, Any]:
    body: dict[str, Any] = httpx2.post(
        url, json={"query": query}, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).json()
    if body.get("errors") or len(body["data"]["sessions"]["edges"]) != 50:
        raise SystemExit(f"the page query did not answer 50 sessions: {str(body)[:500]}")
    return body


async def count_sessions(redis_url: str, prefix: str) -> int:
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        return int(await redis.zcard(Keys(prefix).sessions_by_created))
    finally:
        await redis.aclose()


async def mget_calls(redis_url: str) -> int:
    """MGET calls the server has run: one per executed page (the listing's documents), none per cached answer."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_mget", {}).get("calls", 0))
    finally:
        await redis.aclose()


def own_redis(work: Path, prefix: str) -> tuple[Service, Settings]:
    """A Redis as the stack starts it (users only, passwords in ``work/secrets``), and settings whose URL has no
    credentials (for ``CARAVAN_REDIS_URL``: the gateway connects as its own user from ``CARAVAN_SECRETS_DIR``) and
    give each role's by :meth:`Settings.for_role` (``admin`` for the bench's own seeding and counting)."""
    port = free_port()
    service = start_redis(
        work / "redis", port, log=work / "redis.log", secrets_dir=work / "secrets", key_prefixes=(prefix,)
    )
    return service, Settings(secrets_dir=work / "secrets", redis=RedisSettings(f"redis://127.0.0.1:{port}/0", prefix))


def lone_gateway_env(work: Path, redis_settings: Settings, port: int) -> dict[str, str]:
    """The environment of one gateway worker on ``port`` over :func:`own_redis`'s Redis, with no Nomad (an address
    where nothing listens): for benches of what the gateway serves from Redis alone."""
    return {
        "CARAVAN_HOME": str(work / "home"),
        "CARAVAN_REDIS_URL": redis_settings.redis.url,
        "CARAVAN_REDIS_PREFIX": redis_settings.redis.prefix,
        "CARAVAN_SECRETS_DIR": str(work / "secrets"),
        "CARAVAN_GATEWAY_HOST": "127.0.0.1",
        "CARAVAN_GATEWAY_PORT": str(port),
        "CARAVAN_GATEWAY_WORKERS": "1",
        "CARAVAN_NOMAD_ADDR": f"http://127.0.0.1:{free_port()}",  # nothing here calls Nomad
    }


def calibration() -> dict[str, Any]:
    """How fast this machine runs plain Python right now (the numbers above depend on it): seconds for
    10 million additions (about 0.4 s on one unloaded core of a recent server), and the load average."""
    started = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return {
        "python_loop_10M_s": round(time.perf_counter() - started, 2),
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
    }


def ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """a to b; None where b has nothing to divide by (wrk reports no latency when every request timed out).
    ``cpu``: b's server CPU per request over a's, the requests/s ratio the CPU alone allows (the other helpers'
    load on the machine moves requests/s far more than it moves a request's CPU time)."""
    ratios = {
        name: round(a[key] / b[key], digits) if b[key] else None
        for name, key, digits in (("rps", "rps", 3), ("p50", "p50_ms", 2), ("p99", "p99_ms", 2))
    }
    ratios["cpu"] = round(b["server_cpu_ms"] / a["server_cpu_ms"], 3) if a.get("server_cpu_ms") else None
    return ratios


def servers_cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> float:
    """CPU seconds (user and system) used so far by the servers' processes: each was started in a process group of
    its own (``spawn``), and its workers are in it (``/proc/<pid>/stat``: pgrp, utime, stime)."""
    groups = {p.pid for p in processes}
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) in groups:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median requests/s among a target's rounds (its latencies with it)."""
    return sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]


PAGES = ["page", *VARIANTS]
"""The uncached pages, each measured right after its bare counterpart (``bare`` for ``page``, ``bare_<name>``)."""
TARGETS = ["bare", *PAGES, "cached", "churn", "create"]


def bare_of(name: str) -> str:
    return "bare" if name == "page" else f"bare_{name}"


def summary(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The last line: ratios to the bare page and to the uncached page, the goal and whether it is met."""
    ratios: dict[str, Any] = {}
    for name in PAGES:
        for side in (name, f"{name}_baseline"):
            if side in results and bare_of(name) in results:
                ratios[f"{side}_to_bare"] = ratio(results[side], results[bare_of(name)])
    if "bare" in results:
        for name in ("cached", "churn"):
            if name in results:
                ratios[f"{name}_to_bare"] = ratio(results[name], results["bare"])
    if "page" in results and "cached" in results:
        ratios["cached_to_page"] = ratio(results["cached"], results["page"])
    met = {
        name: results[name]["rps"] >= 1000 and results[name]["p99_ms"] < 50
        for name in ("page", "cached", "churn")
        if name in results
    }
    uncached = {
        name: (ratios[f"{name}_to_bare"]["rps"] or 0) >= UNCACHED_GOAL for name in PAGES if f"{name}_to_bare" in ratios
    }
    by_cpu = {
        name: (ratios[f"{name}_to_bare"]["cpu"] or 0) >= UNCACHED_GOAL for name in PAGES if f"{name}_to_bare" in ratios
    }
    return {
        "ratios": ratios,
        "goal": {
            "rps": 1000,
            "p99_ms": 50,
            "met": met,
            "uncached_to_bare": UNCACHED_GOAL,
            "uncached_met": uncached,
            "uncached_cpu_met": by_cpu,
        },
        "meets_goal": all(met.values()) and all(uncached.values()),
    }


UNCACHED_GOAL = 0.5
"""Issue 30: every uncached page (plain, filtered, an admin's) at least half the requests/s of its bare page."""


def start_servers(
    args: argparse.Namespace,
    work: Path,
    prefix: str,
    redis_settings: Settings,
    processes: list[subprocess.Popen[bytes]],
) -> dict[str, str]:
    """Start the cached and the uncached gateway (and the ``--baseline`` checkout's uncached one) and the bare
    Starlette page (appended to ``processes``); their URLs (the bare page's without its path)."""
    bare_port = free_port()
    gateway_env = {
        "CARAVAN_HOME": str(work / "home"),
        "CARAVAN_REDIS_URL": redis_settings.redis.url,
        "CARAVAN_REDIS_PREFIX": prefix,
        "CARAVAN_SECRETS_DIR": str(work / "secrets"),
        "CARAVAN_ADMIN_TOKEN": TOKEN,
        "CARAVAN_GATEWAY_HOST": "127.0.0.1",
        "CARAVAN_GATEWAY_WORKERS": str(args.workers),
        "CARAVAN_NOMAD_ADDR": f"http://127.0.0.1:{free_port()}",  # nothing here calls Nomad
        "CARAVAN_GRAPHQL_RATE_LIMIT": str(10**9),  # on, so its round trip counts, but never refusing
    }
    gateways = {"cached": ("1", ROOT), "uncached": ("0", ROOT)}
    if args.baseline is not None:  # `python -m` from that directory imports its code first
        gateways["baseline"] = ("0", Path(args.baseline).resolve())
    urls: dict[str, str] = {}
    for name, (cache, checkout) in gateways.items():
        log, port = work / f"gateway-{name}.log", free_port()
        env = {**gateway_env, "CARAVAN_GATEWAY_PORT": str(port), "CARAVAN_GRAPHQL_RESULT_CACHE": cache}
        processes.append(spawn([sys.executable, "-m", "caravan.cli", "gateway"], env, log, checkout))
        wait_http(f"http://127.0.0.1:{port}/healthz", processes[-1], log)
        urls[name] = f"http://127.0.0.1:{port}/graphql"
    bare_log = work / "bare.log"
    processes.append(
        spawn(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.gateway.bare:create",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(bare_port),
                "--workers",
                str(args.workers),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            {"BENCH_REDIS_URL": redis_settings.for_role("gateway").redis.url, "BENCH_REDIS_PREFIX": prefix},
            bare_log,
        )
    )
    urls["bare"] = f"http://127.0.0.1:{bare_port}"
    wait_http(urls["bare"] + "/sessions", processes[-1], bare_log)
    return urls


Measure = Callable[..., dict[str, Any]]
"""``measure(name, label, url, wrk script, **extra)``: one wrk run, printed and kept under ``name``."""


def measure_pages(
    args: argparse.Namespace,
    only: set[str],
    urls: dict[str, str],
    pages: dict[str, tuple[str, str]],
    measure: Measure,
) -> None:
    """``--rounds`` times, each bare page then its uncached GraphQL page (then the ``--baseline``'s), in turn."""
    bare = page_script({}, None)
    for round_ in range(1, args.rounds + 1):
        extra = {"round": round_} if args.rounds > 1 else {}
        if "bare" in only:
            measure("bare", "bare starlette page (ZREVRANGE+MGET)", urls["bare"] + "/sessions", bare, **extra)
        for name in PAGES:
            if name not in only:
                continue
            query, token = pages[name]
            script = page_script({"query": query}, token)
            if name != "page":
                label = f"bare starlette {name} page (the listing's reads, json)"
                measure(bare_of(name), label, f"{urls['bare']}/listing/{name}", bare, **extra)
            what = "sessions(first: 50)" + (f" ({name})" if name != "page" else "")
            measure(name, f"graphql {what}, result cache off", urls["uncached"], script, **extra)
            if "baseline" in urls:
                label = f"graphql {what}, result cache off, {args.baseline}"
                measure(f"{name}_baseline", label, urls["baseline"], script, **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (it shares the cores with the servers)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="server processes of each side")
    parser.add_argument("--churn-ms", type=float, default=100, help="milliseconds between renames in the churn run")
    parser.add_argument("--only", choices=TARGETS, action="append")
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="another checkout (e.g. a git worktree of main): its uncached gateway is measured right after this one's "
        "on every uncached page (`<page>_baseline`), same Redis, same run",
    )
    parser.add_argument("--rounds", type=int, default=1, help="times the bare and uncached pages are measured in turn")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (ops/install installs Debian's wrk)")
    only = set(args.only or TARGETS)

    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        work = Path(tmp)
        prefix = "bench" + uuid.uuid4().hex[:8]
        redis_service, redis_settings = own_redis(work, prefix)
        redis_url = redis_settings.for_role("admin").redis.url  # the bench's own reads and writes
        processes: list[subprocess.Popen[bytes]] = []
        try:
            started = time.perf_counter()
            admin_token = asyncio.run(seed(redis_url, prefix, args.sessions))
            print(
                json.dumps(
                    {
                        "seeded": args.sessions,
                        "seconds": round(time.perf_counter() - started, 2),
                        "machine": calibration(),
                    }
                ),
                flush=True,
            )

            urls = start_servers(args, work, prefix, redis_settings, processes)
            cached_url, uncached_url = urls["cached"], urls["uncached"]
            if page_of(cached_url) != page_of(uncached_url):
                raise SystemExit("the cached and the uncached gateway answer the page differently")

            common = {"duration": args.duration, "connections": args.connections, "threads": args.threads}
            setup = {
                "workers": args.workers,
                "connections": args.connections,
                "duration_s": args.duration,
                "sessions": args.sessions,
            }
            page = page_script({"query": PAGE_QUERY}, TOKEN)
            runs: dict[str, list[dict[str, Any]]] = {}

            def measure(name: str, label: str, url: str, script: str, **extra: Any) -> dict[str, Any]:
                before, cpu_before = asyncio.run(mget_calls(redis_url)), servers_cpu_seconds(processes)
                result = run_wrk(url, script, work, **common)
                cpu = servers_cpu_seconds(processes) - cpu_before
                executed = asyncio.run(mget_calls(redis_url)) - before
                result["executed"] = round(executed / result["requests"], 4) if result["requests"] else None
                result["server_cpu_ms"] = round(cpu * 1000 / result["requests"], 3) if result["requests"] else None
                runs.setdefault(name, []).append(result)
                print(json.dumps({"target": label, **result, **extra, **setup}), flush=True)
                return result

            pages: dict[str, tuple[str, str]] = {"page": (PAGE_QUERY, TOKEN)}
            for name, variant in VARIANTS.items():
                query = page_query(variant.graphql_filter)
                pages[name] = (query, admin_token if variant.admin else TOKEN)
                if name in only and page_of(uncached_url, *pages[name]) != page_of(cached_url, *pages[name]):
                    raise SystemExit(f"the cached and the uncached gateway answer the {name} page differently")
            measure_pages(args, only, urls, pages, measure)
            if "cached" in only:
                measure("cached", "graphql sessions(first: 50), result cache on (repeats)", cached_url, page)
            if "churn" in only:
                with Renamer(redis_url, prefix, args.churn_ms / 1000) as renamer:
                    started = time.monotonic()
                    result = measure(
                        "churn",
                        f"graphql sessions(first: 50), result cache on, a rename every {args.churn_ms:g} ms",
                        cached_url,
                        page,
                    )
                    writes_per_s = renamer.renames / (time.monotonic() - started)
                newest = page_of(cached_url)["data"]["sessions"]["edges"][0]["node"]["name"]
                print(
                    json.dumps(
                        {
                            "churn": {
                                "renames": renamer.renames,
                                "writes_per_s": round(writes_per_s, 1),
                                "answers_per_write": round(result["requests"] / max(1, renamer.renames), 1),
                                "fresh_after": newest == renamer.last_name,
                            }
                        }
                    ),
                    flush=True,
                )
            if "create" in only:
                before = asyncio.run(count_sessions(redis_url, prefix))
                created = run_wrk(cached_url, create_script(TOKEN), work, **common)
                runs["create"] = [created]
                made = asyncio.run(count_sessions(redis_url, prefix)) - before
                print(
                    json.dumps({"target": "graphql createSession", **created, "sessions_created": made, **setup}),
                    flush=True,
                )
            results = {name: median_run(found) for name, found in runs.items()}
            print(json.dumps(summary(results)), flush=True)
        finally:
            for process in processes:
                stop(process)
            redis_service.stop()


if __name__ == "__main__":
    main()
