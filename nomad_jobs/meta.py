"""Ownership stamps on every Caravan job, so Caravan's state can be rebuilt from Nomad alone."""

from __future__ import annotations

SESSION_ID = "caravan_session_id"
SESSION_NAME = "caravan_session_name"
OWNER = "caravan_owner"
SESSION_TYPE = "caravan_session_type"
KERNEL = "caravan_kernel"
START_ATTEMPT = "caravan_start_attempt"
"""A batch kernel's group meta when it is placed again after its set-up failed (``domain.start_retry``): the attempt's
number, a change to that group alone, so that Nomad replaces its failed allocation and no other group's."""

TASK_NAME = "kernel"
"""Each kernel is the single task of its own task group; the group is named after the kernel's hostname."""


def job_id(job_prefix: str, session_id: str) -> str:
    """Deterministic job id: a re-delivered submission hits the same job, never a second one."""
    return f"{job_prefix}-{session_id}"


def session_id_of(job_prefix: str, nomad_job_id: str) -> str | None:
    head = f"{job_prefix}-"
    return nomad_job_id[len(head) :] if nomad_job_id.startswith(head) else None
