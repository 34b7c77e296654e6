"""`tether ui` as a reviewer uses it, in Chromium: what a person sees before saying yes, and what runs after.

The server is the real command on SQLite (see :func:`ui_runs.serve`); the runs are real (tools from a
module on disk, a scripted model, a rule file). Each test acts as a person would: it reads the card,
types, clicks, answers the page's questions, and then checks what the run did.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from support import BROWSER_WAIT_MS, model_reply, tool_use, tool_use_turn
from tether.core.approvals import DecideLater
from tether.drivers.loader import agent_from_spec
from tether.drivers.runner import Runner
from tether.errors import ModelError
from tether.facts.events import ToolFinished
from tether.stores import RunQuery, RunRecord
from tether.stores.sql import SQLStore
from tether.surfaces.web.decisions import UNCONFIRMED_EDIT
from tether.testing import ScriptedModel
from ui_runs import REFUND, SHIPMENT, Project, delegating, looking_up, shipping, two_calls
from ui_servers import ui_server

pytestmark = pytest.mark.slow


@dataclass
class Reviewed:
    """A running ``tether ui`` and the runs its reviewers decide."""

    address: str
    base: str
    url: str
    parked: list[str]
    """Runs parked before ``refund`` (``toolu_refund``, 20 on INV-7), one per test that decides one."""
    shipments: list[str]
    """Runs parked before ``ship`` (``toolu_ship``, :data:`ui_runs.SHIPMENT`)."""
    pairs: list[str]
    """Runs parked on a refund and a shipment asked for in one turn (:func:`ui_runs.two_calls`)."""
    parent: str
    """Parked by its child run (the clerk's), which waits on a refund (``toolu_clerk``)."""
    hostile: str
    """Parked on a shipment whose rule's note holds HTML and a ``javascript:`` link."""
    retrying: str
    """Waiting for a tool retry (``lookup``'s first try failed; the next is due 2 s after it)."""
    failed: str
    """Failed transiently (the model API was overloaded): a retry may mend it."""
    letter: str
    """Has a system prompt; echoed a letter (a multi-line text) and parked before its refund."""
    total: int
    """Runs in the database (child runs included)."""

    def results(self, run_id: str) -> dict[str, str]:
        """What each tool call of the run returned, by call id."""
        store = SQLStore(self.url)
        try:
            events = store.load_events(run_id)
        finally:
            store.close()
        return {e.fact.call_id: e.fact.content for e in events if isinstance(e.fact, ToolFinished)}

    def result(self, run_id: str, call_id: str) -> str:
        """What the call returned, once the run (driven on in the server's background) has run it."""
        for _ in range(300):
            found = self.results(run_id).get(call_id)
            if found is not None:
                return found
            time.sleep(0.1)
        raise AssertionError(f"{call_id} of {run_id} never ran")


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reviewed]:
    root = tmp_path_factory.mktemp("reviewer")
    project = Project.make(root / "project", echoed="Checking the invoice before the refund.", quoted="")
    shipper = Project.make(root / "shipper", turns=shipping())
    pair = Project.make(root / "pair", turns=two_calls())
    delegator = Project.make(root / "delegator", turns=delegating())
    hostile = Project.make(root / "hostile", turns=shipping(), rules=HOSTILE_RULES)
    url = f"sqlite:///{root / 'runs.db'}"
    store = SQLStore(url)
    try:
        parked = [project.park(store, prompt=f"Refund INV-7, case {n}.").run_id for n in range(4)]
        shipments = [shipper.park(store, prompt=f"Ship order A-1, case {n}.").run_id for n in range(4)]
        pairs = [pair.park(store, prompt=f"Refund INV-7 and ship A-1 again, case {n}.").run_id for n in range(3)]
        parent = delegator.park(store, prompt="Have the clerk refund the duplicate charge.").run_id
        hostile_run = hostile.park(store, prompt="Ship it.").run_id
        looker = Project.make(root / "looker", turns=looking_up("k1"))
        retrying = Runner(agent_from_spec(looker.spec), store, approver=DecideLater()).run("Look k1 up.", max_wait=0)
        assert retrying.status == "waiting_retry", retrying
        mended = Project.make(
            root / "mended", turns=[model_reply([{"type": "text", "text": "All good now."}], "end_turn")]
        )
        overloaded = ScriptedModel([ModelError("overloaded", status=529, retryable=True)])
        failed = Runner(agent_from_spec(mended.spec, model=overloaded), store).run("Say it is all good.")
        assert failed.status == "failed", failed
        writing = [
            tool_use_turn(tool_use("toolu_echo", "echo", {"text": LETTER}), tool_use("toolu_refund", "refund", REFUND)),
            model_reply([{"type": "text", "text": "Sent."}], "end_turn"),
        ]
        writer = Project.make(root / "writer", turns=writing, system="You are the billing desk.\nBe brief.")
        letter = writer.park(store, prompt="Write to Ana, then refund INV-7.").run_id
        for n in range(60):  # an older history: enough for a second page of the list
            spec = {"agent": "archivist", "model": "claude-haiku-4-5", "prompt": f"Archive box {n}"}
            row = RunRecord(f"run_old_{n:02d}", "done", 1, spec=spec, summary={"output": f"Box {n} archived."})
            store.create_run(replace(row, created_at=1_700_000_000.0 + n, updated_at=1_700_000_000.0 + n), [])
        total = store.query_runs(RunQuery()).total
    finally:
        store.close()
    with ui_server(url, root / "ui.log") as server:
        address, base = server.address, server.base
        yield Reviewed(
            address,
            base,
            url,
            parked,
            shipments,
            pairs,
            parent,
            hostile_run,
            retrying.run_id,
            failed.run_id,
            letter,
            total,
        )


