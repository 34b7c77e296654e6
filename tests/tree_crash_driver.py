"""A parent run whose call is served by a child run, driven in a subprocess that SIGKILLs itself (test_child_crashes).

Usage: python tree_crash_driver.py WORKDIR DB_URL RUN_ID ACTION [CRASH]
ACTION is "drive" (create the writer's run unless it exists, then drive it; the approver
decides later) or "approve" (approve the reviewer's pending call, from this process).
CRASH is "none" or "after:WHO:KIND": die right after the store write of the parent's
(WHO=parent) or the child's (WHO=child) run whose events include one of KIND, or
"after:child:created" (right after the child's run is created).
Every execution of the reviewer's gated ``publish`` is appended to WORKDIR/effects.log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether import Agent, Approve, Runner, tool
from tether.core.approvals import DecideLater
from tether.errors import RunBusy, RunNotFound
from tether.facts.events import Event
from tether.stores import RunRecord
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel
from tether.views.pending import pending_approvals

WORKDIR = Path(sys.argv[1])
DB_URL, RUN_ID, ACTION = sys.argv[2], sys.argv[3], sys.argv[4]
CRASH = sys.argv[5] if len(sys.argv) > 5 else "none"
LEASE_TTL = 0.5


@tool(approval=True)
def publish(name: str) -> str:
    """Publish a draft: a side effect a person approves, never run twice."""
    with (WORKDIR / "effects.log").open("a") as log:
        log.write(f"publish {name}\n")
        log.flush()
        os.fsync(log.fileno())
    return f"published {name}"


def turn(*content: dict[str, Any], stop: str) -> dict[str, Any]:
    return {"content": list(content), "stop_reason": stop, "usage": {"input_tokens": 3, "output_tokens": 2}}


REVIEWER = Agent(
    ScriptedModel(
        [
            turn({"type": "tool_use", "id": "toolu_pub", "name": "publish", "input": {"name": "a"}}, stop="tool_use"),
            turn({"type": "text", "text": "reviewed and published"}, stop="end_turn"),
        ]
    ),
    tools=[publish],
    name="reviewer",
)
WRITER = Agent(
    ScriptedModel(
        [
            turn(
                {"type": "tool_use", "id": "toolu_review", "name": "review", "input": {"task": "review a"}},
                stop="tool_use",
            ),
            turn({"type": "text", "text": "the reviewer published it"}, stop="end_turn"),
        ]
    ),
    tools=[REVIEWER.as_tool("review", "Have the reviewer check and publish a draft.")],
    name="writer",
)


class CrashingStore(SQLStore):
    def _maybe_die(self, record: RunRecord, kinds: set[str]) -> None:
        who = "child" if "parent" in record.spec else "parent"
        if any(f"after:{who}:{kind}" == CRASH for kind in kinds):
            os.kill(os.getpid(), signal.SIGKILL)

    def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        super().create_run(record, events)
        self._maybe_die(record, {"created"})

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        super().append(record, expected_version, events)
        if "parent" not in record.spec and record.id != RUN_ID:
            return
        self._maybe_die(record, {event.type for event in events})


def main() -> None:
    store = CrashingStore(DB_URL)
    runner = Runner(WRITER, store, approver=DecideLater(), lease_ttl=LEASE_TTL)
    if ACTION == "approve":
        (waiting,) = pending_approvals(store)
        result = runner.decide(waiting.run_id, waiting.call_id, Approve(actor="ann"))
        print(json.dumps({"decided": waiting.run_id, "chain": list(waiting.chain), "status": result.status}))
        return
    try:
        store.load_run(RUN_ID)
    except RunNotFound:
        runner.create("Write a draft, then have it reviewed.", run_id=RUN_ID)
    try:
        result = runner.drive(RUN_ID)
    except RunBusy as busy:
        print(json.dumps({"busy": busy.owner}))
        sys.exit(5)
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main()
