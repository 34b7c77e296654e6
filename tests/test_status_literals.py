"""A run status is spelt in one place: :mod:`tether.facts.status`.

Every other module names a status through :class:`~tether.facts.status.RunStatus` (or the sets and
names derived from it), so renaming or adding one is a change to one file and the type checker
sees every use. This scans the source for string constants equal to a status's stored value or
shown name; the few words that are the same but mean something else are allowed below, each
with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tether
from tether.core.machine import AgentMachine
from tether.facts.status import ENDED, FINAL, SHOWN, WAITING_RETRY, RunStatus, status_name, stored_filter, stored_status

SRC = Path(tether.__file__).parent
HOME = "facts/status.py"
"""The one module that spells statuses."""
WORDS = {status.value for status in RunStatus} | set(SHOWN)

ALLOWED: dict[tuple[str, str | None, str], str] = {
    ("views/audit.py", "_ask", "awaiting_approval"): "a tool call's audit status, not a run's",
    ("surfaces/terminal.py", None, "awaiting_approval"): "the colour of that audit status (CALL_STATUS_STYLES)",
    ("surfaces/story.py", None, "awaiting_approval"): "that audit status, said by the decision's line",
    ("views/diagram.py", None, "failed"): "the kind of a sequence diagram arrow (a call that failed)",
    ("models/shape.py", None, "thinking"): "a Messages API content block type",
    ("models/anthropic.py", "_settings_params", "thinking"): "the Messages API's thinking option",
    ("models/chat_format.py", None, "thinking"): "a Messages API content block type (another provider's, dropped)",
    ("testing/fake_messages_api.py", None, "thinking"): "the Messages API's thinking blocks and option",
}
"""(module under src/tether, enclosing function or None for anywhere in it, word): why it is not a status."""


def _literals(path: Path) -> list[tuple[str | None, str, int]]:
    """(enclosing function, value, line) of each string constant that is a status word."""
    found: list[tuple[str | None, str, int]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in WORDS:
            found.append((function, node.value, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return found


def test_no_status_literal_outside_the_status_module() -> None:
    stray = []
    used: set[tuple[str, str | None, str]] = set()
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        if module == HOME:
            continue
        for function, value, line in _literals(path):
            allowed = next((key for key in ((module, function, value), (module, None, value)) if key in ALLOWED), None)
            if allowed is None:
                stray.append(f"{module}:{line}: {value!r}")
            else:
                used.add(allowed)
    assert stray == [], "spell statuses with tether.facts.status.RunStatus"
    assert used == set(ALLOWED), "an allowed word is gone: drop it from ALLOWED"


def test_the_scan_sees_a_status_literal() -> None:
    home = {value for _, value, _ in _literals(SRC / HOME)}
    assert home == {status.value for status in RunStatus} | {WAITING_RETRY}  # shown names are the members' names


def test_sets_and_names_are_derived_from_the_enum_and_the_machine() -> None:
    assert {state.value for state in AgentMachine.states if state.final} == FINAL
    assert frozenset({"done", "failed", "cancelled"}) == ENDED
    assert SHOWN == ("awaiting_approval", "cancelled", "done", "executing_tool", "failed", "thinking", WAITING_RETRY)
    assert status_name("executingTool") == "executing_tool"
    assert status_name(None) == "unknown"
    assert status_name("someday") == "someday"  # a stored value this version does not know is shown as it is
    assert stored_status("awaiting_approval") == "awaiting_approval"
    assert stored_status("awaitingApproval") == "awaiting_approval"  # as a database keeps it
    assert stored_status(WAITING_RETRY) == RunStatus.executing_tool
    assert stored_filter("awaiting_approval") == (RunStatus.awaiting_approval, None)
    assert stored_filter(WAITING_RETRY) == (RunStatus.executing_tool, True)
    assert stored_filter("executing_tool") == (RunStatus.executing_tool, False)
