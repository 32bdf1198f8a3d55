"""A researcher's flow in a real headless Chromium: pick "Python + Jupyter" and its version in the launcher (no image
typed, no port), mount a folder, launch, open Jupyter from the session page on the app's own origin through HAProxy,
run a cell of a notebook in the mounted folder (Shift+Enter) and save it (Ctrl+S), terminate the session, and find
the notebook on the Folders page. With ``CARAVAN_SCREENSHOTS`` set, it also shoots the launcher and Jupyter there."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from core.settings import Settings
from domain.users import Role
from tests.conftest import DOCKER, STACK
from tests.e2e.test_storage import ready_folder
from tests.harness import Caravan
from tests.ingress import caravan_behind_haproxy
from tests.ui.browser import Browser, attribute_is, fill, sign_in, text_in, type_over, visible, wait

JUPYTER_IMAGE = STACK.get("CARAVAN_JUPYTER_IMAGE", "")
pytestmark = [
    pytest.mark.ui,
    pytest.mark.docker,
    pytest.mark.skipif(not (DOCKER and JUPYTER_IMAGE), reason="needs Docker and ops/build-env-images"),
]
REGISTER = "mutation($i: String!) { registerEnvironment(image: $i) { image } }"
SHOTS = os.environ.get("CARAVAN_SCREENSHOTS")
CELL = "import numpy as np, pandas as pd\nprint('sum of squares', int((pd.Series(np.arange(10)) ** 2).sum()))"
NEW_NOTEBOOK = """
const [source, done] = arguments;
const xsrf = decodeURIComponent(document.cookie.match(/_xsrf=([^;]+)/)[1]);
const cell = {cell_type: "code", source, metadata: {}, outputs: [], execution_count: null};
const content = {nbformat: 4, nbformat_minor: 4, metadata: {}, cells: [cell]};
fetch("/api/contents/data/analysis.ipynb", {method: "PUT", headers: {"X-XSRFToken": xsrf},
  body: JSON.stringify({type: "notebook", content})}).then((r) => done(r.status), (e) => done(String(e)));
"""
READ_NOTEBOOK = """
const done = arguments[0];
fetch("/api/contents/data/analysis.ipynb").then((r) => r.text()).then(done, (e) => done(String(e)));
"""
"""Jupyter's own page makes the notebook file in the mounted folder, as its "New" menu would (one call of its API from
its origin, with its XSRF cookie); the cell is then run and saved by keyboard in Jupyter's editor."""


def shoot(d: WebDriver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(Path(SHOTS) / name))


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
        d.execute_script("window.scrollTo(0, 0)")
        shoot(d, "launcher-environment.png")
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
        origin = d.current_url.split("/tree")[0]
        assert d.execute_async_script(NEW_NOTEBOOK, CELL) == 201
        d.get(origin + "/notebooks/data/analysis.ipynb")
        visible(d, "#kernel_indicator_icon.kernel_idle_icon", timeout=120)  # its kernel started, over the WebSocket
        visible(d, ".code_cell .CodeMirror").click()
        ActionChains(d).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
        text_in(d, ".output_subarea", "sum of squares 285", timeout=60)
        ActionChains(d).key_down(Keys.CONTROL).send_keys("s").key_up(Keys.CONTROL).perform()
        wait(d, 30).until(lambda d: "sum of squares 285" in d.execute_async_script(READ_NOTEBOOK))  # saved, output
        shoot(d, "jupyter.png")
        d.close()
        # Jupyter's page logs its own errors (its optional widgets extension is not installed: a 404; a kernel
        # session race it handles); none may come from Caravan's pages
        assert all(e.startswith("http://jupyter--") for e in browser.console_errors()), browser.console
        d.switch_to.window(start[0])
        d.find_element(By.ID, "terminate").click()
        d.switch_to.alert.accept()
        attribute_is(d, "#session-detail", "data-status", "TERMINATED", timeout=120)
        d.find_element(By.LINK_TEXT, "Folders").click()
        visible(d, "tr[data-folder='notebooks'] button").click()
        visible(d, "tr[data-file='analysis.ipynb']")

    await browser.run(launch)


async def test_a_superadmin_registers_and_retires_an_environment_on_the_admin_page(
    caravan: Caravan, browser: Browser
) -> None:
    root = await caravan.user("root", Role.SUPERADMIN)
    alice = await caravan.user("alice")
    row = f"#environments tr[data-image='{JUPYTER_IMAGE}']"

    def register_and_retire(d: WebDriver) -> None:
        sign_in(d, browser.base, root)
        d.find_element(By.ID, "nav-admin").click()
        d.find_element(By.LINK_TEXT, "Environments").click()
        visible(d, ".empty")
        fill_in = visible(d, "#environment-image")
        fill_in.send_keys("caravan/nothing-here:1")
        d.find_element(By.ID, "register-environment").click()
        text_in(d, "[role=alert]", "NOT_FOUND")  # the engine has no such image: nothing registered
        type_over(d, fill_in, JUPYTER_IMAGE)
        d.find_element(By.ID, "register-environment").click()
        text_in(d, row, "jupyter:8888")  # read from the image's labels
        text_in(d, f"{row} .status", "offered")
        visible(d, f"{row} button").click()
        text_in(d, f"{row} .status", "retired")

    await browser.run(register_and_retire)

    def user_launcher(d: WebDriver) -> None:  # retired: the launcher offers no environment, the image field is back
        d.find_element(By.ID, "sign-out").click()
        sign_in(d, browser.base, alice)
        d.find_element(By.LINK_TEXT, "Launch").click()
        visible(d, "input#f-image")
        assert not d.find_elements(By.ID, "f-environment")

    await browser.run(user_launcher)
