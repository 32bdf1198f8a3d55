"""A session's utilization over its life (``Session.utilization``) end to end: real Nomad, Redis, scheduler, gateway
and idle checker. A kernel burning a core charts above the CPU threshold, an idle one below, with the threshold the
checker judged; another user's session answers not found."""

from __future__ import annotations

from pathlib import Path
from statistics import fmean
from typing import Any

import pytest

from tests.harness import Caravan, GraphQLErrors
from tests.idle.running import BUSY, eventually, policy_file, running_idle, start_interactive

POLICY = """check_interval = "1s"
defaults {
  utilization {
    window = "600s"
    thresholds {
      cpu_util = 10
    }
  }
}
"""
SERIES = """query($id: ID!, $kernel: String) { session(id: $id) { utilization(kernel: $kernel) {
  kernel kernels points { at until sweeps values { metric percent } } thresholds { metric threshold } } } }"""


def cpu(series: dict[str, Any]) -> list[float]:
    return [v["percent"] for p in series["points"] for v in p["values"] if v["metric"] == "cpu_util"]


async def test_a_busy_kernel_charts_above_the_threshold_and_an_idle_one_below(caravan: Caravan, tmp_path: Path) -> None:
    busy = await start_interactive(caravan, "busy", BUSY)
    idle = await start_interactive(caravan, "idle")

    async def charted(session_id: str) -> dict[str, Any] | None:
        series: dict[str, Any] = (await caravan.gql(SERIES, {"id": session_id}))["session"]["utilization"]
        return series if len(cpu(series)) >= 4 else None

    async with running_idle(caravan.settings, policy_file(tmp_path, POLICY)):
        busy_series = await eventually(lambda: charted(busy), timeout=60)
        idle_series = await eventually(lambda: charted(idle), timeout=60)
    assert busy_series["thresholds"] == [{"metric": "cpu_util", "threshold": 10.0}]
    assert idle_series["thresholds"] == [{"metric": "cpu_util", "threshold": 10.0}]
    assert busy_series["kernels"] == [busy_series["kernel"]] and busy_series["kernel"]
    # on average, as the check judges (one sweep's reading of a loaded machine may dip); the first may catch the start
    assert fmean(cpu(busy_series)[1:]) > 10 > fmean(cpu(idle_series)[1:])
    assert all(p["sweeps"] == 1 and p["at"] == p["until"] for p in busy_series["points"])
    by_kernel = await caravan.gql(SERIES, {"id": busy, "kernel": busy_series["kernel"]})
    assert by_kernel["session"]["utilization"]["points"][: len(busy_series["points"])] == busy_series["points"]

    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(SERIES, {"id": busy, "kernel": "no-such-kernel"})
    assert failed.value.codes == ["INVALID_INPUT"]
    bob = await caravan.user("bob")
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(SERIES, {"id": busy}, token=bob)
    assert failed.value.codes == ["NOT_FOUND"]
