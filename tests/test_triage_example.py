"""The triage example runs offline: triage hands the customer to billing, whose tools and gate then apply."""

from __future__ import annotations

import json

import pytest

from tether.core.approvals import Approve
from tether.examples import triage
from tether.facts.history import tool_uses
from tether.testing import ScriptedModel


def test_triage_hands_over_and_billing_refunds_on_a_filtered_history() -> None:
    result, runner, refunds = triage.run(decide=lambda _: Approve(actor="you"))

    assert result.status == "done"
    assert refunds == ["A-17 42.00"]
    assert triage.calls(runner, result.run_id) == [
        "triage: look_up_order ok",
        "triage: transfer_to_billing ok",
        "billing: refund ok",
    ]
    billing = runner.agent.reachable_agents["billing"]
    assert isinstance(billing.model, ScriptedModel)
    first = billing.model.requests[0]
    assert [item["name"] for item in first.tools] == ["refund", "transfer_to_triage"]
    assert not any(tool_uses(message) for message in first.messages)  # words only, as the filter keeps


def test_parked_at_billings_gate(capsys: pytest.CaptureFixture[str]) -> None:
    assert triage.main(["--park"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "billing: refund awaiting_approval"
    shown = json.loads(lines[3])
    assert (shown["status"], shown["agent"], shown["refunds"]) == ("awaiting_approval", "billing", [])
    assert shown["pending"][0]["tool"] == "refund"
