"""What ``appendfsync always`` costs against ``everysec``: Redis alone, and ``createSession`` through the gateway.

For each mode (twice, interleaved, since the machine is shared) it starts a private Redis with that mode and prints
one JSON line: Redis alone (``redis-benchmark`` SET of 1.5 KB values, about a session document, with 1 and 16
clients) and creates per second through an in-process gateway (sequential, and 16 at once; Nomad is not called).
The choice it informs is documented in ``caravan/stack/redis_server.py``.

Usage: .venv/bin/python bench/redis_fsync.py [--creates 250]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caravan.stack.processes import free_port  # noqa: E402
from caravan.stack.redis_server import start_redis  # noqa: E402
from common.settings import NomadSettings, RedisSettings, Settings  # noqa: E402
from tests.harness import CREATE, running_caravan  # noqa: E402

MODES = ("everysec", "always")


def redis_alone(port: int, clients: int) -> float | None:
    binary = shutil.which("redis-benchmark")
    if not binary:
        return None
    out = subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), "-t", "set", "-n", "10000", "-c", str(clients),
                          "-d", "1500", "-q"], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"([\d.]+) requests per second", out.replace("\r", "\n"))
    return float(found[-1]) if found else None


async def creates_per_second(url: str, count: int, concurrency: int) -> float:
    namespace = "bench" + uuid.uuid4().hex[:8]
    settings = Settings(home=Path(tempfile.mkdtemp()), redis=RedisSettings(url=url, prefix=namespace),
                        nomad=NomadSettings(addr="http://127.0.0.1:9", job_prefix=namespace))
    async with running_caravan(settings, scheduler=False) as caravan:
        limit = asyncio.Semaphore(concurrency)

        async def one(n: int) -> None:
            async with limit:
                await caravan.gql(CREATE, {"input": {"name": f"bench-{n}", "type": "BATCH", "driver": "RAW_EXEC",
                                                     "startupCommand": "true"}})

        await one(-1)  # warm up
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(count)))
        return count / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--creates", type=int, default=250, help="per run (the gateway limits 600 a minute)")
    args = parser.parse_args()
    for mode in MODES * 2:
        directory = Path(tempfile.mkdtemp())
        port = free_port()
        service = start_redis(directory, port, log=directory / "redis.log", appendfsync=mode)
        url = f"redis://127.0.0.1:{port}/0"
        try:
            print(json.dumps({
                "appendfsync": mode,
                "redis_set_per_s_1_client": redis_alone(port, 1),
                "redis_set_per_s_16_clients": redis_alone(port, 16),
                "creates_per_s_sequential": round(await creates_per_second(url, args.creates, 1), 1),
                "creates_per_s_16_at_once": round(await creates_per_second(url, args.creates, 16), 1),
            }), flush=True)
        finally:
            service.stop()
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
