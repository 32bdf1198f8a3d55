"""The launcher's conveniences in a real headless Chromium against the real gateway, scheduler and Nomad: several
sessions at once, the HPC thread count reaching the kernels' environment, an app opened to the public, and the five
most recent launches (kept in the browser: re-launch, rename, pin)."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.harness import Caravan
from tests.ui.browser import Browser, attribute_is, fill, sign_in, type_over, visible, wait

pytestmark = [pytest.mark.ui]

MINE = """{ sessions(first: 50) { edges { node { id name status environ { name value } apps { name public }
  mainKernel { logs { stdout } } } } } }"""


async def sessions(caravan: Caravan, token: str) -> dict[str, dict[str, Any]]:
    data = await caravan.gql(MINE, token=token)
    return {e["node"]["name"]: e["node"] for e in data["sessions"]["edges"]}


def recent_names(d: WebDriver) -> list[tuple[str, str]]:
    items = d.find_elements(By.CSS_SELECTOR, "#recent-launches li")
    return [(str(i.get_attribute("data-recent")), str(i.get_attribute("data-pinned"))) for i in items]


def launch(d: WebDriver, fields: dict[str, str]) -> None:
    d.find_element(By.LINK_TEXT, "Launch").click()
    fill(d, fields)
    d.find_element(By.ID, "launch").click()
    wait(d).until(lambda _: "/launch" not in d.current_url)


async def test_several_sessions_threads_public_apps_and_recent_launches(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    command = 'echo "$OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS $NPROC"'

    def first(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        launch(d, {"name": "omp-run", "type": "BATCH", "driver": "EXEC", "cpu": "0.5", "startupCommand": command,
                   "count": "2", "threads": "3"})  # fmt: skip
        visible(d, "#sessions-table")  # more than one: the list

    await browser.run(first)
    mine = await sessions(caravan, alice)
    assert sorted(mine) == ["omp-run-1", "omp-run-2"]
    for name in mine:
        ended = await caravan.wait_for(mine[name]["id"], "TERMINATED")
        assert ended["mainKernel"]["logs"]["stdout"] == "3 3 3 1\n"  # the threads asked for; NPROC the cores

    def more(d: WebDriver) -> list[tuple[str, str]]:
        d.find_element(By.LINK_TEXT, "Launch").click()
        assert recent_names(d) == [("omp-run", "false")]
        visible(d, "#recent-launches .recent-rename").click()
        type_over(d, visible(d, "#recent-launches input.recent-label"), "threads demo")
        d.find_element(By.CSS_SELECTOR, "#recent-launches form button[type=submit]").click()
        visible(d, "#recent-launches .recent-pin").click()
        attribute_is(d, "#recent-launches li", "data-pinned", "true")
        launch(
            d, {"name": "notebook", "type": "INTERACTIVE", "driver": "EXEC", "cpu": "512", "apps": "nb:8888:public"}
        )  # fmt: skip  (waits for cores no agent has)
        for i in range(5):
            launch(d, {"name": f"later-{i}", "type": "BATCH", "driver": "EXEC", "startupCommand": "true",
                       "startsAt": "1h"})  # fmt: skip
        d.find_element(By.LINK_TEXT, "Launch").click()
        visible(d, "#recent-launches")
        return recent_names(d)

    shown = await browser.run(more)
    # five at most: the pinned one stays, the oldest unpinned ("notebook", "later-0") went
    assert shown == [("later-4", "false"), ("later-3", "false"), ("later-2", "false"), ("later-1", "false"),
                     ("threads demo", "true")]  # fmt: skip
    mine = await sessions(caravan, alice)
    assert mine["notebook"]["apps"] == [{"name": "nb", "public": True}]
    assert {e["name"]: e["value"] for e in mine["omp-run-1"]["environ"]}["OMP_NUM_THREADS"] == "3"

    def again(d: WebDriver) -> None:
        d.find_element(By.CSS_SELECTOR, "#recent-launches li[data-recent='threads demo'] .recent-launch").click()
        visible(d, "#sessions-table")

    await browser.run(again)  # the first launch's names are free again: its sessions ended
    names = [e["node"]["name"] for e in (await caravan.gql(MINE, token=alice))["sessions"]["edges"]]
    assert sorted(n for n in names if n.startswith("omp-run")) == ["omp-run-1", "omp-run-1", "omp-run-2", "omp-run-2"]
    assert not browser.console_errors()
