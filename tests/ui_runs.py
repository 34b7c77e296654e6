"""Runs for the inspector's tests: real tools from a module on disk, a scripted model, a rule file.

The runs are made the way ``tether run`` makes them (an agent rebuilt from a spec), so the
inspector, which rebuilds each run's agent from its spec to resume it, drives them for real.
Imported as ``from ui_runs import ...`` (tests/ is on sys.path).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import model_reply, tool_use, tool_use_turn
from tether.core.approvals import DecideLater, fingerprint
from tether.drivers.loader import agent_from_spec
from tether.drivers.runner import Runner, RunResult
from tether.stores import Store

XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
"""Text a model or a tool might return: shown, it must stay text and never run."""
REFUND = {"invoice": "INV-7", "amount": 20}
TOOLS = textwrap.dedent(
    '''
    """Tools for the inspector's tests."""

    from pathlib import Path
    from typing import Annotated, Literal

    import pydantic

    from tether import Agent, RetryPolicy, tool
    from tether.testing import ScriptedModel


    @tool
    def echo(text: str) -> str:
        """Say the text back."""
        return text


    @tool(approval=True)
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice.

        Money leaves the **company account**: check the amount against the invoice.
        """
        return f"refunded {amount} on {invoice}"


    @tool(approval=True)
    def ship(
        order: str,
        carrier: Literal["ups", "dhl"],
        express: bool,
        boxes: Annotated[int, pydantic.Field(ge=1, description="How many boxes")],
        items: list[dict[str, int]],
        note: str | None = None,
    ) -> str:
        """Ship an order's parcels."""
        return f"shipped {order} by {carrier}: {boxes} box(es), express {express}, note {note!r}"


    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=2.0, retry_on=(ConnectionError,)))
    def lookup(key: str) -> str:
        """Look a key up in the directory (its first try fails: the directory is warming up)."""
        tried = Path(__file__).parent / f"{key}.tried"
        if not tried.exists():
            tried.write_text("once")
            raise ConnectionError("the directory is warming up")
        return f"found {key}"


    def clerk(request):
        """The clerk's model: refunds INV-9 (a person approves it), then says so."""
        if request.invocation == 0:
            said = {"type": "text", "text": "The customer was charged twice: I will refund INV-9."}
            refund = {"invoice": "INV-9", "amount": 12}
            asked = {"type": "tool_use", "id": "toolu_clerk", "name": "refund", "input": refund}
            return {"content": [said, asked], "stop_reason": "tool_use"}
        return {"content": [{"type": "text", "text": "Refunded INV-9."}], "stop_reason": "end_turn"}


    CLERK = Agent(ScriptedModel(clerk), tools=[refund], name="clerk")
    TOOLS = [echo, refund, ship, lookup, CLERK.as_tool("delegate", "Hand a billing task to the clerk.")]
    '''
)
RULES = textwrap.dedent(
    """
    [[rules]]
    name = "deny-large-refunds"
    tool = "refund"
    when = { amount = { gt = 100 } }
    action = "deny"
    message = "refunds over 100 need a manager"

    [[rules]]
    name = "shipping-desk"
    tool = "ship"
    action = "require_approval"
    message = "shipments go through the desk"
    description = "Check the **address** with the customer first; see [the runbook](https://example.com/runbook)."
    """
)


def script(echoed: str = XSS, quoted: str = XSS) -> list[dict[str, Any]]:
    """The model: echo ``echoed`` and ask for a refund in one turn, then answer (quoting ``quoted``)."""
    return [
        tool_use_turn(tool_use("toolu_echo", "echo", {"text": echoed}), tool_use("toolu_refund", "refund", REFUND)),
        model_reply([{"type": "text", "text": f"Refund handled. {quoted}".strip()}], "end_turn"),
    ]


@dataclass
class Project:
    """A directory holding the tools module, the model's script and the rules."""

    root: Path
    system: str | None = None
    """The agent's system prompt (``tether run --system``), if any."""

    @classmethod
    def make(
        cls,
        root: Path,
        *,
        echoed: str = XSS,
        quoted: str = XSS,
        turns: list[dict[str, Any]] | None = None,
        rules: str = RULES,
        system: str | None = None,
    ) -> Project:
        """The project's files; the model says ``turns``, or echoes ``echoed`` and asks for the refund."""
        root.mkdir(parents=True, exist_ok=True)
        (root / "uitools.py").write_text(TOOLS, encoding="utf-8")
        said = script(echoed, quoted) if turns is None else turns
        (root / "script.json").write_text(json.dumps(said), encoding="utf-8")
        (root / "rules.toml").write_text(rules, encoding="utf-8")
        return cls(root, system)

    @property
    def spec(self) -> dict[str, Any]:
        """What ``tether run --tools uitools:TOOLS --model scripted:script.json --policy rules.toml`` records."""
        return {
            "tools": ["uitools:TOOLS"],
            "cwd": str(self.root),
            "model": f"scripted:{self.root / 'script.json'}",
            "policy": str(self.root / "rules.toml"),
            **({"system": self.system} if self.system is not None else {}),
        }

    def park(self, store: Store, *, tenant: str | None = None, prompt: str = "Refund INV-7.") -> RunResult:
        """A run parked for a person: by default one that echoed, then parked before ``refund`` (``toolu_refund``)."""
        runner = Runner(agent_from_spec(self.spec), store, approver=DecideLater())
        result = runner.run(prompt, tenant=tenant)
        assert result.status == "awaiting_approval", result
        return result


SHIPMENT = {"order": "A-1", "carrier": "dhl", "express": False, "boxes": 2, "items": [{"sku": 7}]}
"""What the model asks ``ship`` to send, in :func:`shipping`."""


def shipping() -> list[dict[str, Any]]:
    """The model: ask to ship :data:`SHIPMENT` (``toolu_ship``), then answer."""
    return [
        tool_use_turn(tool_use("toolu_ship", "ship", SHIPMENT)),
        model_reply([{"type": "text", "text": "Shipped."}], "end_turn"),
    ]


def two_calls() -> list[dict[str, Any]]:
    """The model: say why, then ask for a refund (``toolu_refund``) and a shipment (``toolu_ship``) in one turn."""
    said = {"type": "text", "text": "Refunding the duplicate charge,\nthen shipping the replacement."}
    asked = tool_use_turn(tool_use("toolu_refund", "refund", REFUND), tool_use("toolu_ship", "ship", SHIPMENT))
    return [
        {**asked, "content": [said, *asked["content"]]},
        model_reply([{"type": "text", "text": "Both done."}], "end_turn"),
    ]


def delegating() -> list[dict[str, Any]]:
    """The model: hand the refund to the clerk (``toolu_delegate``), whose run parks on its own refund."""
    return [
        tool_use_turn(tool_use("toolu_delegate", "delegate", {"task": "Refund INV-9"})),
        model_reply([{"type": "text", "text": "The clerk refunded it."}], "end_turn"),
    ]


def looking_up(key: str) -> list[dict[str, Any]]:
    """The model: look ``key`` up (its first try fails, the next is due 2 s later), then answer."""
    return [
        tool_use_turn(tool_use("toolu_lookup", "lookup", {"key": key})),
        model_reply([{"type": "text", "text": f"Looked {key} up."}], "end_turn"),
    ]


SHOWN_FINGERPRINT = fingerprint(REFUND)
"""What the inbox shows for the parked refund, and a decision must carry."""
