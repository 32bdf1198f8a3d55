"""The scheduler's configuration file as the gateway reads it: parsed again only when the file changes.

The gateway refuses at creation what the file forbids a resource group (``allowed_drivers``), so every
createSession needs it; parsing HCL each time would cost more than the rest of the creation.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.errors import Unavailable
from domain.scheduling_config import SchedulingConfig, SchedulingConfigError, load_scheduling_config

_loaded: dict[str, tuple[tuple[int, int], SchedulingConfig]] = {}


def scheduling_config(path: Path | None) -> SchedulingConfig:
    """The configuration in force (``Unavailable`` when the file cannot be read or is refused)."""
    try:
        if path is None:
            return load_scheduling_config(None)
        stat = os.stat(path)
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = _loaded.get(str(path))
        if cached is None or cached[0] != stamp:
            cached = _loaded[str(path)] = (stamp, load_scheduling_config(path))
        return cached[1]
    except (OSError, SchedulingConfigError) as exc:
        raise Unavailable(f"the scheduler configuration cannot be read: {exc}") from exc
