"""A private Redis on loopback with append-only persistence under the state directory, and users from an ACL file
(:mod:`caravan.stack.redis_acl`): nothing answers without a password, not even ``PING``.

Durability choice (issue #3, "no acknowledged session is lost"): ``appendfsync always``.

- A kill -9 of the Redis *process* alone loses nothing acknowledged even with ``everysec``: Redis write()s the AOF
  buffer to the kernel before it replies, and the page cache outlives the process. Except in one corner: when the
  previous background fsync is still running (a slow or busy disk), ``everysec`` postpones that write() for up to
  2 s while it keeps replying, so acknowledged writes then live only in Redis' memory.
- A machine crash or power loss takes what the kernel has not flushed: up to about 2 s of acknowledged sessions with
  ``everysec``, nothing with ``always`` (Redis fsyncs before it replies, once per event-loop turn for all clients).

The cost, measured with ``bench/redis_fsync`` (figures in bench/README.md): Redis alone falls several-fold (one fsync
per event-loop turn serves all clients), while ``createSession`` through the gateway stays within the machine's
noise: Caravan's Python bounds it, not the fsync. ``appendfsync`` is a parameter for whoever wants the other trade.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import redis

from caravan.stack.nomad_agent import CLEAN_ENV
from caravan.stack.processes import Service, StartupFailed, spawn, wait_until
from caravan.stack.redis_acl import write_acl_file
from core.secrets import read_secret, redis_password_path

APPENDFSYNC = "always"


def start_redis(
    state_dir: Path,
    port: int,
    *,
    log: Path,
    secrets_dir: Path,
    key_prefixes: Sequence[str] = ("caravan",),
    appendfsync: str = APPENDFSYNC,
    extra_users: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    name: str = "redis",
) -> Service:
    """Start Redis on 127.0.0.1:``port`` with its AOF in ``state_dir``; starting it again there replays the AOF.

    Its users are Caravan's (``redis-<role>.password`` in ``secrets_dir``, generated once): the components' users
    reach only keys under ``key_prefixes`` (``<prefix>:*``; glob patterns allowed). ``extra_users``: more ACL file
    lines (a replica's and the Sentinels' users); ``extra_args``: more ``redis-server`` options."""
    binary = shutil.which("redis-server")
    if not binary:
        raise StartupFailed("redis-server is not installed (ops/install installs Debian's redis-server)")
    state_dir.mkdir(parents=True, exist_ok=True)
    acl_file = write_acl_file(secrets_dir, key_prefixes, extra_users)
    admin_password = read_secret(redis_password_path(secrets_dir, "admin"))
    argv = [
        binary,
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(state_dir),
        "--appendonly",
        "yes",
        "--appendfsync",
        appendfsync,
        "--save",
        "",
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
        "--aclfile",
        str(acl_file),
        *extra_args,
    ]
    service = spawn(name, argv, log, env=CLEAN_ENV, clean=True)  # nothing of ours in its environment

    def ready() -> bool:
        with redis.Redis(
            host="127.0.0.1", port=port, username="admin", password=admin_password, socket_timeout=1
        ) as client:
            return bool(client.ping())

    try:
        wait_until(ready, what="Redis", timeout=30, log=log)
    except BaseException:
        service.stop()  # a server that never answered must not outlive the failed start
        raise
    return service