LETTER = "Dear Ana,\nyour refund is on its way.\n\nThe billing desk"
"""A text with line breaks, in a call's input."""
HOSTILE_RULES = """
[[rules]]
tool = "ship"
action = "require_approval"
description = '''**Careful** <script>window.__xss = 1</script> [click](javascript:window.__xss=2)
<img src=x onerror=window.__xss=3>'''
"""
"""A rule whose note tries raw HTML, a script and a ``javascript:`` link: Markdown renders none of them."""


def sized(browser: Any, width: int) -> Any:
    """A fresh browser profile ``width`` pixels wide (a phone's 390, a laptop's 1280)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=BROWSER_WAIT_MS)
    return browser.new_context(viewport={"width": width, "height": 900})


def signed_in(reviewed: Reviewed, context: Any, path: str) -> Any:
    """A page of ``context``, signed in through the printed address, on ``path``."""
    page = context.new_page()
    page.goto(reviewed.address)
    page.goto(reviewed.base + path)
    return page


# Approving an edited input is never silent ------------------------------------------------------
def test_approve_after_an_edit_asks_and_then_runs_the_edit(reviewed: Reviewed, context: Any, shots: Path) -> None:
    from playwright.sync_api import expect

    run = reviewed.parked[0]
    page = signed_in(reviewed, context, f"runs/{run}")
    page.get_by_text("Edit the input").click()
    page.get_by_test_id("fields").get_by_label("amount").fill("5")
    page.get_by_role("button", name="Approve", exact=True).click()

    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Approve the edited input?")
    expect(dialog.locator(".confirm-detail")).to_contain_text("amount: 20 → 5")  # what changed, then the whole input
    expect(dialog.locator(".confirm-detail")).to_contain_text('"amount": 5')
    page.screenshot(path=shots / "ui-confirm-edit.png")
    dialog.get_by_role("button", name="Back").click()  # nothing is sent: the person looks again
    expect(dialog).to_be_hidden()
    assert "toolu_refund" not in reviewed.results(run)

    page.get_by_role("button", name="Approve", exact=True).click()
    dialog.get_by_role("button", name="Approve the edited input").click()
    expect(page.get_by_role("status")).to_contain_text("Decision recorded for toolu_refund")
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    assert reviewed.results(run)["toolu_refund"].endswith("refunded 5.0 on INV-7")  # the edit ran, not the 20


def test_without_a_script_approve_after_an_edit_is_refused_and_says_why(reviewed: Reviewed, browser: Any) -> None:
    from playwright.sync_api import expect

    run = reviewed.parked[1]
    context = browser.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 860})
    try:
        page = signed_in(reviewed, context, f"runs/{run}")
        page.get_by_text("Edit the input").click()
        page.get_by_test_id("fields").get_by_label("amount").fill("5")
        page.get_by_role("button", name="Approve", exact=True).click()
        expect(page.get_by_test_id("decision-error")).to_have_text(UNCONFIRMED_EDIT)
        expect(page.get_by_test_id("fields").get_by_label("amount")).to_have_value("5")  # kept, to approve or undo
        expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")
        assert "toolu_refund" not in reviewed.results(run)

        page.get_by_role("button", name="Approve the edited input").click()
        expect(page.get_by_role("status")).to_contain_text("Decision recorded for toolu_refund")
    finally:
        context.close()
    assert reviewed.result(run, "toolu_refund").endswith("refunded 5.0 on INV-7")


# Editing the input field by field ---------------------------------------------------------------
def test_the_input_is_edited_field_by_field_as_the_tools_schema_says(
    reviewed: Reviewed, context: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    run = reviewed.shipments[0]
    page = signed_in(reviewed, context, f"runs/{run}")
    page.get_by_text("Edit the input").click()
    fields = page.get_by_test_id("fields")
    expect(fields.get_by_label("order")).to_have_value("A-1")
    expect(fields.get_by_label("carrier")).to_have_value('"dhl"')  # a choice of the enum's values
    expect(fields.get_by_label("express")).to_have_value("false")
    expect(fields.get_by_label("boxes")).to_have_attribute("type", "number")
    expect(fields.locator("[data-field=boxes]")).to_contain_text("How many boxes")  # the schema's description
    expect(fields.get_by_label("items")).to_have_value('[\n  {\n    "sku": 7\n  }\n]')  # nested: raw JSON

    fields.get_by_label("carrier").select_option(label="ups")
    fields.get_by_label("express").select_option(label="true")
    fields.get_by_label("boxes").fill("3")
    fields.get_by_label("note").fill("fragile")
    page.screenshot(path=shots / "ui-edit-fields.png", full_page=True)
    page.get_by_role("button", name="Approve", exact=True).click()
    dialog = page.get_by_role("dialog")
    expect(dialog.locator(".confirm-detail")).to_contain_text('"carrier": "ups"')  # the raw JSON follows the fields
    dialog.get_by_role("button", name="Approve the edited input").click()
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    shipped = reviewed.result(run, "toolu_ship")
    assert shipped.endswith(
        "edited the input before running the tool.)\nshipped A-1 by ups: 3 box(es), express True, note 'fragile'"
    )


def test_a_field_the_schema_refuses_says_so_beside_it(reviewed: Reviewed, context: Any) -> None:
    from playwright.sync_api import expect

    run = reviewed.shipments[1]
    page = signed_in(reviewed, context, f"runs/{run}")
    page.get_by_text("Edit the input").click()
    fields = page.get_by_test_id("fields")
    fields.get_by_label("boxes").fill("0")  # the schema wants at least 1
    fields.get_by_label("items").fill('[{"sku": 7},')  # not JSON
    page.get_by_role("button", name="Approve the edited input").click()
    expect(page.locator("[data-field=items] [data-testid=field-error]")).to_contain_text("not valid JSON")
    expect(fields.get_by_label("boxes")).to_have_value("0")  # what was typed stays, to fix

    fields.get_by_label("items").fill('[{"sku": 7}]')
    page.get_by_role("button", name="Approve the edited input").click()
    expect(page.locator("[data-field=boxes] [data-testid=field-error]")).to_contain_text("greater than or equal to 1")
    expect(page.locator("[data-field=items] [data-testid=field-error]")).to_have_count(0)
    expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")

    fields.get_by_label("boxes").fill("1")
    page.get_by_role("button", name="Approve the edited input").click()
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    assert reviewed.result(run, "toolu_ship").endswith("shipped A-1 by dhl: 1 box(es), express False, note None")


def test_the_raw_json_sets_the_fields_aside(reviewed: Reviewed, context: Any) -> None:
    from playwright.sync_api import expect

    run = reviewed.shipments[2]
    page = signed_in(reviewed, context, f"runs/{run}")
    page.get_by_text("Edit the input").click()
    page.get_by_text("Raw JSON").click()
    page.locator("textarea[name=input]").fill(
        '{"order": "A-2", "carrier": "ups", "express": true, "boxes": 4, "items": []}'
    )
    expect(page.get_by_test_id("fields")).to_have_class("fields set-aside")
    expect(page.get_by_test_id("fields").get_by_label("order")).to_be_disabled()
    page.get_by_role("button", name="Approve the edited input").click()
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    assert reviewed.result(run, "toolu_ship").endswith("shipped A-2 by ups: 4 box(es), express True, note None")


def test_the_confirmation_shows_a_text_of_several_lines_as_its_lines(reviewed: Reviewed, context: Any) -> None:
    from playwright.sync_api import expect

    run = reviewed.shipments[3]
    page = signed_in(reviewed, context, f"runs/{run}")
    page.get_by_text("Edit the input").click()
    page.get_by_text("Raw JSON").click()
    edited = {**SHIPMENT, "note": "Leave it at the door.\nRing twice."}
    page.locator("textarea[name=input]").fill(json.dumps(edited))
    page.get_by_role("button", name="Approve", exact=True).click()
    detail = page.get_by_role("dialog").locator(".confirm-detail")
    expect(detail).to_be_visible()
    changed = detail.inner_text().split("\n\n")[0]  # what changed; the whole input (JSON) follows
    assert changed == "note:\n  was: (not given)\n  now:\n    Leave it at the door.\n    Ring twice.", changed
    page.get_by_role("dialog").get_by_role("button", name="Approve the edited input").click()
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    assert reviewed.result(run, "toolu_ship").endswith("note 'Leave it at the door.\\nRing twice.'")


# What a card says ------------------------------------------------------------------------------
def turn_of(page: Any, run_id: str) -> Any:
    return page.locator(f"section.turn[data-run='{run_id}']")


def test_an_inbox_card_shows_what_the_call_will_do_and_why(reviewed: Reviewed, browser: Any, shots: Path) -> None:
    from playwright.sync_api import expect

    for width in (1280, 390):
        context = sized(browser, width)
        try:
            page = signed_in(reviewed, context, "inbox")
            turn = turn_of(page, reviewed.pairs[2])
            expect(turn.get_by_test_id("prompt")).to_contain_text("Refund INV-7 and ship A-1 again, case 2.")
            said = turn.get_by_test_id("model-said").locator(".text")
            assert said.inner_text() == "Refunding the duplicate charge,\nthen shipping the replacement."  # its lines
            refund = turn.locator("article.pending[data-call=toolu_refund]")
            expect(refund.get_by_test_id("tool-description").locator("strong")).to_have_text("company account")
            expect(refund.get_by_test_id("why")).to_contain_text("the tool is marked approval=True")
            ship = turn.locator("article.pending[data-call=toolu_ship]")
            expect(ship.get_by_test_id("why")).to_contain_text("rule 2 (shipping-desk): shipments go through the desk")
            note = ship.get_by_test_id("note")
            expect(note.locator("strong")).to_have_text("address")
            expect(note.get_by_role("link", name="the runbook")).to_have_attribute(
                "rel", "noopener noreferrer nofollow"
            )
            assert page.evaluate("document.documentElement.scrollWidth") == width  # nothing wider than the screen
            turn.scroll_into_view_if_needed()
            page.screenshot(path=shots / f"ui-inbox-{width}.png", full_page=width == 390)
        finally:
            context.close()


def test_a_child_runs_call_shows_its_chain_and_is_decided_from_its_parents_page(
    reviewed: Reviewed, context: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    inbox = signed_in(reviewed, context, "inbox")
    chain = inbox.locator("section.turn").filter(has=inbox.locator("[data-call=toolu_clerk]")).get_by_test_id("chain")
    expect(chain).to_contain_text(reviewed.parent)  # the root first
    expect(chain).to_contain_text("via delegate toolu_delegate")
    expect(chain).to_contain_text("child run")

    page = signed_in(reviewed, context, f"runs/{reviewed.parent}")  # the parent, parked by its child
    expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")
    card = page.locator("article.pending[data-call=toolu_clerk]")
    expect(card).to_be_visible()
    expect(page.get_by_test_id("model-said")).to_contain_text("I will refund INV-9")  # the clerk's words
    page.screenshot(path=shots / "ui-parent-waits-on-child.png", full_page=True)
    card.get_by_label("Decided by").fill("carol")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Decision recorded for toolu_clerk")
    expect(page.get_by_test_id("run-status")).to_have_text("done")  # the root was driven on, its child first
    expect(page.get_by_test_id("run-output")).to_contain_text("The clerk refunded it.")


def test_a_turns_calls_are_decided_together(reviewed: Reviewed, context: Any) -> None:
    from playwright.sync_api import expect

    run = reviewed.pairs[0]
    page = signed_in(reviewed, context, f"runs/{run}")
    ship = page.locator("article.pending[data-call=toolu_ship]")
    ship.get_by_text("Edit the input").click()
    ship.get_by_test_id("fields").get_by_label("boxes").fill("5")
    together = page.get_by_test_id("decide-all")
    together.get_by_role("button", name="Approve all 2 as shown").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("You edited the input of ship")  # all as shown would not be the edit
    dialog.get_by_role("button", name="Back").click()
    ship.get_by_test_id("fields").get_by_label("boxes").fill("2")  # taken back: as shown

    together.get_by_label("Decided by").fill("dana")
    together.get_by_role("button", name="Approve all 2 as shown").click()
    expect(page.get_by_role("status")).to_contain_text("Decision recorded for toolu_refund, toolu_ship")
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    assert reviewed.results(run)["toolu_refund"] == "refunded 20.0 on INV-7"
    assert reviewed.results(run)["toolu_ship"].startswith("shipped A-1 by dhl: 2 box(es)")
    expect(page.locator("table.timeline")).to_contain_text("ship approved by dana")

    denied = reviewed.pairs[1]
    page.goto(f"{reviewed.base}runs/{denied}")
    together = page.get_by_test_id("decide-all")
    together.get_by_label("Reason").fill("not today")
    together.get_by_role("button", name="Deny all 2").click()
    page.get_by_role("dialog").get_by_role("button", name="Deny all").click()  # asked first
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    assert all("not today" in said for said in reviewed.results(denied).values())


def test_markdown_in_a_note_is_shown_safely(reviewed: Reviewed, context: Any) -> None:
    from playwright.sync_api import expect

    page = signed_in(reviewed, context, f"runs/{reviewed.hostile}")
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    note = page.get_by_test_id("note")
    expect(note.locator("strong")).to_have_text("Careful")
    expect(note).to_contain_text("<script>window.__xss = 1</script>")  # shown as text
    expect(note).to_contain_text("[click](javascript:window.__xss=2)")  # not a link
    assert note.locator("script, img, a").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert errors == []


# The runs list ---------------------------------------------------------------------------------
def test_the_runs_list_pages_over_every_run_and_searches_them_all(
    reviewed: Reviewed, browser: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    for width in (1280, 390):
        context = sized(browser, width)
        try:
            page = signed_in(reviewed, context, "")
            expect(page.get_by_test_id("count")).to_contain_text(f"1\N{EN DASH}50 of {reviewed.total} runs")
            assert page.evaluate("document.documentElement.scrollWidth") == width
            table = page.locator("table.runs")
            assert table.evaluate("t => t.scrollWidth <= t.clientWidth")  # no sideways scroll, at 390 px too
            page.screenshot(path=shots / f"ui-runs-{width}.png")

            page.get_by_test_id("pager").get_by_role("link", name="older").click()
            expect(page.get_by_test_id("count")).to_contain_text(
                f"51\N{EN DASH}{reviewed.total} of {reviewed.total} runs"
            )
            expect(page.locator("tr[data-run=run_old_00]")).to_be_visible()  # the oldest, beyond any first page

            page.get_by_label("Search").fill("archive box 7")  # a prompt, on every page
            page.get_by_label("Agent").fill("archiv")
            page.get_by_role("button", name="Filter").click()
            expect(page.locator("tr[data-run]")).to_have_count(1)
            expect(page.locator("tr[data-run=run_old_07]")).to_contain_text("archivist")
            expect(page.locator("tr[data-run=run_old_07]")).to_contain_text("claude-haiku-4-5")
            expect(page.get_by_test_id("count")).to_contain_text("matching these filters")
            page.get_by_label("Search").fill("refund inv-9")  # the clerk's task: a child run's prompt
            page.get_by_label("Agent").fill("")
            page.get_by_role("button", name="Filter").click()
            expect(page.locator("tr[data-run]")).to_have_count(1)
            expect(page.locator("tr[data-run] .parent")).to_contain_text(reviewed.parent)
        finally:
            context.close()


# Cancel, resume, retry and fork: each asked first ------------------------------------------------
def test_a_run_waiting_for_a_retry_says_when_and_is_resumed_after_a_yes(
    reviewed: Reviewed, context: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    page = signed_in(reviewed, context, f"runs/{reviewed.retrying}")
    expect(page.get_by_test_id("run-status")).to_have_text("waiting_retry")
    expect(page.get_by_test_id("due")).to_contain_text("Waits for a tool retry due 20")
    expect(page.locator("main")).to_have_attribute("data-waiting", re.compile(r"^retry due \d{4}-"))
    page.screenshot(path=shots / "ui-waiting-retry.png")
    page.get_by_test_id("control-resume").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(f"Resume run {reviewed.retrying}?")
    expect(dialog).to_contain_text("tools that need no approval run at once")
    dialog.get_by_role("button", name="Back").click()
    expect(page.get_by_test_id("run-status")).to_have_text("waiting_retry")  # nothing was sent

    page.get_by_test_id("control-resume").click()
    dialog.get_by_role("button", name="Resume the run").click()
    expect(page.get_by_test_id("acted")).to_contain_text(f"Run {reviewed.retrying} is driven on")
    expect(page.get_by_test_id("run-status")).to_have_text("done")  # the retry ran, the model answered
    assert reviewed.results(reviewed.retrying)["toolu_lookup"] == "found k1"


def test_a_failed_run_a_new_try_may_mend_is_retried_from_its_page(reviewed: Reviewed, context: Any) -> None:
    from playwright.sync_api import expect

    page = signed_in(reviewed, context, f"runs/{reviewed.failed}")
    expect(page.get_by_test_id("run-status")).to_have_text("failed")
    expect(page.get_by_test_id("control-resume")).to_have_count(0)  # it ended: only a retry goes on
    page.get_by_test_id("control-retry").click()
    page.get_by_role("dialog").get_by_role("button", name="Retry the run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    expect(page.get_by_test_id("run-output")).to_have_text("All good now.")
    expect(page.get_by_test_id("controls")).to_have_count(0)  # nothing more to do to it


def test_cancel_asks_first_on_the_page_or_without_a_script_on_a_page_of_its_own(
    reviewed: Reviewed, context: Any, browser: Any
) -> None:
    from playwright.sync_api import expect

    page = signed_in(reviewed, context, f"runs/{reviewed.parked[2]}")
    page.get_by_label("Why cancel (optional)").fill("the customer withdrew")
    page.get_by_test_id("control-cancel").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("It stops for good")
    dialog.get_by_role("button", name="Cancel the run").click()
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.get_by_test_id("run-error")).to_contain_text("the customer withdrew")

    plain = browser.new_context(java_script_enabled=False)
    try:
        page = signed_in(reviewed, plain, f"runs/{reviewed.parked[3]}")
        page.get_by_test_id("control-cancel").click()
        expect(page.get_by_test_id("confirm-page")).to_contain_text(f"Cancel run {reviewed.parked[3]}?")
        page.get_by_role("link", name="Back to the run").click()
        expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")  # nothing was done
        page.get_by_test_id("control-cancel").click()
        page.get_by_role("button", name="Cancel the run").click()
        expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    finally:
        plain.close()


def test_a_fork_says_it_runs_tools_at_once_and_waits_for_a_yes(reviewed: Reviewed, context: Any) -> None:
    from playwright.sync_api import expect

    page = signed_in(reviewed, context, f"runs/{reviewed.shipments[0]}")
    page.get_by_test_id("fork-2").click()  # the model's first step (forks at #1, before it)
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Fork run")
    expect(dialog).to_contain_text("tools that need no approval run right away")
    dialog.get_by_role("button", name="Back").click()
    expect(page).to_have_url(f"{reviewed.base}runs/{reviewed.shipments[0]}")  # no fork was made


# Reading a run ---------------------------------------------------------------------------------
def test_a_run_reads_as_text_with_its_zone_its_system_prompt_and_a_quiet_timeline(
    reviewed: Reviewed, browser: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    for width in (1280, 390):
        context = sized(browser, width)
        try:
            page = signed_in(reviewed, context, f"runs/{reviewed.letter}")
            expect(page.get_by_test_id("system-prompt")).to_contain_text("You are the billing desk.")
            shown = page.locator("#call-toolu_echo dl.kv .str")
            assert shown.inner_text() == LETTER  # its line breaks, not \n
            started = re.compile(r"started \d{4}-\d\d-\d\d [\d:]+ \S+")  # with its time zone
            expect(page.locator("header.run-head .meta")).to_contain_text(started)

            timeline = page.locator("table.timeline").last
            expect(timeline.locator("tr.tone-move").first).to_be_hidden()  # the noisy moves, hidden at first
            expect(timeline.locator("tr.tone-model").first).to_be_visible()
            page.get_by_test_id("timeline-filter").get_by_label("moves between states").check()
            expect(timeline.locator("tr.tone-move").first).to_be_visible()
            page.get_by_test_id("timeline-filter").get_by_label("model calls").uncheck()
            expect(timeline.locator("tr.tone-model").first).to_be_hidden()

            diagram = page.get_by_test_id("diagram")
            expect(diagram).to_be_hidden()  # folded: it is long
            page.get_by_text("Path through the machine").click()
            expect(diagram).to_be_visible()
            assert page.evaluate("document.documentElement.scrollWidth") == width
            page.screenshot(path=shots / f"ui-run-{width}.png", full_page=True)
        finally:
            context.close()
