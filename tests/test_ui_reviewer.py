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
from ui_runs import Project, serve

pytestmark = pytest.mark.slow

EDITED = '{"invoice": "INV-7", "amount": 5}'
"""A narrower refund than the model's 20, typed over the parked call's input."""


@dataclass
class Reviewed:
    """A running ``tether ui`` and the runs its reviewers decide."""

    address: str
    base: str
    url: str
    parked: list[str]
    """Runs parked before ``refund`` (``toolu_refund``, 20 on INV-7), one per test that decides one."""

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
    url = f"sqlite:///{root / 'runs.db'}"
    store = SQLStore(url)
    try:
        parked = [project.park(store, prompt=f"Refund INV-7, case {n}.").run_id for n in range(4)]
    finally:
        store.close()
    with serve(url, root / "ui.log") as (address, base, _):
        yield Reviewed(address, base, url, parked)


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
    page.locator("textarea[name=input]").fill(EDITED)
    page.get_by_role("button", name="Approve", exact=True).click()

    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Approve the edited input?")
    expect(dialog.locator(".confirm-detail")).to_have_text(EDITED)
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
        page.locator("textarea[name=input]").fill(EDITED)
        page.get_by_role("button", name="Approve", exact=True).click()
        expect(page.get_by_test_id("decision-error")).to_have_text(UNCONFIRMED_EDIT)
        expect(page.locator("textarea[name=input]")).to_have_value(EDITED)  # kept, to approve or undo
        expect(page.get_by_test_id("run-status")).to_have_text("awaiting_approval")
        assert "toolu_refund" not in reviewed.results(run)

        page.get_by_role("button", name="Approve the edited input").click()
        expect(page.get_by_role("status")).to_contain_text("Decision recorded for toolu_refund")
    finally:
        context.close()
    assert reviewed.result(run, "toolu_refund").endswith("refunded 5.0 on INV-7")
