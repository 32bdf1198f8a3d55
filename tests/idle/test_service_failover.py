"""Handing over between idle checkers with real sessions (real Redis, Nomad, scheduler and gateway)."""

from __future__ import annotations

from pathlib import Path

from core.clock import utcnow
from tests.harness import Caravan
from tests.idle.running import BUSY, eventually, policy_file, running_idle, start_interactive

UTILIZATION = """
check_interval = "2s"
defaults {
  utilization {
    window = "6s"
    thresholds {
      cpu_util = 10
    }
  }
}
"""


async def test_a_new_leader_resumes_the_saved_utilization_windows(caravan: Caravan, tmp_path: Path) -> None:
    session_id = await start_interactive(caravan, "busy", BUSY)
    path = policy_file(tmp_path, UTILIZATION)
    async with running_idle(caravan.settings, path, persist_every=0.1) as first:
        store = first.idle_store

        async def judged_utilized() -> bool:
            stored = await store.verdict(session_id)
            return stored is not None and stored.verdict.reports[2].note == "utilized"

        await eventually(judged_utilized, timeout=20)
        async with running_idle(caravan.settings, path) as second:  # a standby, until the first stops
            handed_over = utcnow()
            await first.lease.release()  # as when the first one exits

            async def first_report_of_second() -> str | None:
                stored = await store.verdict(session_id)
                if stored is None or stored.checked_at <= handed_over:
                    return None
                return stored.verdict.reports[2].note

            # a checker starting from scratch would need 6 s of samples before judging again
            assert await eventually(first_report_of_second, timeout=5, every=0.05) == "utilized"
            assert await caravan.store.redis.get(caravan.store.keys.idle_lease) == second.lease.holder
