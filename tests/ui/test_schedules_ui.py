"""The Schedules page in a real headless Chromium against the real gateway and scheduler (its schedule runner makes
the runs' sessions), Redis and Nomad: a schedule made from the page runs, its run shows in its history with a link
to its session, and it pauses; the API's refusals show under their fields (the schedule's own and its spec's)."""

from __future__ import annotations

import uuid

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.harness import Caravan
from tests.ui.browser import Browser, attribute_is, fill, sign_in, text_in, visible, wait

pytestmark = [pytest.mark.ui]


TEMPLATE = "mutation($input: CreateSessionTemplateInput!) { createSessionTemplate(input: $input) { id } }"


async def test_an_interval_schedule_made_on_the_page_runs_shows_its_session_and_pauses(
    caravan: Caravan, browser: Browser
) -> None:
    alice = await caravan.user("alice")
    name, templated = f"ui-every-{uuid.uuid4().hex[:6]}", f"ui-tmpl-{uuid.uuid4().hex[:6]}"
    spec = {"type": "BATCH", "driver": "EXEC", "startupCommand": "echo from the template"}
    made = await caravan.gql(TEMPLATE, {"input": {"name": "ui-nightly", "spec": spec}}, token=alice)
    template_id = made["createSessionTemplate"]["id"]

    def step(d: WebDriver) -> str:
        sign_in(d, browser.base, alice)
        d.find_element(By.LINK_TEXT, "Schedules").click()
        visible(d, "#no-schedules")  # the empty state
        visible(d, "#new-schedule").click()
        tz = d.execute_script("return Intl.DateTimeFormat().resolvedOptions().timeZone")
        assert visible(d, "#f-timeZone").get_attribute("value") == tz  # the browser's zone by default
        fill(d, {"scheduleName": name, "interval": "soon", "driver": "EXEC", "startupCommand": "echo scheduled"})
        d.find_element(By.ID, "save-schedule").click()
        error = visible(d, "#error-interval")  # the schedule's own field
        assert error.get_attribute("data-code") == "INVALID_INPUT"
        assert d.find_element(By.ID, "f-interval").get_attribute("aria-invalid") == "true"
        fill(d, {"interval": "2s", "mem": "lots"})
        d.find_element(By.ID, "save-schedule").click()
        assert (
            visible(d, "#error-mem").get_attribute("data-code") == "INVALID_INPUT"
        )  # spec.mem, under the launcher's field
        assert not d.find_elements(By.ID, "error-interval")
        fill(d, {"mem": "64m"})
        d.find_element(By.ID, "save-schedule").click()
        row = f"tr[data-schedule='{name}']"
        visible(d, row)
        link = visible(d, f"{row} a.run-session", timeout=60)  # a run, with its session
        session_id = str(link.get_attribute("data-session"))
        assert link.get_attribute("href").endswith(f"/ui/sessions/{session_id}")
        assert "CREATED" in d.find_element(By.CSS_SELECTOR, f"{row} .runs").text
        d.find_element(By.CSS_SELECTOR, f"button[aria-label='Edit {name}']").click()
        assert visible(d, "#f-interval").get_attribute("value") == "2s"  # the form holds the schedule as it is
        assert d.find_element(By.ID, "f-startupCommand").get_attribute("value") == "echo scheduled"
        fill(d, {"interval": "1h"})
        d.find_element(By.ID, "save-schedule").click()
        wait(d).until(lambda _: "every 1h" in d.find_element(By.CSS_SELECTOR, row).text)
        d.find_element(By.CSS_SELECTOR, f"button[aria-label='Pause {name}']").click()
        attribute_is(d, row, "data-paused", "true")
        visible(d, f"button[aria-label='Resume {name}']")

        d.find_element(By.ID, "new-schedule").click()  # from a template, with an override
        fill(d, {"scheduleName": templated, "interval": "1h", "templateId": template_id, "o_mem": "lots"})
        d.find_element(By.ID, "save-schedule").click()
        assert visible(d, "#error-o_mem").get_attribute("data-code") == "INVALID_INPUT"  # overrides.resources.mem
        fill(d, {"o_mem": "128m", "o_startupCommand": "echo overridden"})
        d.find_element(By.ID, "save-schedule").click()
        text_in(d, f"tr[data-schedule='{templated}']", "from a template")
        d.find_element(By.CSS_SELECTOR, f"button[aria-label='Edit {templated}']").click()  # its overrides, as they are
        assert visible(d, "#f-o_mem").get_attribute("value") == "128m"
        assert d.find_element(By.ID, "f-o_startupCommand").get_attribute("value") == "echo overridden"
        fill(d, {"o_startupCommand": "echo changed"})
        d.find_element(By.ID, "save-schedule").click()
        wait(d).until(lambda _: not d.find_elements(By.ID, "save-schedule"))  # saved, the form closed
        return session_id

    session_id = await browser.run(step)
    listed = await caravan.gql(
        "{ schedules(first: 5) { edges { node { name overridden "
        "overrides { startupCommand resources { slot amount } } } } } }",
        token=alice,
    )
    [edited] = [e["node"] for e in listed["schedules"]["edges"] if e["node"]["name"] == templated]
    assert sorted(edited["overridden"]) == ["resources", "startup_command"]
    assert edited["overrides"]["startupCommand"] == "echo changed"
    assert edited["overrides"]["resources"] == [{"slot": "mem", "amount": "128m"}]
    session = await caravan.gql("query($id: ID!) { session(id: $id) { name type } }", {"id": session_id}, token=alice)
    assert session["session"]["type"] == "BATCH" and session["session"]["name"].startswith(name)
