"""Nomad allocations read as kernel observations. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from core.clock import from_iso
from domain.model import Driver, KernelObservation, SessionStatus
from nomad_jobs.explain import clipped, describe_event, exit_code_hint, placement_failure, task_failure
from nomad_jobs.meta import TASK_NAME
from nomad_jobs.qemu import guest_exit_code

S = SessionStatus


UNPLACEABLE = "unplaceable"
"""A kernel's reason while Nomad cannot place it (its evaluation failed; a blocked evaluation waits for a change)."""
EXPLAINED = frozenset({S.PREPARING, S.TERMINATED, S.ERROR})
"""Statuses whose observation carries Nomad's reason: one waiting on a restart, one that ended, one that failed."""


def task_state_of(alloc: Mapping[str, Any]) -> Mapping[str, Any]:
    return (alloc.get("TaskStates") or {}).get(TASK_NAME) or {}


def moment(text: str | None) -> datetime | None:
    """A Nomad timestamp (RFC 3339, nanoseconds); None for none, or Go's zero time (a task never started)."""
    if not text or text.startswith("0001-"):
        return None
    return from_iso(text)


def exit_code_of(alloc: dict[str, Any]) -> int | None:
    """The kernel task's exit code: Nomad records it on the task's last ``Terminated`` event."""
    state = task_state_of(alloc)
    for event in reversed(state.get("Events") or []):
        if event.get("Type") == "Terminated":
            details = event.get("Details") or {}
            raw = details.get("exit_code", event.get("ExitCode"))
            return int(raw) if raw not in (None, "") else None
    return None


def restarts_of(alloc: dict[str, Any]) -> int:
    """How often Nomad restarted the kernel task in this allocation (after a crash or a failing health check)."""
    return int(task_state_of(alloc).get("Restarts") or 0)


def is_superseded(alloc: dict[str, Any]) -> bool:
    """Nomad replaced this allocation (rescheduled it): what it says now is stale, its replacement speaks."""
    return bool(alloc.get("NextAllocation"))


def observe_allocation(alloc: dict[str, Any]) -> KernelObservation:
    restarts = restarts_of(alloc)
    state = task_state_of(alloc)
    failed_setup = setup_failed(state)
    code = None if failed_setup else exit_code_of(alloc)  # after a set-up failure, a task's end is Nomad's kill
    status, reason = _status_of(alloc.get("ClientStatus"), alloc.get("DesiredStatus"), code, restarts)
    detail = allocation_detail(alloc, status)
    if failed_setup and status is S.ERROR:
        detail = setup_failure_detail(state)
    return KernelObservation(
        hostname=str(alloc.get("TaskGroup", "")),
        status=status,
        reason=reason,
        detail=detail,
        agent=alloc.get("NodeID"),
        alloc_id=alloc.get("ID"),
        exit_code=code,
        ports=ports_of(alloc),
        restarts=restarts,
        started_at=moment(state.get("StartedAt")),
        finished_at=moment(state.get("FinishedAt")),
        setup_failed=status is S.ERROR and failed_setup,
        command_started=failed_setup and command_started(state),
        alloc_index=int(alloc.get("CreateIndex") or 0),
    )


SETUP_FAILURE = "Setup Failure"


def setup_failed(state: Mapping[str, Any]) -> bool:
    """Did the allocation fail in Nomad's own set-up (``Setup Failure``: a pre-run hook such as the network's) before
    its task ended on its own? Either before the task ever started, or at its client's restart: a client killed just
    after starting a task (before it kept the allocation's network in its state) finds ``network already configured
    but not found in state`` when it restarts, fails the allocation and kills the task it had started (exit 130, 137 or
    143: Nomad's signal, found by bench/chaos). Either way the task's end is not the command's result.

    Only the task's last run counts (its events from the last ``Started``), and in it only a ``Terminated`` before the
    run's FIRST set-up failure is the command's own end: Nomad 1.11.3 persists each event as it comes (``EmitEvent``),
    so a client killed again between the kill's ``Terminated`` and the task's ``dead`` state restores a task still
    "running" whose events already read ``Setup Failure, Terminated`` (Nomad's kill, 143), and fails its set-up once
    more at that restart: ``Setup Failure, Terminated, [Restore Failed,] Setup Failure`` (bench/chaos, session 14)."""
    kinds = [event.get("Type") for event in state.get("Events") or []]
    run = kinds[len(kinds) - 1 - kinds[::-1].index("Started") :] if "Started" in kinds else kinds
    if SETUP_FAILURE not in run:
        return False
    return "Terminated" not in run[: run.index(SETUP_FAILURE)]  # a task that had ended before it had its own result


def command_started(state: Mapping[str, Any]) -> bool:
    """Had the task of an allocation that failed in its set-up started (so Nomad killed its command)?"""
    kinds = {event.get("Type") for event in state.get("Events") or []}
    return bool(kinds & {"Started", "Terminated"}) or moment(state.get("StartedAt")) is not None


def setup_failure_detail(state: Mapping[str, Any]) -> str | None:
    """Nomad's set-up failure, and, for a task that had started, that Nomad killed it."""
    events = state.get("Events") or []
    failure = next((e for e in reversed(events) if e.get("Type") == SETUP_FAILURE), None)
    text = describe_event(failure) if failure else None
    if command_started(state):
        text = f"{text or SETUP_FAILURE}; the task it had started was killed by Nomad"
    return clipped(text) if text else None


