"""Live session events: delivery latency and fan-out of ``sessionEvents`` over graphql-transport-ws.

Starts a private Redis and the real gateway (``caravan gateway``, one worker), opens ``--subscribers``
WebSocket connections for one user, each subscribed to all of that user's sessions, then changes
session statuses through ``SessionStore`` (as the scheduler does):

- ``paced``: ``--events`` changes, one every 20 ms: the latency from the write to each subscriber's
  receipt (p50, p99, max in ms);
- ``burst``: ``--events`` changes as fast as the store writes them: seconds until every subscriber
  has every event, and events delivered per second.

Every line also counts events not delivered (``missed``, must be 0), the Redis clients connected while
subscribed (one ``XREAD`` per gateway process, whatever the number of subscriptions), and the CPU seconds
the gateway and this client (which parses every delivery) spent. Nomad is not needed. The last line compares the
most subscribers against the fewest (the baseline, in the same run): figures, the goal (``GOAL``) and ``meets_goal``.

Usage: .venv/bin/python -m bench.events [--subscribers 1 50 200] [--events 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection, connect

from bench.gateway.__main__ import lone_gateway_env, own_redis, spawn, stop, wait_http
from caravan.stack.processes import free_port
from core.keys import Keys
from domain.lifecycle import transition
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from domain.users import Role, User
from stores.sessions import SessionStore
from stores.users import UserStore

SUBSCRIPTION = "subscription { sessionEvents { sessionId status } }"
POOL_GROWTH = 2
"""Redis clients the gateway's connection pool may add between two runs (measured: 4 with 1 subscriber, then 5 with 50
in the same gateway; 5 and 5 in the opposite order); one ``XREAD`` per subscription would add one per subscriber."""
GOAL = (
    "every event reaches every subscriber (missed 0); Redis clients with the most subscribers at most "
    f"{POOL_GROWTH} more than with the fewest (one XREAD per gateway process, not one per subscription); burst "
    "deliveries/s with the most subscribers at least those with the fewest (fan-out does not make a delivery dearer)"
)


def new_session(owner: str, i: int) -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image="busybox", resources={"cpu": "1"})
    return Session(
        id=uuid.uuid4().hex,
        name=f"bench-{i:06d}",
        owner_id=owner,
        type=SessionType.BATCH,
        driver=Driver.EXEC,
        image="busybox",
        resources={"cpu": "1"},
        kernels=(kernel,),
        created_at=datetime.now(UTC),
    )


class Subscriber:
    """One connection with one all-sessions subscription; notes when each event arrived."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.arrivals: dict[tuple[str, str], float] = {}
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, url: str, token: str) -> Subscriber:
        ws = await connect(url, subprotocols=["graphql-transport-ws"], open_timeout=30, max_queue=None)  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": SUBSCRIPTION}}))
        subscriber = cls(ws)
        subscriber.task = asyncio.create_task(subscriber.receive())
        return subscriber

    async def receive(self) -> None:
        async for raw in self.ws:
            message = json.loads(raw)
            if message.get("type") == "next":
                event = message["payload"]["data"]["sessionEvents"]
                self.arrivals[(event["sessionId"], event["status"])] = time.perf_counter()

    async def close(self) -> None:
        if self.task:
            self.task.cancel()
        await self.ws.close()


async def write_changes(store: SessionStore, owner: str, count: int, pace: float) -> dict[tuple[str, str], float]:
    """``count`` status changes (creations and cancellations); when each write was issued."""
    written: dict[tuple[str, str], float] = {}
    i = 0
    while len(written) < count:
        session = new_session(owner, i)
        i += 1
        written[(session.id, "PENDING")] = time.perf_counter()
        await store.create([session])
        if pace:
            await asyncio.sleep(pace)
        if len(written) < count:
            written[(session.id, "CANCELLED")] = time.perf_counter()
            await store.update(
                session.id, lambda s: transition(s, SessionStatus.CANCELLED, reason="bench", at=datetime.now(UTC))
            )
            if pace:
                await asyncio.sleep(pace)
    return written


