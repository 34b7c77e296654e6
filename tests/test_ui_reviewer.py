"""`tether ui` as a reviewer uses it, in Chromium: what a person sees before saying yes, and what runs after.

The server is the real command on SQLite (see :func:`ui_runs.serve`); the runs are real (tools from a
module on disk, a scripted model, a rule file). Each test acts as a person would: it reads the card,
types, clicks, answers the page's questions, and then checks what the run did.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tether.core.events import ToolFinished
from tether.stores.sql import SQLStore
from tether.surfaces.web.decisions import UNCONFIRMED_EDIT
from ui_runs import Project, serve, shipping

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
    url = f"sqlite:///{root / 'runs.db'}"
    store = SQLStore(url)
    try:
        parked = [project.park(store, prompt=f"Refund INV-7, case {n}.").run_id for n in range(4)]
        shipments = [shipper.park(store, prompt=f"Ship order A-1, case {n}.").run_id for n in range(3)]
    finally:
        store.close()
    with serve(url, root / "ui.log") as (address, base, _):
        yield Reviewed(address, base, url, parked, shipments)


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
