"""``python -m devices.sim``: the device plugin process (what the launcher in Nomad's ``plugin_dir`` runs)."""

import sys

from devices.sim.server import serve

sys.exit(serve())
