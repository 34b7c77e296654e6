"""`tether ui` in a real browser: Playwright drives Debian's headless Chromium against the command.

The server is the real command (``tether ui --port 0`` in a subprocess, on SQLite), entered
through the address it prints. A person opens the list, opens a parked run, approves its call
in the inbox, and watches the run page, left open, follow the run to its end over server-sent
events without a reload; text a model and a tool wrote holding ``<script>`` stays text.

Screenshots of the pages go to the test's directory, or to ``$TETHER_UI_SCREENSHOTS``
(``scripts/ui-screenshots`` sets it to diagrams/ for the README); the browser, its fresh
profiles and that directory are conftest.py's fixtures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tether.core.approvals import AutoApprover
from tether.drivers.loader import agent_from_spec
from tether.drivers.runner import Runner
from tether.stores.sql import SQLStore
from ui_runs import XSS, Project
from ui_servers import ui_server

pytestmark = pytest.mark.slow


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


@contextmanager
def serve(url: str, log: Path) -> Iterator[tuple[str, str, str]]:
    """``tether ui`` on ``url``: the printed address, the base URL and the token."""
    with ui_server(url, log) as server:
        assert server.token is not None
        yield server.address, server.base, server.token


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
    with serve(url, root / "ui.log") as (address, base, token):
        yield Served(address, base, token, parked.run_id, done.run_id)


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
    page.get_by_text("Path through the machine").click()  # folded at first: it is long
    expect(page.get_by_test_id("diagram")).to_be_visible()
    page.evaluate("window.__loaded_once = true")  # gone if the page reloads
    page.screenshot(path=shots / "ui-run.png", full_page=True)

    inbox = context.new_page()
    inbox.goto(served.base + "inbox")
    cards = inbox.locator("article.pending")
    expect(cards).to_have_count(2)  # every tenant's: the printed token is an operator's
    inbox.screenshot(path=shots / "ui-inbox.png", full_page=True)
    card = inbox.locator(f"section.turn[data-run='{served.parked}'] article.pending")
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
    expect(page.get_by_role("heading", name="Inbox")).to_be_visible()  # the page it asked for


def show_moves(page: Any) -> None:
    """Show the timeline's moves between states (hidden at first): the rows the fork tests start from."""
    page.get_by_test_id("timeline-filter").get_by_label("moves between states").check()


def fork_it(page: Any) -> None:
    """Say yes to the page's question before a fork (it runs tools at once)."""
    page.get_by_role("dialog").get_by_role("button", name="Fork and run it").click()


def test_a_person_forks_a_run_from_a_step_and_watches_the_fork_go(served: Served, context: Any) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(served.address)
    page.goto(f"{served.base}runs/{served.done}")
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    show_moves(page)
    page.get_by_test_id("fork-1").click()  # the prompt: the model is asked again from there
    fork_it(page)

    expect(page.get_by_test_id("forked-from")).to_contain_text(f"forked from {served.done} at #1")
    assert served.done not in page.url
    expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")  # driven on, parked at the refund
    page.get_by_role("link", name=served.done).click()
    expect(page.get_by_test_id("run-status")).to_have_text("done")  # the original is as it was

    show_moves(page)
    page.get_by_test_id("fork-edit-1").click()  # the prompt again, its text edited
    page.get_by_test_id("fork-text-1").fill("Refund INV-9 instead.")
    page.get_by_test_id("fork-edited-1").click()
    fork_it(page)
    expect(page.get_by_test_id("forked-from")).to_contain_text(f"forked from {served.done} at #1")
    expect(page.locator("body")).to_contain_text("Refund INV-9 instead.")

    page.get_by_role("link", name=served.done).click()  # the last fork point follows the tool results:
    show_moves(page)
    edit = page.locator('summary[data-testid^="fork-edit-"]').last  # its last message has no text,
    at = (edit.get_attribute("data-testid") or "").removeprefix("fork-edit-")
    assert int(at) > 1
    edit.click()
    page.get_by_test_id(f"fork-message-{at}").fill("0")  # so the prompt, message 0, is the one edited
    page.get_by_test_id(f"fork-text-{at}").fill("Refund INV-11 instead.")
    page.get_by_test_id(f"fork-edited-{at}").click()
    fork_it(page)
    expect(page.get_by_test_id("forked-from")).to_contain_text(f"forked from {served.done} at #")
    expect(page.locator("body")).to_contain_text("Refund INV-11 instead.")


