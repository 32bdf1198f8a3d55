"""The Folders page in a real headless Chromium against the real gateway, scheduler (its job owner makes each folder
a Nomad host volume), Redis and Nomad: a folder made, filled through the page's upload (in pieces, with progress)
and read back byte for byte through its download, renamed, trashed and restored; shared RO with another user, who
sees it only then and cannot write to it."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.harness import Caravan
from tests.ui.browser import Browser, attribute_is, fill, fill_select, sign_in, text_in, type_over, visible, wait

pytestmark = [pytest.mark.ui]

SIZE = 9 * 1024 * 1024 + 12345
"""Bytes of the uploaded file: more than one of the page's 8 MiB pieces, so the upload appends at an offset too."""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def open_folder(d: WebDriver, name: str) -> None:
    visible(d, f"tr[data-folder='{name}'] button").click()
    visible(d, "#folder-card")


def folders_page(d: WebDriver, base: str, token: str) -> None:
    """Sign in (after signing out whoever was) and open the Folders page."""
    if d.find_elements(By.ID, "sign-out"):
        d.find_element(By.ID, "sign-out").click()
    sign_in(d, base, token)
    d.get(base + "/ui/folders")


def type_into(d: WebDriver, css: str, text: str) -> None:
    field = visible(d, css)
    type_over(d, field, text)


async def test_a_folder_is_filled_downloaded_renamed_trashed_restored_and_shared_read_only(
    caravan: Caravan, browser: Browser, tmp_path: Path
) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    name, renamed = unique("ui-data"), unique("ui-kept")
    payload = os.urandom(SIZE)
    source = tmp_path / "upload" / "sample.bin"
    source.parent.mkdir()
    source.write_bytes(payload)
    downloads = tmp_path / "downloads"
    downloads.mkdir()

    def as_alice(d: WebDriver) -> None:
        d.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        sign_in(d, browser.base, alice)
        d.find_element(By.LINK_TEXT, "Folders").click()
        visible(d, "#no-folders")  # the empty state
        type_into(d, "#f-folder-name", "bad name!")
        d.find_element(By.ID, "create-folder").click()
        error = visible(d, "#error-folder-name")  # the API's refusal, under its field
        assert error.get_attribute("data-code") == "INVALID_INPUT"
        assert d.find_element(By.ID, "f-folder-name").get_attribute("aria-invalid") == "true"
        type_into(d, "#f-folder-name", name)
        d.find_element(By.ID, "create-folder").click()
        attribute_is(d, "#folder-card", "data-status", "READY")
        visible(d, "#no-files")
        d.find_element(By.ID, "upload-input").send_keys(str(source))
        text_in(d, "#files-done", "Uploaded sample.bin")
        row = visible(d, "tr[data-file='sample.bin']")
        assert "9.0 MiB" in row.text
        row.find_element(By.CSS_SELECTOR, "button[aria-label='Download sample.bin']").click()
        saved = downloads / "sample.bin"
        wait(d).until(lambda _: saved.is_file() and saved.stat().st_size == SIZE)
        assert hashlib.sha256(saved.read_bytes()).digest() == hashlib.sha256(payload).digest()
        text_in(d, f"tr[data-folder='{name}']", "9.0 MiB")  # the usage, counted by the file API

        type_into(d, "#f-mkdir", "raw")  # a directory, a file moved into it and back, the directory deleted
        d.find_element(By.ID, "mkdir").click()
        visible(d, "tr[data-file='raw'][data-type='dir']")
        d.find_element(By.CSS_SELECTOR, "button[aria-label='Move or rename sample.bin']").click()
        type_into(d, "#f-move-to", "raw/sample.bin")
        d.find_element(By.ID, "move").click()
        text_in(d, "#files-done", "Moved sample.bin")
        assert not d.find_elements(By.CSS_SELECTOR, "tr[data-file='sample.bin']")
        d.find_element(By.CSS_SELECTOR, "button[aria-label='Open directory raw']").click()
        visible(d, "tr[data-file='sample.bin']").find_element(By.CSS_SELECTOR, "button[aria-label^='Move']").click()
        type_into(d, "#f-move-to", "sample.bin")
        d.find_element(By.ID, "move").click()
        visible(d, "#no-files")
        d.find_element(By.CSS_SELECTOR, "nav.crumbs button").click()  # back to the folder's top
        visible(d, "button[aria-label='Delete raw']").click()
        d.switch_to.alert.accept()
        text_in(d, "#files-done", "Deleted raw")
        assert not d.find_elements(By.CSS_SELECTOR, "tr[data-file='raw']")
        visible(d, "tr[data-file='sample.bin']")

        type_into(d, "#f-rename-folder", renamed)
        d.find_element(By.ID, "rename-folder").click()
        visible(d, f"tr[data-folder='{renamed}']")
        d.find_element(By.ID, "trash-folder").click()
        attribute_is(d, "#folder-card", "data-status", "TRASHED")
        assert visible(d, "#purge-at").text not in ("", "—")
        assert not d.find_elements(By.ID, "file-browser")  # no file access in the trash
        d.find_element(By.ID, "restore-folder").click()
        attribute_is(d, "#folder-card", "data-status", "READY")
        visible(d, "tr[data-file='sample.bin']")

    await browser.run(as_alice)

    def bob_sees_nothing(d: WebDriver) -> None:
        folders_page(d, browser.base, bob)
        visible(d, "#no-folders")

    await browser.run(bob_sees_nothing)

    def alice_shares(d: WebDriver) -> None:
        folders_page(d, browser.base, alice)
        open_folder(d, renamed)
        type_into(d, "#f-share-whom", "nobody-such")
        d.find_element(By.ID, "share-folder").click()
        assert visible(d, "#error-share-whom").get_attribute("data-code")  # the API's refusal, under its field
        type_into(d, "#f-share-whom", "bob")
        fill_select(d, "#f-share-mode", "RO")
        d.find_element(By.ID, "share-folder").click()
        visible(d, "li[data-share='user:bob']")

    await browser.run(alice_shares)

    def bob_reads(d: WebDriver) -> str:
        folders_page(d, browser.base, bob)
        row = visible(d, f"tr[data-folder='{renamed}']")
        assert row.find_element(By.CSS_SELECTOR, "[data-mode]").text == "RO"
        open_folder(d, renamed)
        visible(d, "#read-only")
        visible(d, "tr[data-file='sample.bin']")
        assert not d.find_elements(By.ID, "upload-input")  # no upload control on an RO share
        assert not d.find_elements(By.CSS_SELECTOR, "button[aria-label='Delete sample.bin']")
        assert not d.find_elements(By.ID, "trash-folder")
        folder_id = str(d.find_element(By.ID, "folder-card").get_attribute("data-id"))
        # the launcher mounts folders by name: an RO share asked RW is the API's FORBIDDEN on the mount's mode
        d.find_element(By.LINK_TEXT, "Launch").click()
        fill(
            d,
            {
                "name": unique("ui-mount"),
                "type": "BATCH",
                "driver": "EXEC",
                "startupCommand": "true",
                "mounts": f"{renamed}:/data:RW",
            },
        )
        d.find_element(By.ID, "launch").click()
        error = visible(d, "#error-mounts")
        assert error.get_attribute("data-code") == "FORBIDDEN" and "read-only" in error.text, error.text
        return folder_id

    folder_id = await browser.run(bob_reads)
    refused = await caravan.http.put(
        caravan.url.removesuffix("/graphql") + f"/folders/{folder_id}/files",
        params={"path": "bob.txt"},
        content=b"no",
        headers={"Authorization": f"Bearer {bob}"},
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
