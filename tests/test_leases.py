"""Leases: a run belongs to the process holding its lease row, and to nobody else.

Whoever drives a run claims its lease in the store before any model call or tool start and
renews it while it works. The row names the holder process (host, PID namespace, pid, start
time): a resumer on the same host and in the same namespace takes the run over at once from
a holder that is gone (killed), and says so; anywhere else the lease is honoured until it
expires (a driver in another PID namespace on the same host is busy). An operator who knows
a driver is gone can take the run over at once (``tether resume RUN --force``), and the log
remembers it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from support import (
    TETHER,
    as_holder,
    clean_env,
    finish_tether,
    finish_tether_forked,
    run_tether,
    start_tether,
    start_tether_forked,
    tool_use,
    tool_use_turn,
)
from tether import Agent, Approve, AsyncRunner, Runner, tool
from tether.core.approvals import DecideLater
from tether.drivers.loader import agent_from_spec, agent_spec
from tether.errors import RunBusy, StaleRun
from tether.facts import events as ev
from tether.stores import Holder, Store, holders
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel
from tether.tools import Tool

HOST = socket.gethostname()


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process on this host that is not a tether driver."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition()`` until true, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# A run whose call was started by a driver that then went away ----------------------------
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


def started_then_died(runner: Runner) -> str:
    """A run whose call ``toolu_1`` was started (committed) and never finished."""
    state = runner.create("Move 5.")
    with pytest.raises(KeyboardInterrupt, match="the process dies here"):
        runner.drive(state.id)
    assert "toolu_1" in runner.load(state.id).in_flight
    return state.id


def held_by(store: Store, run_id: str, owner: str, *, expires_in: float) -> None:
    """Make ``owner`` the run's lease holder until ``expires_in`` seconds from now (negative: expired)."""
    store.claim_run(run_id, owner, now=time.time() - 60, ttl=60 + expires_in, force=True)


def test_a_run_whose_lease_another_driver_holds_is_busy_until_it_expires() -> None:
    ran: list[int] = []
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool(ran)])
    run_id = started_then_died(Runner(agent, store))
    held_by(store, run_id, "elsewhere:7:live", expires_in=60)
    runner = Runner(agent, store, approver=DecideLater())
    with pytest.raises(RunBusy) as busy:
        runner.drive(run_id)
    assert busy.value.owner == "elsewhere:7:live"
    assert "another process is driving" in str(busy.value)
    assert f"tether resume {run_id} --force" in str(busy.value)
    assert ran == [5]

    held_by(store, run_id, "elsewhere:7:live", expires_in=-1)  # its driver stopped renewing it
    result = runner.drive(run_id)
    assert result.status == "awaiting_approval"  # taken over: the call is in doubt, asked about
    assert "interrupted" in result.pending_approvals[0]["reason"]
    assert ran == [5]


def test_the_async_runner_claims_the_lease_too() -> None:
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT[1:]))
    run_id = Runner(agent, store).create("Say it.").id
    held_by(store, run_id, "elsewhere:7:live", expires_in=60)
    with pytest.raises(RunBusy):
        asyncio.run(AsyncRunner(agent, store).drive(run_id))
    store.release_run(run_id, "elsewhere:7:live")
    assert asyncio.run(AsyncRunner(agent, store).drive(run_id)).status == "done"
    assert store.claim_run(run_id, "next:1:n", now=time.time(), ttl=1).owner == "next:1:n"  # released


def test_a_lease_that_names_no_holder_process_is_honoured_until_it_expires(
    other_process: subprocess.Popen[bytes],
) -> None:
    """As an older tether wrote them: a live pid on this host is no driver without the lease; a dead one is."""
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool([])])
    run_id = started_then_died(Runner(agent, store))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    held_by(store, run_id, f"{HOST}:{gone.pid}:dead", expires_in=60)  # its pid is gone, its lease is not
    with pytest.raises(RunBusy):
        Runner(agent, store, approver=DecideLater()).drive(run_id)

    # as a driver in another PID namespace looks from here: this host, a live pid of another program
    held_by(store, run_id, f"{HOST}:{other_process.pid}:ns", expires_in=-1)
    assert Runner(agent, store, approver=DecideLater()).drive(run_id).status == "awaiting_approval"


