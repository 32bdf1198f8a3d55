"""A private Redis on loopback with append-only persistence under the state directory.

Durability choice (issue #3, "no acknowledged session is lost"): ``appendfsync always``.

- A kill -9 of the Redis *process* alone loses nothing acknowledged even with ``everysec``: Redis write()s the AOF
  buffer to the kernel before it replies, and the page cache outlives the process. Except in one corner: when the
  previous background fsync is still running (a slow or busy disk), ``everysec`` postpones that write() for up to
  2 s while it keeps replying, so acknowledged writes then live only in Redis' memory.
- A machine crash or power loss takes what the kernel has not flushed: up to about 2 s of acknowledged sessions with
  ``everysec``, nothing with ``always`` (Redis fsyncs before it replies, once per event-loop turn for all clients).

The cost, measured with ``bench/redis_fsync`` on the shared 2-core test machine (ext4), ranges over runs with a
busy and an idle disk: Redis alone drops from 10-27k to 0.3-3.4k SET/s with one client, and from 13-51k to
2-20k with 16 (one fsync per event-loop turn serves them all). ``createSession`` through the gateway stays at
27-106/s either way (within the machine's noise): Caravan's Python bounds it, not the fsync. One client creating
sequentially waits for each fsync: 34 -> 23/s in one run on a busy disk, no difference in the others. ``appendfsync`` is a parameter for whoever wants the other trade.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import redis

from caravan.stack.processes import Service, StartupFailed, spawn, wait_until

APPENDFSYNC = "always"


def start_redis(state_dir: Path, port: int, *, log: Path, appendfsync: str = APPENDFSYNC) -> Service:
    """Start Redis on 127.0.0.1:``port`` with its AOF in ``state_dir``; starting it again there replays the AOF."""
    binary = shutil.which("redis-server")
    if not binary:
        raise StartupFailed("redis-server is not installed (ops/install installs Debian's redis-server)")
    state_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(state_dir),
        "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "",
        "--protected-mode", "yes", "--daemonize", "no",
    ]
    service = spawn("redis", argv, log)
    try:
        wait_until(lambda: redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping(), what="Redis",
                   timeout=30, log=log)
    except BaseException:
        service.stop()  # a server that never answered must not outlive the failed start
        raise
    return service