# Live pages keep what a person did; long text keeps to the screen ------------------------------
LONG = "W" * 2_000
"""A prompt, a tool input, a tool output and an answer with no space to break at."""
EDITED = '{"invoice": "INV-7", "amount": 5}'
"""A narrower refund, typed over the parked call's input."""


@dataclass
class Lively:
    """A second ``tether ui``, whose runs the tests below change under its open pages."""

    address: str
    base: str
    url: str
    spec: dict[str, Any]
    edited: str
    """Its refund is approved with an edited input while the inbox refreshes."""
    typed: str
    """Stays parked: a name is typed on its card, then taken back."""
    refused: str
    panels: str
    spares: list[str]
    """Cancelled to make the inbox change."""
    long_parked: str
    long_done: str

    def cancel(self, run_id: str) -> None:
        """Changes a run from another process's side: every page showing it is told."""
        store = SQLStore(self.url)
        try:
            Runner(agent_from_spec(self.spec), store).cancel(run_id, "the test moved on")
        finally:
            store.close()


@pytest.fixture(scope="module")
def lively(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lively]:
    from support import model_reply, tool_use, tool_use_turn

    root = tmp_path_factory.mktemp("lively")
    project = Project.make(root / "project", echoed="Checking the invoice.", quoted="")
    long = Project.make(root / "long")
    turns = [
        tool_use_turn(
            tool_use("toolu_echo", "echo", {"text": LONG}),
            tool_use("toolu_refund", "refund", {"invoice": LONG, "amount": 20}),
        ),
        model_reply([{"type": "text", "text": f"Refund handled. {LONG}"}], "end_turn"),
    ]
    (long.root / "script.json").write_text(json.dumps(turns), encoding="utf-8")
    url = f"sqlite:///{root / 'runs.db'}"
    store = SQLStore(url)
    try:
        long_done = long.park(store, prompt=LONG).run_id
        Runner(agent_from_spec(long.spec), store, approver=AutoApprover(approve=True)).drive(long_done)
        long_parked = long.park(store, prompt=LONG).run_id
        parked = [project.park(store, prompt=f"Refund INV-7, run {n}.").run_id for n in range(6)]
    finally:
        store.close()
    with serve(url, root / "ui.log") as (address, base, _):
        edited, typed, refused, panels, *spares = parked
        yield Lively(address, base, url, project.spec, edited, typed, refused, panels, spares, long_parked, long_done)


def card_of(page: Any, run_id: str) -> Any:
    return page.locator(f"section.turn[data-run='{run_id}'] article.pending")


def live_inbox(lively: Lively, context: Any) -> tuple[Any, Any]:
    """A signed-in page on the inbox, listening to its stream: the page and its ``<main>``."""
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(lively.address)
    page.goto(lively.base + "inbox")
    main = page.locator("main")
    expect(main).to_have_attribute("data-state", "live")
    return page, main


def test_a_live_refresh_never_undoes_what_a_person_typed_in_a_decision(lively: Lively, context: Any) -> None:
    from playwright.sync_api import expect

    page, main = live_inbox(lively, context)
    card = card_of(page, lively.edited)
    card.get_by_label("Decided by").fill("alice")
    card.get_by_label("Reason").fill("five is enough")
    card.get_by_text("Edit the input").click()
    card.get_by_text("Raw JSON").click()
    card.locator("textarea[name=input]").fill(EDITED)
    page.locator("h1").click()  # nothing has the focus now: the edits alone hold the page
    assert page.evaluate("document.activeElement === document.body")

    lively.cancel(lively.spares[0])  # another run changes: the inbox is told
    expect(main).to_have_attribute("data-state", "stale")  # newer state, held back
    expect(card.locator("textarea[name=input]")).to_have_value(EDITED)
    expect(card.get_by_label("Decided by")).to_have_value("alice")
    expect(card.get_by_label("Reason")).to_have_value("five is enough")
    expect(card_of(page, lively.spares[0])).to_have_count(1)

    card.get_by_role("button", name="Approve the edited input").click()
    expect(page.get_by_role("status")).to_contain_text("Decision recorded")
    expect(card_of(page, lively.spares[0])).to_have_count(0)
    page.goto(f"{lively.base}runs/{lively.edited}")
    call = page.locator("#call-toolu_refund")
    expect(call).to_contain_text("Input as edited by a person (what ran)")
    expect(call.get_by_test_id("edited-input")).to_contain_text(re.compile(r"amount\s*5\b"))  # not the 20 asked for
    expect(call).to_contain_text("approved by alice")


