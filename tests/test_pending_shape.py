"""A call waiting for approval has one shape, and an edit of it one check.

The approver, ``RunResult.pending_approvals``, the rows behind ``tether pending`` and the
service all describe a parked call with :class:`tether.core.approvals.PendingApproval`, built from a
run state in one place; :func:`tether.core.engine.check_edit` is the check a decision's edited input
passes, made by the engine on a decision and by the terminal's edit prompt alike.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import tether
from support import model_reply, tool_use
from tether import Agent, Approve, Policy, Rule, Runner, tool
from tether.core.approvals import PendingApproval, fingerprint
from tether.core.engine import check_edit
from tether.errors import DeniedByPolicy, InvalidEditedInput
from tether.models.scripted import ScriptedModel
from tether.stores.memory import MemoryStore
from tether.testing import RecordingApprover
from tether.views.pending import pending_approvals


@tool(approval=True)
def delete(path: str, recursive: bool = False) -> str:
    """Delete a path."""
    return f"deleted {path}"


SCRIPT = [
    model_reply(
        [tool_use("c1", "delete", {"path": "/tmp/a"}), tool_use("c2", "delete", {"path": "/tmp/b", "recursive": True})],
        "tool_use",
    ),
    model_reply([{"type": "text", "text": "Done."}], "end_turn"),
]
NO_ROOT = Rule(action="deny", tool="delete", when={"path": {"equals": "/"}}, message="never /", name="no-root")


def agent() -> Agent:
    return Agent(model=ScriptedModel(SCRIPT), tools=[delete], policy=Policy([NO_ROOT]))


def test_approval_request_is_the_one_pending_shape() -> None:
    assert tether.ApprovalRequest is PendingApproval


def test_approver_result_and_listing_describe_a_parked_call_alike() -> None:
    store = MemoryStore()
    asked = RecordingApprover({})  # decides nothing: the run parks
    runner = Runner(agent(), store, approver=asked)
    result = runner.run("Clean up.", tenant="acme")
    [requests] = asked.seen
    listed = pending_approvals(store, tenant="acme")
    row = store.load_run(result.run_id, tenant="acme")

    assert [r.call_id for r in requests] == ["c1", "c2"]
    assert requests[1] == PendingApproval(
        run_id=result.run_id,
        call_id="c2",
        tool="delete",
        input={"path": "/tmp/b", "recursive": True},
        reason=requests[1].reason,
        fingerprint=fingerprint({"path": "/tmp/b", "recursive": True}),
        description="Delete a path.",
        tenant="acme",
    )
    assert result.pending_approvals == [r.item() for r in requests]
    # the row holds no descriptions; it knows since when the run waits
    assert listed == [replace(r, description="", waiting_since=row.updated_at) for r in requests]
    assert runner.approval_requests(runner.load(result.run_id, tenant="acme")) == requests


def test_check_edit_returns_what_would_run() -> None:
    request = PendingApproval("run_1", "c1", "delete", {"path": "/tmp/a"}, "", fingerprint({"path": "/tmp/a"}))
    assert check_edit(agent(), request, {"path": "/tmp/c"}) == {"path": "/tmp/c", "recursive": False}


def test_check_edit_refuses_input_the_schema_rejects() -> None:
    request = PendingApproval("run_1", "c1", "delete", {"path": "/tmp/a"}, "", fingerprint({"path": "/tmp/a"}))
    with pytest.raises(InvalidEditedInput) as refused:
        check_edit(agent(), request, {"path": "/tmp/a", "recursive": "maybe"})
    assert refused.value.problems.startswith("recursive: ")
    assert (refused.value.tool, refused.value.call_id) == ("delete", "c1")


def test_check_edit_refuses_input_a_deny_rule_forbids() -> None:
    request = PendingApproval("run_1", "c1", "delete", {"path": "/tmp/a"}, "", fingerprint({"path": "/tmp/a"}))
    with pytest.raises(DeniedByPolicy, match="never /"):
        check_edit(agent(), request, {"path": "/"})


def test_a_decision_runs_the_edit_as_checked() -> None:
    store = MemoryStore()
    runner = Runner(agent(), store)
    parked = runner.run("Clean up.")
    with pytest.raises(DeniedByPolicy):
        runner.decide(parked.run_id, "c1", Approve(input={"path": "/"}))
    decided = runner.decide(parked.run_id, "c1", Approve(input={"path": "/tmp/c"}))
    assert decided.pending_approvals == [
        {
            "call_id": "c2",
            "tool": "delete",
            "input": {"path": "/tmp/b", "recursive": True},
            "reason": parked.pending_approvals[1]["reason"],
            "fingerprint": fingerprint({"path": "/tmp/b", "recursive": True}),
        }
    ]
    assert runner.load(parked.run_id).decisions["c1"].input == {"path": "/tmp/c", "recursive": False}
