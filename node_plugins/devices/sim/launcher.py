"""The launcher Nomad runs: a small script named :data:`~node_plugins.devices.sim.config.PLUGIN_NAME` in a client's
``plugin_dir`` that starts ``python -m node_plugins.devices.sim`` from this checkout, with Nomad's generated plugin
stubs on its path."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from node_plugins.devices.sim.config import PLUGIN_NAME

ROOT = Path(__file__).resolve().parents[3]
"""The checkout the launcher runs the plugin from."""


def install_launcher(plugin_dir: Path, protos: Path, *, python: str = sys.executable) -> Path:
    """Write (or rewrite) the launcher into ``plugin_dir``; ``protos``: the directory ``ops/install-device-protos``
    printed. Returns its path."""
    if not (protos / "plugins" / "device" / "proto" / "device_pb2.py").exists():
        raise FileNotFoundError(f"no generated Nomad plugin stubs in {protos}: run ops/install-device-protos")
    plugin_dir.mkdir(parents=True, exist_ok=True)
    path = plugin_dir / PLUGIN_NAME
    script = (
        "#!/bin/sh\n"
        "# Caravan's simulated-accelerator device plugin (node_plugins/devices/sim), started by Nomad (go-plugin).\n"
        f"PYTHONPATH={shlex.quote(f'{ROOT}{os.pathsep}{protos}')} "
        f'exec {shlex.quote(python)} -m node_plugins.devices.sim "$@"\n'
    )
    temporary = path.with_name(f".{PLUGIN_NAME}.tmp")
    temporary.write_text(script)
    temporary.chmod(0o755)
    os.replace(temporary, path)
    return path


def main() -> int:
    """``python -m node_plugins.devices.sim.launcher <plugin_dir> <protos dir>``, by hand (the stacks write their
    own: ``caravan.stack.device_plugin``; ``ops/install-device-protos`` prints the protos directory)."""
    if len(sys.argv) != 3:
        print("usage: python -m node_plugins.devices.sim.launcher PLUGIN_DIR PROTOS_DIR", file=sys.stderr)
        return 2
    print(install_launcher(Path(sys.argv[1]), Path(sys.argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
