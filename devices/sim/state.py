"""The plugin's state directory (``state_dir``): what operators and workloads change at runtime.

- ``unhealthy/<device>``: present = the device (and every share of it) is unhealthy; its first line says why (the
  health description Nomad shows). Remove it and the device is healthy again (the next fingerprint, within
  ``fingerprint_period``).
- ``reservations/<id>/load``: one per ``Reserve``, the directory mounted into the task; the workload writes its load
  there (``util=<percent> mem_mib=<MiB>``) and the plugin's statistics report it.
- ``instances/<instance id>``: the reservation an instance belongs to now (Nomad never reserves an instance twice at
  once, so the newest reservation of an instance is the live one; a reservation no instance points to is deleted).

Everything here survives a restart of the plugin (Nomad restarts plugins as it likes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from devices.sim.inventory import Load, parse_load

LOAD_FILE_BYTES = 4096
"""At most this much of a load file is read: the workload owns it."""


class StateDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.health = root / "unhealthy"
        self.reservations = root / "reservations"
        self.instances = root / "instances"

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
        try:
            with open(self.reservations / reservation / "load", "rb") as file:
                return parse_load(file.read(LOAD_FILE_BYTES).decode(errors="replace"))
        except OSError:
            return None

    def _forget_unreferenced(self, keep: str) -> None:
        live: Mapping[str, None] = {keep: None} | {
            path.read_text().strip(): None for path in self.instances.iterdir() if not path.name.startswith(".")
        }
        for reservation in self.reservations.iterdir():
            if reservation.name not in live:
                shutil.rmtree(reservation, ignore_errors=True)
