"""A call a crash left in doubt (started, never finished) is resolved by policy, never silently re-run.

The crash here is a KeyboardInterrupt raised inside the tool (the one exception a tool's error
does not absorb): the tool's start stays committed and its end never is, as when the process dies (the real
SIGKILL version of these cases is in test_crash_safety.py). A fresh runner then resumes.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import tool_use, tool_use_turn
from tether import Agent, Approve, Deny, Runner, tool
from tether.core.approvals import Approver, AutoApprover, DecideLater, fingerprint
from tether.errors import ConfigError, ToolDefinitionError
from tether.stores.memory import MemoryStore
from tether.testing import RecordingApprover, ScriptedModel
from tether.tools import OnInterrupted, Tool
from tether.views.pending import pending_approvals


class Crash(KeyboardInterrupt):
    """Stands in for the process dying mid-tool (only Ctrl-C escapes a tool: anything else is its error)."""


def transfer_tool(ran: list[int], on_interrupted: OnInterrupted | None = None, *, approval: bool = False) -> Tool:
    crashes = [True]

    @tool(on_interrupted=on_interrupted, approval=approval)
    def transfer(amount: int) -> str:
        """Move money (not idempotent)."""
        ran.append(amount)
        if crashes:
            crashes.pop()
            raise Crash
        return f"moved {amount}"

    return transfer


SCRIPT = [
    tool_use_turn(tool_use("toolu_1", "transfer", {"amount": 5})),
    {"content": [{"type": "text", "text": "Handled."}], "stop_reason": "end_turn"},
]


def crashed_run(store: MemoryStore, transfer: Tool, **agent_options: Any) -> str:
    runner = Runner(Agent(model=ScriptedModel(SCRIPT), tools=[transfer], **agent_options), store)
    state = runner.create("Move 5.")
    with pytest.raises(Crash):
        runner.drive(state.id)
    return state.id


def resumed(store: MemoryStore, run_id: str, transfer: Tool, approver: Approver | None, **agent_options: Any) -> Runner:
    return Runner(Agent(model=ScriptedModel(SCRIPT), tools=[transfer], **agent_options), store, approver=approver)


def transfer_result(store: MemoryStore, run_id: str) -> dict[str, Any]:
    return [e.data for e in store.load_events(run_id) if e.type == "tool_finished"][-1]


@pytest.mark.parametrize(
    ("tool_setting", "agent_setting", "approver", "outcome"),
    [
        (None, "ask", DecideLater(), "asked"),
        (None, "ask", None, "no approver"),
        (None, "error", DecideLater(), "policy"),
        ("error", "ask", DecideLater(), "policy"),  # the tool's own setting wins
        ("ask", "error", DecideLater(), "asked"),
        ("ask", "ask", None, "no approver"),  # asking needs someone to ask
    ],
)
def test_the_in_doubt_policy_decides_between_asking_and_reporting(
    tool_setting: OnInterrupted | None, agent_setting: OnInterrupted, approver: Approver | None, outcome: str
) -> None:
    ran: list[int] = []
    transfer = transfer_tool(ran, tool_setting)
    store = MemoryStore()
    run_id = crashed_run(store, transfer, on_interrupted=agent_setting)
    result = resumed(store, run_id, transfer, approver, on_interrupted=agent_setting).drive(run_id)
    assert ran == [5]  # never silently twice
    if outcome == "asked":
        assert result.status == "awaiting_approval"
        assert "interrupted mid-run" in result.pending_approvals[0]["reason"]
        return
    assert result.status == "done"
    reported = transfer_result(store, run_id)
    assert reported["is_error"] is True
    assert reported["interrupted"] is True
    why = "its policy is not to re-run" if outcome == "policy" else "there is no approver to ask"
    assert reported["content"] == (
        "Error: this call was interrupted mid-run (the process running it stopped before its result was "
        f"recorded), so it may already have taken effect; it was not run again ({why}). "
        "Check its effect before calling it again."
    )


def test_a_denied_rerun_tells_the_model_the_call_was_interrupted() -> None:
    ran: list[int] = []
    transfer = transfer_tool(ran)
    store = MemoryStore()
    run_id = crashed_run(store, transfer)
    approver = RecordingApprover({"toolu_1": Deny("it probably went through", actor="alice")})
    result = resumed(store, run_id, transfer, approver).drive(run_id)
    assert result.status == "done"
    assert ran == [5]
    content = transfer_result(store, run_id)["content"]
    assert "interrupted mid-run" in content
    assert "may already have taken effect" in content
    assert "it was not run again (alice declined to re-run it: it probably went through)" in content
    assert "denied by" not in content


def test_an_approved_rerun_runs_the_call_again_once() -> None:
    ran: list[int] = []
    transfer = transfer_tool(ran)
    store = MemoryStore()
    run_id = crashed_run(store, transfer)
    result = resumed(store, run_id, transfer, AutoApprover(approve=True)).drive(run_id)
    assert result.status == "done"
    assert ran == [5, 5]
    assert transfer_result(store, run_id)["content"] == "moved 5"


def test_a_person_can_decide_later_from_another_runner() -> None:
    ran: list[int] = []
    transfer = transfer_tool(ran)
    store = MemoryStore()
    run_id = crashed_run(store, transfer)
    parked = resumed(store, run_id, transfer, DecideLater()).drive(run_id)
    assert parked.status == "awaiting_approval"
    service = resumed(store, run_id, transfer, None)
    service.decide(run_id, "toolu_1", Approve(actor="bob"))
    assert service.drive(run_id).status == "done"
    assert ran == [5, 5]


def test_a_call_in_doubt_whose_approval_edited_its_input_is_shown_and_rerun_with_that_input() -> None:
    ran: list[int] = []
    transfer = transfer_tool(ran, approval=True)
    store = MemoryStore()
    first = Runner(Agent(model=ScriptedModel(SCRIPT), tools=[transfer]), store)
    run_id = first.run("Move 5.").run_id
    first.decide(run_id, "toolu_1", Approve(input={"amount": 3}, actor="alice"))
    with pytest.raises(Crash):
        first.drive(run_id)
    assert ran == [3]

    parked = resumed(store, run_id, transfer, DecideLater()).drive(run_id)
    assert parked.status == "awaiting_approval"
    [shown] = parked.pending_approvals
    assert shown["input"] == {"amount": 3}  # what would run, not the model's {"amount": 5}
    assert shown["fingerprint"] == fingerprint({"amount": 3})
    assert "as alice edited it" in shown["reason"]
    [listed] = pending_approvals(store, run_id=run_id)
    assert (listed.input, listed.fingerprint) == ({"amount": 3}, shown["fingerprint"])
    asked = [e.data for e in store.load_events(run_id) if e.type == "approval_requested"][-1]
    assert asked["calls"][0]["input"] == {"amount": 3}

    approver = RecordingApprover({"toolu_1": Approve(actor="bob")})
    result = resumed(store, run_id, transfer, approver).drive(run_id)
    assert [(request.input, request.fingerprint) for request in approver.seen[0]] == [
        ({"amount": 3}, shown["fingerprint"])
    ]
    assert result.status == "done"
    assert ran == [3, 3]  # approving what was shown runs what was shown
    decided = [e.data for e in store.load_events(run_id) if e.type == "approval_decided"][-1]
    assert (decided["actor"], decided["input"]) == ("bob", {"amount": 3})


def test_bad_settings_are_refused_when_defined() -> None:
    def pay() -> str:
        """Pay."""
        return "paid"

    with pytest.raises(ToolDefinitionError, match="on_interrupted must be 'ask' or 'error'"):
        tool(on_interrupted="rerun")(pay)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="on_interrupted must be 'ask' or 'error'"):
        Agent(model=ScriptedModel([]), on_interrupted="rerun")  # type: ignore[arg-type]
