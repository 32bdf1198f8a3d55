"""Nomad allocations read as kernel observations. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from common.model import KernelObservation, SessionStatus
from nomad_jobs.meta import TASK_NAME

S = SessionStatus


def exit_code_of(alloc: dict[str, Any]) -> int | None:
    """The kernel task's exit code: Nomad records it on the task's last ``Terminated`` event."""
    state = (alloc.get("TaskStates") or {}).get(TASK_NAME) or {}
    for event in reversed(state.get("Events") or []):
        if event.get("Type") == "Terminated":
            details = event.get("Details") or {}
            raw = details.get("exit_code", event.get("ExitCode"))
            return int(raw) if raw not in (None, "") else None
    return None


def observe_allocation(alloc: dict[str, Any]) -> KernelObservation:
    hostname = str(alloc.get("TaskGroup", ""))
    client = alloc.get("ClientStatus")
    desired = alloc.get("DesiredStatus")
    code = exit_code_of(alloc)
    common = {"hostname": hostname, "agent": alloc.get("NodeID"), "alloc_id": alloc.get("ID"), "exit_code": code,
              "ports": ports_of(alloc)}
    if client == "pending":
        status, reason = (S.TERMINATING, "stopping") if desired != "run" else (S.PREPARING, "allocation-pending")
    elif client == "running":
        status, reason = (S.TERMINATING, "stopping") if desired != "run" else (S.RUNNING, "kernel-running")
    elif client == "complete":
        status, reason = S.TERMINATED, "task-finished" if (code or 0) == 0 else "task-failed"
    elif client == "failed":
        status, reason = (S.TERMINATED, "task-failed") if code is not None else (S.ERROR, "failed-to-start")
    else:  # lost, unknown
        status, reason = S.ERROR, "job-lost"
    return KernelObservation(status=status, reason=reason, **common)


def ports_of(alloc: dict[str, Any]) -> tuple[str, ...]:
    """Preopened ports as ``port=host:port``, from the ports Nomad allocated (labels are ``p<port>``)."""
    shared = (alloc.get("AllocatedResources") or {}).get("Shared") or {}
    found = []
    for port in shared.get("Ports") or []:
        label = str(port.get("Label", ""))
        if label.startswith("p") and label[1:].isdigit():
            found.append(f"{label[1:]}={port.get('HostIP') or '127.0.0.1'}:{port.get('Value')}")
    return tuple(sorted(found))


def latest_per_group(allocs: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The newest allocation of each task group: a rescheduled kernel's replacement wins."""
    newest: dict[str, dict[str, Any]] = {}
    for alloc in allocs:
        group = str(alloc.get("TaskGroup", ""))
        if group not in newest or alloc.get("CreateIndex", 0) > newest[group].get("CreateIndex", 0):
            newest[group] = alloc
    return newest
