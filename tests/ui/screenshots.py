"""Screenshots of the web UI's main pages, for the README: ``./ops/ui-screenshots [DIR]`` (default web/screenshots).

A pytest module (not collected by the suite: its name is not test_*) so that it runs on the tests' real stack: a
gateway, scheduler, Redis and Nomad of its own, a few sessions in various states, then each page in headless Chromium
at a laptop's size."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from domain.users import Role
from tests.e2e.test_utilization_series import fetching, serving_session
from tests.harness import CREATE, Caravan
from tests.idle.running import policy_file, running_idle
from tests.ui.browser import Browser, attribute_is, fill, sign_in, text_in, visible
from tests.ui.test_usage_charts_ui import POLICY, charts_on_page, sampled

pytestmark = [pytest.mark.ui]

OUT = Path(os.environ.get("CARAVAN_SCREENSHOTS", Path(__file__).resolve().parents[2] / "web" / "screenshots"))
APP = r"""
mkdir -p /tmp/w && echo 'hello from the app' > /tmp/w/index.html && : > /tmp/w/favicon.ico
httpd -f -p 8080 -h /tmp/w &
i=0; while true; do i=$((i+1)); echo "step $i: loss $((1000 / i))"; sleep 1; done
"""


async def test_screenshots(caravan: Caravan, browser: Browser) -> None:
    admin = await caravan.user("ada", Role.SUPERADMIN)
    made = []
    for name, kind, command in (
        ("train-resnet", "INTERACTIVE", APP),
        ("nightly-eval", "BATCH", "echo evaluating; sleep 1; echo done"),
        ("broken-job", "BATCH", "echo oops >&2; exit 3"),
    ):
        session = {"name": name, "type": kind, "driver": "EXEC", "startupCommand": command}
        if kind == "INTERACTIVE":
            session["apps"] = [{"name": "notebook", "port": 8080}]
        data = await caravan.gql(CREATE, {"input": session}, token=admin)
        made.append(data["createSession"]["sessions"][0]["id"])
    await caravan.wait_for(made[0], "RUNNING")
    await caravan.wait_for(made[1], "TERMINATED")
    await caravan.wait_for(made[2], "TERMINATED")
    await caravan.gql(
        CREATE,
        {
            "input": {
                "name": "waits-for-gpus",
                "type": "INTERACTIVE",
                "driver": "EXEC",
                "resources": [{"slot": "cpu", "amount": "512"}],
            }
        },
        token=admin,
    )
    await caravan.gql('mutation { createFolder(input: {name: "datasets"}) { id } }', token=admin)
    await caravan.gql(
        "mutation($input: CreateScheduleInput!) { createSchedule(input: $input) { id } }",
        {
            "input": {
                "name": "nightly-etl",
                "cron": "30 2 * * *",
                "timeZone": "Europe/Berlin",
                "concurrency": "FORBID",
                "spec": {"type": "BATCH", "driver": "EXEC", "startupCommand": "echo etl"},
            }
        },
        token=admin,
    )
    await asyncio.sleep(2)  # a scheduling pass has judged the last one (its wait reasons)

    def shoot(d: WebDriver, name: str) -> None:
        d.execute_script("window.scrollTo(0, 0)")
        browser.screenshot(OUT / f"{name}.png")

    def pages(d: WebDriver) -> None:
        d.get(browser.base + "/ui/")
        visible(d, "#token")
        shoot(d, "sign-in")
        sign_in(d, browser.base, admin)
        visible(d, "#sessions-table")
        shoot(d, "sessions")
        d.find_element(By.LINK_TEXT, "Launch").click()
        fill(d, {"name": "x", "type": "BATCH", "driver": "EXEC"})
        d.find_element(By.ID, "launch").click()
        visible(d, "#error-name")
        shoot(d, "launcher")
        d.find_element(By.LINK_TEXT, "Sessions").click()
        visible(d, "tr[data-name='train-resnet'] a").click()
        attribute_is(d, "#session-detail", "data-status", "RUNNING")
        text_in(d, "#logs", "step 3")
        shoot(d, "session")
        d.find_element(By.ID, "nav-admin").click()
        visible(d, "section.group .agent meter")
        shoot(d, "admin-groups")
        d.find_element(By.LINK_TEXT, "Users and tokens").click()
        visible(d, "#users")
        shoot(d, "admin-users")
        d.find_element(By.LINK_TEXT, "Folders").click()
        visible(d, "tr[data-folder='datasets'] button").click()
        attribute_is(d, "#folder-card", "data-status", "READY")
        visible(d, "#no-files")
        shoot(d, "folders")
        d.find_element(By.LINK_TEXT, "Schedules").click()
        visible(d, "tr[data-schedule='nightly-etl']")
        shoot(d, "schedules")
        d.execute_cdp_cmd(  # the system's dark theme
            "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
        )
        d.find_element(By.LINK_TEXT, "Sessions").click()
        visible(d, "tr[data-name='train-resnet'] a").click()
        text_in(d, "#logs", "step 2")
        shoot(d, "session-dark")

    await browser.run(pages)
    await caravan.gql("mutation($ids: [ID!]!) { destroySession(ids: $ids, forced: true) { id } }", {"ids": made[:1]})


async def test_usage_charts_screenshot(caravan: Caravan, browser: Browser, tmp_path: Path) -> None:
    """The session page's usage charts: a kernel burning a core and serving a file fetched over and over, sampled by
    a real idle checker for a few sweeps (CPU and memory against their thresholds, network I/O in bytes/s)."""
    admin = await caravan.user("ada", Role.SUPERADMIN)
    busy, url = await serving_session(caravan, "train-resnet", busy=True)
    async with fetching(caravan, url), running_idle(caravan.settings, policy_file(tmp_path, POLICY)):
        await sampled(caravan, busy, 12)

        def shoot(d: WebDriver) -> None:
            sign_in(d, browser.base, admin)
            charts_on_page(d, browser.base, busy)
            visible(d, "#usage-charts figure[data-metric='net_tx'] polyline.series")
            size = d.get_window_size()
            d.set_window_size(size["width"], 1000)  # the four charts and the apps above them
            try:
                browser.screenshot(OUT / "usage-charts.png")
            finally:
                d.set_window_size(size["width"], size["height"])

        await browser.run(shoot)
    await caravan.gql("mutation($ids: [ID!]!) { destroySession(ids: $ids, forced: true) { id } }", {"ids": [busy]})