def _status_of(client: object, desired: object, code: int | None, restarts: int) -> tuple[SessionStatus, str]:
    """The kernel's status and reason from its allocation's client and desired statuses (Nomad's words)."""
    if client == "pending":
        # Between a task's exit and its restart Nomad shows the allocation pending again.
        waiting = "restarting" if restarts else "allocation-pending"
        return (S.TERMINATING, "stopping") if desired != "run" else (S.PREPARING, waiting)
    if client == "running":
        return (S.TERMINATING, "stopping") if desired != "run" else (S.RUNNING, "kernel-running")
    if client == "complete":
        return S.TERMINATED, "task-finished" if (code or 0) == 0 else "task-failed"
    if client == "failed":
        return (S.TERMINATED, "task-failed") if code is not None else (S.ERROR, "failed-to-start")
    return S.ERROR, "job-lost"  # lost, unknown


def allocation_detail(alloc: Mapping[str, Any], status: SessionStatus) -> str | None:
    """What Nomad says about a kernel in ``status`` beyond the code: its task's failure (restarting, failed, ended
    with a non-zero code), else, for an allocation that failed or was lost, Nomad's description of the allocation."""
    if status not in EXPLAINED:
        return None
    if found := task_failure(task_state_of(alloc)):
        return found
    if alloc.get("ClientStatus") == "lost":
        # the client's last word ("Tasks are running") is stale: the node is what matters, by name
        node = alloc.get("NodeName") or alloc.get("NodeID") or "?"
        return clipped(f"node {node} is down: {alloc.get('DesiredDescription') or 'allocation lost'}")
    if status is S.ERROR:
        described = [str(alloc.get(f) or "").strip() for f in ("ClientDescription", "DesiredDescription")]
        return clipped("; ".join(d for d in described if d)) or None
    return None


def placement_failures(evaluations: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Task group -> why Nomad cannot place it, from the newest of a job's evaluations (a later one that placed it
    clears what an earlier one failed); empty when the newest placed everything."""
    newest = max(evaluations, key=lambda e: (e.get("ModifyIndex", 0), e.get("CreateIndex", 0)), default=None)
    if newest is None:
        return {}
    return {str(group): placement_failure(metric) for group, metric in (newest.get("FailedTGAllocs") or {}).items()}


def observe_unplaced(group: str, detail: str) -> KernelObservation:
    """A kernel Nomad cannot place (no allocation): it waits, PREPARING, until a node fits."""
    return KernelObservation(hostname=group, status=S.PREPARING, reason=UNPLACEABLE, detail=detail, placed=False)


def for_driver(seen: KernelObservation, driver: Driver) -> KernelObservation:
    """``seen`` with the command's own exit code: a qemu task's exit code is QEMU's, which encodes the guest's (its
    detail then says the code it quotes is QEMU's); other drivers run the command through a shell, whose codes 126
    and 127 mean it could not run the command (its detail then says so)."""
    exit_code = seen.exit_code
    if exit_code is None:
        return seen
    quoted = f"Exit Code: {exit_code}"
    if driver is not Driver.QEMU:
        hint = exit_code_hint(exit_code)
        if hint and seen.detail and quoted in seen.detail:
            return replace(seen, detail=seen.detail.replace(quoted, f"{quoted} ({hint})", 1))
        return seen
    if seen.detail:
        seen = replace(seen, detail=seen.detail.replace(quoted, f"QEMU {quoted}", 1))
    code = guest_exit_code(exit_code)
    if seen.status is not S.TERMINATED:
        return replace(seen, exit_code=code)
    if code is not None:
        return replace(seen, exit_code=code, reason="task-finished" if code == 0 else "task-failed")
    if seen.exit_code == 1:  # QEMU's own error exit: it could not start the VM
        return replace(seen, exit_code=None, status=S.ERROR, reason="failed-to-start")
    # 0 or a signal (-1): stopped from outside, or the guest powered off, before the command reported
    return replace(seen, exit_code=None, reason="vm-stopped")


def ports_of(alloc: dict[str, Any]) -> tuple[str, ...]:
    """Preopened ports (and an INFERENCE service port) as ``port=host:port``, from the ports Nomad allocated
    (labels are ``p<port>``)."""
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


DEVICE_UNHEALTHY = "device-unhealthy"
"""A running kernel's reason while a device it holds is unhealthy (it runs on: Nomad only stops placing there)."""


def unhealthy_devices(node: Mapping[str, Any]) -> dict[str, str]:
    """Device instance id -> why, for the node's unhealthy device instances (``NodeResources.Devices``)."""
    found: dict[str, str] = {}
    for group in (node.get("NodeResources") or {}).get("Devices") or []:
        for instance in group.get("Instances") or []:
            if not instance.get("Healthy"):
                found[str(instance.get("ID"))] = str(instance.get("HealthDescription") or "unhealthy")
    return found


def with_device_health(
    seen: KernelObservation, alloc: Mapping[str, Any], unhealthy: Mapping[str, Mapping[str, str]]
) -> KernelObservation:
    """``seen``, a running kernel's, saying which of its allocation's devices are unhealthy (``unhealthy``: node id ->
    :func:`unhealthy_devices`): reason ``device-unhealthy``, detail ``caravan-sim/gpu/SimGPU-C gpu1: fan failure``."""
    bad = unhealthy.get(str(alloc.get("NodeID"))) or {}
    if seen.status is not SessionStatus.RUNNING or not bad:
        return seen
    troubles = [
        f"{device.get('Vendor')}/{device.get('Type')}/{device.get('Name')} {instance}: {bad[instance]}"
        for task in ((alloc.get("AllocatedResources") or {}).get("Tasks") or {}).values()
        for device in task.get("Devices") or []
        for instance in device.get("DeviceIDs") or []
        if instance in bad
    ]
    return replace(seen, reason=DEVICE_UNHEALTHY, detail="; ".join(troubles)) if troubles else seen
