"""A private Redis on loopback with append-only persistence under the state directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import redis

from caravan.stack.processes import Service, StartupFailed, spawn, wait_until


def start_redis(state_dir: Path, port: int, *, log: Path) -> Service:
    binary = shutil.which("redis-server")
    if not binary:
        raise StartupFailed("redis-server is not installed (ops/install installs Debian's redis-server)")
    state_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(state_dir),
        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
        "--protected-mode", "yes", "--daemonize", "no",
    ]
    service = spawn("redis", argv, log)
    wait_until(lambda: redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping(), what="Redis",
               timeout=30, log=log)
    return service
