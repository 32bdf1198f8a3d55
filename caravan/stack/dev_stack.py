"""The one-machine stack behind ``ops/dev``: Redis, a single-node Nomad (server and client), HAProxy (the ingress, on
the public port: the apps' data plane, and the gateway behind it) and Caravan, detached.

Process ids go to ``$CARAVAN_HOME/run``; logs to ``$CARAVAN_HOME/logs``; credentials (Nomad tokens, Redis passwords)
to the secrets directory (``$CARAVAN_HOME/secrets``, 0700, each file 0600). Before anything starts, every port a part
that is not already running from this state directory needs is checked: a taken one stops ``up`` with the port, what
it is for and who holds it, before anything is written or started.

``down`` stops the parts and releases the mounts of Nomad's ended allocations (running sessions survive it and a
later ``up``); ``reset`` takes the stack back to nothing: every job purged, every mount released, the session network
removed, the state directory deleted.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from caravan.stack.allocation_mounts import ended_allocation_mounts, live_allocations
from caravan.stack.haproxy import ingress_config, start_haproxy
from caravan.stack.nomad_agent import drain
from caravan.stack.nomad_cluster import single_node_ports, start_nomad_single_node
from caravan.stack.ports import PortNeed, taken
from caravan.stack.processes import Service, StartupFailed, mounts_under, spawn, unmount, unmount_under, wait_until
from caravan.stack.redis_server import start_redis
from caravan.stack.session_network import SessionNetwork, recorded_network, release
from core.secrets import nomad_token_path, read_secret
from core.settings import Settings
from node_plugins.namespace_pool import Client, PoolError, delete, labelled
from nomad_jobs.namespace_keeper import LABEL

PARTS = ("caravan", "haproxy", "nomad", "redis")
"""In the order ``down`` stops them."""
ROOT = Path(__file__).resolve().parents[2]
"""The checkout: never a state directory to delete."""
STATE_MARKS = ("logs", "run", "nomad", "redis", "secrets", "haproxy")
"""What a state directory the stack used has (ops/ makes ``logs`` first): reset deletes only such a directory."""


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
        "nomad": [
            PortNeed(nomad, "the Nomad HTTP API"),
            PortNeed(rpc, "Nomad RPC"),
            PortNeed(serf, "Nomad Serf", udp=True),
        ],
        "haproxy": [PortNeed(settings.gateway.port, "HAProxy, the stack's ingress (the apps and the gateway)")],
        "caravan": [PortNeed(gateway_port(settings), "the Caravan gateway (behind HAProxy)")],
    }


def gateway_port(settings: Settings) -> int:
    """Where the gateway process listens behind HAProxy, which takes the public port (``CARAVAN_GATEWAY_PORT``):
    ``CARAVAN_GATEWAY_BACKEND_PORT``, else the next port."""
    return settings.gateway.backend_port or settings.gateway.port + 1


def check_ports(settings: Settings) -> list[str]:
    """What is in the way of the parts not running from this state directory: one line per taken port."""
    needed = [need for part, needs in _ports(settings).items() if not _running(settings, part) for need in needs]
    return [port.describe() for port in taken(needed)]


def up(settings: Settings) -> int:
    logs = settings.home / "logs"
    if conflicts := check_ports(settings):
        for line in conflicts:
            print(f"caravan: {line}", file=sys.stderr)
        print(
            "caravan: nothing started: another stack (or program) uses these ports; stop it, or give this one "
            "other ports (CARAVAN_REDIS_URL, CARAVAN_NOMAD_ADDR, CARAVAN_GATEWAY_PORT, CARAVAN_GATEWAY_BACKEND_PORT)",
            file=sys.stderr,
        )
        return 1
    try:
        if not _running(settings, "redis"):
            port = urlparse(settings.redis.url).port or 6379
            _remember(
                settings,
                start_redis(
                    settings.home / "redis",
                    port,
                    log=logs / "redis.log",
                    secrets_dir=settings.secrets,
                    key_prefixes=(settings.redis.prefix,),
                ),
            )
        if not _running(settings, "nomad"):
            _start_nomad(settings)
        backend = gateway_port(settings)
        if not _running(settings, "haproxy"):  # empty maps: no app passes until the gateway rebuilt them
            config = ingress_config(settings, settings.gateway.port, backend)
            _remember(settings, start_haproxy(config, settings.ingress_dir, log=logs / "haproxy.log"))
        if not _running(settings, "caravan"):
            env = {
                "CARAVAN_GATEWAY_PORT": str(backend),
                "CARAVAN_INGRESS_PORT": str(settings.gateway.port),
                "CARAVAN_TRUSTED_PROXIES": ",".join((*settings.gateway.trusted_proxies, "127.0.0.1")),  # HAProxy
            }
            service = spawn("caravan", [sys.executable, "-m", "caravan.cli", "dev"], logs / "caravan.log", env=env)
            _remember(settings, service)
            url = f"http://{settings.gateway.host}:{settings.gateway.port}/readyz"  # through HAProxy
            wait_until(
                lambda: urllib.request.urlopen(url, timeout=2).status == 200,
                what="Caravan gateway",
                timeout=60,
                log=logs / "caravan.log",
            )
    except StartupFailed as exc:
        print(f"caravan: {exc}", file=sys.stderr)
        return 1
    return 0


def _start_nomad(settings: Settings) -> None:
    env = os.environ
    raw_exec = env.get("CARAVAN_ENABLE_RAW_EXEC", "") in ("1", "true", "yes")
    docker = env.get("CARAVAN_DOCKER_AVAILABLE") == "1"
    # raw_exec runs on the node either way, for the platform's jobs (docker commit) in their own namespace; the
    # users' namespace allows it only with CARAVAN_ENABLE_RAW_EXEC (SUPERADMINs' raw_exec sessions).
    drivers = ("exec", "raw_exec") + (("docker",) if docker else ())
    if "CARAVAN_NOMAD_HOME" not in env or "CARAVAN_ROOTFS" not in env:
        raise StartupFailed(
            "CARAVAN_NOMAD_HOME and CARAVAN_ROOTFS are not set: run this through ops/ (ops/dev, "
            "ops/reset), which set them"
        )
    # Not a -dev agent: its state is on disk, so sessions survive ./ops/stop and a Nomad restart.
    nomad_agent = start_nomad_single_node(
        settings.home / "nomad",
        nomad_home=Path(env["CARAVAN_NOMAD_HOME"]),
        rootfs=Path(env["CARAVAN_ROOTFS"]),
        http=urlparse(settings.nomad.addr).port or 4646,
        want_drivers=drivers,
        log=settings.home / "logs" / "nomad.log",
        qemu_image_dirs=tuple(Path(d) for d in settings.qemu_images.values()),
        pause_image=env.get("CARAVAN_PAUSE_IMAGE") if docker else None,
        raw_exec=raw_exec,
        secrets_dir=settings.secrets,
        namespace=settings.nomad.namespace,
        platform_namespace=settings.nomad.platform_namespace,
    )
    _remember(settings, nomad_agent.server)


def down(settings: Settings) -> int:
    """Stop Caravan, Nomad and Redis; then release the mounts of Nomad's ended allocations (see
    :mod:`caravan.stack.allocation_mounts`): those of running ones stay with their tasks, which outlive the stop."""
    live = None
    for name in PARTS:
        if name == "nomad" and _running(settings, name):
            live = live_allocations(settings.nomad.addr, _nomad_admin_token(settings))
        _stop(settings, name)
    data = settings.home / "nomad" / "data"
    if live is not None:
        unmount(ended_allocation_mounts(data, live))
    elif left := mounts_under(data):
        print(
            f"caravan: Nomad did not say which of its allocations run: their {len(left)} mounts under {data} are "
            f"left as they are (./ops/reset removes everything)",
            file=sys.stderr,
        )
    return 0


def _stop(settings: Settings, name: str) -> None:
    pid = _running(settings, name)
    if pid:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while _running(settings, name) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _running(settings, name):
            os.killpg(pid, signal.SIGKILL)
    _pidfile(settings, name).unlink(missing_ok=True)


def _nomad_admin_token(settings: Settings) -> str | None:
    return read_secret(nomad_token_path(settings.secrets, "admin"))


def reset(settings: Settings) -> int:
    """Back to nothing: Caravan stopped, every Nomad job purged and its tasks torn down, Nomad and Redis stopped, every
    mount under the state directory released, the node's session network removed, the state directory deleted."""
    home = settings.home.resolve()
    if refusal := _not_a_state_dir(home):
        print(f"caravan: not resetting {home}: {refusal}", file=sys.stderr)
        return 1
    if not home.exists():
        print(f"caravan: nothing to reset: {home} does not exist")
        return 0
    _stop(settings, "caravan")  # first: its scheduler would submit again what is purged
    nomad_dir = home / "nomad"
    if (nomad_dir / "data").exists():
        try:
            if not _running(settings, "nomad"):  # its tasks outlive a stopped agent: only a running one ends them
                _start_nomad(settings)
            drain(settings.nomad.addr, nomad_dir, 60, token=_nomad_admin_token(settings))
        except (StartupFailed, OSError) as exc:
            print(
                f"caravan: the sessions' tasks could not all be stopped through Nomad ({exc}); going on",
                file=sys.stderr,
            )
    down(settings)
    unmount_under(home)
    network = recorded_network(nomad_dir)
    if network is not None:
        _delete_pooled(nomad_dir / "data", network)
        release(network)
    shutil.rmtree(home)
    print(f"caravan: removed {home}; ./ops/dev starts an empty stack")
    return 0


