"""The memory explorer (``/ui``) as a user meets it: headless Chromium, driven by Selenium through the
system chromedriver, against a real ``engram serve`` on the embedded default (SQLite) with a real worker
fleet behind it (the offline extractor; no LLM). Memory is written through the pipeline over HTTP
(``tests.support.explorer``).

Every test saves a screenshot of the page it looked at into ``build/explorer-screenshots/`` of the checkout
(``build/`` is git-ignored and left out of the wheel; pytest's own temporary directories are pruned to the
last three runs, which on a shared machine can be someone else's), and checks it is a PNG of the window.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.browser import chromium_driver
from tests.support.explorer import LETTER, REASON, T0, WHERE, World, lives_in
from tests.support.gateway import auth, gateway_process

WAIT_S = 60  # a hang guard for the page's calls, not a timing assertion
T = TypeVar("T")
SHOTS = Path(__file__).resolve().parents[2] / "build" / "explorer-screenshots"


@pytest.fixture(scope="module")
def shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    driver = chromium_driver(tmp_path)
    try:
        yield driver
    finally:
        driver.quit()


# -------------------------------------------------------------------------------------------- helpers
def until(driver: WebDriver, what: str, check: Callable[[WebDriver], T]) -> T:
    """``check``'s first truthy answer; ``what`` names it if none comes within ``WAIT_S``. An element the
    page replaced while ``check`` read it (a redraw) is asked again, as a missing one is."""
    wait = WebDriverWait(driver, WAIT_S, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
    return wait.until(check, message=what)


def sign_in(driver: WebDriver, world: World, key: str) -> None:
    driver.get(f"{world.url}/ui")
    until(driver, "the key form", lambda d: d.find_element(By.ID, "key").is_displayed())
    driver.find_element(By.ID, "key").send_keys(world.secrets[key])
    driver.find_element(By.ID, "use-key").click()
    until(driver, "signed in", lambda d: d.find_element(By.ID, "who").text)


def open_user(driver: WebDriver, uid: str) -> None:
    field = driver.find_element(By.ID, "user")
    field.clear()
    field.send_keys(uid)
    driver.find_element(By.ID, "open-user").click()


def opened(driver: WebDriver, uid: str) -> None:
    """Opens ``uid`` and waits for its facts."""
    open_user(driver, uid)
    until(
        driver,
        f"{uid} opened",
        lambda d: d.find_element(By.ID, "main").is_displayed() and d.find_elements(By.CSS_SELECTOR, "tr[data-fact-id]"),
    )


def at_user(driver: WebDriver, world: World, key: str, uid: str) -> None:
    sign_in(driver, world, key)
    opened(driver, uid)


def tab(driver: WebDriver, name: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f"nav button[data-tab={name}]").click()


def fact_rows(driver: WebDriver) -> dict[str, WebElement]:
    return {
        row.get_attribute("data-fact-id"): row
        for row in driver.find_elements(By.CSS_SELECTOR, "#facts-body tr[data-fact-id]")
    }


def recall_in_page(driver: WebDriver, query: str) -> list[WebElement]:
    tab(driver, "recall")
    box = driver.find_element(By.ID, "recall-query")
    box.clear()
    box.send_keys(query)
    before = driver.find_element(By.ID, "recall-meta").text
    driver.find_element(By.ID, "recall-go").click()
    until(driver, "a recall answer", lambda d: d.find_element(By.ID, "recall-meta").text not in ("", before))
    return driver.find_elements(By.CSS_SELECTOR, "#recall-body tr[data-id]")


def recalled_denver(world: World, http: httpx.Client, driver: WebDriver, uid: str) -> tuple[str, WebElement]:
    """(the id of the user's current LIVES_IN fact, its row in the playground's answer to ``WHERE``)."""
    denver = lives_in(http, world, uid)[-1]["id"]
    at_user(driver, world, "a_rw", uid)
    items = {row.get_attribute("data-id"): row for row in recall_in_page(driver, WHERE)}
    assert denver in items
    return denver, items[denver]


def screenshot(driver: WebDriver, shots: Path, name: str) -> Path:
    path = shots / f"{name}.png"
    assert driver.save_screenshot(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 1000 and height >= 600, (width, height)
    return path


# ---------------------------------------------------------------------------------------------- tests
def test_facts_and_a_superseded_values_history_render(
    world: World, http: httpx.Client, browser: WebDriver, shots: Path
) -> None:
    chain = lives_in(http, world, world.user)
    assert [f["object_name"] for f in chain] == ["Tampa", "Austin", "Denver"]
    tampa, austin, denver = (f["id"] for f in chain)
    at_user(browser, world, "a_rw", world.user)
    rows = fact_rows(browser)
    listed = http.get(f"/v1/users/{world.user}/graph", headers=auth(world.secrets, "a_rw")).json()
    assert set(rows) == {f["id"] for f in listed["facts"]}  # superseded facts are listed too
    assert rows[denver].find_element(By.CSS_SELECTOR, "td.status").text == "current"
    assert [rows[f].find_element(By.CSS_SELECTOR, "td.status").text for f in (tampa, austin)] == ["superseded"] * 2
    assert "held" in rows[denver].get_attribute("class") and "held" not in rows[austin].get_attribute("class")

    rows[denver].find_element(By.CSS_SELECTOR, "button[data-action=history]").click()
    until(browser, "the timeline", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline li[data-fact-id]")) == 3)
    entries = browser.find_elements(By.CSS_SELECTOR, "#timeline li[data-fact-id]")
    assert [e.get_attribute("data-fact-id") for e in entries] == [tampa, austin, denver]
    assert [e.find_element(By.CSS_SELECTOR, ".value").text for e in entries] == ["Tampa", "Austin", "Denver"]
    assert [e.find_element(By.CSS_SELECTOR, ".status").text for e in entries] == ["superseded", "superseded", "current"]

    # As of a day in the Austin months, Austin is what held, in the table and on the timeline.
    browser.execute_script(
        "const i = document.getElementById('asof'); i.value = arguments[0]; i.dispatchEvent(new Event('change'));",
        (T0 + timedelta(days=200)).strftime("%Y-%m-%dT%H:%M:%S"),
    )
    rows = fact_rows(browser)
    assert "held" in rows[austin].get_attribute("class") and "held" not in rows[denver].get_attribute("class")
    held = [e.get_attribute("data-fact-id") for e in browser.find_elements(By.CSS_SELECTOR, "#timeline li.held")]
    assert held == [austin]
    screenshot(browser, shots, "facts-and-history")


def test_the_entity_graph_draws_the_neighbourhood_the_api_returns(
    world: World, http: httpx.Client, browser: WebDriver, shots: Path
) -> None:
    at_user(browser, world, "a_rw", world.user)
    tab(browser, "graph")
    until(browser, "the graph", lambda d: d.find_elements(By.CSS_SELECTOR, "#graph g.node"))
    found = http.get(
        f"/v1/users/{world.user}/neighbourhood", headers=auth(world.secrets, "a_rw"), params={"hops": 1, "limit": 40}
    ).json()
    drawn = [n.get_attribute("data-entity-id") for n in browser.find_elements(By.CSS_SELECTOR, "#graph g.node")]
    assert drawn == [e["id"] for e in found["entities"]]
    names = {e["name"] for e in found["entities"]}
    assert {"Denver", "Ana", "Braga"} <= names and not {"Tampa", "Austin"} & names  # current facts only
    # Centre Ana: her facts are at hop 0, Braga one step away.
    ana = next(e["id"] for e in found["entities"] if e["name"] == "Ana")
    browser.find_element(By.CSS_SELECTOR, f'#graph g.node[data-entity-id="{ana}"] circle').click()
    until(
        browser,
        "Ana drawn in the centre",
        lambda d: d.find_element(By.CSS_SELECTOR, "#graph g.node.hop0").get_attribute("data-entity-id") == ana,
    )
    assert browser.find_element(By.ID, "graph-entity").get_attribute("value") == ana
    around_ana = {
        n.get_attribute("data-entity-id") for n in browser.find_elements(By.CSS_SELECTOR, "#graph g.node.hop1")
    }
    assert {e["name"] for e in found["entities"] if e["id"] in around_ana} == {"User", "Braga"}
    screenshot(browser, shots, "entity-graph")


def test_a_recall_in_the_playground_shows_the_item_with_its_channels(
    world: World, http: httpx.Client, browser: WebDriver, shots: Path
) -> None:
    denver, row = recalled_denver(world, http, browser, world.user)
    assert "Denver" in row.find_element(By.CSS_SELECTOR, "td.statement").text
    assert row.find_element(By.CSS_SELECTOR, "td.kind").text == "fact"
    shown = [c.text for c in row.find_elements(By.CSS_SELECTOR, ".channel")]
    api = http.post(f"/v1/users/{world.user}/recall", headers=auth(world.secrets, "a_rw"), json={"query": WHERE}).json()
    item = next(i for i in api["items"] if i["id"] == denver)
    assert shown == item["channels"] and shown  # what found it, as the API says
    assert float(row.find_element(By.CSS_SELECTOR, "td.score").text) == pytest.approx(item["score"], abs=1e-3)
    assert "m2" in row.find_element(By.CSS_SELECTOR, "td.sources").text  # its source message
    steps = [li.get_attribute("data-step") for li in browser.find_elements(By.CSS_SELECTOR, "#recall-timings li")]
    assert steps and all(re.fullmatch(r"[a-z_]+", s) for s in steps)
    screenshot(browser, shots, "recall-playground")

    tab(browser, "context")
    browser.find_element(By.ID, "context-query").send_keys(WHERE)
    browser.find_element(By.ID, "context-go").click()
    until(browser, "the context block", lambda d: d.find_element(By.ID, "context").text)
    expected = http.post(
        f"/v1/users/{world.user}/context", headers=auth(world.secrets, "a_rw"), json={"query": WHERE}
    ).json()
    assert (
        browser.find_element(By.ID, "context").text == expected["context"].strip() and "Denver" in expected["context"]
    )
    screenshot(browser, shots, "get-context")


def test_the_dead_letters_tab_lists_the_users_letters_for_an_operator_key(
    world: World, browser: WebDriver, shots: Path
) -> None:
    at_user(browser, world, "a_rw", world.user)
    tab(browser, "dead")
    until(browser, "the note", lambda d: d.find_element(By.ID, "dead-note").text)
    assert "operator" in browser.find_element(By.ID, "dead-note").text
    browser.find_element(By.ID, "sign-out").click()
    at_user(browser, world, "a_op", world.user)
    tab(browser, "dead")
    until(browser, "the letters", lambda d: "dead letter(s)" in d.find_element(By.ID, "dead-note").text)
    assert browser.find_element(By.ID, "dead-note").text == "1 dead letter(s)."
    (row,) = browser.find_elements(By.CSS_SELECTOR, "#dead-body tr[data-message-id]")
    assert row.get_attribute("data-message-id") == LETTER
    assert [td.text for td in row.find_elements(By.TAG_NAME, "td")][:4] == [LETTER, "extract", REASON, "3"]
    screenshot(browser, shots, "dead-letters")


def test_a_forget_from_the_ui_removes_the_fact_from_a_later_recall(
    world: World, http: httpx.Client, browser: WebDriver, shots: Path
) -> None:
    denver, row = recalled_denver(world, http, browser, world.doomed)
    row.find_element(By.CSS_SELECTOR, f'td.actions button[data-action=forget][data-target="{denver}"]').click()
    until(browser, "the confirm step", lambda d: d.find_element(By.ID, "confirm").is_displayed())
    screenshot(browser, shots, "forget-confirm")
    browser.find_element(By.ID, "confirm-no").click()  # cancelled: nothing forgotten
    until(browser, "the dialog closed", lambda d: not d.find_element(By.ID, "confirm").is_displayed())
    assert denver in {f["id"] for f in lives_in(http, world, world.doomed)}

    row.find_element(By.CSS_SELECTOR, f'td.actions button[data-action=forget][data-target="{denver}"]').click()
    until(browser, "the confirm step", lambda d: d.find_element(By.ID, "confirm").is_displayed())
    browser.find_element(By.ID, "confirm-yes").click()
    until(
        browser,
        "the forget's answer",
        lambda d: d.find_element(By.ID, "notice").text.startswith("Forgotten: 1 fact(s)"),
    )
    until(browser, "the facts reloaded", lambda d: denver not in fact_rows(d))
    later = http.post(
        f"/v1/users/{world.doomed}/recall", headers=auth(world.secrets, "a_rw"), json={"query": WHERE}
    ).json()
    assert denver not in {i["id"] for i in later["items"]}
    assert denver not in {r.get_attribute("data-id") for r in recall_in_page(browser, WHERE)}
    screenshot(browser, shots, "after-forget")


def test_a_message_and_then_the_user_are_forgotten_from_the_ui(
    world: World, http: httpx.Client, browser: WebDriver, shots: Path
) -> None:
    a = auth(world.secrets, "a_rw")
    at_user(browser, world, "a_rw", world.erased)
    assert len(fact_rows(browser)) == 2
    browser.find_element(
        By.CSS_SELECTOR, '#facts-body .source[data-message-id="m1"] button[data-action=forget]'
    ).click()
    until(browser, "the confirm step", lambda d: d.find_element(By.ID, "confirm").is_displayed())
    browser.find_element(By.ID, "confirm-yes").click()
    until(browser, "the message forgotten", lambda d: len(fact_rows(d)) == 1)
    assert "Lima" in browser.find_element(By.ID, "facts-body").text and "Dell" not in browser.page_source
    assert http.get(f"/v1/users/{world.erased}/stats", headers=a).json()["episodes"] == 1

    button, field = browser.find_element(By.ID, "forget-user"), browser.find_element(By.ID, "forget-user-confirm")
    field.send_keys(world.erased[:-1])
    assert not button.is_enabled()  # the user id must be typed out
    field.send_keys(world.erased[-1])
    assert button.is_enabled()
    button.click()
    until(browser, "the confirm step", lambda d: d.find_element(By.ID, "confirm").is_displayed())
    screenshot(browser, shots, "forget-user")
    browser.find_element(By.ID, "confirm-yes").click()
    until(
        browser,
        "the user forgotten",
        lambda d: d.find_element(By.ID, "notice").text.startswith(f"Forgot {world.erased}"),
    )
    until(browser, "no facts left", lambda d: not fact_rows(d))
    stats = http.get(f"/v1/users/{world.erased}/stats", headers=a).json()
    assert (stats["facts"], stats["episodes"], stats["entities"]) == (0, 0, 0)


def test_a_read_only_key_sees_no_forget_control(
    world: World, http: httpx.Client, browser: WebDriver, shots: Path
) -> None:
    sign_in(browser, world, "a_read")
    assert "scopes read ·" in browser.find_element(By.ID, "who").text
    opened(browser, world.user)
    assert browser.find_elements(By.CSS_SELECTOR, "[data-action=history]")  # the page is there...
    assert recall_in_page(browser, WHERE)
    assert browser.find_elements(By.CSS_SELECTOR, "[data-action=forget]") == []  # ...without a forget button
    assert not browser.find_element(By.ID, "danger").is_displayed()
    screenshot(browser, shots, "read-only")
    fact = lives_in(http, world, world.user, "a_read")[-1]["id"]
    refused = http.delete(f"/v1/users/{world.user}/memories/{fact}", headers=auth(world.secrets, "a_read"))
    assert refused.status_code == 403  # and the gateway would refuse one anyway


def test_another_namespaces_user_cannot_be_opened(
    world: World, http: httpx.Client, browser: WebDriver, shots: Path
) -> None:
    assert lives_in(http, world, world.other, "b_rw")  # the user exists, with a fact
    sign_in(browser, world, "a_rw")
    listed = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#users option")]
    assert world.user in listed and all(u.startswith("appA.") for u in listed)
    open_user(browser, world.other)
    until(browser, "the refusal", lambda d: d.find_element(By.ID, "user-error").text)
    assert browser.find_element(By.ID, "user-error").text.startswith("403 ")
    assert "appA." in browser.find_element(By.ID, "user-error").text
    assert not browser.find_element(By.ID, "main").is_displayed()
    assert "Oslo" not in browser.page_source
    screenshot(browser, shots, "other-namespace")
    # A link naming the user opens nothing either (a new load: the tab's key signs in, then the link's user).
    browser.get("about:blank")
    browser.get(f"{world.url}/ui#user={world.other}")
    until(browser, "the refusal", lambda d: d.find_element(By.ID, "user-error").text.startswith("403 "))
    assert "Oslo" not in browser.page_source


def test_with_no_key_configured_the_page_opens_without_one(world: World, browser: WebDriver, shots: Path) -> None:
    """Local mode (loopback only): every caller is 'local', so the page asks for no key and may forget."""
    with gateway_process(world.env, Path(world.env["ENGRAM_DATA_DIR"]) / "local-logs", name="local-gateway") as local:
        browser.get(f"{local.url}/ui")
        until(browser, "signed in as local", lambda d: d.find_element(By.ID, "who").text)
        assert "local mode" in browser.find_element(By.ID, "who").text
        assert not browser.find_element(By.ID, "key-form").is_displayed()
        opened(browser, world.other)  # every namespace
        assert "Oslo" in browser.find_element(By.ID, "facts-body").text
        assert browser.find_elements(By.CSS_SELECTOR, "[data-action=forget]")
        screenshot(browser, shots, "local-mode")