def held_by_process(store: Store, run_id: str, holder: Holder, *, expires_in: float = 600) -> str:
    """Make ``holder`` (a process) the run's lease holder until ``expires_in`` seconds from now; its owner id."""
    owner = f"{HOST}:{holder.pid}:held"
    store.claim_run(run_id, owner, now=time.time(), ttl=expires_in, force=True, holder=holder)
    return owner


def test_a_holder_process_gone_from_this_host_is_replaced_at_once_and_said(
    other_process: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool([])])
    run_id = started_then_died(Runner(agent, store))
    me = holders.this_process()
    if me.started is None:
        pytest.skip("this system's /proc does not say when a process started")
    # a pid now used by a later process than the one that claimed the lease
    owner = held_by_process(store, run_id, replace(me, pid=other_process.pid, started=me.started - 1))
    with caplog.at_level(logging.WARNING, logger="tether.stores.leases"):
        result = Runner(agent, store, approver=DecideLater()).drive(run_id)
    assert result.status == "awaiting_approval"  # taken over: its call is in doubt, asked about
    [said] = [r.getMessage() for r in caplog.records if r.name == "tether.stores.leases"]
    assert said.startswith(f"run {run_id}: the drive that held it ({owner}, pid {other_process.pid} on this host)")
    assert "has ended; taken over now" in said


def test_a_live_holder_or_one_in_another_pid_namespace_is_never_replaced(
    other_process: subprocess.Popen[bytes],
) -> None:
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool([])])
    run_id = started_then_died(Runner(agent, store))
    me = holders.this_process()
    assert me.pid_namespace is not None
    other_namespace = me.pid_namespace + 1
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for holder in (
        as_holder(other_process.pid),  # a live process on this host
        replace(me, pid_namespace=other_namespace),  # a live pid here, but the namespace's is another process
        replace(me, pid_namespace=other_namespace, pid=dead.pid),  # no such pid here, which says nothing there
        replace(me, host="boot:another-host", pid=dead.pid),
    ):
        owner = held_by_process(store, run_id, holder)
        with pytest.raises(RunBusy) as busy:
            Runner(agent, store, approver=DecideLater()).drive(run_id)
        assert busy.value.owner == owner, holder


def test_force_takes_the_run_from_a_live_holder_and_the_log_remembers(other_process: subprocess.Popen[bytes]) -> None:
    ran: list[int] = []
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool(ran)])
    run_id = started_then_died(Runner(agent, store))
    [started] = [e.data for e in store.load_events(run_id) if e.type == ev.ToolStarted.kind]
    holder = f"{HOST}:{other_process.pid}:live"
    held_by(store, run_id, holder, expires_in=60)
    runner = Runner(agent, store, approver=DecideLater())

    parked = runner.drive(run_id, force=True)
    assert parked.status == "awaiting_approval"
    [abandoned] = [e.data for e in store.load_events(run_id) if e.type == ev.CallAbandoned.kind]
    assert (abandoned["call_id"], abandoned["owner"]) == ("toolu_1", started["owner"])
    assert store.claim_run(run_id, holder, now=time.time(), ttl=30).owner == holder  # released: free again
    store.release_run(run_id, holder)
    # the override is in the log: later drives, without force, treat the call as in doubt too
    runner.decide(run_id, "toolu_1", Approve(actor="ops"))
    assert runner.drive(run_id).status == "done"
    assert ran == [5, 5]