def test_a_held_back_page_catches_up_once_the_typing_is_taken_back(lively: Lively, context: Any) -> None:
    from playwright.sync_api import expect

    page, main = live_inbox(lively, context)
    who = card_of(page, lively.typed).get_by_label("Decided by")
    who.fill("bob")
    page.locator("h1").click()
    lively.cancel(lively.spares[1])
    expect(main).to_have_attribute("data-state", "stale")
    expect(card_of(page, lively.spares[1])).to_have_count(1)

    who.fill("")  # taken back, and left: nothing typed is lost by showing the newer state now
    page.locator("h1").click()
    expect(card_of(page, lively.spares[1])).to_have_count(0)
    expect(main).to_have_attribute("data-state", "live")


def test_a_live_refresh_reopens_only_the_panels_that_were_open(lively: Lively, context: Any) -> None:
    from playwright.sync_api import expect

    inbox = context.new_page()
    inbox.goto(lively.address)
    inbox.goto(lively.base + "inbox")
    expect(inbox.locator("main")).to_have_attribute("data-state", "live")
    assert inbox.locator("article.pending").count() > 2  # the cards share their call id: toolu_refund
    card_of(inbox, lively.typed).get_by_text("Edit the input").click()

    page = context.new_page()
    page.goto(f"{lively.base}runs/{lively.panels}")
    expect(page.locator("main")).to_have_attribute("data-state", "live")
    show_moves(page)
    page.get_by_test_id("fork-edit-1").click()
    assert page.locator("main details[open]").count() == 1

    lively.cancel(lively.panels)
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.locator("main details[open]")).to_have_count(1)
    expect(page.locator("main details[open] summary")).to_have_attribute("data-testid", "fork-edit-1")

    expect(card_of(inbox, lively.panels)).to_have_count(0)
    expect(inbox.locator("main details[open]")).to_have_count(1)
    expect(card_of(inbox, lively.typed).locator("details").first).to_have_attribute("open", "")


def test_after_a_refused_decision_the_page_keeps_following_its_run(lively: Lively, context: Any) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(lively.address)
    page.goto(f"{lively.base}runs/{lively.refused}")
    page.get_by_text("Edit the input").click()
    page.get_by_text("Raw JSON").click()
    page.locator("textarea[name=input]").fill('{"amount": 20}')  # no invoice: the schema refuses it
    page.get_by_role("button", name="Approve the edited input").click()
    expect(page.get_by_test_id("decision-error")).to_be_visible()
    expect(page).to_have_url(f"{lively.base}runs/{lively.refused}")  # not /decide: what the page fetches again
    expect(page.locator("main")).to_have_attribute("data-state", "live")

    lively.cancel(lively.refused)
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.locator("main")).to_have_attribute("data-state", "ended")
    page.reload()  # the run's page again, nothing posted twice
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.get_by_test_id("decision-error")).to_have_count(0)


@pytest.mark.parametrize("width", [1280, 390])
def test_long_text_without_a_space_keeps_to_the_width_of_the_screen(lively: Lively, browser: Any, width: int) -> None:
    context = browser.new_context(viewport={"width": width, "height": 860})
    try:
        page = context.new_page()
        page.goto(lively.address)
        where = {
            "runs": "",
            "inbox": "inbox",
            "parked": f"runs/{lively.long_parked}",
            "done": f"runs/{lively.long_done}",
        }
        wide = {}
        for name, path in where.items():
            page.goto(lively.base + path)
            wide[name] = page.evaluate("document.documentElement.scrollWidth")
        assert page.locator("body").inner_text().count(LONG) >= 3  # the prompt, the tool's input and its output
        assert wide == dict.fromkeys(where, width)
    finally:
        context.close()


def test_timeline_rows_that_link_to_a_call_keep_their_colour(lively: Lively, context: Any) -> None:
    page = context.new_page()
    page.goto(lively.address)
    page.goto(f"{lively.base}runs/{lively.long_done}")
    links = page.locator("table.timeline td:nth-child(3) a")
    assert links.count() > 0
    colours = links.evaluate_all(
        "links => links.map(a => [getComputedStyle(a).color, getComputedStyle(a.parentElement).color])"
    )
    assert all(mine == cell for mine, cell in colours), colours


def test_the_pages_load_with_no_console_error(lively: Lively, context: Any) -> None:
    """Not even the browser's own request for an icon (the CSP allows images from the server only)."""
    from playwright.sync_api import expect

    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(lively.address)
    for path in ["inbox", f"runs/{lively.long_done}"]:
        page.goto(lively.base + path)
        expect(page.locator("h1")).to_be_visible()
    page.wait_for_timeout(300)  # the icon is fetched after the page has loaded
    assert errors == []
