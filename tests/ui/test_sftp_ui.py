"""SFTP access from the Folders page against the real stack with the SFTP image (ops/build-sftp-image): the API's
refusal of a bad key under its field, then a generated key shown once and the server's address once it runs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from core.settings import Settings
from tests.conftest import STACK
from tests.harness import Caravan, running_caravan
from tests.ui.browser import Browser, text_in, visible
from tests.ui.test_folders_ui import folders_page, type_into, unique

SFTP_IMAGE = STACK.get("CARAVAN_SFTP_IMAGE", "")
pytestmark = [pytest.mark.ui, pytest.mark.skipif(not SFTP_IMAGE, reason="no SFTP image: run ops/build-sftp-image")]


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with running_caravan(dataclasses.replace(settings, sftp_image=SFTP_IMAGE)) as running:
        yield running


async def test_sftp_access_shows_the_address_and_a_generated_key_once(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    name = unique("ui-sftp")
    made = await caravan.gql(CREATE_FOLDER, {"name": name}, token=alice)
    folder_id = made["createFolder"]["id"]

    def step(d: WebDriver) -> tuple[str, str]:
        folders_page(d, browser.base, alice)
        visible(d, f"input[data-sftp-folder='{name}']").click()  # offered once READY
        type_into(d, "#f-sftp-key", "ssh-rsa not-a-key")
        d.find_element(By.ID, "request-sftp").click()
        assert visible(d, "#error-sftp-key").get_attribute("data-code") == "INVALID_INPUT"
        visible(d, "#f-sftp-key").send_keys(Keys.CONTROL, "a", Keys.BACKSPACE)  # an input event, as a user's
        d.find_element(By.ID, "request-sftp").click()
        text_in(d, "#sftp-private-key", "Shown once")
        key = str(visible(d, "#sftp-key-text").get_attribute("value"))
        assert key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        address = visible(d, "#sftp-address", timeout=90).text  # once the SFTP session runs
        session = d.find_element(By.CSS_SELECTOR, "#sftp-access a").text
        return address, session

    address, session_id = await browser.run(step)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", address), address
    mounts = await caravan.gql(SESSION_MOUNTS, {"id": session_id}, token=alice)
    assert [m["folder"] for m in mounts["session"]["mounts"]] == [folder_id]
    await caravan.gql(
        "mutation($ids: [ID!]!) { destroySession(ids: $ids, forced: true) { id } }", {"ids": [session_id]}
    )


CREATE_FOLDER = "mutation($name: String!) { createFolder(input: {name: $name}) { id } }"
SESSION_MOUNTS = "query($id: ID!) { session(id: $id) { mounts { folder } } }"
