"""Another process acting on a run while this one drives it, and tools modules that try to end the program.

- ``tether approve``/``deny``/``cancel`` from another shell while the terminal prompt is open:
  the person's answers for calls nobody else decided are recorded, the others are said to be
  decided elsewhere (by whom), and the run goes on.
- ``tether cancel`` while ``tether run --json`` runs a tool: one JSON object still (the cancelled
  run), exit 1, and a message saying the tool's outcome was discarded (not "in doubt").
- ``tether resume --json`` on a run another process drives: exit 5 and one object saying so.
- a tools module calling ``sys.exit()`` at import: a usage error naming it, never a silent exit 0.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pexpect
import pytest

from support import (
    EFFECT_TOOLS,
    Cli,
    finish_tether,
    model_reply,
    run_tether,
    screen_text,
    spawn_tether,
    tool_use,
    tool_use_turn,
    transcript,
)
from tether import Agent, Runner, tool
from tether.core.approvals import Approve, Decision, Deny, PendingApproval
from tether.drivers.loader import PRIVATE_PREFIX, load_tools
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

BATCH = [
    tool_use_turn(
        tool_use("toolu_1", "delete", {"path": "/a"}),
        tool_use("toolu_2", "delete", {"path": "/b"}),
        tool_use("toolu_3", "delete", {"path": "/c"}),
    ),
    tool_use_turn(tool_use("toolu_4", "delete", {"path": "/d"})),
    model_reply([{"type": "text", "text": "All done."}], "end_turn"),
]


def prompt(label: str) -> str:
    """The approval prompt of one call (a pexpect pattern); escape codes may sit in between."""
    return re.escape(label) + r"[^\n]*: approve[^\n]*> "


def decisions_of(cli: Cli, run_id: str, db: str) -> dict[str, dict[str, Any]]:
    shown = cli("show", run_id, "--json", "--db", db)
    assert shown.returncode == 0, shown
    return {e["call_id"]: e for e in shown.data["events"] if e["type"] == "approval_decided"}


# The terminal prompt while another process decides (two real processes) ----------------------
@pytest.fixture
def workspace(tmp_path: Path) -> Cli:
    (tmp_path / "mytools.py").write_text(EFFECT_TOOLS, encoding="utf-8")
    (tmp_path / "script.json").write_text(json.dumps(BATCH), encoding="utf-8")
    return Cli(tmp_path)


@pytest.fixture
def terminal(workspace: Cli) -> Iterator[pexpect.spawn]:
    args = ["run", "Clean up.", "--tools", "mytools:TOOLS", "--model", "scripted:script.json"]
    child = spawn_tether(workspace.cwd, *args, "--db", f"sqlite:///{workspace.cwd / 'runs.db'}", env={"USER": "alice"})
    try:
        yield child
    finally:
        child.close(force=True)


def effects(cli: Cli) -> list[str]:
    log = cli.cwd / "effects.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


@pytest.mark.slow
def test_answers_at_the_prompt_survive_decisions_made_in_another_process(
    workspace: Cli, terminal: pexpect.spawn
) -> None:
    db = f"sqlite:///{workspace.cwd / 'runs.db'}"
    terminal.expect(prompt("[1/3] delete toolu_1"))
    [run] = workspace("runs", "--json", "--db", db).data["runs"]
    run_id = run["run_id"]
    # another shell decides two of the three calls while the person reads the first
    approved = workspace.process("approve", run_id, "toolu_1", "--by", "bob", "--db", db)
    assert approved.returncode == 0, approved
    denied = workspace.process("deny", run_id, "toolu_2", "--reason", "outside", "--by", "bob", "--db", db)
    assert denied.returncode == 0, denied

    terminal.sendline("a")  # toolu_1: already approved by bob, unknown to the prompt when it asked
    terminal.expect(re.escape("[2/3] delete toolu_2") + r"[^\n]*not asked: already denied in another process")
    terminal.expect(prompt("[3/3] delete toolu_3"))  # nobody else decided it: asked
    terminal.sendline("a")
    terminal.expect(r"toolu_1[^\n]*your answer was not recorded: already approved in another process \(by bob\)")
    terminal.expect(prompt("delete toolu_4"))  # the run went on: the model's next turn
    terminal.sendline("a")
    terminal.expect(pexpect.EOF)
    terminal.close()
    shown = screen_text(transcript(terminal))
    assert terminal.exitstatus == 0, shown
    assert "already denied in another process (by bob: outside)" in shown
    assert "in doubt" not in shown
    assert "refused" not in shown

    decided = decisions_of(workspace, run_id, db)
    assert {call: (d["approved"], d["actor"]) for call, d in decided.items()} == {
        "toolu_1": (True, "bob"),
        "toolu_2": (False, "bob"),
        "toolu_3": (True, "alice"),
        "toolu_4": (True, "alice"),
    }
    assert effects(workspace) == ["delete /a", "delete /c", "delete /d"]
    assert workspace("pending", "--db", db).stdout.startswith("No tool calls are waiting")


# The same race in the library: answers applied on the run as it is now -------------------------
class Racing:
    """An approver that, while "the person" answers, lets another writer act on the run first."""

    def __init__(self, meanwhile: Any, answers: Mapping[str, Decision]) -> None:
        self.meanwhile = meanwhile
        self.answers = answers
        self.told: list[tuple[str, str]] = []

    def decide(self, requests: Sequence[PendingApproval]) -> Mapping[str, Decision]:
        if self.meanwhile is not None:
            self.meanwhile(requests[0].run_id)
            self.meanwhile = None
        return {r.call_id: self.answers[r.call_id] for r in requests if r.call_id in self.answers}

    def decided_elsewhere(self, notes: Sequence[tuple[str, str]]) -> None:
        self.told.extend(notes)


def racing_agent(ran: list[str]) -> Agent:
    @tool(approval=True)
    def delete(path: str) -> str:
        """Delete a file (pretend)."""
        ran.append(path)
        return f"deleted {path}"

    return Agent(model=ScriptedModel(BATCH), tools=[delete])


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[SQLStore, SQLStore]]:
    """This driver's store and another writer's, on one database."""
    ours, theirs = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}"), SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


def test_a_drive_records_the_answers_nobody_else_gave_and_tells_the_approver_of_the_others(
    stores: tuple[SQLStore, SQLStore],
) -> None:
    store, ran = stores[0], list[str]()
    other = Runner(racing_agent([]), stores[1])  # another process's

    def meanwhile(run_id: str) -> None:
        other.decide(run_id, "toolu_1", Approve(actor="bob"))
        other.decide(run_id, "toolu_2", Deny("outside", actor="bob"))

    everything = {f"toolu_{n}": Approve(actor="alice") for n in range(1, 5)}
    approver = Racing(meanwhile, everything)
    result = Runner(racing_agent(ran), store, approver=approver).run("Clean up.")

    assert result.status == "done"
    assert approver.told == [
        ("toolu_1", "already approved in another process (by bob)"),
        ("toolu_2", "already denied in another process (by bob: outside)"),
    ]
    assert ran == ["/a", "/c", "/d"]
    state = Runner(racing_agent([]), store).load(result.run_id)
    assert {call: (d.approved, d.actor) for call, d in state.decisions.items()} == {"toolu_4": (True, "alice")}
    decided = [e.data for e in store.load_events(result.run_id) if e.type == "approval_decided"]
    assert [(d["call_id"], d["actor"]) for d in decided] == [
        ("toolu_1", "bob"),
        ("toolu_2", "bob"),
        ("toolu_3", "alice"),
        ("toolu_4", "alice"),
    ]


def test_a_run_cancelled_while_the_approver_answers_ends_cancelled_with_nothing_run(
    stores: tuple[SQLStore, SQLStore],
) -> None:
    store, ran = stores[0], list[str]()
    other = Runner(racing_agent([]), stores[1])
    approver = Racing(lambda run_id: other.cancel(run_id, "stop"), {"toolu_1": Approve(actor="alice")})

    result = Runner(racing_agent(ran), store, approver=approver).run("Clean up.")

    assert result.status == "cancelled"
    assert approver.told == [("toolu_1", "no longer waiting: the run is now cancelled")]
    assert ran == []


# run --json cancelled mid-tool, resume --json on a busy run (real processes) ------------------
WAITING = [
    tool_use_turn(tool_use("toolu_w", "wait_for", {"flag": "go"})),
    model_reply([{"type": "text", "text": "Waited."}], "end_turn"),
]


@pytest.mark.slow
def test_run_json_prints_the_cancelled_run_and_resume_json_says_busy(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(EFFECT_TOOLS, encoding="utf-8")
    (tmp_path / "script.json").write_text(json.dumps(WAITING), encoding="utf-8")
    cli = Cli(tmp_path)
    driving = cli.start("run", "Wait.", "--tools", "mytools:TOOLS", "--model", "scripted:script.json", "--json")
    try:
        deadline = time.monotonic() + 30
        while "waiting for go" not in effects(cli) and time.monotonic() < deadline:
            time.sleep(0.05)
        [run] = cli("runs", "--json").data["runs"]

        busy = cli("resume", run["run_id"], "--json")
        assert busy.returncode == 5, busy
        assert busy.data["run_id"] == run["run_id"]
        assert busy.data["status"] == "executing_tool"
        assert busy.data["busy"]["holder"].count(":") == 2  # host:pid:token
        assert busy.data["busy"]["lost"] is False
        assert "another process is driving run" in busy.err

        cancelled = cli("cancel", run["run_id"], "--reason", "stop")
        assert cancelled.returncode == 0, cancelled
    finally:
        (tmp_path / "go").touch()
    finished = finish_tether(driving)

    assert finished.returncode == 1, finished  # cancelled: the README's exit status
    assert finished.data["status"] == "cancelled"
    assert finished.data["error"] == "cancelled: stop"
    assert "it is now cancelled" in finished.err
    assert "tool 'wait_for' (call toolu_w) ran" in finished.err
    assert "its outcome was discarded" in finished.err
    assert "in doubt" not in finished.err
    assert "resume" not in finished.err
    assert effects(cli) == ["waiting for go", "wait_for go"]


# A tools module that exits at import ------------------------------------------------------------
def test_a_tools_module_calling_sys_exit_at_import_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n", encoding="utf-8")
    (tmp_path / "script.json").write_text(json.dumps(WAITING), encoding="utf-8")

    result = run_tether(tmp_path, "run", "x", "--tools", "exits:TOOLS", "--model", "scripted:script.json")

    assert result.returncode == 2, result
    assert "cannot import 'exits'" in result.err
    assert "it called sys.exit() at import (raised SystemExit: 0)" in result.err
    assert not (tmp_path / "tether.db").exists() or not run_tether(tmp_path, "runs", "--json").data["runs"]


def test_ctrl_c_while_a_tools_module_imports_stays_ctrl_c(tmp_path: Path) -> None:
    (tmp_path / "interrupted.py").write_text("raise KeyboardInterrupt\n", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        load_tools(["interrupted:TOOLS"], cwd=str(tmp_path))
    assert not [name for name in sys.modules if name.startswith(PRIVATE_PREFIX) and name.endswith("_interrupted")]


def test_sys_exit_with_a_message_names_it(tmp_path: Path) -> None:
    (tmp_path / "leaves.py").write_text(textwrap.dedent("import sys\nsys.exit('no config here')\n"), encoding="utf-8")
    (tmp_path / "script.json").write_text(json.dumps(WAITING), encoding="utf-8")

    result = run_tether(tmp_path, "run", "x", "--tools", "leaves:TOOLS", "--model", "scripted:script.json")

    assert result.returncode == 2, result
    assert "(raised SystemExit: no config here)" in result.err
