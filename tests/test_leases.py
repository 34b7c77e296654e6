"""Leases: a started call belongs to its driver while that process lives, and only then.

A driver is ``host:pid:start:token``. A live pid whose process started at another time is
a reused pid, not the driver: its calls are in doubt, not busy. An operator who knows a
driver is gone can say so (``tether resume RUN --force``), and the log remembers it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import run_tether, tool_use, tool_use_turn
from tether import Agent, Approve, Runner, tool
from tether import events as ev
from tether.approvals import DecideLater
from tether.errors import RunBusy
from tether.leases import HOST, UNKNOWN_START, alive, owner_id, parse_owner, process_start
from tether.loader import agent_from_spec
from tether.state import Lease, RunState
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel
from tether.tools import Tool


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not a tether driver (what a reused pid points at)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# Liveness --------------------------------------------------------------------------------
def test_process_start_tells_processes_apart(other_process: subprocess.Popen[bytes]) -> None:
    import os

    mine = process_start(os.getpid())
    assert mine != UNKNOWN_START
    assert process_start(os.getpid()) == mine  # stable
    assert process_start(other_process.pid) not in (mine, UNKNOWN_START)
    assert process_start(dead_pid()) == UNKNOWN_START


def test_owner_strings_old_and_new() -> None:
    new = parse_owner(owner_id(42, "123456", "ab12cd34"))
    assert new is not None
    assert (new.host, new.pid, new.start) == (HOST, 42, "123456")
    old = parse_owner("somehost:42:ab12cd34")  # recorded before start times were
    assert old is not None
    assert (old.pid, old.start) == (42, UNKNOWN_START)
    assert parse_owner("") is None
    assert parse_owner("somehost:not-a-pid:x") is None


def test_a_driver_is_alive_only_while_the_same_process_runs(other_process: subprocess.Popen[bytes]) -> None:
    now = time.time()
    pid = other_process.pid
    start = process_start(pid)

    def lease(owner: str, until: float = now + 600, *, abandoned: bool = False) -> Lease:
        return Lease(owner, until, abandoned=abandoned)

    me = owner_id(1, "1", "me")
    assert alive(lease(owner_id(pid, start, "t")), now, me=me)  # the driver itself
    assert not alive(lease(owner_id(pid, "999999999", "t")), now, me=me)  # its pid, reused
    assert alive(lease(f"{HOST}:{pid}:t"), now, me=me)  # start unknown: assume the driver
    assert not alive(lease(owner_id(dead_pid(), start, "t")), now, me=me)
    assert not alive(lease(owner_id(pid, start, "t"), abandoned=True), now, me=me)  # an operator said so
    assert not alive(lease(me), now, me=me)  # this drive is not running it: interrupted
    assert alive(lease("elsewhere:7:1:t"), now, me=me)  # another host: the lease holds...
    assert not alive(lease("elsewhere:7:1:t", until=now - 1), now, me=me)  # ...until it expires


# A run with a call started by a given owner ------------------------------------------------
def transfer_tool(ran: list[int]) -> Tool:
    @tool
    def transfer(amount: int) -> str:
        """Move money (not idempotent)."""
        ran.append(amount)
        if len(ran) == 1:
            raise KeyboardInterrupt("the process dies here")  # only Ctrl-C escapes a tool, as SIGKILL would
        return f"moved {amount}"

    return transfer


SCRIPT = [
    tool_use_turn(tool_use("toolu_1", "transfer", {"amount": 5})),
    {"content": [{"type": "text", "text": "Moved."}], "stop_reason": "end_turn"},
]


def drive_as(runner: Runner, state: RunState, owner: str) -> None:
    while runner.step(state, owner=owner):
        pass


def started_by(runner: Runner, owner: str) -> str:
    """A run whose call ``toolu_1`` was started by ``owner``, whose process then died in the tool."""
    state = runner.create("Move 5.")
    with pytest.raises(BaseException, match="the process dies here"):
        drive_as(runner, state, owner)
    assert state.in_flight["toolu_1"].owner == owner
    return state.id


def test_a_reused_pid_does_not_keep_the_run_busy(other_process: subprocess.Popen[bytes]) -> None:
    ran: list[int] = []
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool(ran)])
    run_id = started_by(Runner(agent, store), owner_id(other_process.pid, "999999999", "gone"))
    result = Runner(agent, store, approver=DecideLater()).drive(run_id)
    assert result.status == "awaiting_approval"  # in doubt, asked about: not RunBusy
    assert "interrupted" in result.pending_approvals[0]["reason"]
    assert ran == [5]


def test_a_live_driver_keeps_the_run_busy_until_an_operator_forces_it(
    other_process: subprocess.Popen[bytes],
) -> None:
    ran: list[int] = []
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool(ran)])
    driver = owner_id(other_process.pid, process_start(other_process.pid), "live")
    run_id = started_by(Runner(agent, store), driver)
    runner = Runner(agent, store, approver=DecideLater())
    with pytest.raises(RunBusy, match=f"tether resume {run_id} --force"):
        runner.drive(run_id)

    parked = runner.drive(run_id, force=True)
    assert parked.status == "awaiting_approval"
    [abandoned] = [e.data for e in store.load_events(run_id) if e.type == ev.CALL_ABANDONED]
    assert (abandoned["call_id"], abandoned["owner"]) == ("toolu_1", driver)
    # the override is in the log: later drives, without force, treat the call as in doubt too
    runner.decide(run_id, "toolu_1", Approve(actor="ops"))
    assert runner.drive(run_id).status == "done"
    assert ran == [5, 5]


TOOLS_MODULE = '''
import os
from pathlib import Path

from tether import tool


@tool
def transfer(amount: int) -> str:
    """Move money (not idempotent)."""
    with Path("effects.log").open("a") as log:
        log.write(f"transfer {amount}\\n")
    if os.environ.get("CRASH_IN_TOOL"):
        raise KeyboardInterrupt("the process dies here")
    return f"moved {amount}"


TOOLS = [transfer]
'''


@pytest.mark.slow
def test_tether_resume_force_takes_over_from_a_driver_it_cannot_see(
    tmp_path: Path, other_process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lease_tools.py").write_text(TOOLS_MODULE)
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    monkeypatch.setattr(sys, "path", [*sys.path])  # loading the tools adds tmp_path: undone afterwards
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    spec = {"tools": ["lease_tools:TOOLS"], "model": f"scripted:{tmp_path / 'script.json'}", "cwd": str(tmp_path)}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CRASH_IN_TOOL", "1")
    driver = owner_id(other_process.pid, process_start(other_process.pid), "live")
    store = SQLStore(db)
    try:
        run_id = started_by(Runner(agent_from_spec(spec), store), driver)
    finally:
        store.close()
        sys.modules.pop("lease_tools", None)
    monkeypatch.delenv("CRASH_IN_TOOL")

    busy = run_tether(tmp_path, "resume", run_id, "--db", db)
    assert busy.returncode == 1
    assert f"tether resume {run_id} --force" in busy.err
    forced = run_tether(tmp_path, "resume", run_id, "--force", "--db", db, "--json")
    assert forced.returncode == 3, forced  # no terminal: parked for `tether approve`
    assert "interrupted" in forced.data["pending_approvals"][0]["reason"]
    assert run_tether(tmp_path, "approve", run_id, "toolu_1", "--db", db).returncode == 0
    done = run_tether(tmp_path, "resume", run_id, "--db", db, "--json")
    assert done.data["status"] == "done"
    assert (tmp_path / "effects.log").read_text().split("\n") == ["transfer 5", "transfer 5", ""]
