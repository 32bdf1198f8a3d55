"""A session's usage charts in a real headless Chromium: a kernel burning a core on real Nomad, sampled by a real idle
checker, charted on its session page with the idle threshold drawn across the same axes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from domain.users import Role
from tests.e2e.test_utilization_series import NET, fetching, sent, serving_session
from tests.harness import Caravan
from tests.idle.running import BUSY, eventually, policy_file, running_idle, start_interactive
from tests.ui.browser import Browser, sign_in, visible, wait

pytestmark = [pytest.mark.ui]

POLICY = """check_interval = "1s"
defaults {
  utilization {
    window = "600s"
    thresholds {
      cpu_util = 10
      mem = 90
    }
  }
}
"""
POINTS = "query($id: ID!) { session(id: $id) { utilization { points { at } } } }"


async def sampled(caravan: Caravan, session_id: str, points: int) -> None:
    """Wait until the idle checker has charted ``points`` sweeps of the session."""

    async def enough() -> bool | None:
        found: dict[str, Any] = await caravan.gql(POINTS, {"id": session_id})
        return len(found["session"]["utilization"]["points"]) >= points or None

    await eventually(enough, timeout=60)


async def charted_rates(caravan: Caravan, session_id: str, rates: int) -> None:
    """Wait until the idle checker has charted ``rates`` points of the session's network rate (bytes sent a second)."""

    async def enough() -> bool | None:
        return len(sent((await caravan.gql(NET, {"id": session_id}))["session"]["utilization"])) >= rates or None

    await eventually(enough, timeout=60)


def charts_on_page(d: WebDriver, base: str, session_id: str) -> dict[str, Any]:
    d.get(f"{base}/ui/sessions/{session_id}")
    visible(d, "#usage-charts figure[data-metric='cpu_util'] polyline.series")
    d.execute_script("document.getElementById('usage-charts').scrollIntoView()")
    threshold = d.find_element(By.CSS_SELECTOR, "figure[data-metric='cpu_util'] line.threshold")
    line = d.find_element(By.CSS_SELECTOR, "figure[data-metric='cpu_util'] polyline.series")
    ys = [float(xy.split(",")[1]) for xy in str(line.get_attribute("points")).split()]
    return {
        "metrics": [f.get_attribute("data-metric") for f in d.find_elements(By.CSS_SELECTOR, "#usage-charts figure")],
        "threshold": threshold.get_attribute("data-threshold"),
        "threshold_y": float(str(threshold.get_attribute("y1"))),
        "ys": ys,
        "caption": d.find_element(By.CSS_SELECTOR, "figure[data-metric='cpu_util'] figcaption").text,
    }


async def test_a_busy_kernels_chart_runs_above_its_idle_threshold(
    caravan: Caravan, browser: Browser, tmp_path: Path
) -> None:
    admin = await caravan.user("root", Role.SUPERADMIN)
    busy = await start_interactive(caravan, "ui-busy", BUSY)
    async with running_idle(caravan.settings, policy_file(tmp_path, POLICY)):
        await sampled(caravan, busy, 4)

        def step(d: WebDriver) -> dict[str, Any]:
            sign_in(d, browser.base, admin)
            return charts_on_page(d, browser.base, busy)

        shown = await browser.run(step)
    assert shown["metrics"][:2] == ["cpu_util", "mem"] and shown["threshold"] == "10"
    assert "idle below 10%" in shown["caption"]
    assert len(shown["ys"]) >= 4
    # SVG's y grows downwards: the busy kernel's line is, on average, drawn above the threshold's
    assert sum(shown["ys"][1:]) / len(shown["ys"][1:]) < shown["threshold_y"]
    assert not browser.console_errors()


async def test_a_session_without_samples_says_why(caravan: Caravan, browser: Browser) -> None:
    admin = await caravan.user("root", Role.SUPERADMIN)
    quiet = await start_interactive(caravan, "ui-quiet")  # no idle checker: nothing sampled

    def step(d: WebDriver) -> str:
        sign_in(d, browser.base, admin)
        d.get(f"{browser.base}/ui/sessions/{quiet}")
        wait(d).until(lambda _: d.find_elements(By.ID, "usage-none"))
        return str(d.find_element(By.ID, "usage-none").text)

    assert "every running" in await browser.run(step)


def network_chart(d: WebDriver, base: str, session_id: str) -> dict[str, Any]:
    d.get(f"{base}/ui/sessions/{session_id}")
    visible(d, "#usage-charts figure[data-metric='net_tx'] polyline.series")
    d.execute_script("document.getElementById('usage-charts').scrollIntoView()")
    figure = d.find_element(By.CSS_SELECTOR, "#usage-charts figure[data-metric='net_tx']")
    return {
        "unit": figure.get_attribute("data-unit"),
        "thresholds": len(figure.find_elements(By.CSS_SELECTOR, "line.threshold")),
        "caption": figure.find_element(By.TAG_NAME, "figcaption").text,
        "metrics": [f.get_attribute("data-metric") for f in d.find_elements(By.CSS_SELECTOR, "#usage-charts figure")],
    }


async def test_a_kernels_network_io_is_charted_in_bytes_per_second(
    caravan: Caravan, browser: Browser, tmp_path: Path
) -> None:
    admin = await caravan.user("root", Role.SUPERADMIN)
    serving, url = await serving_session(caravan, "ui-serving")
    async with fetching(caravan, url), running_idle(caravan.settings, policy_file(tmp_path, POLICY)):
        await charted_rates(caravan, serving, 2)  # the second point on has a rate

        def step(d: WebDriver) -> dict[str, Any]:
            sign_in(d, browser.base, admin)
            return network_chart(d, browser.base, serving)

        shown = await browser.run(step)
    assert shown["metrics"] == ["cpu_util", "mem", "net_rx", "net_tx"]
    assert shown["unit"] == "BYTES_PER_SECOND" and shown["thresholds"] == 0
    assert "Network sent" in shown["caption"] and "B/s" in shown["caption"]
    assert not browser.console_errors()
