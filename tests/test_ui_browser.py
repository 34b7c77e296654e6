"""`tether ui` in a real browser: Playwright drives Debian's headless Chromium against the command.

The server is the real command (``tether ui --port 0`` in a subprocess, on SQLite), entered
through the address it prints. A person opens the list, opens a parked run, approves its call
in the inbox, and watches the run page, left open, follow the run to its end over server-sent
events without a reload; text a model and a tool wrote holding ``<script>`` stays text.

Screenshots of the pages go to the test's directory, or to ``$TETHER_UI_SCREENSHOTS``
(``scripts/ui-screenshots`` sets it to diagrams/ for the README).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support import clean_env
from tether.core.approvals import AutoApprover
from tether.drivers.loader import agent_from_spec
from tether.drivers.runner import Runner
from tether.stores.sql import SQLStore
from ui_runs import XSS, Project

pytestmark = pytest.mark.slow

SCREENSHOTS = "TETHER_UI_SCREENSHOTS"
WAIT_MS = 30_000
"""How long an expectation waits for the page (a shared 2-core machine can be slow); not a speed check."""


@dataclass
class Served:
    """A running ``tether ui`` and the runs it shows."""

    address: str
    """What the command printed: the base URL with ``?token=``."""
    base: str
    token: str
    parked: str
    """Parked before its refund, for the person to approve."""
    done: str
    """Ended, its tool output and answer holding the XSS attempt (the parked runs hold none)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("ui")
    hostile = Project.make(root / "hostile")
    # The parked runs are the README's pictures (scripts/ui-screenshots): plain text there.
    project = Project.make(root / "project", echoed="Checking the invoice before the refund.", quoted="")
    url = f"sqlite:///{root / 'runs.db'}"
    store = SQLStore(url)
    try:
        done = hostile.park(store, tenant="acme", prompt="Refund INV-7 and repeat what I sent.")
        Runner(agent_from_spec(hostile.spec), store, approver=AutoApprover(approve=True)).drive(done.run_id)
        project.park(store, tenant="globex", prompt="Refund INV-7 for globex.")
        parked = project.park(store, tenant="acme", prompt="Refund INV-7, the 20 I was charged twice.")
    finally:
        store.close()
    command = [sys.executable, "-m", "tether", "ui", "--db", url, "--port", "0"]
    log = root / "ui.log"
    with (
        log.open("w") as errors,
        subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE, stderr=errors, text=True) as server,
    ):
        try:
            assert server.stdout is not None
            first = server.stdout.readline()  # printed once the port is bound
            found = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", first)
            assert found is not None, first + log.read_text()
            base, token = found.group(1), found.group(2)
            yield Served(f"{base}?token={token}", base, token, parked.run_id, done.run_id)
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    """A fresh browser profile (no cookie yet) whose expectations wait up to WAIT_MS."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    made = browser.new_context(viewport={"width": 1280, "height": 860})
    yield made
    made.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get(SCREENSHOTS) or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_a_person_opens_a_parked_run_approves_it_and_watches_it_end(served: Served, context: Any, shots: Path) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(served.address)
    assert page.url == served.base  # signed in; the token left the address
    expect(page.locator("tr[data-run]")).to_have_count(3)
    expect(page.locator(f"tr[data-run='{served.parked}'] .status")).to_have_text("awaiting_approval")
    page.screenshot(path=shots / "ui-runs.png")

    page.click(f"a[href='/runs/{served.parked}']")
    expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")
    expect(page.locator("main")).to_have_attribute("data-state", "live")  # listening to the run's stream
    expect(page.get_by_test_id("diagram")).to_be_visible()
    page.evaluate("window.__loaded_once = true")  # gone if the page reloads
    page.screenshot(path=shots / "ui-run.png", full_page=True)

    inbox = context.new_page()
    inbox.goto(served.base + "inbox")
    cards = inbox.locator("article.pending")
    expect(cards).to_have_count(2)  # every tenant's: the printed token is an operator's
    inbox.screenshot(path=shots / "ui-inbox.png", full_page=True)
    card = cards.filter(has=inbox.locator(f"a[href='/runs/{served.parked}']"))
    card.get_by_label("Decided by").fill("alice")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(inbox.get_by_role("status")).to_contain_text("Decision recorded for toolu_refund")
    expect(inbox.locator("article.pending")).to_have_count(1)

    # The run page, left open, follows the run to its end: no reload, the stream says it moved.
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    expect(page.get_by_test_id("run-output")).to_contain_text("Refund handled.")
    expect(page.locator("main")).to_have_attribute("data-state", "ended")
    assert page.evaluate("window.__loaded_once") is True
    expect(page.locator("table.timeline")).to_contain_text("refund approved by alice")


def test_a_script_in_a_tool_output_or_an_answer_stays_text(served: Served, context: Any) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(served.address)
    page.goto(f"{served.base}runs/{served.done}")
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    expect(page.get_by_test_id("tool-output").first).to_have_text(XSS)
    expect(page.get_by_test_id("run-output")).to_have_text(f"Refund handled. {XSS}")
    assert page.evaluate("typeof window.__xss") == "undefined"  # neither the script nor the onerror ran
    assert page.locator("main script, main img[src='x']").count() == 0
    assert errors == []


def test_without_the_token_the_browser_gets_the_sign_in_page(served: Served, context: Any) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(served.base + "inbox")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Token").fill("not-the-token-at-all")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
    page.get_by_label("Token").fill(served.token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()


def test_a_person_forks_a_run_from_a_step_and_watches_the_fork_go(served: Served, context: Any) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(served.address)
    page.goto(f"{served.base}runs/{served.done}")
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    page.get_by_test_id("fork-1").click()  # the prompt: the model is asked again from there

    expect(page.get_by_test_id("forked-from")).to_contain_text(f"forked from {served.done} at #1")
    assert served.done not in page.url
    expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")  # driven on, parked at the refund
    page.get_by_role("link", name=served.done).click()
    expect(page.get_by_test_id("run-status")).to_have_text("done")  # the original is as it was

    page.get_by_test_id("fork-edit-1").click()  # the prompt again, its text edited
    page.get_by_test_id("fork-text-1").fill("Refund INV-9 instead.")
    page.get_by_test_id("fork-edited-1").click()
    expect(page.get_by_test_id("forked-from")).to_contain_text(f"forked from {served.done} at #1")
    expect(page.locator("body")).to_contain_text("Refund INV-9 instead.")

    page.get_by_role("link", name=served.done).click()  # the last fork point follows the tool results:
    edit = page.locator('summary[data-testid^="fork-edit-"]').last  # its last message has no text,
    at = (edit.get_attribute("data-testid") or "").removeprefix("fork-edit-")
    assert int(at) > 1
    edit.click()
    page.get_by_test_id(f"fork-message-{at}").fill("0")  # so the prompt, message 0, is the one edited
    page.get_by_test_id(f"fork-text-{at}").fill("Refund INV-11 instead.")
    page.get_by_test_id(f"fork-edited-{at}").click()
    expect(page.get_by_test_id("forked-from")).to_contain_text(f"forked from {served.done} at #")
    expect(page.locator("body")).to_contain_text("Refund INV-11 instead.")
