"""Why a session waits, in words a user can act on: what is missing and on which agent."""

from __future__ import annotations

from domain.slots import format_slots
from scheduler.agents.occupancy import GroupOccupancy
from scheduler.agents.vectors import Demand
from scheduler.pass_model import WaitExplanation, WaitKind

__all__ = ["explain_never_fits", "explain_no_fit"]


def _what(occupancy: GroupOccupancy, demand: Demand, role: str | None) -> str:
    # marker slots (``designated:<node>``, ``driver:<name>``, scheduler.snapshot) are not amounts a user asked for
    asked = {slot: amount for slot, amount in occupancy.codec.to_slots(demand).items() if ":" not in slot}
    wanted = format_slots(asked)
    return f"kernel {role} ({wanted})" if role else wanted


def explain_never_fits(occupancy: GroupOccupancy, group: str, demand: Demand, role: str | None) -> WaitExplanation:
    what = _what(occupancy, demand, role)
    if not occupancy.ids:
        return WaitExplanation(WaitKind.NEVER_FITS, f"resource group {group} has no schedulable agent")
    missing = [occupancy.codec.names[p] for p, _ in demand if not occupancy.members((p,))]
    if missing:
        message = f"no schedulable agent of resource group {group} has {', '.join(missing)}"
        return WaitExplanation(WaitKind.NEVER_FITS, message)
    agent, short = occupancy.closest(demand, when_empty=True)
    shortfall = occupancy.codec.to_slots(short)
    agent_id = None if agent is None else occupancy.ids[agent]
    message = (
        f"{what} is bigger than any schedulable agent of resource group {group}: even empty, "
        f"the closest ({agent_id}) lacks {format_slots(shortfall)}"
    )
    return WaitExplanation(WaitKind.NEVER_FITS, message, shortfall=shortfall, best_agent=agent_id)


def explain_no_fit(
    occupancy: GroupOccupancy, demand: Demand, role: str | None, reserved: str | None
) -> WaitExplanation:
    what = _what(occupancy, demand, role)
    agent, short = occupancy.closest(demand)
    shortfall = occupancy.codec.to_slots(short)
    agent_id = None if agent is None else occupancy.ids[agent]
    if shortfall.is_zero():
        message = f"no agent fits {what} after the session's other kernels"
    else:
        message = f"no agent has {what} free now; the closest ({agent_id}) lacks {format_slots(shortfall)}"
    if reserved:
        message += f"; agent {reserved} is reserved for this session"
    return WaitExplanation(WaitKind.NO_AGENT_FITS, message, shortfall=shortfall, best_agent=agent_id)