def test_a_drive_that_lost_its_lease_stops_and_writes_nothing() -> None:
    store = MemoryStore()
    runner = Runner(Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool([0])]), store, lease_ttl=0.3)
    state = runner.create("Move 5.")
    with runner.hold(state.id) as lease:
        assert runner.step(state)  # the model asked for the tool: committed
        written = len(store.load_events(state.id))
        store.claim_run(state.id, "thief:1:t", now=time.time(), ttl=60, force=True)
        wait_for(lambda: lease.lost is not None, "the heartbeat to notice")
        with pytest.raises(RunBusy, match=r"lost run '.*' to thief:1:t"):
            runner.step(state)
    assert len(store.load_events(state.id)) == written
    assert store.claim_run(state.id, "x:1:x", now=time.time(), ttl=1).owner == "thief:1:t"  # not released


def test_a_driver_whose_run_was_forced_away_never_takes_it_back() -> None:
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[transfer_tool([0])])
    hung = Runner(agent, store, lease_ttl=0.3)
    state = hung.create("Move 5.")
    with hung.hold(state.id) as lease:  # a driver stuck (in a tool, say) while it holds the run
        assert Runner(agent, store).drive(state.id, force=True).status == "done"  # the operator's; it lets go
        wait_for(lambda: lease.lost is not None, "the heartbeat to notice")
        assert store.claim_run(state.id, "next:1:n", now=time.time(), ttl=1).owner == "next:1:n"
        with pytest.raises(RunBusy, match="lost run"):
            hung.step(state)


def test_a_long_tool_keeps_the_lease_renewed() -> None:
    store = MemoryStore()
    seen: list[str] = []

    @tool
    def slow() -> str:
        """Outlast several lease periods."""
        until = time.time() + 1.0  # ttl 0.2: expired five times over unless renewed
        while time.time() < until:
            seen.append(store.claim_run(run_id, "other:1:o", now=time.time(), ttl=1).owner)
            time.sleep(0.05)
        return "done"

    script = [tool_use_turn(tool_use("toolu_1", "slow", {})), SCRIPT[1]]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[slow]), store, lease_ttl=0.2)
    run_id = runner.create("Be slow.").id
    assert runner.drive(run_id).status == "done"
    [started] = [e.data for e in store.load_events(run_id) if e.type == ev.ToolStarted.kind]
    assert len(seen) > 3
    assert set(seen) == {started["owner"]}  # nobody else could take it while the tool ran
    assert store.claim_run(run_id, "other:1:o", now=time.time(), ttl=1).owner == "other:1:o"  # released at the end


def test_a_cancel_from_elsewhere_stops_the_drive_cleanly() -> None:
    """Deciding and cancelling need no lease; the driver's next write then fails, and it says why."""
    store = MemoryStore()
    elsewhere: list[str] = []

    @tool
    def slow() -> str:
        """Meanwhile, another process cancels the run."""
        elsewhere.append(Runner(Agent(model=ScriptedModel([])), store).cancel(run_id, "stop").status)
        return "done"

    script = [tool_use_turn(tool_use("toolu_1", "slow", {})), SCRIPT[1]]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[slow]), store)
    run_id = runner.create("Be slow.").id
    with pytest.raises(StaleRun, match=r"changed by another process while this one drove it \(it is now cancelled\)"):
        runner.drive(run_id)
    assert elsewhere == ["cancelled"]
    assert store.load_events(run_id)[-1].type == ev.RunFinished.kind  # the cancel; the tool's result was not written
    assert store.claim_run(run_id, "next:1:n", now=time.time(), ttl=1).owner == "next:1:n"  # released


# Real processes ------------------------------------------------------------------------------
SLOW_TOOLS = '''
import time
from pathlib import Path

from tether import tool


@tool(idempotent=True)
def lookup(item: str) -> str:
    """Look an item up, slowly (safe to repeat: a resumer taking the call for abandoned re-runs it)."""
    with Path("started.log").open("a") as log:
        log.write(f"{item}\\n")
    deadline = time.monotonic() + 60
    while not Path("release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return f"{item}: found"


TOOLS = [lookup]
'''

