"""``python -m node_plugins.devices.sim``: the device plugin process (what the launcher in Nomad's ``plugin_dir``
runs)."""

import sys

from node_plugins.devices.sim.server import serve

sys.exit(serve())