async def wait_delivered(subscribers: list[Subscriber], written: dict[tuple[str, str], float], timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if all(all(k in s.arrivals for k in written) for s in subscribers):
            return
        await asyncio.sleep(0.01)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (the gateway may serve from a child process)."""
    total = 0.0
    for child in [pid, *(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]:
        fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


async def run(
    redis_url: str, prefix: str, url: str, subscribers_count: int, events: int, gateway_pid: int
) -> list[dict[str, Any]]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(prefix)
    store, users = SessionStore(redis, keys), UserStore(redis, keys)
    owner = f"watcher-{subscribers_count}"
    await users.put(User(id=owner, name=owner, role=Role.USER))
    token = await users.issue_token(owner)
    subscribers = [await Subscriber.open(url, token) for _ in range(subscribers_count)]
    await asyncio.sleep(0.5)  # every subscription is blocked in XREAD by now
    redis_clients = int((await redis.info("clients"))["connected_clients"])
    lines = []
    for mode, pace in (("paced", 0.02), ("burst", 0.0)):
        for s in subscribers:
            s.arrivals.clear()
        started, gateway_cpu, bench_cpu = time.perf_counter(), cpu_seconds(gateway_pid), time.process_time()
        written = await write_changes(store, owner, events, pace)
        await wait_delivered(subscribers, written, timeout=60)
        finished = max((max(s.arrivals.values(), default=started) for s in subscribers), default=started)
        latencies = sorted(
            (s.arrivals[k] - at) * 1000 for s in subscribers for k, at in written.items() if k in s.arrivals
        )
        missed = len(written) * len(subscribers) - len(latencies)
        line: dict[str, Any] = {
            "mode": mode,
            "subscribers": subscribers_count,
            "events": len(written),
            "missed": missed,
            "redis_clients": redis_clients,
            "gateway_cpu_s": round(cpu_seconds(gateway_pid) - gateway_cpu, 2),
            "bench_cpu_s": round(time.process_time() - bench_cpu, 2),
        }
        if mode == "paced":
            line |= {
                "p50_ms": round(statistics.median(latencies), 2),
                "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2),
                "max_ms": round(latencies[-1], 2),
            }
        else:
            seconds = finished - started
            line |= {"seconds": round(seconds, 3), "deliveries_per_s": round(len(latencies) / seconds)}
        lines.append(line)
        print(json.dumps(line), flush=True)
    for s in subscribers:
        await s.close()
    await redis.aclose()
    return lines


def verdict(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The last line: the figures per subscriber count, the goal and whether this run met it."""
    paced = {line["subscribers"]: line for line in lines if line["mode"] == "paced"}
    burst = {line["subscribers"]: line for line in lines if line["mode"] == "burst"}
    fewest, most = min(burst), max(burst)
    missed = sum(line["missed"] for line in lines)
    clients = {count: line["redis_clients"] for count, line in burst.items()}
    fan_out = round(burst[most]["deliveries_per_s"] / burst[fewest]["deliveries_per_s"], 2)
    return {
        "bench": "events",
        "subscribers": sorted(burst),
        "missed": missed,
        "redis_clients": clients,
        "paced_p50_ms": {count: line["p50_ms"] for count, line in paced.items()},
        "paced_p99_ms": {count: line["p99_ms"] for count, line in paced.items()},
        "burst_deliveries_per_s": {count: line["deliveries_per_s"] for count, line in burst.items()},
        "deliveries_per_s_most_to_fewest": fan_out,
        "goal": GOAL,
        "meets_goal": missed == 0 and clients[most] - clients[fewest] <= POOL_GROWTH and fan_out >= 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 50, 200])
    parser.add_argument("--events", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp:
        work = Path(tmp)
        prefix = "bench" + uuid.uuid4().hex[:8]
        redis_service, redis_settings = own_redis(work, prefix)
        redis_url = redis_settings.for_role("admin").redis.url  # the bench's own writes
        port = free_port()
        env = lone_gateway_env(work, redis_settings, port)
        log = work / "gateway.log"
        gateway = spawn([sys.executable, "-m", "caravan.cli", "gateway"], env, log)
        lines: list[dict[str, Any]] = []
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", gateway, log)
            for count in args.subscribers:
                try:
                    lines += asyncio.run(
                        run(redis_url, prefix, f"ws://127.0.0.1:{port}/graphql", count, args.events, gateway.pid)
                    )
                except Exception:
                    print(log.read_text()[-4000:], file=sys.stderr)
                    raise
        finally:
            stop(gateway)
            redis_service.stop()
    print(json.dumps(verdict(lines)), flush=True)


if __name__ == "__main__":
    main()
