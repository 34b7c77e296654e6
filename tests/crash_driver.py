"""A run driven in a subprocess that SIGKILLs itself at a chosen point (for test_crash_safety).

Usage: python crash_driver.py WORKDIR DB_URL RUN_ID CRASH [APPROVER [MODE]]
CRASH is "none", "before-append:N" (die just before the N-th store write, 1-based),
"after-append:N" (die right after it) or "in-tool:NAME" (die inside that tool, once).
APPROVER answers the question asked about a call in doubt: "deny" (the default),
"approve" (run it again), or "none" (no approver: the model is told it was not re-run).
Every request the model receives is appended to WORKDIR/requests.jsonl; every execution of
a tool to WORKDIR/effects.log, so the test can check what happened across processes.
MODE is "serial" (the default: the two calls run one after the other), "concurrent" (both
tools concurrent, on Runner) or "concurrent-async" (the same on AsyncRunner). In the process
that creates the run, concurrent calls meet in a fixed order (see :class:`Meeting`), so every
crash point finds them in one known state; a resuming process runs them unhindered.
The driver holds the run's lease for LEASE_TTL seconds at a time: a killed driver's lease
keeps the run busy that long (this driver then prints {"busy": OWNER} and exits 5).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from tether import Agent, Approve, AsyncRunner, Deny, Runner, tool
from tether.core.approvals import ApprovalRequest, Decision
from tether.errors import RunBusy
from tether.facts.events import Event
from tether.models import ModelRequest
from tether.stores import RunRecord
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

WORKDIR = Path(sys.argv[1])
DB_URL, RUN_ID, CRASH = sys.argv[2], sys.argv[3], sys.argv[4]
APPROVER = sys.argv[5] if len(sys.argv) > 5 else "deny"
MODE = sys.argv[6] if len(sys.argv) > 6 else "serial"
LEASE_TTL = 0.5
MEET_TIMEOUT = 30.0
"""Seconds a tool waits for its partner: only reached if the calls did not run at once."""


class Meeting:
    """The order two concurrent calls keep in the process that created the run.

    Both reach a barrier (only possible if they run at once); send_email performs its effect,
    then fetch_price performs its own; fetch_price returns, and send_email returns only once
    fetch_price's result is committed. So the store writes come in a fixed order (the starts
    of toolu_a then toolu_b, their results in that order) and a crash inside either tool
    finds both effects in a known state.
    """

    def __init__(self) -> None:
        self.active = False
        self.barrier = threading.Barrier(2, timeout=MEET_TIMEOUT)
        self.email_sent = threading.Event()
        self.fetch_recorded = threading.Event()

    def before(self, name: str) -> None:
        if not self.active:
            return
        self.barrier.wait()
        if name == "fetch_price" and not self.email_sent.wait(MEET_TIMEOUT):
            raise TimeoutError("send_email never ran")

    def after(self, name: str) -> None:
        if not self.active:
            return
        if name == "send_email":
            self.email_sent.set()
            if not self.fetch_recorded.wait(MEET_TIMEOUT):
                raise TimeoutError("fetch_price's result was never committed")

    def listen(self, state: object, event: Event) -> None:
        if event.type == "tool_finished" and event.data["call_id"] == "toolu_a":
            self.fetch_recorded.set()


MEETING = Meeting()


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def effect(name: str, call_id: str) -> None:
    MEETING.before(name)
    with (WORKDIR / "effects.log").open("a") as log:
        log.write(f"{name} {call_id}\n")
        log.flush()
        os.fsync(log.fileno())
    marker = WORKDIR / f"crashed-in-{name}"
    if f"in-tool:{name}" == CRASH and not marker.exists():
        marker.touch()
        die()
    MEETING.after(name)


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


SCRIPT: list[dict[str, object]] = [
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
    concurrent = MODE != "serial"
    tools = [fetch_price, send_email]
    agent = Agent(model=ScriptedModel(reply), tools=tools, model_name="claude-test", concurrent_tools=concurrent)
    approver = None if APPROVER == "none" else DecideReruns(approve=APPROVER == "approve")
    runner_class = AsyncRunner if MODE == "concurrent-async" else Runner
    runner = runner_class(agent, store, approver=approver, lease_ttl=LEASE_TTL, listeners=[MEETING.listen])
    try:
        store.load_run(RUN_ID)
    except Exception:
        prompt = "What does tea cost? Then tell ops."
        if isinstance(runner, AsyncRunner):
            asyncio.run(runner.create(prompt, run_id=RUN_ID))
        else:
            runner.create(prompt, run_id=RUN_ID)
        MEETING.active = concurrent
    try:
        result = asyncio.run(runner.drive(RUN_ID)) if isinstance(runner, AsyncRunner) else runner.drive(RUN_ID)
    except RunBusy as busy:
        print(json.dumps({"busy": busy.owner}))
        sys.exit(5)
    print(json.dumps({**result.to_dict(), "store_writes": CrashingStore.writes}))


if __name__ == "__main__":
    main()
