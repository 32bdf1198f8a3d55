"""The Usage page in a real headless Chromium against the real gateway and Redis: an admin sees both users' usage
stacked per day and in the table, regroups it by project and downloads the same report as CSV; a user sees only
their own. (The sessions are ended through the session store, in a resource group no agent serves.)"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from domain.users import Role
from tests.harness import Caravan
from tests.stores.test_usage import new_session, run_and_end
from tests.ui.browser import Browser, fill_select, sign_in, text_in, visible, wait

pytestmark = [pytest.mark.ui]

CAPTURE_DOWNLOADS = """
window.__downloads = [];
URL.createObjectURL = (blob) => { window.__downloads.push(blob); return "data:text/csv,captured"; };
"""
DOWNLOADED_TEXT = """
const done = arguments[arguments.length - 1];
window.__downloads[0].text().then(done);
"""


async def test_the_usage_page_charts_tables_and_exports_what_the_viewer_may_see(
    caravan: Caravan, browser: Browser
) -> None:
    alice = await caravan.user("alice", projects=("p1",))
    await caravan.user("bob", projects=("p2",))
    admin = await caravan.user("boss", Role.ADMIN, projects=("p1", "p2"))
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    held = max(2, min(3600, int((datetime.now(UTC) - midnight).total_seconds()) - 2))
    alice_session = new_session(owner="alice", project="p1", group="ui-no-agents")
    bob_session = new_session(owner="bob", project="p2", group="ui-no-agents", kernels=2)
    await run_and_end(caravan.store, alice_session.evolve(created_at=midnight), midnight, held)
    await run_and_end(caravan.store, bob_session.evolve(created_at=midnight), midnight, held)
    cpu_hours = {"alice": f"{held * 0.5 / 3600:.2f}", "bob": f"{held * 1.0 / 3600:.2f}"}

    def as_admin(d: WebDriver) -> str:
        sign_in(d, browser.base, admin)
        d.find_element(By.ID, "nav-usage").click()
        fill_select(d, "#usage-zone", "UTC")
        visible(d, "#usage-table")
        for user, hours in cpu_hours.items():
            text_in(d, f"#usage-table tr[data-key='{user}'] td[data-slot='cpu']", hours)
        bars = d.find_elements(By.CSS_SELECTOR, "#usage-chart rect[data-key]")
        assert {b.get_attribute("data-key") for b in bars} == {"alice", "bob"}
        fill_select(d, "#usage-by", "project")
        text_in(d, "#usage-table tr[data-key='p2'] td[data-slot='cpu']", cpu_hours["bob"])
        d.execute_script(CAPTURE_DOWNLOADS)
        d.find_element(By.ID, "usage-csv").click()
        wait(d).until(lambda _: d.execute_script("return window.__downloads.length") == 1)
        text: str = d.execute_async_script(DOWNLOADED_TEXT)
        d.find_element(By.ID, "sign-out").click()
        return text

    csv_text = await browser.run(as_admin)
    header, *lines = csv_text.strip().splitlines()
    assert header.startswith("day,project,seconds,kernel_seconds")
    assert sorted(line.split(",")[1] for line in lines) == ["p1", "p2"]
    assert all(line.split(",")[2] == str(held) for line in lines)

    def as_alice(d: WebDriver) -> list[str]:
        sign_in(d, browser.base, alice)
        d.find_element(By.ID, "nav-usage").click()
        fill_select(d, "#usage-zone", "UTC")
        visible(d, "#usage-table")
        wait(d).until(lambda _: d.find_elements(By.CSS_SELECTOR, "#usage-table tbody tr"))
        return [str(r.get_attribute("data-key")) for r in d.find_elements(By.CSS_SELECTOR, "#usage-table tbody tr")]

    assert await browser.run(as_alice) == ["p1"]  # her project: bob's usage is not in her answer
