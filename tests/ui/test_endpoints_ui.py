"""The Endpoints page, in headless Chromium, for a real endpoint on real Nomad behind the stack's HAProxy: its
figures (url, replicas, requests, latency), its chart once the series has points, a token issued and revoked from
the page (checked through the endpoint itself), the public toggle. With ``CARAVAN_SCREENSHOTS`` set
(``./ops/ui-screenshots``) it leaves ``endpoints.png`` there for the docs."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from core.settings import Settings
from tests.e2e.test_inference import eventually
from tests.e2e.test_inference_endpoints import MODEL, _create, _serving, _settings, _until
from tests.harness import ADMIN_TOKEN, Caravan
from tests.ingress import caravan_behind_haproxy
from tests.ui.browser import Browser, sign_in, text_in, type_over, visible

pytestmark = [pytest.mark.ui]


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with caravan_behind_haproxy(_settings(settings)) as (running, _):
        yield running


async def test_the_endpoints_page_shows_an_endpoint_and_manages_its_tokens(
    caravan: Caravan, browser: Browser, tmp_path: Path
) -> None:
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    model.chmod(0o644)
    tmp_path.chmod(0o755)
    endpoint = await _create(caravan, model, replicas=1)
    await _serving(endpoint, 1)
    for _ in range(30):
        assert (await endpoint.get("/")).status_code == 200

    async def charted() -> bool | None:
        found = await caravan.gql(
            "query($id: ID!) { session(id: $id) { endpoint { series { at } stats { requestsTotal } } } }",
            {"id": endpoint.session_id},
        )
        ep = found["session"]["endpoint"]
        return True if len(ep["series"]) >= 2 and ep["stats"]["requestsTotal"] >= 30 else None

    await eventually(charted, "two points of the endpoint's series")
    card = f"article[data-endpoint='{endpoint.session_id}']"

    def figures(d: WebDriver) -> None:
        sign_in(d, browser.base, ADMIN_TOKEN)
        d.find_element(By.ID, "nav-endpoints").click()
        visible(d, card)
        assert d.find_element(By.CSS_SELECTOR, f"{card} [data-url]").text == endpoint.url
        text_in(d, f"{card} [data-replicas]", "1 / 1")
        text_in(d, f"{card} [data-access]", "private")
        requests = int(d.find_element(By.CSS_SELECTOR, f"{card} [data-errors]").text.split(" / ")[0])
        assert requests >= 30
        text_in(d, f"{card} [data-latency]", "ms")
        chart = visible(d, f"{card} svg.endpoint-chart")
        assert int(chart.get_attribute("data-points") or 0) >= 2
        assert chart.find_element(By.CSS_SELECTOR, "polyline[data-line='rps']").get_attribute("points")
        if os.environ.get("CARAVAN_SCREENSHOTS"):
            d.execute_script("window.scrollTo(0, 0)")
            browser.screenshot(Path(os.environ["CARAVAN_SCREENSHOTS"]) / "endpoints.png")

    await browser.run(figures)

    def issue(d: WebDriver) -> str:
        type_over(d, visible(d, f"{card} [data-issue-name]"), "from-the-page")
        d.find_element(By.CSS_SELECTOR, f"{card} [data-issue]").click()
        visible(d, f"{card} li[data-token='from-the-page']")
        return visible(d, f"{card} [data-secret] code").text

    secret = await browser.run(issue)
    assert secret.startswith("cep_")
    await _until(endpoint, secret, 200)  # the token the page issued calls the endpoint

    def revoke(d: WebDriver) -> None:
        d.find_element(By.CSS_SELECTOR, f"{card} [data-revoke='from-the-page']").click()
        visible(d, f"{card} .endpoint-tokens .empty")

    await browser.run(revoke)
    await _until(endpoint, secret, 401)  # revoked from the page: refused

    def make_public(d: WebDriver) -> None:
        d.find_element(By.CSS_SELECTOR, f"{card} [data-toggle-public]").click()
        text_in(d, f"{card} [data-access]", "public")

    await browser.run(make_public)
    await _until(endpoint, None, 200)
