"""HAProxy, the apps' data plane and the stack's ingress, on 127.0.0.1 (Debian's ``haproxy``; configuration from
``gateway.apps.ingress_config``). It starts with empty maps: nobody passes to any app until the gateway's control
plane (``gateway.apps.control``) rebuilt them from Redis. Its runtime API is a unix socket 0600 in its state
directory (0700), never a TCP port: no session can reach it."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Mapping
from pathlib import Path

from caravan.stack.nomad_agent import CLEAN_ENV
from caravan.stack.processes import Service, StartupFailed, spawn, wait_until
from core.secrets import ensure_app_cookie_key
from core.settings import Settings
from gateway.apps.ingress_config import IngressConfig, IngressPaths, write_files


def ingress_config(settings: Settings, port: int, gateway_port: int) -> IngressConfig:
    return IngressConfig(
        port=port,
        gateway_port=gateway_port,
        apps_domain=settings.gateway.apps_domain,
        cookie_key=ensure_app_cookie_key(settings.secrets),
        upstream_timeout=settings.gateway.app_upstream_timeout,
        endpoints=settings.endpoints,
        bind=settings.gateway.ingress_bind,
    )


def start_haproxy(
    config: IngressConfig, state_dir: Path, *, log: Path, maps: Mapping[str, Mapping[str, str]] | None = None
) -> Service:
    """Start HAProxy on ``config`` with its files in ``state_dir`` (fresh maps: empty, or ``maps``' content); wait
    for its runtime API."""
    binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if not binary:
        raise StartupFailed("haproxy is not installed (ops/install installs Debian's haproxy)")
    paths = IngressPaths(state_dir)
    write_files(config, paths, maps)
    paths.socket.unlink(missing_ok=True)
    service = spawn("haproxy", [binary, "-db", "-f", str(paths.config)], log, env=CLEAN_ENV, clean=True)

    def ready() -> bool:
        if not service.alive():
            raise StartupFailed(f"HAProxy exited at start (status {service.process.returncode})")
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(1)
            client.connect(str(paths.socket))
            client.sendall(b"show info\n")
            return b"Name: HAProxy" in client.recv(4096)

    try:
        wait_until(ready, what="HAProxy", timeout=30, log=log)
    except BaseException:
        service.stop()
        raise
    return service
