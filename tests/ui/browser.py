"""A real headless Chromium (Debian's ``chromium`` through ``chromium-driver``, driven by Selenium; no browser is
downloaded) for the web UI's tests and ``bench/ui``.

The gateway under test runs in the test's event loop, so nothing may block it: every Selenium call runs in a worker
thread (:meth:`Browser.run`), a whole step at a time (a function of the driver)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

T = TypeVar("T")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 30.0
"""Seconds a step waits for the page to show something (sessions running, logs arriving) before it fails."""
SCREEN = (1366, 800)
"""A laptop's screen, the smallest the UI is laid out for."""


def chromium(*, width: int = SCREEN[0], height: int = SCREEN[1]) -> WebDriver:
    """A fresh headless Chromium with its own profile, collecting the console's messages."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--disable-extensions",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-popup-blocking",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER, log_output=os.devnull))
    driver.set_page_load_timeout(WAIT)
    return driver


class Browser:
    """One Chromium and the gateway it talks to."""

    def __init__(self, driver: WebDriver, base: str) -> None:
        self.driver = driver
        self.base = base.rstrip("/")
        self.console: list[dict[str, Any]] = []
        """Every console message read so far (:meth:`console_errors` reads the new ones)."""

    async def run(self, step: Callable[[WebDriver], T]) -> T:
        """Run one step (Selenium calls) in a worker thread, off the event loop the gateway serves on."""
        return await asyncio.to_thread(step, self.driver)

    def console_errors(self) -> list[str]:
        """The console's errors (SEVERE: uncaught exceptions, failed loads, console.error) since the last call."""
        entries = self.driver.get_log("browser")
        self.console.extend(entries)
        return [entry["message"] for entry in entries if entry["level"] == "SEVERE"]

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return path


def wait(driver: WebDriver, timeout: float = WAIT) -> WebDriverWait[WebDriver]:
    return WebDriverWait(driver, timeout, poll_frequency=0.05)


def visible(driver: WebDriver, selector: str, timeout: float = WAIT, *, by: str = By.CSS_SELECTOR) -> WebElement:
    element: WebElement = wait(driver, timeout).until(ec.visibility_of_element_located((by, selector)))
    return element


def text_in(driver: WebDriver, css: str, text: str, timeout: float = WAIT) -> None:
    wait(driver, timeout).until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))


def attribute_is(driver: WebDriver, css: str, name: str, value: str, timeout: float = WAIT) -> WebElement:
    """Wait until the element at ``css`` has ``name="value"``; the element."""

    def found(d: WebDriver) -> WebElement | bool:
        for element in d.find_elements(By.CSS_SELECTOR, css):
            if element.get_attribute(name) == value:
                return element
        return False

    element: WebElement = wait(driver, timeout).until(found)
    return element


def sign_in(driver: WebDriver, base: str, token: str) -> None:
    """Open the UI and sign in with ``token``; returns once the viewer's name shows."""
    driver.get(base + "/ui/")
    field = visible(driver, "#token")
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form[aria-label='Sign in'] button[type=submit]").click()
    visible(driver, "#viewer-name")


def fill_select(driver: WebDriver, css: str, value: str) -> None:
    """Choose ``value`` in the select at ``css`` (by its value, or by its text for an option without one)."""
    choices = Select(visible(driver, css))
    try:
        choices.select_by_value(value)
    except NoSuchElementException:
        choices.select_by_visible_text(value)


CLEARED = "arguments[0].dispatchEvent(new Event('input', {bubbles: true}))"
"""Tell the page a field was emptied: WebDriver's ``clear()`` fires no ``input`` event, so without it the page's state
keeps the old text and its next render (a list refreshing every few seconds) puts it back, before the new text."""


def type_over(driver: WebDriver, element: WebElement, text: str) -> None:
    """Replace a text field's content with ``text``, as the page's state sees it (see :data:`CLEARED`)."""
    element.clear()
    driver.execute_script(CLEARED, element)
    element.send_keys(text)


def fill(driver: WebDriver, fields: dict[str, str]) -> None:
    """Type into (or select in) the launcher's fields, by the form field's name (``#f-<name>``)."""
    for name, value in fields.items():
        element = visible(driver, f"#f-{name}")
        if element.tag_name == "select":
            fill_select(driver, f"#f-{name}", value)
        else:
            type_over(driver, element, value)
