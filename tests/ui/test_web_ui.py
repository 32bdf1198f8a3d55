"""The web UI in a real headless Chromium against a real gateway, scheduler, Redis and Nomad: what a researcher and
an operator do every day, through the browser only (tests/ui/conftest.py: no console errors, screenshots on failure).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from core.clock import utcnow
from core.settings import Settings
from domain.users import Role
from tests.harness import CREATE, Caravan
from tests.idle.running import eventually, policy_file, running_idle, swept_since
from tests.ingress import caravan_behind_haproxy
from tests.ui.browser import Browser, attribute_is, fill, fill_select, sign_in, text_in, type_over, visible, wait

pytestmark = [pytest.mark.ui]


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    """As the README's stack: the apps' origins through a HAProxy of the test's own, in front of the gateway (the
    page itself is the gateway's)."""
    async with caravan_behind_haproxy(settings) as (running, _):
        yield running


NO_RELOAD = "window.__caravanNoReload = true"
"""Set once after loading: still set later means the page was never reloaded."""
STILL_LOADED = "return window.__caravanNoReload === true"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_sign_in_keeps_the_token_out_of_urls_and_sign_out_forgets_it(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")

    def step(d: WebDriver) -> None:
        d.get(browser.base + "/ui/")
        visible(d, "#token").send_keys("not-a-token")
        d.find_element(By.CSS_SELECTOR, "form[aria-label='Sign in'] button[type=submit]").click()
        text_in(d, "[role=alert]", "UNAUTHENTICATED")
        sign_in(d, browser.base, alice)
        assert d.find_element(By.ID, "viewer-name").text == "alice"
        assert alice not in d.current_url
        assert d.execute_script("return sessionStorage.getItem('caravan.token')") == alice
        assert d.execute_script("return localStorage.length") == 0
        assert not d.find_elements(By.ID, "nav-admin")  # a USER has no admin menu
        d.refresh()  # the tab keeps its sign-in
        visible(d, "#viewer-name")
        d.find_element(By.ID, "sign-out").click()
        visible(d, "#token")
        assert d.execute_script("return sessionStorage.getItem('caravan.token')") is None

    await browser.run(step)


async def test_a_batch_session_launched_from_the_form_reaches_success_without_a_reload(
    caravan: Caravan, browser: Browser
) -> None:
    alice = await caravan.user("alice")
    name = unique("ui-batch")

    def launch(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        d.execute_script(NO_RELOAD)
        d.find_element(By.LINK_TEXT, "Launch").click()
        fill(d, {"name": name, "type": "BATCH", "driver": "EXEC", "startupCommand": "echo hello from the browser"})
        d.find_element(By.ID, "launch").click()
        visible(d, "#session-detail")  # the new session's page
        attribute_is(d, "#session-detail", "data-status", "TERMINATED", timeout=90)
        text_in(d, "#session-result", "SUCCESS")
        text_in(d, "#history", "task-finished")
        assert d.execute_script(STILL_LOADED)
        d.find_element(By.LINK_TEXT, "Sessions").click()
        row = visible(d, f"tr[data-name='{name}']")
        assert row.find_element(By.CSS_SELECTOR, "[data-status]").get_attribute("data-status") == "TERMINATED"

    await browser.run(launch)


async def test_the_sessions_list_follows_a_new_session_live(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    name = unique("ui-live")

    def open_list(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        d.execute_script(NO_RELOAD)
        visible(d, "#no-sessions")  # the empty state
        text_in(d, ".live", "live")

    await browser.run(open_list)
    session = {"name": name, "type": "BATCH", "driver": "EXEC", "startupCommand": "sleep 1; echo done"}
    await caravan.gql(CREATE, {"input": session}, token=alice)

    def follow(d: WebDriver) -> None:
        visible(d, f"tr[data-name='{name}']")
        attribute_is(d, f"tr[data-name='{name}'] [data-status]", "data-status", "RUNNING", timeout=90)
        attribute_is(d, f"tr[data-name='{name}'] [data-status]", "data-status", "TERMINATED", timeout=90)
        assert d.execute_script(STILL_LOADED)

    await browser.run(follow)


async def test_a_validation_error_shows_next_to_its_field(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")

    def step(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        d.get(browser.base + "/ui/launch")
        fill(d, {"name": "x!", "driver": "EXEC"})
        d.find_element(By.ID, "launch").click()
        error = visible(d, "#error-name")
        assert error.get_attribute("data-code") == "INVALID_INPUT" and "name" in error.text
        assert d.find_element(By.ID, "f-name").get_attribute("aria-invalid") == "true"
        fill(d, {"name": unique("ui-valid"), "type": "BATCH", "startupCommand": ""})
        d.find_element(By.ID, "launch").click()
        error = visible(d, "#error-startupCommand")
        assert "startupCommand" in error.text
        assert not d.find_elements(By.ID, "error-name")  # the earlier error is gone
        fill(d, {"startupCommand": "true", "mem": "lots"})
        d.find_element(By.ID, "launch").click()
        assert visible(d, "#error-mem").get_attribute("data-code") == "INVALID_INPUT"

    await browser.run(step)


async def test_a_user_does_not_see_another_users_sessions(caravan: Caravan, browser: Browser) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    theirs = unique("ui-alice")
    made = await caravan.gql(CREATE, {"input": {"name": theirs, "type": "INTERACTIVE", "driver": "EXEC"}}, token=alice)
    alices = made["createSession"]["sessions"][0]["id"]
    mine = unique("ui-bob")
    await caravan.gql(CREATE, {"input": {"name": mine, "type": "INTERACTIVE", "driver": "EXEC"}}, token=bob)

    def step(d: WebDriver) -> None:
        sign_in(d, browser.base, bob)
        visible(d, f"tr[data-name='{mine}']")
        assert not d.find_elements(By.CSS_SELECTOR, f"tr[data-name='{theirs}']")
        assert "1 session(s)" in d.find_element(By.CSS_SELECTOR, ".pager").text
        d.get(f"{browser.base}/ui/sessions/{alices}")
        text_in(d, "[role=alert]", "NOT_FOUND")

    await browser.run(step)
    await caravan.gql("mutation($ids: [ID!]!) { destroySession(ids: $ids, forced: true) { id } }", {"ids": [alices]})


async def test_an_admin_sees_the_resource_group_bars(caravan: Caravan, browser: Browser) -> None:
    admin = await caravan.user("root", Role.SUPERADMIN)

    def step(d: WebDriver) -> None:
        sign_in(d, browser.base, admin)
        d.find_element(By.ID, "nav-admin").click()
        group = visible(d, "section.group[data-group='default']")
        cpu = group.find_element(By.CSS_SELECTOR, ".agent meter[data-slot='cpu']")
        assert float(cpu.get_attribute("max") or 0) > 0
        assert group.find_elements(By.CSS_SELECTOR, ".agent")  # each agent's own bars
        d.find_element(By.LINK_TEXT, "Users and tokens").click()
        text_in(d, "#users", "root")
        d.find_element(By.LINK_TEXT, "Presets and policies").click()
        text_in(d, ".content", "User policies")

    await browser.run(step)


SITE = r"""
mkdir -p /tmp/w && echo 'hello from the app' > /tmp/w/index.html && : > /tmp/w/favicon.ico
httpd -f -p 8080 -h /tmp/w &
i=0; while true; do i=$((i+1)); echo "tick $i"; sleep 0.5; done
"""


async def test_an_interactive_session_logs_app_and_terminate(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    name = unique("ui-app")
    session = {
        "name": name,
        "type": "INTERACTIVE",
        "driver": "EXEC",
        "startupCommand": SITE,
        "apps": [{"name": "web", "port": 8080}],
    }
    made = await caravan.gql(CREATE, {"input": session}, token=alice)
    session_id = made["createSession"]["sessions"][0]["id"]

    def step(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        d.execute_script(NO_RELOAD)
        visible(d, f"tr[data-name='{name}'] a").click()
        attribute_is(d, "#session-detail", "data-status", "RUNNING", timeout=90)
        text_in(d, "#logs", "tick 3")  # followed live
        d.find_element(By.ID, "log-follow").click()  # stop following
        text_in(d, "#log-follow", "Follow")
        start = d.window_handles
        d.find_element(By.CSS_SELECTOR, "button.app[data-app='web']").click()
        wait(d).until(lambda d: len(d.window_handles) == len(start) + 1)
        main = d.current_window_handle
        d.switch_to.window(next(h for h in d.window_handles if h not in start))
        wait(d).until(lambda d: "hello from the app" in d.page_source)
        assert d.current_url.startswith(f"http://web--{session_id}.")
        d.close()
        d.switch_to.window(main)
        d.find_element(By.XPATH, "//button[text()='Open terminal']").click()
        text_in(d, "#terminal-state", "open")
        # type at the shell's prompt ('$' or '#'; the banner before it has neither), as a person would
        wait(d).until(lambda d: any(p in d.find_element(By.CSS_SELECTOR, ".xterm-rows").text for p in "$#"))
        d.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea").send_keys("echo typed-$((40+2))\n")
        text_in(d, ".xterm-rows", "typed-42")  # the shell's answer, through the terminal WebSocket
        d.find_element(By.ID, "restart").click()
        text_in(d, "#notice", "Restart requested")

    await browser.run(step)

    async def restarted() -> bool | None:
        found = await caravan.store.get(session_id)
        return True if found and found.kernels[0].restarts >= 1 and found.status.value == "RUNNING" else None

    await eventually(restarted, timeout=60)

    def rename_and_terminate(d: WebDriver) -> None:
        renamed = name + "-renamed"
        rename = d.find_element(By.ID, "rename")
        type_over(d, rename, renamed + "\n")
        text_in(d, "#session-title", renamed)
        assert d.find_element(By.CSS_SELECTOR, "#kernels .restarts").text == "1"  # read again with the rename
        d.find_element(By.ID, "terminate").click()
        d.switch_to.alert.accept()
        attribute_is(d, "#session-detail", "data-status", "TERMINATED", timeout=90)
        assert d.execute_script(STILL_LOADED)

    await browser.run(rename_and_terminate)


async def test_several_sessions_terminated_at_once_from_the_list(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    names = [unique("ui-many") for _ in range(2)]
    for name in names:
        session = {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": "sleep 600"}
        await caravan.gql(CREATE, {"input": session}, token=alice)

    def step(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        for name in names:
            visible(d, f"tr[data-name='{name}'] input[type=checkbox]").click()
        button = d.find_element(By.ID, "terminate-selected")
        assert button.text == "Terminate selected (2)"
        button.click()
        d.switch_to.alert.accept()
        for name in names:
            status = f"tr[data-name='{name}'] [data-status]"
            wait(d, 90).until(
                lambda d, css=status: (
                    d.find_element(By.CSS_SELECTOR, css).get_attribute("data-status") in ("TERMINATED", "CANCELLED")
                )
            )

    await browser.run(step)


async def test_a_form_saved_as_a_template_fills_the_form_again(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    template = unique("tpl")

    def step(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        d.get(browser.base + "/ui/launch")
        fields = {"type": "BATCH", "driver": "EXEC", "startupCommand": "echo from a template", "cpu": "0.5"}
        fill(d, {**fields, "environ": "MODE=fast", "templateName": template})
        d.find_element(By.XPATH, "//button[text()='Save template']").click()
        text_in(d, "[role=status]", f"Saved template {template}")
        d.refresh()
        fill(
            d,
            {
                "template": next(
                    o.get_attribute("value") or ""
                    for o in visible(d, "#f-template").find_elements(By.TAG_NAME, "option")
                    if o.text.startswith(template)
                )
            },
        )
        for name, value in {**fields, "environ": "MODE=fast"}.items():
            assert d.find_element(By.ID, f"f-{name}").get_attribute("value") == value, name

    await browser.run(step)


async def test_an_admin_follows_other_users_sessions_live(caravan: Caravan, browser: Browser) -> None:
    admin, alice = await caravan.user("root", Role.SUPERADMIN), await caravan.user("alice")
    name = unique("ui-theirs")
    session = {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": "sleep 600"}
    made = await caravan.gql(CREATE, {"input": session}, token=alice)
    session_id = made["createSession"]["sessions"][0]["id"]

    def see_it_run(d: WebDriver) -> None:
        sign_in(d, browser.base, admin)
        d.execute_script(NO_RELOAD)
        attribute_is(d, f"tr[data-name='{name}'] [data-status]", "data-status", "RUNNING", timeout=90)

    await browser.run(see_it_run)
    await caravan.gql("mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }", {"ids": [session_id]}, token=alice)

    def see_it_end(d: WebDriver) -> None:
        attribute_is(d, f"tr[data-name='{name}'] [data-status]", "data-status", "TERMINATED", timeout=90)
        assert d.execute_script(STILL_LOADED)

    await browser.run(see_it_end)


ABOUT_AN_HOUR = re.compile(r"^(1h 0m|5[5-9]m \d{1,2}s)$")
"""A 1 h network-idle countdown shown a little later: from "1h 0m" (activity within the last half second, rounded)
down to some minutes less (the seconds since the session started or was last active)."""


async def test_a_running_session_shows_its_idle_checks_with_time_left(
    caravan: Caravan, browser: Browser, tmp_path: Path
) -> None:
    admin = await caravan.user("root", Role.SUPERADMIN)
    name = unique("ui-idle")
    session = {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": "sleep 600"}
    made = await caravan.gql(CREATE, {"input": session}, token=admin)
    session_id = made["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING")
    path = policy_file(tmp_path, 'check_interval = "1s"\ndefaults {\n  network_idle_timeout = "1h"\n}\n')
    async with running_idle(caravan.settings, path) as service:
        await swept_since(service.idle_store, session_id, utcnow())

        def step(d: WebDriver) -> None:
            sign_in(d, browser.base, admin)
            d.get(f"{browser.base}/ui/sessions/{session_id}")
            text_in(d, "#idle-checks", "NETWORK_TIMEOUT")
            row = d.find_element(By.XPATH, "//table[@id='idle-checks']//tr[td[1]='NETWORK_TIMEOUT']")
            left = row.find_elements(By.TAG_NAME, "td")[1].text
            assert ABOUT_AN_HOUR.match(left), left  # an hour, less the seconds since the last activity or start
            text_in(d, "#idle-policy", "network idle 1h 0m")
            d.get(browser.base + "/ui/")
            cell = visible(d, f"tr[data-name='{name}'] td:nth-child(7)")
            assert ABOUT_AN_HOUR.match(cell.text), cell.text  # the list's "Idle in"

        await browser.run(step)
    await caravan.gql(
        "mutation($ids: [ID!]!) { destroySession(ids: $ids, forced: true) { id } }", {"ids": [session_id]}
    )


async def test_an_admin_issues_a_token_shown_once_that_signs_in_and_revokes_it(
    caravan: Caravan, browser: Browser
) -> None:
    admin = await caravan.user("root", Role.SUPERADMIN)
    await caravan.user("carol")

    def issue(d: WebDriver) -> str:
        sign_in(d, browser.base, admin)
        d.get(browser.base + "/ui/admin/users")
        row = visible(d, "//table[@id='users']//tr[td[1]='carol']", by=By.XPATH)
        row.find_element(By.XPATH, ".//button[text()='Tokens']").click()
        label = visible(d, ".tokens input[required]")
        label.send_keys("laptop\n")  # Enter submits: the form works from the keyboard
        secret = visible(d, ".secret code").text
        text_in(d, ".tokens table", "laptop")
        return secret

    secret = await browser.run(issue)
    assert (await caravan.gql("{ viewer { id } }", token=secret))["viewer"]["id"] == "carol"

    def revoke(d: WebDriver) -> None:
        d.find_element(By.XPATH, "//div[@class='tokens']//tr[td[1]='laptop']//button[text()='Revoke']").click()
        d.switch_to.alert.accept()
        wait(d).until(lambda d: not d.find_elements(By.XPATH, "//div[@class='tokens']//td[text()='laptop']"))

    await browser.run(revoke)
    refused = await caravan.post("{ viewer { id } }", token=secret)
    assert refused["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_the_list_pages_filters_and_searches(caravan: Caravan, browser: Browser) -> None:
    alice = await caravan.user("alice")
    base = unique("ui-page")
    waiting = {"type": "INTERACTIVE", "driver": "EXEC", "resources": [{"slot": "cpu", "amount": "512"}]}  # no room
    made = await caravan.gql(CREATE, {"input": {"name": base, "count": 30, **waiting}}, token=alice)
    ids = [s["id"] for s in made["createSession"]["sessions"]]
    done = unique("ui-done")
    batch = {"name": done, "type": "BATCH", "driver": "EXEC", "startupCommand": "true"}
    finished = (await caravan.gql(CREATE, {"input": batch}, token=alice))["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(finished, "TERMINATED")

    def rows(d: WebDriver) -> list[str]:
        names: list[str] = d.execute_script(  # one reading (the rows may be replaced meanwhile)
            "return [...document.querySelectorAll('tr[data-session]')].map(r => r.dataset.name)"
        )
        return names

    def step(d: WebDriver) -> None:
        sign_in(d, browser.base, alice)
        visible(d, "#sessions-table")
        fill_select(d, "select[aria-label='Sessions per page']", "25")
        wait(d).until(lambda d: len(rows(d)) == 25)
        assert "31 session(s)" in d.find_element(By.CSS_SELECTOR, ".pager").text
        first = rows(d)
        d.find_element(By.ID, "next-page").click()
        wait(d).until(lambda d: len(rows(d)) == 6)
        assert not set(rows(d)) & set(first)  # the next page: the 6 others
        d.find_element(By.XPATH, "//button[contains(., 'Newer')]").click()
        wait(d).until(lambda d: rows(d) == first)
        fill_select(d, "#filter-status", "TERMINATED")
        wait(d).until(lambda d: rows(d) == [done])
        fill_select(d, "#filter-status", "")
        d.find_element(By.ID, "search").send_keys(f"{base}-1")  # -1, -10 … -19
        wait(d).until(lambda d: sorted(rows(d)) == sorted([f"{base}-1", *(f"{base}-{i}" for i in range(10, 20))]))

    await browser.run(step)
    await caravan.gql("mutation($ids: [ID!]!) { destroySession(ids: $ids, forced: true) { id } }", {"ids": ids})