SLOW_SCRIPT = [
    tool_use_turn(tool_use("toolu_1", "lookup", {"item": "tea"})),
    {"content": [{"type": "text", "text": "Tea found."}], "stop_reason": "end_turn"},
]


def unshare_missing() -> str | None:
    try:
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    except OSError as error:
        return f"unshare cannot run here: {error}"
    return None if probe.returncode == 0 else f"unshare --pid is not permitted here: {probe.stderr.decode().strip()}"


def started_log(workdir: Path) -> list[str]:
    log = workdir / "started.log"
    return log.read_text().split() if log.exists() else []


def test_a_live_driver_in_another_pid_namespace_is_never_taken_over(tmp_path: Path) -> None:
    """The driver's pid, seen from here, is another live process (pid 1): its run is still busy."""
    missing = unshare_missing()
    if missing is not None:
        pytest.skip(missing)  # test_pids_decide_nothing_only_the_lease_does covers the same in-process
    (tmp_path / "slow_tools.py").write_text(SLOW_TOOLS)
    (tmp_path / "script.json").write_text(json.dumps(SLOW_SCRIPT))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    command = ["run", "Look tea up.", "--tools", "slow_tools:TOOLS", "--model", "scripted:script.json", "--db", db]
    driver = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "tether", *command, "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        wait_for(lambda: started_log(tmp_path) == ["tea"] or driver.poll() is not None, "the tool to start")
        assert driver.poll() is None, driver.communicate()
        store = SQLStore(db)
        try:
            [record] = store.list_runs()
        finally:
            store.close()
        resumer = start_tether(tmp_path, "resume", record.id, "--json", "--db", db)
        wait_for(lambda: resumer.poll() is not None or len(started_log(tmp_path)) > 1, "the resumer to decide")
    finally:
        (tmp_path / "release").touch()
    busy = finish_tether(resumer)
    out, err = driver.communicate(timeout=60)
    assert busy.returncode == 5, busy
    assert "another process is driving" in busy.err
    assert started_log(tmp_path) == ["tea"]  # the tool ran once
    assert driver.returncode == 0, err
    done = json.loads(out)
    assert (done["status"], done["output"]) == ("done", "Tea found.")


def killed_while_driving(tmp_path: Path, db: str) -> str:
    """``tether run`` killed (SIGKILL: no clean-up) while its tool runs; its run's id, the lease still held."""
    (tmp_path / "slow_tools.py").write_text(SLOW_TOOLS)
    (tmp_path / "script.json").write_text(json.dumps(SLOW_SCRIPT))
    command = ["run", "Look tea up.", "--tools", "slow_tools:TOOLS", "--model", "scripted:script.json", "--db", db]
    driver = start_tether_forked(tmp_path, *command)
    try:
        wait_for(lambda: started_log(tmp_path) == ["tea"] or not driver.process.is_alive(), "the tool to start")
        assert driver.process.is_alive(), finish_tether_forked(driver)
    finally:
        driver.process.kill()
    assert finish_tether_forked(driver).returncode == -9
    (tmp_path / "release").touch()  # the tool, run again, returns at once
    store = SQLStore(db)
    try:
        [record] = store.list_runs()
        assert store.claim_run(record.id, "probe:1:p", now=time.time(), ttl=60).owner != "probe:1:p"  # still held
    finally:
        store.close()
    return record.id


