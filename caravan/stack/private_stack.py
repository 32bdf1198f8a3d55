"""A private Redis and Nomad dev agent for one benchmark run, started as the stack starts them.

The benches that measure Caravan against real Nomad (`destroy`, `lifecycle`, `devices`, `inference_recovery`,
`app_proxy`, `storage`) each need the same thing: a Redis with Caravan's ACL users and a ``nomad agent -dev`` with
ACLs on, both on free loopback ports in a temporary directory, the machine's installed pieces read from the
``stack.env`` that ``ops/install`` writes (``$CARAVAN_CACHE/stack.env``), and admin ``Settings`` under a fresh
``bench<hex>`` prefix. ``private_stack`` gives exactly that and stops both processes on the way out, whatever happens
inside.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from caravan.stack.nomad_agent import NomadAgent, start_nomad_dev
from caravan.stack.processes import free_port
from caravan.stack.redis_server import start_redis
from core.settings import NomadSettings, RedisSettings, Settings


def stack_env() -> dict[str, str]:
    """The ``KEY=value`` lines of ``$CARAVAN_CACHE/stack.env`` (default ``~/.cache/caravan``): where ``ops/install``
    put Nomad (``CARAVAN_NOMAD_HOME``), the exec root filesystem, the pause image, the SFTP image..."""
    path = Path(os.environ.get("CARAVAN_CACHE", Path.home() / ".cache" / "caravan")) / "stack.env"
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@dataclass(frozen=True)
class PrivateStack:
    settings: Settings
    """Admin settings for this stack: its Redis and Nomad, ``home`` the temporary directory, a ``bench<hex>`` prefix."""
    nomad_agent: NomadAgent
    """The running dev agent (``addr``, ``node_id``, ``device_dir``)."""
    env: dict[str, str]
    """``stack.env`` as read at start (see ``stack_env``)."""

    @property
    def home(self) -> Path:
        """The temporary directory holding both processes' state, logs and the secrets; removed on exit."""
        return self.settings.home


@contextmanager
def private_stack(
    *,
    want_drivers: tuple[str, ...] = ("raw_exec", "exec"),
    pause_image: bool = True,
    settings: dict[str, Any] | None = None,
    **nomad_options: Any,
) -> Iterator[PrivateStack]:
    """Start a private Redis and Nomad dev agent; yield them with admin ``Settings``; stop both on exit.

    ``want_drivers`` are the Nomad agent's task drivers; ``pause_image`` passes the installed pause image (bridge
    networking for docker kernels); ``settings`` are extra ``Settings`` fields (e.g.
    ``storage=StorageSettings(...)``); any other keyword goes to ``start_nomad_dev`` (e.g. ``devices=``)."""
    env = stack_env()
    with tempfile.TemporaryDirectory(prefix="caravan-bench-") as tmp:
        home = Path(tmp)
        secrets = home / "secrets"
        redis_port = free_port()
        redis = start_redis(
            home / "redis", redis_port, log=home / "redis.log", secrets_dir=secrets, key_prefixes=("bench*",)
        )
        try:
            nomad_agent = start_nomad_dev(
                home / "nomad",
                nomad_home=Path(env["CARAVAN_NOMAD_HOME"]),
                rootfs=Path(env["CARAVAN_ROOTFS"]),
                want_drivers=want_drivers,
                log=home / "nomad.log",
                pause_image=env.get("CARAVAN_PAUSE_IMAGE") if pause_image else None,
                secrets_dir=secrets,
                **nomad_options,
            )
        except BaseException:
            redis.stop()
            raise
        try:
            base = Settings(
                home=home,
                secrets_dir=secrets,
                redis=RedisSettings(url=f"redis://127.0.0.1:{redis_port}/0"),
                nomad=NomadSettings(addr=nomad_agent.addr),
            )
            chosen = replace(base, **(settings or {})).with_prefix("bench" + uuid.uuid4().hex[:6]).for_role("admin")
            yield PrivateStack(settings=chosen, nomad_agent=nomad_agent, env=env)
        finally:
            nomad_agent.stop()
            redis.stop()
