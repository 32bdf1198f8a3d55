"""The gateway's app proxy: each session app on an origin of its own (``domain.apps``), reverse-proxied to the
kernel's Nomad host port (``proxy``), who may pass (``access``), what is forwarded (``headers``), and the traffic
recorded as the session's activity (``activity``)."""