@pytest.mark.slow
def test_tether_resume_right_after_kill_9_takes_the_run_over_and_says_so(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = killed_while_driving(tmp_path, db)
    resumed = run_tether(tmp_path, "resume", run_id, "--json", "--db", db)
    assert resumed.returncode == 0, resumed
    assert (resumed.data["status"], resumed.data["output"]) == ("done", "Tea found.")
    assert f"notice: run {run_id}: the drive that held it (" in resumed.err
    assert "has ended; taken over now, without waiting for its lease to expire" in resumed.err
    assert started_log(tmp_path) == ["tea", "tea"]  # idempotent: the abandoned call ran again


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["Runner", "AsyncRunner"])
def test_drive_right_after_kill_9_takes_the_run_over(
    runner: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = killed_while_driving(tmp_path, db)
    monkeypatch.setattr(sys, "path", [*sys.path])  # loading the tools adds tmp_path: undone afterwards
    monkeypatch.chdir(tmp_path)
    store = SQLStore(db)
    try:
        agent = agent_from_spec(agent_spec(store, store.load_run(run_id)))
        with caplog.at_level(logging.WARNING, logger="tether.stores.leases"):
            if runner == "Runner":
                result = Runner(agent, store).drive(run_id)
            else:
                result = asyncio.run(AsyncRunner(agent, store).drive(run_id))
    finally:
        store.close()
        sys.modules.pop("slow_tools", None)
    assert (result.status, result.output) == ("done", "Tea found.")
    assert [r.name for r in caplog.records if "taken over now" in r.getMessage()] == ["tether.stores.leases"]
    assert started_log(tmp_path) == ["tea", "tea"]


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
def test_tether_resume_exits_5_while_another_process_drives_and_force_takes_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lease_tools.py").write_text(TOOLS_MODULE)
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    monkeypatch.setattr(sys, "path", [*sys.path])  # loading the tools adds tmp_path: undone afterwards
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    spec = {"tools": ["lease_tools:TOOLS"], "model": f"scripted:{tmp_path / 'script.json'}", "cwd": str(tmp_path)}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CRASH_IN_TOOL", "1")
    store = SQLStore(db)
    try:
        run_id = started_then_died(Runner(agent_from_spec(spec), store))
        held_by(store, run_id, f"{HOST}:{os.getpid()}:live", expires_in=600)
    finally:
        store.close()
        sys.modules.pop("lease_tools", None)
    monkeypatch.delenv("CRASH_IN_TOOL")

    busy = run_tether(tmp_path, "resume", run_id, "--db", db)
    assert busy.returncode == 5, busy
    assert f"another process is driving run {run_id!r}: {HOST}:{os.getpid()}:live holds its lease until" in busy.err
    take_over = f"take the run over with:\n  {TETHER} resume {run_id} --force --db {db}\n"  # a line of its own
    assert take_over in busy.stderr
    assert "drive(force=True)" not in busy.err  # the library's advice is not the command line's
    forced = run_tether(tmp_path, "resume", run_id, "--force", "--db", db, "--json")
    assert forced.returncode == 3, forced  # no terminal: parked for `tether approve`
    assert "interrupted" in forced.data["pending_approvals"][0]["reason"]
    assert run_tether(tmp_path, "approve", run_id, "toolu_1", "--db", db).returncode == 0
    done = run_tether(tmp_path, "resume", run_id, "--db", db, "--json")
    assert done.data["status"] == "done"
    assert (tmp_path / "effects.log").read_text().split("\n") == ["transfer 5", "transfer 5", ""]


def test_the_cli_says_when_another_process_changed_the_run_it_drove(tmp_path: Path) -> None:
    (tmp_path / "slow_tools.py").write_text(SLOW_TOOLS)
    (tmp_path / "script.json").write_text(json.dumps(SLOW_SCRIPT))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    driver = start_tether_forked(
        tmp_path, "run", "Look tea up.", "--tools", "slow_tools:TOOLS", "--model", "scripted:script.json", "--db", db
    )
    try:
        wait_for(lambda: started_log(tmp_path) == ["tea"] or not driver.process.is_alive(), "the tool to start")
        store = SQLStore(db)
        try:
            [record] = store.list_runs()
            Runner(Agent(model=ScriptedModel([])), store).cancel(record.id, "not needed")
        finally:
            store.close()
    finally:
        (tmp_path / "release").touch()
    stopped = finish_tether_forked(driver)
    assert stopped.returncode == 1, stopped
    assert f"run {record.id!r} was changed by another process while this one drove it (it is now cancelled)" in (
        stopped.err
    )
