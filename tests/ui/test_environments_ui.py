"""The launcher's environment picker in a real headless Chromium: a researcher picks "Python + Jupyter" and its version
from the catalog (no image typed, no port), mounts a folder, launches, and opens Jupyter from the session page on the
app's own origin through HAProxy, where the mounted folder shows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from core.settings import Settings
from tests.conftest import DOCKER, STACK
from tests.e2e.test_storage import ready_folder
from tests.harness import Caravan
from tests.ingress import caravan_behind_haproxy
from tests.ui.browser import Browser, attribute_is, fill, sign_in, text_in, visible, wait

JUPYTER_IMAGE = STACK.get("CARAVAN_JUPYTER_IMAGE", "")
pytestmark = [
    pytest.mark.ui,
    pytest.mark.skipif(not (DOCKER and JUPYTER_IMAGE), reason="needs Docker and ops/build-env-images"),
]
REGISTER = "mutation($i: String!) { registerEnvironment(image: $i) { image } }"


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with caravan_behind_haproxy(settings) as (running, _):
        yield running


async def test_jupyter_launched_from_the_environment_picker_opens_on_its_origin(
    caravan: Caravan, browser: Browser
) -> None:
    await caravan.gql(REGISTER, {"i": JUPYTER_IMAGE})
    alice = await caravan.user("alice")
    await ready_folder(caravan, alice, "notebooks")
    name = f"ui-jupyter-{uuid.uuid4().hex[:6]}"

    def launch(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        d.find_element(By.LINK_TEXT, "Launch").click()
        environment = Select(visible(d, "#f-environment"))
        assert "Python 3" in " ".join(o.text for o in environment.options)
        environment.select_by_value("python")
        version = Select(visible(d, "#f-image"))  # the version picker: the image's tag, its apps in the hint
        assert version.first_selected_option.get_attribute("value") == JUPYTER_IMAGE
        text_in(d, "#hint-image", "jupyter")
        fill(d, {"name": name, "mem": "1g", "mounts": "notebooks:/home/work/data:RW"})
        d.find_element(By.ID, "launch").click()
        visible(d, "#session-detail")
        attribute_is(d, "#session-detail", "data-status", "RUNNING", timeout=180)
        start = d.window_handles
        app = visible(d, "button.app[data-app='jupyter']")
        wait(d).until(lambda d: app.is_enabled())
        app.click()
        wait(d).until(lambda d: len(d.window_handles) == len(start) + 1)
        d.switch_to.window(next(h for h in d.window_handles if h not in start))
        wait(d).until(lambda d: d.current_url.startswith("http://jupyter--"))  # the tab opens blank, then goes
        # Jupyter's file list, with the mounted folder (the page reloads until Jupyter answers: it starts with the
        # session)
        for _ in range(60):
            if d.find_elements(By.CSS_SELECTOR, "#notebook_list a[href$='/tree/data']"):
                break
            d.refresh()
            wait(d).until(lambda d: d.execute_script("return document.readyState") == "complete")
        visible(d, "#notebook_list a[href$='/tree/data']", timeout=30)

    await browser.run(launch)
