"""The simulated accelerator's configuration: the plugin block of a Nomad client, checked. Pure.

Operators write it in the client's agent configuration (the label is the launcher's file name)::

    plugin "caravan-device-sim" {
      config {
        state_dir          = "/var/lib/caravan-sim"   # health switches, reservations, load files (required)
        alloc_dir          = "/var/lib/nomad/alloc"   # the client's allocation directory: tasks' load files
        count              = 2                        # devices on this client
        model              = "SimGPU-16G"
        memory_mib         = 16384                    # device memory per device, MiB
        compute_capability = "8.0"
        shares             = 4                        # 0: whole devices; K: each device is K shares
        fingerprint_period = "1s"                     # how often health is re-read
      }
    }

Nomad checks the types against :data:`SCHEMA` (``hclspec``); :func:`parse_config` checks the values and names every
field that is wrong, so a bad block stops the Nomad agent with that message instead of a silently missing device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.durations import parse_duration

PLUGIN_NAME = "caravan-device-sim"
"""The plugin's name, and the file name of its launcher in Nomad's ``plugin_dir`` (Nomad matches the ``plugin``
block by file name)."""
PLUGIN_VERSION = "0.1.0"
VENDOR = "caravan-sim"
WHOLE_TYPE = "gpu"
SHARE_TYPE = "gpu-share"
MAX_DEVICES = 64
SHARE_COUNTS = (1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100)
"""Shares per device a client may offer: those whose one share (1/K of a device) Caravan's slots hold exactly
(amounts are kept to 0.001)."""
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CAPABILITY = re.compile(r"\d{1,2}\.\d{1,2}")

SCHEMA: Mapping[str, tuple[str, str | None]] = {
    "state_dir": ("string", None),
    "alloc_dir": ("string", '""'),
    "count": ("number", "2"),
    "model": ("string", '"SimGPU-16G"'),
    "memory_mib": ("number", "16384"),
    "compute_capability": ("string", '"8.0"'),
    "shares": ("number", "0"),
    "fingerprint_period": ("string", '"1s"'),
}
"""Attribute -> (HCL type, default as an HCL expression; None: required). :mod:`node_plugins.devices.sim.server` turns
it into Nomad's ``hclspec``."""


class ConfigError(ValueError):
    """A plugin block Nomad must refuse; the message names every wrong field."""


@dataclass(frozen=True)
class SimConfig:
    state_dir: Path
    """Where health switches, reservations and load files live (created if missing)."""
    count: int = 2
    """Devices on this client."""
    model: str = "SimGPU-16G"
    memory_mib: int = 16384
    """Device memory of one device, MiB."""
    compute_capability: str = "8.0"
    shares: int = 0
    """0: whole devices; K: each device offered as K shares (instances of a ``gpu-share`` group)."""
    fingerprint_period: float = 1.0
    """Seconds between two readings of the devices' health."""
    alloc_dir: Path | None = None
    """The Nomad client's allocation directory (``<data_dir>/alloc`` unless ``client.alloc_dir`` moves it), where
    the plugin finds the load file a docker or exec task writes in its allocation's shared directory (None: only
    ``CARAVAN_SIM_HOST_LOAD_FILE``, raw_exec's, is read)."""


def parse_config(raw: Mapping[str, object]) -> SimConfig:
    """The configuration Nomad decoded with :data:`SCHEMA` (msgpack of its values); ``ConfigError`` naming each wrong
    field."""
    problems: list[str] = []

    def whole(name: str, low: int, high: int, allowed: tuple[int, ...] = ()) -> int:
        value = raw.get(name)
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if number is None or number != int(number) or not low <= number <= high or (allowed and number not in allowed):
            choice = f"one of {', '.join(map(str, allowed))}" if allowed else f"a whole number from {low} to {high}"
            problems.append(f"{name} must be {choice}, got {value!r}")
            return low
        return int(number)

    def text(name: str) -> str:
        value = raw.get(name)
        if not isinstance(value, str):
            problems.append(f"{name} must be a string, got {value!r}")
            return ""
        return value

    state_dir = text("state_dir")
    if state_dir and not state_dir.startswith("/"):
        problems.append(f"state_dir must be an absolute path, got {state_dir!r}")
    alloc_dir = text("alloc_dir") if "alloc_dir" in raw else ""
    if alloc_dir and not alloc_dir.startswith("/"):
        problems.append(f"alloc_dir must be an absolute path, got {alloc_dir!r}")
    count = whole("count", 0, MAX_DEVICES)
    model = text("model")
    if model and not _MODEL.fullmatch(model):
        problems.append(f"model must be 1-64 letters, digits, '.', '_' or '-' (it names the device), got {model!r}")
    memory = whole("memory_mib", 1, 1 << 24)
    capability = text("compute_capability")
    if capability and not _CAPABILITY.fullmatch(capability):
        problems.append(f'compute_capability must look like "8.0", got {capability!r}')
    shares = whole("shares", 0, max(SHARE_COUNTS), (0, *SHARE_COUNTS))
    period = 1.0
    try:
        period = parse_duration(text("fingerprint_period") or "1s")
        if not 0.05 <= period <= 3600:
            problems.append(f"fingerprint_period must be between 0.05s and 1h, got {raw.get('fingerprint_period')!r}")
    except ValueError as exc:
        problems.append(f"fingerprint_period: {exc}")
    if problems:
        raise ConfigError(f"{PLUGIN_NAME} config: " + "; ".join(problems))
    return SimConfig(
        Path(state_dir), count, model, memory, capability, shares, period, Path(alloc_dir) if alloc_dir else None
    )