def _delete_pooled(data_dir: Path, network: SessionNetwork) -> None:
    """The pooled namespaces of the stack's client (``nomad_jobs.namespace_keeper``) still there: a keeper killed
    before it released its free ones leaves them (their pause containers running, labelled with the client's node)."""
    node_file = data_dir / "client" / "client-id"
    if not node_file.exists() or shutil.which("docker") is None:
        return
    try:
        left = labelled(LABEL, node_file.read_text().strip())
    except PoolError as exc:
        print(f"caravan: the pooled namespaces could not be listed ({exc}); going on", file=sys.stderr)
        return
    client = Client(network.conflist(), network.cni_path)
    for name in left:
        delete(client, name)


def _not_a_state_dir(home: Path) -> str | None:
    """Why ``home`` must not be deleted as a state directory, if it must not."""
    if home in (Path("/"), Path.home().resolve(), ROOT) or ROOT.is_relative_to(home):
        return "it is not a state directory of its own"
    if home.exists() and not any((home / mark).exists() for mark in STATE_MARKS):
        return f"it has none of {', '.join(STATE_MARKS)}: not a Caravan state directory"
    return None


def status(settings: Settings) -> int:
    for name in PARTS:
        pid = _running(settings, name)
        print(f"{name:8} {f'running (pid {pid})' if pid else 'stopped'}")
    return 0
