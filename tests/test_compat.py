"""A stored run refuses to resume with tools whose inputs changed incompatibly, saying how."""

from __future__ import annotations

import pytest

from tether import Agent, Approve, Runner, tool
from tether.compat import schema_changes
from tether.errors import IncompatibleRun
from tether.machine import MACHINE_VERSION
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel


def gated_script() -> list[dict[str, object]]:
    return [
        {
            "content": [{"type": "tool_use", "id": "t1", "name": "refund", "input": {"invoice": "A1", "amount": 5}}],
            "stop_reason": "tool_use",
        },
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
    ]


@tool(approval=True)
def refund(invoice: str, amount: int) -> str:
    """Refund (version 1)."""
    return f"refunded {amount}"


def parked_run(store: MemoryStore) -> str:
    result = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund]), store).run("refund A1")
    assert result.status == "awaiting_approval"
    return result.run_id


def test_compatible_changes_resume() -> None:
    @tool(name="refund", approval=True)
    def refund_v2(invoice: str, amount: int, note: str = "") -> str:
        """Refund (version 2: an optional field)."""
        return f"refunded {amount}"

    @tool
    def extra() -> str:
        """A new tool."""
        return "x"

    store = MemoryStore()
    run_id = parked_run(store)
    runner = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund_v2, extra]), store)
    assert runner.drive(run_id).status == "awaiting_approval"


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        ("removed", "tool 'refund' is no longer available"),
        ("field_removed", "tool 'refund': field 'amount' was removed"),
        ("new_required", "tool 'refund': field 'reason' is now required"),
        ("type_changed", "tool 'refund': field 'amount' changed type from integer to string"),
    ],
)
def test_incompatible_changes_are_refused_naming_the_tool_and_change(changed: str, says: str) -> None:
    @tool(name="refund")
    def without_amount(invoice: str) -> str:
        """Refund."""
        return "x"

    @tool(name="refund")
    def with_reason(invoice: str, amount: int, reason: str) -> str:
        """Refund."""
        return "x"

    @tool(name="refund")
    def amount_as_text(invoice: str, amount: str) -> str:
        """Refund."""
        return "x"

    tools = {
        "removed": [],
        "field_removed": [without_amount],
        "new_required": [with_reason],
        "type_changed": [amount_as_text],
    }[changed]
    store = MemoryStore()
    run_id = parked_run(store)
    runner = Runner(Agent(model=ScriptedModel(gated_script()), tools=tools), store)
    with pytest.raises(IncompatibleRun, match=says):
        runner.drive(run_id)
    with pytest.raises(IncompatibleRun):
        runner.decide(run_id, "t1", Approve())
    assert store.load_run(run_id).status == "awaitingApproval"  # nothing was changed


def test_a_run_from_a_newer_machine_is_refused() -> None:
    store = MemoryStore()
    run_id = parked_run(store)
    runner = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund]), store)
    state = runner.load(run_id)
    state.spec["machine_version"] = MACHINE_VERSION + 1
    with pytest.raises(IncompatibleRun, match="newer tether"):
        runner.drive(state)


def test_schema_changes_lists_only_incompatible_differences() -> None:
    old = {"properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    new = {
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "string"}},
        "required": ["a"],
    }
    assert schema_changes(old, new) == []
    assert schema_changes(new, old) == ["field 'c' was removed"]
