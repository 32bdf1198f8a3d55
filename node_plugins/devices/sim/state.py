"""The plugin's state directory (``state_dir``): what operators and workloads change at runtime.

- ``unhealthy/<device>``: present = the device (and every share of it) is unhealthy; its first line says why (the
  health description Nomad shows). Remove it and the device is healthy again (the next fingerprint, within
  ``fingerprint_period``).
- ``reservations/<id>/load``: one per ``Reserve``; a raw_exec workload writes its load there
  (``util=<percent> mem_mib=<MiB>``, ``CARAVAN_SIM_HOST_LOAD_FILE``) and the plugin's statistics report it.
- a docker or exec workload, which sees no host path, writes its load to ``/alloc/caravan-sim-<id>.load``
  (``CARAVAN_SIM_LOAD_FILE``) in its allocation's shared directory; the plugin finds that file under the client's
  ``alloc_dir`` and reads it in preference. The reservation is mounted into no task: Nomad (1.11) keeps only the
  mounts of the last task hook that returned any, so a reservation's mounts replaced the task's folder mounts.
- ``instances/<instance id>``: the reservation an instance belongs to now (Nomad never reserves an instance twice at
  once, so the newest reservation of an instance is the live one; a reservation no instance points to is deleted).

Everything here survives a restart of the plugin (Nomad restarts plugins as it likes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from node_plugins.devices.sim.inventory import Load, parse_load

LOAD_FILE_BYTES = 4096
"""At most this much of a load file is read: the workload owns it."""
TASK_ALLOC_DIR = "/alloc"
"""Where docker and exec tasks see their allocation's shared directory (``NOMAD_ALLOC_DIR``)."""
LOCATE_PERIOD = 1.0
"""Seconds between two looks through the client's allocations for load files not found yet."""
SETTLED_NS = 2_000_000_000
"""A directory whose mtime is older than this (ns) is not listed again until it changes: a file made there later
has a later mtime (the kernel's timestamps are coarse, so a newer mtime might equal one just read)."""


def task_load_name(reservation: str) -> str:
    """The file a task writes its load to, in its allocation's shared directory: named after the reservation, which
    only the holder's environment tells (16 random hex digits), so a task cannot report another's load."""
    return f"caravan-sim-{reservation}.load"


