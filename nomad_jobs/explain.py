"""Why a kernel did not start or stopped, in Nomad's words: task events and placement failures as text. Pure.

A task's ``TaskState.Events`` (Nomad keeps the last 10) name what went wrong: a ``Driver Failure`` (an image that
cannot be pulled), a ``Setup Failure``, a ``Terminated`` event with the exit code, signal and OOM kill, a ``Not
Restarting`` that says why Nomad gave up. An evaluation's ``FailedTGAllocs`` say why a task group could not be placed,
in the metrics ``nomad job status`` prints (constraints that filtered nodes, resources exhausted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FAILURE_EVENTS = frozenset(
    {
        "Driver Failure",
        "Setup Failure",
        "Failed Artifact Download",
        "Failed Validation",
        "Task hook failed",
        "Sibling Task Failed",
        "Failed Restoring Task",
        "Plugin became unhealthy",
    }
)
"""Task event types that are a failure by themselves (``api/tasks.go``)."""
GAVE_UP = "Not Restarting"
SHELL_EXIT_CODES = {
    126: "the shell's code for a command it cannot execute",
    127: "the shell's code for a command not found",
}
"""Every docker, exec and raw_exec kernel runs its command through ``/bin/sh -c`` (``nomad_jobs.session_job``)."""
MAX_DETAIL = 1000
"""Characters of a detail kept (a driver's error may quote a whole daemon answer)."""


def _details(event: Mapping[str, Any]) -> Mapping[str, str]:
    return event.get("Details") or {}


def _message(event: Mapping[str, Any]) -> str:
    return str(event.get("DisplayMessage") or event.get("Message") or "").strip()


def _abnormal_exit(event: Mapping[str, Any]) -> bool:
    details = _details(event)
    return (
        details.get("exit_code", "0") not in ("", "0")
        or details.get("signal", "0") not in ("", "0")
        or details.get("oom_killed") == "true"
    )


def is_cause(event: Mapping[str, Any]) -> bool:
    """Does this event say why the task failed (rather than what Nomad did about it)?"""
    kind = event.get("Type")
    if kind in FAILURE_EVENTS:
        return True
    if kind == "Terminated":
        return _abnormal_exit(event)
    if kind == "Killing":
        return bool(_details(event).get("kill_reason"))
    return kind == "Killed" and bool(_details(event).get("kill_error"))


def describe_event(event: Mapping[str, Any]) -> str:
    """``<Type>: <Nomad's message>``, with what the message leaves out: an OOM kill (the exec driver says only the
    exit code), a reason to kill."""
    kind = str(event.get("Type", ""))
    details = _details(event)
    message = _message(event)
    if kind == "Killing" and details.get("kill_reason"):
        message = details["kill_reason"]
    elif kind == "Killed" and details.get("kill_error"):
        message = details["kill_error"]
    elif kind == "Terminated" and details.get("oom_killed") == "true" and "OOM" not in message:
        message += " (OOM killed: the kernel ran out of memory)"
    return f"{kind}: {message}" if message else kind


def task_failure(state: Mapping[str, Any] | None) -> str | None:
    """Why the task failed, from its newest failure event, and why Nomad will not restart it if it said so; None if
    its events show no failure (still running, ended with 0, or none kept)."""
    events: Sequence[Mapping[str, Any]] = (state or {}).get("Events") or []
    for position in range(len(events) - 1, -1, -1):
        if is_cause(events[position]):
            text = describe_event(events[position])
            gave_up = next((e for e in events[position + 1 :] if e.get("Type") == GAVE_UP), None)
            if gave_up is not None and (reason := _details(gave_up).get("restart_reason") or _message(gave_up)):
                text += f"; not restarted: {reason}"
            return clipped(text)
    return None


def exit_code_hint(code: int | None) -> str | None:
    """What a shell's exit code says about the command (126, 127), for a command run through ``/bin/sh -c``."""
    return SHELL_EXIT_CODES.get(code) if code is not None else None


def placement_failure(metric: Mapping[str, Any]) -> str:
    """Why Nomad could not place a task group, from its evaluation's ``FailedTGAllocs[group]`` (an
    ``AllocationMetric``), worded as ``nomad job status`` words it."""
    parts: list[str] = []
    if not metric.get("NodesEvaluated"):
        parts.append("no nodes were eligible for evaluation")
    for datacenter, available in sorted((metric.get("NodesAvailable") or {}).items()):
        if not available:
            parts.append(f"no nodes are available in datacenter {datacenter!r}")
    for label, field in (("class", "ClassFiltered"), ("constraint", "ConstraintFiltered")):
        for name, count in sorted((metric.get(field) or {}).items()):
            parts.append(f"{label} {name!r} excluded {_nodes(count)}")
    if exhausted := metric.get("NodesExhausted"):
        parts.append(f"resources exhausted on {_nodes(exhausted)}")
    for label, field in (("class", "ClassExhausted"), ("dimension", "DimensionExhausted")):
        for name, count in sorted((metric.get(field) or {}).items()):
            parts.append(f"{label} {name!r} exhausted on {_nodes(count)}")
    parts.extend(f"quota limit hit {name!r}" for name in metric.get("QuotaExhausted") or ())
    return clipped("Nomad cannot place it: " + ("; ".join(parts) or "no reason given"))


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def clipped(text: str) -> str:
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"
