"""``tether show`` tells a run as a conversation, and ``tether audit`` says what ran and why.

One run, driven by the real ``tether`` command with a scripted model and a tools module on disk:
a system prompt and a prompt; a first turn whose gated calls are approved with an edit and denied
with a reason; a tool that raises; a tool approved for the rest of the run; an answer. A reviewer
reads it in a pipe (every value whole, no colour) and on an 80-column terminal.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import ANSI, CliResult, finish_terminal, model_reply, run_tether, spawn_tether, tool_use, transcript

pytestmark = pytest.mark.slow  # whole `tether` commands

TOOLS = textwrap.dedent(
    '''
    """Tools a reviewer gates."""

    from tether import tool


    @tool
    def echo(text: str) -> str:
        """Say the text back."""
        return text


    @tool(approval=True)
    def delete(path: str) -> str:
        """Delete a file (pretend)."""
        return f"deleted {path}"


    @tool
    def boom() -> str:
        """Fail."""
        raise ValueError("disk on fire")


    @tool(approval=True)
    def send(to: str) -> str:
        """Send a message (pretend)."""
        return f"sent to {to}"


    TOOLS = [echo, delete, boom, send]
    '''
)
SYSTEM = "You are a careful janitor. " + "Never delete anything without asking first. " * 6
PROMPT = "Clean up /a and /b,\nthen tell me what you did."
SCRIPT = [
    model_reply(
        [
            {"type": "text", "text": "Let me look first."},
            tool_use("toolu_echo", "echo", {"text": "hello"}),
            tool_use("toolu_a", "delete", {"path": "/a"}),
            tool_use("toolu_b", "delete", {"path": "/b"}),
        ],
        "tool_use",
    ),
    model_reply(
        [
            {"type": "text", "text": "Now the risky part."},
            tool_use("toolu_boom", "boom", {}),
            tool_use("toolu_s1", "send", {"to": "ann"}),
        ],
        "tool_use",
    ),
    model_reply([tool_use("toolu_s2", "send", {"to": "bob"})], "tool_use"),
    model_reply([{"type": "text", "text": "Deleted /tmp/a; /b was kept. Told ann and bob."}], "end_turn"),
]


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = f"sqlite:///{root / 'runs.db'}"
        (root / "janitor.py").write_text(TOOLS, encoding="utf-8")
        (root / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")

    def __call__(self, *args: str, code: int = 0) -> CliResult:
        done = run_tether(self.root, *args, "--db", self.db, env={"COLUMNS": "80"})
        assert done.returncode == code, done
        return done


@pytest.fixture(scope="module")
def told(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, str]:
    """The run, decided and done: (workspace, run id)."""
    ws = Workspace(tmp_path_factory.mktemp("told"))
    model = ("--model", "scripted:script.json", "--tools", "janitor:TOOLS", "--system", SYSTEM)
    run_id = ws("run", PROMPT, *model, "--json", code=3).data["run_id"]
    ws("approve", run_id, "toolu_a", "--input", '{"path": "/tmp/a"}', "--by", "ann")
    ws("deny", run_id, "toolu_b", "--reason", "keep b: it holds the backups", "--by", "bob")
    ws("resume", run_id, code=3)  # boom fails; send waits
    ws("approve", run_id, "toolu_s1", "--for-run", "--by", "cy")
    ws("resume", run_id)  # the second send is approved for the run: nobody is asked
    return ws, run_id


def lines_of(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


def test_show_tells_the_run_as_a_conversation_in_a_pipe(told: tuple[Workspace, str]) -> None:
    ws, run_id = told
    shown = ws("show", run_id).stdout
    assert "\x1b[" not in shown  # no colour in a pipe
    lines = lines_of(shown)
    system = next(line for line in lines if line.startswith("system "))
    assert system.startswith("system You are a careful janitor.")
    assert system.endswith("…")  # folded
    assert len(system) < len(SYSTEM)
    at = lines.index("prompt")
    assert lines[at + 1 : at + 3] == ["Clean up /a and /b,", "then tell me what you did."]
    steps = [line.split(" ·")[0] for line in lines if line.startswith("step ")]
    assert steps == ["step 1", "step 2", "step 3", "step 4"]
    assert "Let me look first." in lines
    expected_in_order = [
        "▸ echo toolu_echo",
        'input {"text": "hello"}',
        "allowed no approval needed",
        "result hello",
        "▸ delete toolu_a",
        'input {"path": "/tmp/a"}',  # what ran
        'original {"path": "/a"}',  # what the model asked for
        "asked the tool is marked approval=True",
        "approved by ann",
        "result (Note: a reviewer edited the input before running the tool.)",
        "deleted /tmp/a",
        "▸ delete toolu_b",
        "denied by bob: keep b: it holds the backups",
        "refused Error: the call was denied by bob: keep b: it holds the backups",
        "▸ boom toolu_boom",
        "error Error (retryable): tool 'boom' raised ValueError: disk on fire",
        "▸ send toolu_s1",
        "approved by cy, for the rest of the run",
        "result sent to ann",
        "▸ send toolu_s2",
        "approved by cy, for the run with toolu_s1: send was approved for the rest of the run",
        "result sent to bob",
        "Deleted /tmp/a; /b was kept. Told ann and bob.",
    ]
    found = [next((i for i, line in enumerate(lines) if line.startswith(want)), -1) for want in expected_in_order]
    assert -1 not in found, [want for want, at in zip(expected_in_order, found, strict=True) if at == -1]
    assert found == sorted(found), shown
    assert "tool_finished" not in shown  # the log is one flag away
    logged = ws("show", run_id, "--events").stdout
    assert "tool_finished" in logged
    assert "approval_decided" in logged


def test_show_json_is_unchanged_by_the_conversation(told: tuple[Workspace, str]) -> None:
    ws, run_id = told
    data = ws("show", run_id, "--json").data
    assert {"messages", "events", "status", "steps"} <= set(data)
    assert data["steps"] == 4


def test_a_reviewer_reads_show_on_an_80_column_terminal(told: tuple[Workspace, str]) -> None:
    ws, run_id = told
    child = spawn_tether(ws.root, "show", run_id, "--db", ws.db, columns=80)
    try:
        status, _ = finish_terminal(child)
    finally:
        child.close(force=True)
    assert status == 0, transcript(child)
    screen = ANSI.sub("", transcript(child).replace("\r\n", "\n"))
    rows = screen.split("\n")
    assert all(len(row) <= 80 for row in rows), [row for row in rows if len(row) > 80]
    flat = " ".join(screen.split())
    for said in (
        "step 1",
        "Let me look first.",
        'input {"path": "/tmp/a"}',
        'original {"path": "/a"}',
        "approved by ann",
        "denied by bob: keep b: it holds the backups",
        "raised ValueError: disk on fire",
        "approved by cy, for the rest of the run",
    ):
        assert said in flat, (said, screen)
    assert re.search(r"step 4 · [^\n]*─+", screen)


def test_audit_shows_the_input_that_ran_the_error_and_every_reason(told: tuple[Workspace, str]) -> None:
    ws, run_id = told
    lines = lines_of(ws("audit", "--run", run_id).stdout)
    for said in (
        'input {"path": "/tmp/a"}',  # what ran
        'original {"path": "/a"}',  # what the model asked for
        "asked the tool is marked approval=True",
        "decision approved by ann (input edited)",
        "decision denied by bob: keep b: it holds the backups",
        "error Error: the call was denied by bob: keep b: it holds the backups",
        "outcome error ValueError",
        "error Error (retryable): tool 'boom' raised ValueError: disk on fire",
        "decision approved by cy, for the rest of the run",
        "decision approved by cy, for the run with toolu_s1: send was approved for the rest of the run",
    ):
        assert said in lines, (said, lines)


def test_audit_on_a_wide_terminal_is_a_table_with_the_input_that_ran_and_the_error(
    told: tuple[Workspace, str],
) -> None:
    ws, run_id = told
    child = spawn_tether(ws.root, "audit", "--run", run_id, "--db", ws.db, columns=300)
    try:
        status, _ = finish_terminal(child)
    finally:
        child.close(force=True)
    assert status == 0, transcript(child)
    rows = ANSI.sub("", transcript(child).replace("\r\n", "\n")).split("\n")
    [edited] = [row for row in rows if "toolu_a" in row]
    assert '{"path": "/tmp/a"}' in edited
    assert "approved by ann (input edited)" in edited
    [failed] = [row for row in rows if "toolu_boom" in row]
    assert "error ValueError: Error (retryable): tool" in failed


def test_the_conversation_is_a_fold_of_the_log_with_what_tether_did_between_steps() -> None:
    """A continued conversation's prompt, a discarded answer, a warning and a handoff, from events alone."""
    from tether.facts.events import Event, Fact, HandedOff, ModelResponded, RunStarted, Warned
    from tether.views.conversation import Aside, Turn, conversation

    earlier: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "yo"}]},
    ]
    cut: list[dict[str, Any]] = [{"type": "tool_use", "id": "toolu_cut", "name": "write", "input": {}}]
    facts: list[Fact] = [
        RunStarted({"system": "Be brief.", "agent": "triage"}, [*earlier, {"role": "user", "content": "Fix it."}]),
        ModelResponded(cut, "max_tokens", discarded=True),
        Warned("budget max_cost_usd at 80%"),
        HandedOff("triage", "fixer", "toolu_h", "to_fixer"),
        ModelResponded([{"type": "text", "text": "Fixed."}], "end_turn"),
    ]
    told = conversation("run_1", [Event(seq, float(seq), fact) for seq, fact in enumerate(facts)])
    assert (told.prompt, told.system, told.earlier) == ("Fix it.", "Be brief.", 2)
    first, warned, handed, second = told.beats
    assert isinstance(first, Turn)
    assert (first.step, first.calls, first.agent) == (1, (), "triage")  # a call not kept is not shown as made
    assert first.discarded == "not kept (stop reason max_tokens): the model was asked again"
    assert warned == Aside("budget max_cost_usd at 80%", warning=True)
    assert handed == Aside("handed off from triage to fixer")
    assert isinstance(second, Turn)
    assert (second.step, second.text, second.agent, second.discarded) == (2, "Fixed.", "fixer", None)


