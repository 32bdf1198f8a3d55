"""What makes an INFERENCE replica's task group a recovering, health-checked service. Pure.

Each replica is a task group of its own (see ``domain.inference``); this module adds to it:

- the **service port** as a Nomad dynamic host port labelled ``p<port>``, like preopened ports, so it is
  reported in ``Kernel.ports`` the same way. Kernels use host networking, so the replica must listen on the
  host port itself: it gets it in ``CARAVAN_SERVICE_PORT``.
- a Nomad-native **service** (``provider = "nomad"``, no Consul needed) on that port with a **check**: an HTTP
  GET of ``health_check_path`` (2xx passes) or, without a path, a TCP connect. ``check_restart`` restarts the
  task after :data:`UNHEALTHY_CHECKS` failing checks in a row, counted only after the session's grace period
  (a model may take long to load).
- **restart** in place after a crash or a failing check, a few times, then the allocation fails and
  **reschedule** places a new one, without limit: a replica comes back without user action.

Reading the check back (whether a replica gets traffic) is ``domain.inference.replica_health``; what it needs of the
allocation, when the task's current run started, is read here.
"""

from __future__ import annotations

import re
from typing import Any

from core.clock import from_iso
from domain.inference import SERVICE_PORT_ENV
from domain.model import Session
from nomad_jobs.hcl import Block
from nomad_jobs.meta import TASK_NAME

CHECK_INTERVAL = "2s"
CHECK_TIMEOUT = "1s"
UNHEALTHY_CHECKS = 3
"""Consecutive failing checks before Nomad restarts the replica's task."""
DEFAULT_GRACE_SECONDS = 30.0
"""After a (re)start, failing checks count only once this long has passed (unless the session sets its own)."""
RESTART = {"attempts": 3, "interval": "5m", "delay": "2s", "mode": "fail"}
"""In place: up to 3 restarts in 5 minutes, 2 s apart (Nomad adds jitter); then the allocation fails and is
rescheduled."""
RESCHEDULE = {"unlimited": True, "delay": "5s", "delay_function": "exponential", "max_delay": "1m"}
"""A failed replica's allocation is replaced for as long as the session lives, backing off up to a minute."""
CHECK_NAME = "health"
SERVICE_NAME_RULE = re.compile(r"[^a-z0-9-]+")
MAX_SERVICE_NAME = 63
"""Nomad wants service names as DNS labels (RFC 1123): letters, digits and '-', at most 63."""


def port_label(port: int) -> str:
    """The Nomad port label of a container port: ``p<port>`` (read back by ``nomad_jobs.observe.ports_of``)."""
    return f"p{port}"


def exposed_ports(session: Session) -> tuple[int, ...]:
    """Every port that gets a dynamic host port: the preopened ones, the service port, then the apps' (each once)."""
    service = () if session.service_port is None else (session.service_port,)
    ports = (*session.preopen_ports, *service, *(app.port for app in session.apps))
    return tuple(dict.fromkeys(ports))


def service_environment(session: Session) -> dict[str, str]:
    """``CARAVAN_SERVICE_PORT``: the host port Nomad allocated, filled in by the Nomad client at task start."""
    if session.service_port is None:
        return {}
    return {SERVICE_PORT_ENV: "${NOMAD_PORT_" + port_label(session.service_port) + "}"}


def service_name(session: Session, prefix: str = "caravan-") -> str:
    """``caravan-<session id>``: one service, one instance per replica (tagged with its hostname). Other services of a
    session (``nomad_jobs.kernel_network``'s peers) take another prefix."""
    name = prefix + SERVICE_NAME_RULE.sub("-", session.id.lower())
    return name[:MAX_SERVICE_NAME].rstrip("-")


def add_recovery(group: Block) -> None:
    group.block("restart", **RESTART)
    group.block("reschedule", **RESCHEDULE)


def add_service(task: Block, session: Session, hostname: str) -> None:
    """The replica's service and its health check (only for a session with a service port)."""
    if session.service_port is None:
        return
    label = port_label(session.service_port)
    service = task.block("service", provider="nomad", name=service_name(session), port=label, tags=[hostname])
    if session.health_check_path is not None:
        check = service.block(
            "check",
            name=CHECK_NAME,
            type="http",
            path=session.health_check_path,
            interval=CHECK_INTERVAL,
            timeout=CHECK_TIMEOUT,
        )
    else:
        check = service.block("check", name=CHECK_NAME, type="tcp", interval=CHECK_INTERVAL, timeout=CHECK_TIMEOUT)
    grace = session.health_check_grace if session.health_check_grace is not None else DEFAULT_GRACE_SECONDS
    check.block("check_restart", limit=UNHEALTHY_CHECKS, grace=f"{round(grace * 1000)}ms", ignore_warnings=False)


def run_started_at(alloc: dict[str, Any]) -> int | None:
    """When the replica task's current run started, in unix seconds (Nomad's ``StartedAt`` moves to each restart);
    None before it first started. Whole seconds, as Nomad stamps check results."""
    state = (alloc.get("TaskStates") or {}).get(TASK_NAME) or {}
    started = str(state.get("StartedAt") or "")
    if not started or started.startswith("0001-"):  # Go's zero time: not started
        return None
    return int(from_iso(started).timestamp())  # RFC 3339 with nanoseconds: Python keeps microseconds, enough
