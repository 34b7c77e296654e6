"""A run driven in a subprocess that SIGKILLs itself at a chosen point (for test_crash_safety).

Usage: python crash_driver.py WORKDIR DB_URL RUN_ID CRASH [APPROVER]
CRASH is "none", "before-append:N" (die just before the N-th store write, 1-based),
"after-append:N" (die right after it) or "in-tool:NAME" (die inside that tool, once).
APPROVER answers the question asked about a call in doubt: "deny" (the default),
"approve" (run it again), or "none" (no approver: the model is told it was not re-run).
Every request the model receives is appended to WORKDIR/requests.jsonl; every execution of
a tool to WORKDIR/effects.log, so the test can check what happened across processes.
The driver holds the run's lease for LEASE_TTL seconds at a time: a killed driver's lease
keeps the run busy that long (this driver then prints {"busy": OWNER} and exits 5).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tether import Agent, Approve, Deny, Runner, tool
from tether.core.approvals import ApprovalRequest, Decision
from tether.core.events import Event
from tether.errors import RunBusy
from tether.models import ModelRequest
from tether.stores import RunRecord
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

WORKDIR = Path(sys.argv[1])
DB_URL, RUN_ID, CRASH = sys.argv[2], sys.argv[3], sys.argv[4]
APPROVER = sys.argv[5] if len(sys.argv) > 5 else "deny"
LEASE_TTL = 0.5


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def effect(name: str, call_id: str) -> None:
    with (WORKDIR / "effects.log").open("a") as log:
        log.write(f"{name} {call_id}\n")
        log.flush()
        os.fsync(log.fileno())
    marker = WORKDIR / f"crashed-in-{name}"
    if f"in-tool:{name}" == CRASH and not marker.exists():
        marker.touch()
        die()


@tool
def send_email(to: str, tool_use_id: str) -> str:
    """Send an email (a side effect: must never happen twice silently)."""
    effect("send_email", tool_use_id)
    return f"sent to {to}"


@tool(idempotent=True)
def fetch_price(item: str, tool_use_id: str) -> str:
    """Look a price up (safe to repeat)."""
    effect("fetch_price", tool_use_id)
    return f"{item}: 3.50"


SCRIPT = [
    {
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_a", "name": "fetch_price", "input": {"item": "tea"}},
            {"type": "tool_use", "id": "toolu_b", "name": "send_email", "input": {"to": "ops@example.com"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 20, "output_tokens": 10},
    },
    {
        "content": [{"type": "text", "text": "Done: tea costs 3.50 and ops were told."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 30, "output_tokens": 8},
    },
]


def reply(request: ModelRequest) -> dict[str, object]:
    with (WORKDIR / "requests.jsonl").open("a") as log:
        log.write(
            json.dumps(
                {
                    "model": request.model,
                    "max_tokens": request.max_tokens,
                    "messages": request.messages,
                    "tools": request.tools,
                }
            )
            + "\n"
        )
    return SCRIPT[request.invocation]


class CrashingStore(SQLStore):
    writes = 0

    def _maybe_die(self, when: str) -> None:
        if f"{when}:{CrashingStore.writes}" == CRASH:
            die()

    def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        CrashingStore.writes += 1
        self._maybe_die("before-append")
        super().create_run(record, events)
        self._maybe_die("after-append")

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        CrashingStore.writes += 1
        self._maybe_die("before-append")
        super().append(record, expected_version, events)
        self._maybe_die("after-append")


class DecideReruns:
    """Answers every question (here only ever: re-run an interrupted call?) the same way."""

    def __init__(self, approve: bool) -> None:
        self.approve = approve

    def decide(self, requests: Sequence[ApprovalRequest]) -> dict[str, Decision]:
        if self.approve:
            return {r.call_id: Approve(actor="harness") for r in requests}
        return {r.call_id: Deny("not re-running an interrupted call", actor="harness") for r in requests}


def main() -> None:
    store = CrashingStore(DB_URL)
    agent = Agent(model=ScriptedModel(reply), tools=[fetch_price, send_email], model_name="claude-test")
    approver = None if APPROVER == "none" else DecideReruns(approve=APPROVER == "approve")
    runner = Runner(agent, store, approver=approver, lease_ttl=LEASE_TTL)
    try:
        store.load_run(RUN_ID)
    except Exception:
        runner.create("What does tea cost? Then tell ops.", run_id=RUN_ID)
    try:
        result = runner.drive(RUN_ID)
    except RunBusy as busy:
        print(json.dumps({"busy": busy.owner}))
        sys.exit(5)
    print(json.dumps({**result.to_dict(), "store_writes": CrashingStore.writes}))


if __name__ == "__main__":
    main()