def test_an_abandoned_call_is_told_where_it_happened_before_it_was_asked_again(tmp_path: Path) -> None:
    """A call whose driver died, forced over, asked about again and run: abandoned, asked, approved, result."""
    from support import tool_use_turn
    from tether import Agent, Approve, Runner, tool
    from tether.core.approvals import DecideLater
    from tether.stores.sql import SQLStore
    from tether.testing import ScriptedModel
    from tether.views.conversation import Turn, conversation

    ran: list[int] = []

    @tool
    def transfer(amount: int) -> str:
        """Move money (not idempotent)."""
        ran.append(amount)
        if len(ran) == 1:
            raise KeyboardInterrupt("the process dies here")  # only Ctrl-C escapes a tool, as SIGKILL would
        return f"moved {amount}"

    script = [
        tool_use_turn(tool_use("toolu_1", "transfer", {"amount": 5})),
        {"content": [{"type": "text", "text": "Moved."}], "stop_reason": "end_turn"},
    ]
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SQLStore(url)
    runner = Runner(Agent(model=ScriptedModel(script), tools=[transfer]), store, approver=DecideLater())
    run_id = runner.create("Move 5.").id
    with pytest.raises(KeyboardInterrupt):
        runner.drive(run_id)
    assert runner.drive(run_id, force=True).status == "awaiting_approval"  # the call is in doubt
    runner.decide(run_id, "toolu_1", Approve(actor="ops"))
    assert runner.drive(run_id).status == "done"

    told = conversation(run_id, store.load_events(run_id))
    assert all(isinstance(beat, Turn) for beat in told.beats)  # not an aside after the call's result
    shown = run_tether(tmp_path, "show", run_id, "--db", url)
    assert shown.returncode == 0, shown
    lines = [line.strip() for line in shown.stdout.splitlines()]
    said = [
        next((i for i, line in enumerate(lines) if line.startswith(w)), -1)
        for w in ("abandoned", "asked", "approved", "result")
    ]
    assert -1 not in said, lines
    assert said == sorted(said), lines
    assert "forced: the operator says its driver is gone" in lines[said[0]]
