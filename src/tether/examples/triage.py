"""A triage agent hands a customer over to a billing specialist: one run, two agents, each with its own permissions.

Triage may look orders up and hand the conversation to ``billing`` (``Agent(handoffs=[billing])``
gives its model a ``transfer_to_billing`` tool). The handoff is recorded in the run; from the next
turn the billing agent is in charge, with its own system prompt, tools and gates: it may refund
(a person approves each refund) but no longer look orders up. The history it sees is the
conversation's words only (``input_filter=without_tool_calls``). Offline, scripted models play both::

    python -m tether.examples.triage            # approves the refund here
    python -m tether.examples.triage --park     # parks at the refund, like a service would
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from tether.agent import Agent
from tether.core.approvals import Approve, CallbackApprover, DecideLater, PendingApproval
from tether.core.handoffs import Handoff, without_tool_calls
from tether.drivers.runner import Runner, RunResult
from tether.models.scripted import ScriptedModel
from tether.stores import Store
from tether.stores.memory import MemoryStore
from tether.tools import Tool, tool
from tether.views import audit

PROMPT = "I was charged twice for order A-17. Can I get my money back?"


def _use(call_id: str, name: str, arguments: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    said = [{"type": "text", "text": text}] if text else []
    return {
        "content": [*said, {"type": "tool_use", "id": call_id, "name": name, "input": arguments}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 50, "output_tokens": 12},
    }


def _say(text: str) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 70, "output_tokens": 15},
    }


SCRIPT = [
    _use("toolu_lookup", "look_up_order", {"order": "A-17"}),
    _use("toolu_transfer", "transfer_to_billing", {}, text="Order A-17 was paid twice; billing can refund it."),
    _use("toolu_refund", "refund", {"order": "A-17", "amount": 42.0}),
    _say("I have refunded the duplicate payment of 42.00 for order A-17."),
]
"""The conversation's turns, by the run's model call (a scripted model answers by invocation):
triage plays the first two, billing the rest."""


def tools_for(orders: dict[str, float], refunds: list[str]) -> tuple[list[Tool], list[Tool]]:
    """Triage's tools and billing's, over one shared order book."""

    @tool
    def look_up_order(order: str) -> str:
        """Look an order up: what was paid, and how often."""
        return f"order {order}: {orders.get(order, 0.0):.2f} paid twice" if order in orders else f"no order {order}"

    @tool(approval=True)
    def refund(order: str, amount: float) -> str:
        """Refund part of an order: a person approves each refund."""
        refunds.append(f"{order} {amount:.2f}")
        return f"refunded {amount:.2f} for {order}"

    return [look_up_order], [refund]


def agents(orders: dict[str, float], refunds: list[str]) -> Agent:
    """Triage, able to hand over to billing; both played by scripted models."""
    triage_tools, billing_tools = tools_for(orders, refunds)
    billing = Agent(
        ScriptedModel(SCRIPT, name="billing"),
        tools=billing_tools,
        system="You are billing. You refund duplicate payments; you cannot look orders up.",
        name="billing",
        handoffs=["triage"],  # may hand back: by name, as agents cannot hold one another
    )
    handoff = Handoff(
        billing, description="Money questions: refunds, charges, invoices.", input_filter=without_tool_calls
    )
    return Agent(
        ScriptedModel(SCRIPT, name="triage"),
        tools=triage_tools,
        system="You are triage. Find out what the customer needs and hand them to the right specialist.",
        name="triage",
        handoffs=[handoff],
    )


def run(
    store: Store | None = None, *, decide: Callable[[PendingApproval], Approve | None] | None = None
) -> tuple[RunResult, Runner, list[str]]:
    """Run the conversation; ``decide`` answers the refund (None: the run parks for a decision later)."""
    refunds: list[str] = []
    approver = CallbackApprover(decide) if decide is not None else DecideLater()
    runner = Runner(agents({"A-17": 42.0}, refunds), store or MemoryStore(), approver=approver)
    return runner.run(PROMPT), runner, refunds


def calls(runner: Runner, run_id: str) -> list[str]:
    """Each tool call of the run with the agent that made it and how it ended (from the audit)."""
    return [f"{entry.agent}: {entry.tool} {entry.status}" for entry in audit.query(runner.store, run_id=run_id)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example and print who made which call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--park", action="store_true", help="leave the refund for a decision later")
    args = parser.parse_args(argv)
    result, runner, refunds = run(decide=None if args.park else (lambda _: Approve(actor="you")))
    print("\n".join(calls(runner, result.run_id)))
    state = runner.load(result.run_id)
    summary = {"status": result.status, "agent": state.agent, "refunds": refunds, "output": result.output}
    print(json.dumps({**summary, "pending": result.pending_approvals}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
