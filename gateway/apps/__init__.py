"""Session apps, each on an origin of its own (``domain.apps``), served by HAProxy: its configuration
(``ingress_config``), its runtime API (``runtime_api``), the control plane that keeps its maps from Redis
(``control``), and what the gateway still does on an app origin, the launch exchange (``proxy``, ``headers``)."""
