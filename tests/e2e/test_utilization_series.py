"""A session's utilization over its life (``Session.utilization``) end to end: real Nomad, Redis, scheduler, gateway
and idle checker. A kernel burning a core charts above the CPU threshold, an idle one below, with the threshold the
checker judged; another user's session answers not found."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest

from tests.harness import CREATE, Caravan, GraphQLErrors
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


UNCHECKED = """check_interval = "1s"
defaults {
  network_idle_timeout = "1h"
}
"""


async def test_a_session_whose_utilization_no_threshold_judges_is_charted_too(caravan: Caravan, tmp_path: Path) -> None:
    """Every running session gets its series, not only those a utilization threshold judges (then every
    ``SWEEPS_PER_POINT`` sweeps, its turn): with no threshold, no threshold line."""
    busy = await start_interactive(caravan, "unchecked-busy", BUSY)

    async def charted() -> dict[str, Any] | None:
        series: dict[str, Any] = (await caravan.gql(SERIES, {"id": busy}))["session"]["utilization"]
        return series if len(cpu(series)) >= 3 else None

    async with running_idle(caravan.settings, policy_file(tmp_path, UNCHECKED)):
        series = await eventually(charted, timeout=90)
    assert series["thresholds"] == []
    assert fmean(cpu(series)[1:]) > 10
    assert {v["metric"] for p in series["points"] for v in p["values"]} >= {"cpu_util", "mem"}


SERVED_PORT = 8080
SERVE_BIG = (
    "mkdir -p /tmp/w && head -c 1000000 /dev/zero > /tmp/w/big && "
    f'exec httpd -f -p "${{NOMAD_PORT_p{SERVED_PORT}}}" -h /tmp/w'
)
"""A kernel serving a megabyte on its preopened port (its own port in its namespace on the session network)."""
NET = """query($id: ID!) { session(id: $id) { utilization { points { values { metric value unit percent } } } } }"""


def sent(series: dict[str, Any]) -> list[float]:
    return [v["value"] for p in series["points"] for v in p["values"] if v["metric"] == "net_tx"]


async def serving_session(caravan: Caravan, name: str, *, busy: bool = False) -> tuple[str, str]:
    """A RUNNING session whose kernel serves a megabyte (and burns a core when ``busy``): its id and the file's URL
    on the kernel's published port."""
    command = (f"{{ {BUSY}; }} & " if busy else "") + SERVE_BIG
    data = await caravan.gql(CREATE, {"input": {
        "name": name, "type": "INTERACTIVE", "driver": "EXEC", "preopenPorts": [SERVED_PORT], "startupCommand": command,
        "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "64m"}],
    }})  # fmt: skip
    session_id = str(data["createSession"]["sessions"][0]["id"])
    await caravan.wait_for(session_id, "RUNNING", timeout=60)
    stored = await caravan.store.get(session_id)
    assert stored is not None
    [published] = stored.main_kernel.ports
    return session_id, f"http://127.0.0.1:{published.rsplit(':', 1)[1]}/big"


@contextlib.asynccontextmanager
async def fetching(caravan: Caravan, url: str) -> AsyncIterator[list[int]]:
    """Fetch ``url`` over and over while the block runs; yields the bytes fetched so far (one number, kept current)."""
    fetched = [0]

    async def fetch_forever() -> None:
        while True:
            try:
                fetched[0] += len((await caravan.http.get(url, timeout=5)).content)
            except Exception:  # not answering yet
                await asyncio.sleep(0.2)

    task = asyncio.create_task(fetch_forever())
    try:
        yield fetched
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_traffic_a_kernel_serves_shows_in_its_network_series(caravan: Caravan, tmp_path: Path) -> None:
    """Nomad's stats have no network counters: the kernel's own namespace's, copied by its bootstrap and read through
    Nomad's file API (``domain.idle.network``), chart its I/O in bytes per second."""
    session_id, url = await serving_session(caravan, "serving")

    async def busy_sending() -> dict[str, Any] | None:
        series: dict[str, Any] = (await caravan.gql(NET, {"id": session_id}))["session"]["utilization"]
        return series if sum(1 for v in sent(series) if v > 100_000) >= 2 else None

    async with fetching(caravan, url) as fetched, running_idle(caravan.settings, policy_file(tmp_path, UNCHECKED)):
        series = await eventually(busy_sending, timeout=120)
    assert fetched[0] > 2_000_000
    values = [v for p in series["points"] for v in p["values"]]
    assert {(v["unit"], v["percent"]) for v in values if v["metric"] in ("net_rx", "net_tx")} == {
        ("BYTES_PER_SECOND", None)
    }
    assert all(v["unit"] == "PERCENT" and v["percent"] == v["value"] for v in values if v["metric"] == "cpu_util")
