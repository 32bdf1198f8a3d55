"""Agents: the Nomad client nodes sessions run on, as Caravan counts them (capacity and occupancy in slots). An
agent's resource group is its node pool. Read from Nomad by ``nomad_jobs.agents``; the scheduler places sessions on
them and the gateway shows them (``resourceGroups``)."""

from __future__ import annotations

from dataclasses import dataclass

from domain.slots import ResourceSlots


@dataclass(frozen=True)
class Agent:
    """A Nomad client node as the scheduler sees it."""

    id: str
    resource_group: str
    capacity: ResourceSlots
    occupied: ResourceSlots = ResourceSlots()
    """Everything allocated on the node (Caravan's or not) plus Caravan placements Nomad does not show yet."""
    schedulable: bool = True
    """False when down, draining or ineligible: such agents are dropped before any selection."""