class StateDir:
    def __init__(self, root: Path, alloc_dir: Path | None = None) -> None:
        self.root = root
        self.health = root / "unhealthy"
        self.reservations = root / "reservations"
        self.instances = root / "instances"
        self.alloc_dir = alloc_dir
        self._shared: dict[str, Path] = {}
        """Reservation -> the allocation's shared directory its task wrote its load file in."""
        self._looked = -LOCATE_PERIOD
        self._listed: dict[str, int] = {}
        """Allocation shared directory -> its mtime when listed (only once it had not changed for a while)."""

    def create(self) -> None:
        for directory in (self.root, self.health, self.reservations, self.instances):
            directory.mkdir(parents=True, exist_ok=True)

    def unhealthy(self, devices: Iterable[str]) -> dict[str, str]:
        """Device id -> why, for the devices marked unhealthy."""
        found: dict[str, str] = {}
        for device in devices:
            with contextlib.suppress(FileNotFoundError):
                lines = (self.health / device).read_text(errors="replace").splitlines()
                found[device] = lines[0].strip()[:200] if lines else ""
        return found

    def reserve(self, ids: Sequence[str]) -> Path:
        """A new reservation directory (world-writable: the task's user writes its load there) for ``ids``."""
        reservation = self.reservations / uuid.uuid4().hex[:16]
        reservation.mkdir(parents=True)
        reservation.chmod(0o777)
        load = reservation / "load"
        load.write_text("util=0 mem_mib=0\n")
        load.chmod(0o666)
        for instance in ids:
            record = self.instances / f".{instance}.{reservation.name}"
            record.write_text(reservation.name)
            os.replace(record, self.instances / instance)
        self._forget_unreferenced(keep=reservation.name)
        return reservation

    def loads(self, ids: Iterable[str]) -> dict[str, tuple[Load | None, int]]:
        """Instance id -> (its reservation's load, how many instances that reservation holds); (None, 0) for an
        instance never reserved."""
        owner: dict[str, str] = {}
        for instance in ids:
            with contextlib.suppress(FileNotFoundError):
                owner[instance] = (self.instances / instance).read_text().strip()
        holders: dict[str, int] = {}
        for name in owner.values():
            holders[name] = holders.get(name, 0) + 1
        self._locate(holders)
        read: dict[str, Load | None] = {name: self._load(name) for name in holders}
        return {
            instance: (read.get(owner.get(instance, "")), holders.get(owner.get(instance, ""), 0)) for instance in ids
        }

    def mark(self, device: str, why: str | None) -> None:
        """Mark ``device`` unhealthy (``why``) or healthy (None): what an operator does with a file, for tests."""
        if why is None:
            (self.health / device).unlink(missing_ok=True)
        else:
            (self.health / device).write_text(why + "\n")

    def _load(self, reservation: str) -> Load | None:
        shared = self._shared.get(reservation)
        task = _read_task_file(shared, task_load_name(reservation)) if shared else None
        if task is not None:
            return parse_load(task.decode(errors="replace"))
        try:
            with open(self.reservations / reservation / "load", "rb") as file:
                return parse_load(file.read(LOAD_FILE_BYTES).decode(errors="replace"))
        except OSError:
            return None

    def _locate(self, reservations: Iterable[str]) -> None:
        """Find the allocations whose task wrote the load file of a reservation not located yet, at most once a
        :data:`LOCATE_PERIOD`: a look at the client's allocations (``<alloc_dir>/<alloc id>/alloc``) that lists only
        the shared directories changed since they were last listed (a file made there changes its mtime)."""
        wanted = {task_load_name(r): r for r in reservations if r not in self._shared}
        if self.alloc_dir is None or not wanted or time.monotonic() - self._looked < LOCATE_PERIOD:
            return
        self._looked = time.monotonic()
        try:
            allocations = [os.path.join(entry.path, "alloc") for entry in os.scandir(self.alloc_dir)]
        except OSError:
            return
        listed: dict[str, int] = {}
        for shared in allocations:
            try:
                changed = os.stat(shared).st_mtime_ns
                if self._listed.get(shared) == changed:
                    listed[shared] = changed
                    continue
                names = os.listdir(shared)
            except OSError:
                continue
            if time.time_ns() - changed > SETTLED_NS:  # a change within the clock's granularity may be missed
                listed[shared] = changed
            for name in names:
                if (reservation := wanted.get(name)) is not None:
                    self._shared.setdefault(reservation, Path(shared))
        self._listed = listed

    def _forget_unreferenced(self, keep: str) -> None:
        live: Mapping[str, None] = {keep: None} | {
            path.read_text().strip(): None for path in self.instances.iterdir() if not path.name.startswith(".")
        }
        for reservation in self.reservations.iterdir():
            if reservation.name not in live:
                shutil.rmtree(reservation, ignore_errors=True)
        self._shared = {r: d for r, d in self._shared.items() if r in live}


def _read_task_file(directory: Path, name: str) -> bytes | None:
    """The first :data:`LOAD_FILE_BYTES` of ``directory/name`` when it is a regular file; None otherwise. The task
    owns the directory and the plugin runs as root: the file is opened without following a symlink and without
    opening what is not a regular file (a device node or a FIFO a task made there is never opened for reading)."""
    try:
        handle = os.open(directory / name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return None
        with open(f"/proc/self/fd/{handle}", "rb") as file:  # the inode just checked, reopened for reading
            return file.read(LOAD_FILE_BYTES)
    except OSError:
        return None
    finally:
        os.close(handle)
