"""Node-side plugins: code that runs on the Nomad client hosts, started by Nomad or its CNI, not by Caravan's services.

- :mod:`node_plugins.cni_isolation`: the ``caravan-isolation`` CNI plugin, chained last in a kernel's network (a
  kernel reaches only its own session's kernels), run by Nomad's CNI as a standalone script.
- :mod:`node_plugins.devices.sim`: the simulated-accelerator Nomad device plugin, launched from a client's
  ``plugin_dir``.

Nothing of Caravan's services imports them (the import contract in ``pyproject.toml``); the stack that sets the nodes
up (``caravan.stack``) installs them, and ``nomad_jobs.session_peers`` (the per-host daemon) shares the isolation
plugin's membership files.
"""
