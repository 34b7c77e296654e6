"""CallbackApprover: code that decides gated calls inline, one request at a time.

An answer of Approve runs the call, Deny gives the model the reason, and None leaves the call
pending: the run parks, and any later decision (another approver, another process) resumes it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Deny, Runner, RunResult, tool
from tether.core.approvals import ApprovalRequest, CallbackApprover, Decision, fingerprint
from tether.models.scripted import ScriptedModel
from tether.stores.memory import MemoryStore

BATCH = [
    tool_use_turn(
        tool_use("toolu_1", "pay", {"to": "alice", "amount": 5}),
        tool_use("toolu_2", "pay", {"to": "mallory", "amount": 500}),
        tool_use("toolu_3", "pay", {"to": "bob", "amount": 50}),
    ),
    model_reply([{"type": "text", "text": "Paid what I could."}], "end_turn"),
]


class Ledger:
    """The gated tool, and every payment it really made."""

    def __init__(self) -> None:
        self.paid: list[tuple[str, int]] = []

        @tool(approval=True)
        def pay(to: str, amount: int) -> str:
            """Pay someone."""
            self.paid.append((to, amount))
            return f"paid {amount} to {to}"

        self.pay = pay


def drive(kind: str, agent: Agent, store: MemoryStore, callback: Any, run_id: str | None = None) -> RunResult:
    approver = CallbackApprover(callback)
    if kind == "sync":
        runner = Runner(agent, store, approver=approver)
        return runner.drive(run_id) if run_id else runner.run("Pay everyone.", tenant="acme")
    async_runner = AsyncRunner(agent, store, approver=approver)
    return asyncio.run(async_runner.drive(run_id) if run_id else async_runner.run("Pay everyone.", tenant="acme"))


def results(store: MemoryStore, run_id: str) -> dict[str, dict[str, Any]]:
    finished = [e.data for e in store.load_events(run_id, tenant="acme") if e.type == "tool_finished"]
    return {data["call_id"]: data for data in finished}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_callback_sees_each_request_and_its_approvals_and_denials_apply(kind: str) -> None:
    ledger, store = Ledger(), MemoryStore()
    seen: list[ApprovalRequest] = []

    def decide(request: ApprovalRequest) -> Decision:
        seen.append(request)
        if request.input["amount"] > 100:
            return Deny("too much for a bot", actor="limits-bot")
        return Approve(actor="limits-bot")

    result = drive(kind, Agent(model=ScriptedModel(BATCH), tools=[ledger.pay]), store, decide)
    assert result.status == "done"
    assert ledger.paid == [("alice", 5), ("bob", 50)]
    assert [r.call_id for r in seen] == ["toolu_1", "toolu_2", "toolu_3"]  # asked once each, in call order
    first = seen[0]
    assert (first.run_id, first.tool, first.tenant) == (result.run_id, "pay", "acme")
    assert first.input == {"to": "alice", "amount": 5}
    assert first.description == "Pay someone."
    assert first.reason == "the tool is marked approval=True"
    assert first.fingerprint == fingerprint({"to": "alice", "amount": 5})
    denied = results(store, result.run_id)["toolu_2"]
    assert denied["is_error"] is True
    assert "denied by limits-bot: too much for a bot" in denied["content"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_none_leaves_the_call_pending_and_a_later_decision_resumes_the_run(kind: str) -> None:
    ledger, store = Ledger(), MemoryStore()
    agent = Agent(model=ScriptedModel(BATCH), tools=[ledger.pay])

    def small_only(request: ApprovalRequest) -> Decision | None:
        return Approve(actor="bot") if request.input["amount"] < 100 else None  # a person decides the rest

    parked = drive(kind, agent, store, small_only)
    assert parked.status == "awaiting_approval"
    assert [p["call_id"] for p in parked.pending_approvals] == ["toolu_2"]
    assert ledger.paid == []  # the batch waits: nothing runs until every gated call is decided

    again = drive(kind, agent, store, small_only, run_id=parked.run_id)  # still no answer: still parked
    assert again.status == "awaiting_approval"
    assert ledger.paid == []

    done = drive(kind, agent, store, lambda request: Deny("no", actor="alice"), run_id=parked.run_id)
    assert done.status == "done"
    assert ledger.paid == [("alice", 5), ("bob", 50)]
    assert results(store, parked.run_id)["toolu_2"]["is_error"] is True
