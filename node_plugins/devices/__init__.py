"""Nomad device plugins Caravan ships (``sim``: the simulated accelerator)."""
