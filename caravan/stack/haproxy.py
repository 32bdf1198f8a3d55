"""HAProxy, the apps' data plane and the stack's ingress, on 127.0.0.1 (Debian's ``haproxy``; configuration from
``gateway.apps.ingress_config``). It starts with empty maps: nobody passes to any app until the gateway's control
plane (``gateway.apps.control``) rebuilt them from Redis. Its runtime API is a unix socket 0600 in its state
directory (0700), never a TCP port: no session can reach it."""

from __future__ import annotations

import secrets
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from caravan.stack.nomad_agent import CLEAN_ENV
from caravan.stack.processes import Service, StartupFailed, spawn, wait_until
from core.secrets import ensure_app_cookie_key
from core.settings import Settings
from gateway.apps.ingress_config import SOCKET_PATH_MAX, IngressConfig, IngressPaths, write_files
from gateway.endpoints.ingress import activator_socket


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


@dataclass
class Haproxy(Service):
    runtime: Path
    """Its own runtime API (``IngressPaths.own_socket``); ``IngressPaths.socket`` links to it while it serves."""


def start_haproxy(
    config: IngressConfig, state_dir: Path, *, log: Path, maps: Mapping[str, Mapping[str, str]] | None = None
) -> Haproxy:
    """Start HAProxy on ``config`` with its files in ``state_dir`` (fresh maps: empty, or ``maps``' content); wait
    for its runtime API, then link ``IngressPaths.socket`` to it.

    If a HAProxy serves from ``state_dir`` already (an upgrade overlapping the old one), the new one is given its
    listening sockets (``-x``) instead of binding its own beside them: the two then accept from one queue, so the old
    one's soft stop drops nothing. (Two sockets on one port, ``SO_REUSEPORT``, split the queue, and Linux resets the
    connections waiting in the one that closes: 3 in 40 upgrades under load, none in 60 with ``-x``.)"""
    binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if not binary:
        raise StartupFailed("haproxy is not installed (ops/install installs Debian's haproxy)")
    paths = IngressPaths(state_dir)
    own = paths.own_socket(secrets.token_hex(3))
    while own.exists():
        own = paths.own_socket(secrets.token_hex(3))
    # its unix sockets: its runtime API, which it binds, and the activator's, which it connects to (the longest)
    for path in (own, activator_socket(state_dir)):
        if len(bytes(path)) > SOCKET_PATH_MAX:
            raise StartupFailed(
                f"HAProxy's unix socket {path} would be {len(bytes(path))} bytes long; HAProxy takes at most "
                f"{SOCKET_PATH_MAX}: give it a shorter state directory (CARAVAN_INGRESS_DIR)"
            )
    write_files(config, paths, own, maps)
    for stale in paths.own_sockets():
        if stale != own and not _answers(stale):
            stale.unlink(missing_ok=True)
    serving = paths.socket if _answers(paths.socket) else None
    argv = [binary, "-db", "-f", str(paths.config)]
    try:
        service = _started(argv + (["-x", str(serving)] if serving else []), own, log)
    except StartupFailed:
        if not serving:
            raise
        # the old HAProxy ended meanwhile, or does not hand its listeners over (a release before this one): bind
        service = _started(argv, own, log)
    link = paths.socket.with_name(f".{paths.socket.name}.{own.stem}")
    link.unlink(missing_ok=True)
    link.symlink_to(own.name)
    link.replace(paths.socket)
    return Haproxy(service.name, service.process, service.log, own)


def _started(argv: list[str], runtime: Path, log: Path) -> Service:
    service = spawn("haproxy", argv, log, env=CLEAN_ENV, clean=True)

    def ready() -> bool:
        if not service.alive():
            raise StartupFailed(f"HAProxy exited at start (status {service.process.returncode})")
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(1)
            client.connect(str(runtime))
            client.sendall(b"show info\n")
            return b"Name: HAProxy" in client.recv(4096)

    try:
        wait_until(ready, what="HAProxy", timeout=30, log=log)
    except BaseException:
        service.stop()
        raise
    return service


def _answers(runtime: Path) -> bool:
    """Whether a HAProxy accepts on ``runtime`` (no: no such file, or its HAProxy has ended)."""
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(1)
        try:
            client.connect(str(runtime))
        except OSError:
            return False
    return True
