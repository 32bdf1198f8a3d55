"""The simulated accelerators a stack's Nomad clients offer: Caravan's device plugin
(:mod:`node_plugins.devices.sim`), its launcher in the client's own ``plugin_dir`` and its ``plugin`` block.

Each agent gets a plugin directory of its own (``<state>/plugins``) holding only the launcher, pointing at this
checkout: two checkouts' stacks on one machine never run each other's plugin. The generated gRPC stubs come from
``ops/install-device-protos`` (in the cache, next to Nomad's build).
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from caravan.stack.processes import StartupFailed
from node_plugins.devices.sim.config import PLUGIN_NAME
from node_plugins.devices.sim.launcher import install_launcher


@dataclass(frozen=True)
class SimDevices:
    """What one client's plugin offers (the ``plugin`` block's values; :mod:`node_plugins.devices.sim.config`)."""

    count: int = 2
    model: str = "SimGPU-16G"
    memory_mib: int = 16384
    compute_capability: str = "8.0"
    shares: int = 4
    """0: whole devices (``sim.device``); K: each device as K shares (``sim.shares``, 1/K each)."""
    fingerprint_period: str = "0.2s"

    @property
    def instances(self) -> int:
        """Instances Nomad lists for the client (shares count one each)."""
        return self.count * (self.shares or 1)


DEFAULT_DEVICES = SimDevices()
"""The dev stack's: two devices of four shares each per client."""


def protos_dir(nomad_home: Path) -> Path:
    """Where ``ops/install-device-protos`` generated the stubs for the Nomad in ``nomad_home``
    (``<cache>/nomad-<version>`` -> ``<cache>/nomad-protos-<version>-grpcio-tools-<version>``)."""
    version = nomad_home.name.removeprefix("nomad-")
    tools = importlib.metadata.version("grpcio-tools")
    return nomad_home.parent / f"nomad-protos-{version}-grpcio-tools-{tools}"


def plugin_dir(state_dir: Path, nomad_home: Path) -> Path:
    """``<state_dir>/plugins`` with the launcher written into it."""
    directory = state_dir / "plugins"
    try:
        install_launcher(directory, protos_dir(nomad_home))
    except FileNotFoundError as exc:
        raise StartupFailed(f"{exc} (ops/install runs it)") from exc
    return directory


def plugin_block(devices: SimDevices | None, state_dir: Path, data_dir: Path) -> str:
    """The client's ``plugin "caravan-device-sim"`` block (none without devices: the launcher is then skipped);
    ``data_dir`` is the client's, whose ``alloc`` directory holds the load files docker and exec tasks write."""
    if devices is None:
        return ""
    values = {
        "state_dir": str(state_dir),
        "alloc_dir": str(data_dir / "alloc"),
        "count": devices.count,
        "model": devices.model,
        "memory_mib": devices.memory_mib,
        "compute_capability": devices.compute_capability,
        "shares": devices.shares,
        "fingerprint_period": devices.fingerprint_period,
    }
    body = "".join(f"    {name} = {json.dumps(value)}\n" for name, value in values.items())  # JSON scalars are HCL
    return f'plugin "{PLUGIN_NAME}" {{\n  config {{\n{body}  }}\n}}\n'
