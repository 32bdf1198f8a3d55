"""The one-machine stack behind ``ops/dev``: Redis, a single-node Nomad (server and client) and Caravan, detached.

Process ids go to ``$CARAVAN_HOME/run``; logs to ``$CARAVAN_HOME/logs``; credentials (Nomad tokens, Redis passwords)
to the secrets directory (``$CARAVAN_HOME/secrets``, 0700, each file 0600). Before anything starts, every port a part
that is not already running from this state directory needs is checked: a taken one stops ``up`` with the port, what
it is for and who holds it, before anything is written or started.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from caravan.stack.nomad_cluster import single_node_ports, start_nomad_single_node
from caravan.stack.ports import PortNeed, taken
from caravan.stack.processes import Service, StartupFailed, spawn, wait_until
from caravan.stack.redis_server import start_redis
from common.settings import Settings

PARTS = ("caravan", "nomad", "redis")


def _pidfile(settings: Settings, name: str) -> Path:
    return settings.home / "run" / f"{name}.pid"


def _running(settings: Settings, name: str) -> int | None:
    path = _pidfile(settings, name)
    if not path.exists():
        return None
    pid = int(path.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _remember(settings: Settings, service: Service) -> None:
    path = _pidfile(settings, service.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(service.pid))


def _ports(settings: Settings) -> dict[str, list[PortNeed]]:
    """The ports each part binds."""
    redis = urlparse(settings.redis.url).port or 6379
    nomad = urlparse(settings.nomad.addr).port or 4646
    rpc, serf = single_node_ports(nomad)
    return {
        "redis": [PortNeed(redis, "Redis")],
        "nomad": [PortNeed(nomad, "the Nomad HTTP API"), PortNeed(rpc, "Nomad RPC"),
                  PortNeed(serf, "Nomad Serf", udp=True)],
        "caravan": [PortNeed(settings.gateway.port, "the Caravan gateway")],
    }


def check_ports(settings: Settings) -> list[str]:
    """What is in the way of the parts not running from this state directory: one line per taken port."""
    needed = [need for part, needs in _ports(settings).items() if not _running(settings, part) for need in needs]
    return [port.describe() for port in taken(needed)]


def up(settings: Settings) -> int:
    logs = settings.home / "logs"
    env = os.environ
    if conflicts := check_ports(settings):
        for line in conflicts:
            print(f"caravan: {line}", file=sys.stderr)
        print("caravan: nothing started: another stack (or program) uses these ports; stop it, or give this one "
              "other ports (CARAVAN_REDIS_URL, CARAVAN_NOMAD_ADDR, CARAVAN_GATEWAY_PORT)", file=sys.stderr)
        return 1
    try:
        if not _running(settings, "redis"):
            port = urlparse(settings.redis.url).port or 6379
            _remember(settings, start_redis(settings.home / "redis", port, log=logs / "redis.log",
                                            secrets_dir=settings.secrets, key_prefixes=(settings.redis.prefix,)))
        if not _running(settings, "nomad"):
            raw_exec = env.get("CARAVAN_ENABLE_RAW_EXEC", "") in ("1", "true", "yes")
            docker = env.get("CARAVAN_DOCKER_AVAILABLE") == "1"
            drivers = ("exec",) + (("raw_exec",) if raw_exec else ()) + (("docker",) if docker else ())
            # Not a -dev agent: its state is on disk, so sessions survive ./ops/stop and a Nomad restart.
            agent = start_nomad_single_node(
                settings.home / "nomad", nomad_home=Path(env["CARAVAN_NOMAD_HOME"]), rootfs=Path(env["CARAVAN_ROOTFS"]),
                http=urlparse(settings.nomad.addr).port or 4646, want_drivers=drivers, log=logs / "nomad.log",
                qemu_image_dirs=tuple(Path(d) for d in settings.qemu_images.values()),
                pause_image=env.get("CARAVAN_PAUSE_IMAGE") if docker else None, raw_exec=raw_exec,
                secrets_dir=settings.secrets, namespace=settings.nomad.namespace,
            )
            _remember(settings, agent.server)
        if not _running(settings, "caravan"):
            service = spawn("caravan", [sys.executable, "-m", "caravan.cli", "dev"], logs / "caravan.log")
            _remember(settings, service)
            url = f"http://{settings.gateway.host}:{settings.gateway.port}/readyz"
            wait_until(lambda: urllib.request.urlopen(url, timeout=2).status == 200, what="Caravan gateway",
                       timeout=60, log=logs / "caravan.log")
    except StartupFailed as exc:
        print(f"caravan: {exc}", file=sys.stderr)
        return 1
    return 0


def down(settings: Settings) -> int:
    for name in PARTS:
        pid = _running(settings, name)
        if pid:
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while _running(settings, name) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _running(settings, name):
                os.killpg(pid, signal.SIGKILL)
        _pidfile(settings, name).unlink(missing_ok=True)
    return 0


def status(settings: Settings) -> int:
    for name in PARTS:
        pid = _running(settings, name)
        print(f"{name:8} {'running (pid %d)' % pid if pid else 'stopped'}")
    return 0
