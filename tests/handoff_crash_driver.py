"""A triage run that hands off to billing, driven in a subprocess that may SIGKILL itself (test_handoff_crash).

Usage: python handoff_crash_driver.py WORKDIR DB_URL RUN_ID [CRASH]
CRASH is "none" or "after:KIND": die right after the store write whose events include KIND.
Every execution of triage's ``look_up_order`` is appended to WORKDIR/effects.log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether import Agent, Runner, tool
from tether.errors import RunBusy, RunNotFound
from tether.facts.events import Event
from tether.stores import RunRecord
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

WORKDIR = Path(sys.argv[1])
DB_URL, RUN_ID = sys.argv[2], sys.argv[3]
CRASH = sys.argv[4] if len(sys.argv) > 4 else "none"
LEASE_TTL = 0.5


@tool
def look_up_order(order: str) -> str:
    """Look an order up (a side effect logged, never run twice)."""
    with (WORKDIR / "effects.log").open("a") as log:
        log.write(f"look up {order}\n")
        log.flush()
        os.fsync(log.fileno())
    return f"order {order}: paid twice"


def turn(*content: dict[str, Any], stop: str) -> dict[str, Any]:
    return {"content": list(content), "stop_reason": stop, "usage": {"input_tokens": 3, "output_tokens": 2}}


SCRIPT = [
    turn({"type": "tool_use", "id": "toolu_l", "name": "look_up_order", "input": {"order": "A-17"}}, stop="tool_use"),
    turn({"type": "tool_use", "id": "toolu_t", "name": "transfer_to_billing", "input": {}}, stop="tool_use"),
    turn({"type": "text", "text": "billing: refund on its way"}, stop="end_turn"),
]
BILLING = Agent(ScriptedModel(SCRIPT), name="billing", system="You are billing.")
TRIAGE = Agent(ScriptedModel(SCRIPT), tools=[look_up_order], name="triage", handoffs=[BILLING])


class CrashingStore(SQLStore):
    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        super().append(record, expected_version, events)
        if any(f"after:{event.type}" == CRASH for event in events):
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    store = CrashingStore(DB_URL)
    runner = Runner(TRIAGE, store, lease_ttl=LEASE_TTL)
    try:
        store.load_run(RUN_ID)
    except RunNotFound:
        runner.create("I was charged twice for A-17.", run_id=RUN_ID)
    try:
        result = runner.drive(RUN_ID)
    except RunBusy as busy:
        print(json.dumps({"busy": busy.owner}))
        sys.exit(5)
    models = {"triage": len(TRIAGE.model.requests), "billing": len(BILLING.model.requests)}  # type: ignore[attr-defined]
    print(json.dumps({**result.to_dict(), "model_calls": models}))


if __name__ == "__main__":
    main()
