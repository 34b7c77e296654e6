"""Text from people, tools and models is printed as text: brackets that look like rich markup
(``[/x]``, a key of an edited input) neither crash the CLI nor disappear."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import DEMO_PROMPT, FIBONACCI, demo_db_url, finish_terminal, flat, run_tether, spawn_tether

pytestmark = pytest.mark.slow  # real `tether` processes and pseudo-terminals

MARKUP_KEY = '{"path": "fib.py", "[/x]": 1}'
"""Edited input whose extra key is a rich closing tag: the tool's schema rejects it."""


def test_decisions_and_listings_print_bracketed_text_as_it_is(tmp_path: Path) -> None:
    parked = run_tether(tmp_path, "demo", "--json")
    assert parked.returncode == 3, parked
    run_id, db = parked.data["run_id"], demo_db_url(tmp_path / "tether-demo")

    extra_key = run_tether(tmp_path, "approve", run_id, "toolu_demo_run", "--input", MARKUP_KEY, "--db", db)
    assert extra_key.returncode == 1, extra_key
    assert "refused: " in extra_key.err
    assert "[/x]" in extra_key.err
    assert "Traceback" not in extra_key.stderr

    missing = run_tether(tmp_path, "approve", run_id, "toolu_demo_run", "--input", "{}", "--db", db)
    assert missing.returncode == 1, missing
    assert "path: Field required" in missing.err  # said per field in plain words

    reason = "[/x] [bold]not today[/bold]"
    denied = run_tether(tmp_path, "deny", run_id, "toolu_demo_run", "--reason", reason, "--db", db)
    assert denied.returncode == 0, denied
    for command in (["show", run_id], ["audit", "--run", run_id]):
        shown = run_tether(tmp_path, *command, "--db", db)
        assert shown.returncode == 0, shown
        assert "[/x] [bold]not" in flat(shown.stdout), shown


def test_an_edit_with_a_markup_like_key_is_refused_and_asked_again_in_a_terminal(tmp_path: Path) -> None:
    child = spawn_tether(tmp_path, "demo")
    try:
        child.expect(DEMO_PROMPT)
        child.sendline("e")
        child.expect(r"JSON[^\n]*> ")
        child.sendline(MARKUP_KEY)
        child.expect(re.escape("Not valid for run_python: [/x]: Extra inputs are not permitted"))
        child.expect(r"JSON[^\n]*> ")
        child.sendline('{"path": "fib.py"}')
        status, output = finish_terminal(child)
    finally:
        child.close(force=True)
    assert status == 0, output
    assert "MarkupError" not in output
    assert f"printed: {FIBONACCI}" in output
