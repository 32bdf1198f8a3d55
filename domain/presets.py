"""Resource presets: named bundles of slots (and /dev/shm) a creation may name instead of listing resources: the
model. Kept in Redis by ``stores.presets``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from core.errors import InvalidInput

PRESET_NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class ResourcePreset:
    name: str
    resources: dict[str, str] = field(default_factory=dict)
    """Slot -> exact amount (cores, bytes, devices)."""
    shared_memory: str | None = None
    """Bytes of /dev/shm, exact; a request's own ``sharedMemory`` wins."""


def check_preset_name(name: str) -> None:
    if not PRESET_NAME_RULE.match(name):
        raise InvalidInput("a preset name is 1-64 characters: letters, digits, '_', '.', '-', not first", field="name")
