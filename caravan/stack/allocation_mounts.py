"""The mounts of a stopped Nomad client's allocations, and which of them a stop of the stack releases.

Nomad mounts a ``secrets`` and a ``private`` tmpfs in each task directory of an allocation (and binds the shared
``alloc`` directory into an exec task's) when the allocation starts, and unmounts them only when it garbage-collects
the allocation: the dev agent does that late (``gc_max_allocs = 2000``, so that ended sessions' logs stay readable),
and a stopped agent never. Left alone they pile up (171 after an hour), and the state directory cannot be removed.

A stop releases the mounts of every allocation that has ended (nothing uses them; when Nomad later collects the
allocation, its unmount of a directory that is no longer a mount point is a no-op). It keeps those of allocations
still running: their tasks outlive the stop, and a restarted agent must find their task directories as it left them
(it mounts a new ``secrets`` tmpfs wherever its marker file is missing, which would cut a running task off from what
Nomad writes there). What is running is asked of Nomad before it stops; when it cannot be asked, nothing is unmounted.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from caravan.stack.processes import mounts_under
from nomad_jobs.client import TERMINAL_ALLOCATION_STATUSES


def live_allocations(addr: str, token: str | None, timeout: float = 5.0) -> set[str] | None:
    """Ids of the allocations (any namespace) whose tasks may still run; None when Nomad does not answer."""
    request = urllib.request.Request(f"{addr}/v1/allocations?namespace=*&task_states=false")
    if token:
        request.add_header("X-Nomad-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            allocations = json.loads(response.read())
    except (OSError, ValueError):
        return None
    return {str(a["ID"]) for a in allocations if str(a.get("ClientStatus")) not in TERMINAL_ALLOCATION_STATUSES}


def ended_allocation_mounts(data_dir: Path, live: Iterable[str]) -> list[Path]:
    """The mount points under the client's ``data_dir`` that belong to allocations not in ``live``."""
    allocations = (data_dir / "alloc").resolve()
    keep = set(live)
    return [mount for mount in mounts_under(allocations) if mount.relative_to(allocations).parts[0] not in keep]
