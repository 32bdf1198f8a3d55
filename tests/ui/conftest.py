"""The web UI's fixtures: a real gateway and scheduler (``caravan``) and a headless Chromium signed in to nothing yet.

Every test of tests/ui/ is marked ``ui`` (skipped without chromium, chromedriver or the built UI; not in the quick
tier). After each test the browser's console must hold no error; a test that fails leaves a screenshot of the page in
``.caravan/ui-failures/<test>.png`` (its path is in the failure's report)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.harness import Caravan
from tests.ui.browser import Browser, chromium

FAILURES = Path(__file__).resolve().parents[2] / ".caravan" / "ui-failures"
"""Where a failing UI test leaves its screenshot."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
async def browser(request: pytest.FixtureRequest, caravan: Caravan) -> AsyncIterator[Browser]:
    driver = await asyncio.to_thread(chromium)
    ui = Browser(driver, caravan.url.removesuffix("/graphql"))
    try:
        yield ui
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
            shot = await asyncio.to_thread(ui.screenshot, FAILURES / f"{name}.png")
            report.sections.append(("screenshot", str(shot)))
            report.sections.append(("browser console", "\n".join(await asyncio.to_thread(ui.console_errors))))
            print(f"screenshot of the failing page: {shot}")
        else:
            errors = await asyncio.to_thread(ui.console_errors)
            assert not errors, f"the browser's console has errors: {errors}"
    finally:
        await asyncio.to_thread(driver.quit)
