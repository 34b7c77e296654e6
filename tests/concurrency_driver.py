"""One of N processes racing on runs (for test_concurrency).

Usage: python concurrency_driver.py MODE WORKDIR DB_URL RUN_ID
MODE "drive": drive RUN_ID (creating it if absent is the parent's job) and print the status,
"busy" if another process held the run's lease, or "stale" if another process changed the run
after this one loaded it. Every model call is appended to WORKDIR/model_calls.log.
MODE "approve": approve the pending call and print "ok", or "refused" if another process
decided first. Each process loads the run,
says so (WORKDIR/ready-PID), then waits for WORKDIR/go: all start from the same version,
so they really race.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tether import Agent, ApprovalError, Approve, Runner, StaleRun, tool
from tether.errors import RunBusy
from tether.models import ModelRequest
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

WORKDIR = Path()


@tool
def record(note: str, tool_use_id: str) -> str:
    """Append a note (a side effect that must happen once per call)."""
    with (WORKDIR / "effects.log").open("a") as log:
        log.write(f"{tool_use_id}\n")
    time.sleep(0.05)
    return "noted"


@tool(approval=True)
def publish(text: str) -> str:
    """Publish (gated)."""
    with (WORKDIR / "published.log").open("a") as log:
        log.write(text + "\n")
    return "published"


def reply(request: ModelRequest) -> dict[str, object]:
    with (WORKDIR / "model_calls.log").open("a") as log:
        log.write(f"{os.getpid()} {request.invocation}\n")
    turns = sum(1 for m in request.messages if m["role"] == "assistant")
    if turns < 3:
        call = {"type": "tool_use", "id": f"toolu_{turns}", "name": "record", "input": {"note": str(turns)}}
        return {"content": [call], "stop_reason": "tool_use"}
    return {"content": [{"type": "text", "text": "recorded three notes"}], "stop_reason": "end_turn"}


def agent() -> Agent:
    return Agent(model=ScriptedModel(reply), tools=[record, publish], model_name="claude-test")


def main() -> None:
    global WORKDIR
    mode, WORKDIR, db_url, run_id = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    store = SQLStore(db_url)
    runner = Runner(agent(), store)
    state = runner.load(run_id)
    (WORKDIR / f"ready-{os.getpid()}").touch()
    while not (WORKDIR / "go").exists():
        time.sleep(0.005)
    try:
        if mode == "drive":
            print(runner.drive(state).status)
        else:
            runner.decide(run_id, "toolu_pub", Approve(actor=f"pid{os.getpid()}"))
            print("ok")
    except RunBusy:
        print("busy")
    except StaleRun:
        print("stale")
    except ApprovalError:
        print("refused")
    finally:
        store.close()


if __name__ == "__main__":
    main()
