"""Caravan's simulated accelerator: a Nomad device plugin written in Python (HashiCorp go-plugin over gRPC).

No machine here has a GPU, so the accelerator is simulated, but everything between the device and the user is the real
thing: Nomad launches this plugin from its ``plugin_dir`` (the launcher :mod:`node_plugins.devices.sim.launcher`
writes), fingerprints it, reserves its instances for tasks and polls their statistics, exactly as it does the NVIDIA
plugin.

- :mod:`~node_plugins.devices.sim.config`: the plugin's ``config { ... }`` block, checked (pure).
- :mod:`~node_plugins.devices.sim.inventory`: the devices a configuration offers, their health and statistics (pure).
- :mod:`~node_plugins.devices.sim.state`: the plugin's state directory: health switches, reservations and load files
  (disk).
- :mod:`~node_plugins.devices.sim.server`: go-plugin's handshake and Nomad's ``base`` and ``device`` gRPC services.

Vendor ``caravan-sim`` (clearly not a real vendor): whole devices are ``caravan-sim/gpu/<model>``; a device offered
as K shares is a group ``caravan-sim/gpu-share/<model>@<device id>`` of K instances (one group per physical device,
so the shares Nomad grants one task are always of one device: Nomad fills a device request from a single group).
"""
