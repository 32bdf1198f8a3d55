""" "Try preferred port" in a real headless Chromium against the real gateway, scheduler and Nomad: the launcher's
checkbox and port field, the API's refusal on that field, and the session page saying whether the port was granted
or taken (then the app's other host port)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e.test_preferred_port import SERVE, free_preferred_port
from tests.harness import Caravan
from tests.ui.browser import Browser, fill, sign_in, visible, wait

pytestmark = [pytest.mark.ui]


def launch_preferring(d: WebDriver, name: str, port: str) -> None:
    d.find_element(By.LINK_TEXT, "Launch").click()
    fill(d, {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "cpu": "0.25", "mem": "64m",
             "startupCommand": SERVE.replace("$WHO", name), "apps": "db:8080:TCP"})  # fmt: skip
    box = visible(d, "#f-preferPort")
    if not box.is_selected():  # the form keeps what the last launch from it asked
        box.click()
    fill(d, {"preferredPort": port})
    d.find_element(By.ID, "launch").click()


def shown_port(d: WebDriver) -> dict[str, Any]:
    """The session page's word on the app's preferred port, once Nomad published the app."""
    note = visible(d, ".preferred-port[data-app='db']")
    wait(d, 90).until(lambda _: "host port" in d.find_element(By.CSS_SELECTOR, "ul.apps li").text)
    return {"taken": note.get_attribute("data-taken"), "text": d.find_element(By.CSS_SELECTOR, "ul.apps li").text}


async def test_the_launcher_asks_for_a_preferred_port_and_the_page_says_what_came_of_it(
    caravan: Caravan, browser: Browser
) -> None:
    alice = await caravan.user("alice")
    wanted = await free_preferred_port(caravan)

    def refused(d: WebDriver) -> str:
        sign_in(d, browser.base, alice)
        launch_preferring(d, "privileged", "80")
        return str(visible(d, "#error-preferredPort").get_attribute("data-code"))

    assert await browser.run(refused) == "INVALID_INPUT"

    def launched(name: str) -> Callable[[WebDriver], dict[str, Any]]:
        def step(d: WebDriver) -> dict[str, Any]:
            launch_preferring(d, name, str(wanted))
            wait(d).until(lambda _: "/launch" not in d.current_url)
            return shown_port(d)

        return step

    first = await browser.run(launched("first"))
    assert first["taken"] == "false" and f"host port {wanted}" in first["text"], first

    second = await browser.run(launched("second"))  # the same node: the first holds the port
    assert second["taken"] == "true" and f"preferred port {wanted} was taken" in second["text"], second
    assert f"host port {wanted}" not in second["text"]
    assert not browser.console_errors()
