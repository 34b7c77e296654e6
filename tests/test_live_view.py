"""The live view: the runner's ``on_action`` hook, the spinner it drives, the streamed text
under it, and the CLI in a real pseudo-terminal (pexpect) and in a pipe (plain lines, no
escape codes).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from rich.console import Console  # noqa: TID251 - the view is checked on rich consoles writing to a buffer

from support import ANSI, DEMO_PROMPT, FIBONACCI, demo_db_url, model_reply, run_tether, screen_text, spawn_tether
from tether import Agent, AsyncRunner, Runner, tool
from tether.core.engine import CallModel, RunTool, WaitUntil
from tether.core.flow import Activity, RunningTools
from tether.core.state import PendingCall, RunState
from tether.facts import events as ev
from tether.facts.events import Event
from tether.models.scripted import ScriptedModel
from tether.surfaces.terminal import LiveView, describe_activity

HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(approval=True)
def wipe(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


@tool(concurrent=True)
def double(a: int) -> int:
    """Double an integer."""
    return 2 * a


ADD_THEN_ANSWER = [
    model_reply([{"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 2, "b": 3}}], "tool_use"),
    model_reply([{"type": "text", "text": "5"}], "end_turn"),
]
GATED = [model_reply([{"type": "tool_use", "id": "g1", "name": "wipe", "input": {"path": "x"}}], "tool_use")]


class Recorder:
    """Records actions as the hook sees them, and how many model calls had happened then."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.seen: list[tuple[str, str | None, int]] = []

    def __call__(self, state: RunState, action: Activity) -> None:
        self.seen.append((type(action).__name__, state.status, len(self.model.requests)))


# The hook --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_on_action_is_told_before_each_model_call_and_tool_attempt(kind: str) -> None:
    model = ScriptedModel(ADD_THEN_ANSWER)
    recorder = Recorder(model)
    agent = Agent(model=model, tools=[add])
    if kind == "sync":
        result = Runner(agent, on_action=recorder).run("2+3?")
    else:
        result = asyncio.run(AsyncRunner(agent, on_action=recorder).run("2+3?"))
    assert result.output == "5"
    # Before the I/O: the model has not yet been called for the call being announced.
    assert recorder.seen == [
        ("CallModel", "thinking", 0),
        ("RunTool", "executing_tool", 1),
        ("CallModel", "thinking", 1),
    ]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_on_action_is_told_what_runs_at_once_while_concurrent_calls_run(kind: str) -> None:
    uses = [{"type": "tool_use", "id": f"d{n}", "name": "double", "input": {"a": n}} for n in (1, 2)]
    model = ScriptedModel([model_reply(uses, "tool_use"), model_reply([{"type": "text", "text": "2, 4"}], "end_turn")])
    recorder = Recorder(model)
    agent = Agent(model=model, tools=[double])
    if kind == "sync":
        Runner(agent, on_action=recorder).run("double 1 and 2")
    else:
        asyncio.run(AsyncRunner(agent, on_action=recorder).run("double 1 and 2"))
    seen = [name for name, _, _ in recorder.seen]
    # the first call is announced as it comes up; then, before each wait, what is under way
    assert seen[:3] == ["CallModel", "RunTool", "RunningTools"]
    assert seen[-1] == "CallModel"
    assert set(seen[2:-1]) == {"RunningTools"}


def test_on_action_is_not_told_about_commits_or_parking() -> None:
    model = ScriptedModel(GATED)
    recorder = Recorder(model)
    result = Runner(Agent(model=model, tools=[wipe]), on_action=recorder).run("wipe x")
    assert result.status == "awaiting_approval"
    assert recorder.seen == [("CallModel", "thinking", 0)]  # the gate is a commit, parking a stop


# The spinner -------------------------------------------------------------------------------
def console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=100, color_system="standard" if terminal else None), out


def event(fact: ev.Fact) -> Event:
    return Event(1, 0.0, fact)


def test_live_view_does_nothing_off_a_terminal() -> None:
    plain, out = console(terminal=False)
    view = LiveView(plain)
    view.on_action(RunState(id="r", status="thinking"), CallModel(request=None))  # type: ignore[arg-type]
    view(RunState(id="r"), event(ev.ModelResponded([], "end_turn")))
    view.stop()
    assert not view.enabled
    assert out.getvalue() == ""


def test_live_view_spins_from_an_action_until_the_next_commit() -> None:
    tty, out = console(terminal=True)
    view = LiveView(tty)
    state = RunState(id="r", status="thinking", steps=2)
    try:
        view.on_action(state, CallModel(request=None))  # type: ignore[arg-type]
        assert "thinking · step 3 · calling the model…" in ANSI.sub("", out.getvalue())
        view(state, event(ev.ToolStarted("c1", "t", 1)))  # part of the tool's activity: keeps spinning
        assert view.active
        view(state, event(ev.ModelResponded([], "end_turn")))
        assert not view.active
        assert out.getvalue().rfind(HIDE_CURSOR) < out.getvalue().rfind(SHOW_CURSOR)
    finally:
        view.stop()
    view.stop()  # idempotent


def test_live_view_shows_streamed_text_under_the_spinner_until_the_commit() -> None:
    tty, out = console(terminal=True)
    view = LiveView(tty)
    state = RunState(id="r", status="thinking", steps=0)
    view.on_text("too early")  # no model call under way: nothing to show it in
    try:
        view.on_action(state, CallModel(request=None))  # type: ignore[arg-type]
        for piece in ["Streaming", " is", " shown"]:
            view.on_text(piece)
            assert ANSI.sub("", out.getvalue()).endswith(piece)  # each piece is drawn as it comes
        screen = ANSI.sub("", out.getvalue())
        assert "thinking · step 1 · calling the model…\nStreaming is shown" in screen
        assert "too early" not in screen
        view(state, event(ev.ModelResponded([], "end_turn")))
        assert not view.active
        drawn = len(out.getvalue())
        view.on_text(" late")  # after the commit: ignored
        assert len(out.getvalue()) == drawn
        view.on_action(state, CallModel(request=None))  # type: ignore[arg-type]
        view.on_text("Fresh")
        assert ANSI.sub("", out.getvalue()).endswith("calling the model…\nFresh")  # the next call starts empty
    finally:
        view.stop()


def test_live_view_keeps_the_streamed_text_within_the_screen() -> None:
    out = io.StringIO()
    tty = Console(file=out, force_terminal=True, width=40, height=6, color_system="standard")
    view = LiveView(tty)
    try:
        view.on_action(RunState(id="r", status="thinking"), CallModel(request=None))  # type: ignore[arg-type]
        view.on_text("".join(f"line {n}\n" for n in range(50)))
        last_frame = ANSI.sub("", out.getvalue()).rsplit("calling the model…", 1)[1]
        assert last_frame.split() == ["line", "46", "line", "47", "line", "48", "line", "49"]  # the newest lines
    finally:
        view.stop()


def test_the_streamed_text_reaches_the_view_only_from_a_streaming_call() -> None:
    tty, out = console(terminal=True)
    view = LiveView(tty)
    model = ScriptedModel(ADD_THEN_ANSWER[1:])
    try:
        result = Runner(Agent(model=model), listeners=[view], on_action=view.on_action, on_text=view.on_text).run("?")
    finally:
        view.stop()
    assert result.output == "5"
    assert "calling the model…\n5" in ANSI.sub("", out.getvalue())


def test_live_view_shows_a_model_retry_wait_in_the_spinner() -> None:
    tty, out = console(terminal=True)
    view = LiveView(tty)
    state = RunState(id="r", status="thinking", steps=2)
    assert view.waiting_for_model(3.0, 1) is False  # no call under way: nothing to update
    try:
        view.on_action(state, CallModel(request=None))  # type: ignore[arg-type]
        assert view.waiting_for_model(2.6, 2) is True
        assert "thinking · step 3 · API busy or unreachable: retrying in 3s (retry 2)…" in ANSI.sub("", out.getvalue())
    finally:
        view.stop()
    plain, _ = console(terminal=False)
    assert LiveView(plain).waiting_for_model(1.0, 1) is False  # off a terminal the CLI prints a line


def test_describe_activity_names_the_status_by_its_python_id() -> None:
    call = PendingCall(call_id="c1", tool="add", input={"a": 1, "b": 2})
    state = RunState(id="r", status="executing_tool", steps=4)
    running = RunTool(call=call, tool=add, arguments=add.validate(call.input), attempt=1)
    assert describe_activity(state, running) == "executing_tool · step 4 · running add…"
    retrying = RunTool(call=call, tool=add, arguments=add.validate(call.input), attempt=3)
    assert describe_activity(state, retrying) == "executing_tool · step 4 · running add (attempt 3)…"
    waiting = WaitUntil(due_at=105.0)
    assert describe_activity(state, waiting, now=100.0) == "executing_tool · step 4 · waiting 5s to retry…"
    other = PendingCall(call_id="c2", tool="fetch", input={})
    beside = RunTool(call=other, tool=add, arguments=add.validate(call.input), attempt=2)
    both = RunningTools((running, beside))
    assert describe_activity(state, both) == "executing_tool · step 4 · running add, fetch (attempt 2) at once…"


# The CLI -----------------------------------------------------------------------------------
def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    child = spawn_tether(tmp_path, *args, timeout=30)
    child.logfile_read = io.StringIO()  # the whole screen stream, escape codes included
    return child


def transcript(child: pexpect.spawn) -> str:
    log = child.logfile_read
    assert isinstance(log, io.StringIO)
    return log.getvalue()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[pexpect.spawn]:
    child = spawn(tmp_path, "demo")
    try:
        yield child
    finally:
        if child.isalive():
            child.terminate(force=True)


@pytest.mark.slow
def test_demo_in_a_terminal_shows_a_spinner_then_stops_it_for_the_prompt(demo: pexpect.spawn) -> None:
    demo.expect("thinking · step 1 · calling the model")
    demo.expect("I'll write the\r")  # the model's text under the spinner, half written
    demo.expect("model  I'll write the program first.")  # then its summary, once committed
    demo.expect("call   write_file")
    demo.expect("executing_tool · step 1 · running write_file")
    demo.expect("result write_file: wrote")
    demo.expect("thinking · step 2 · calling the model")
    demo.expect("call   run_python")
    demo.expect(DEMO_PROMPT)
    shown = transcript(demo)
    # Every spinner shown before the prompt was taken down (the cursor shown again) before it.
    assert 0 <= shown.rfind(HIDE_CURSOR) < shown.rfind(SHOW_CURSOR) < shown.rfind("Approval needed")
    demo.sendline("a")
    demo.expect("executing_tool · step 2 · running run_python")
    demo.expect(f"result run_python: [^\n]*{FIBONACCI}")
    demo.expect("thinking · step 3 · calling the model")
    demo.expect(pexpect.EOF)
    demo.close()
    assert demo.exitstatus == 0
    shown = transcript(demo)
    assert shown.rfind(HIDE_CURSOR) < shown.rfind(SHOW_CURSOR)  # the cursor is back at the end
    text = screen_text(shown)
    assert "status: done" in text
    assert f"printed: {FIBONACCI}" in text
    assert "3 model call(s), 2 tool call(s)" in text  # the final usage line


@pytest.mark.slow
def test_resume_in_a_terminal_asks_then_shows_the_rest(tmp_path: Path) -> None:
    parked = run_tether(tmp_path, "demo", "--json")
    assert parked.returncode == 3, parked.stderr
    run_id = json.loads(parked.stdout)["run_id"]
    db = demo_db_url(tmp_path / "tether-demo")
    child = spawn(tmp_path, "resume", run_id, "--db", db)
    try:
        child.expect(DEMO_PROMPT)
        child.sendline("a")
        child.expect("running run_python")
        child.expect("thinking · step 3 · calling the model")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert "status: done" in screen_text(transcript(child))


@pytest.mark.slow
def test_demo_in_a_pipe_prints_plain_lines_only(tmp_path: Path) -> None:
    done = run_tether(tmp_path, "demo", "--approve-all", env={"TERM": "xterm"})
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    assert "\x1b" not in done.stderr
    assert "calling the model" not in done.stdout  # no spinner frames in a file
    for line in ("call   write_file", "result write_file: wrote", "result run_python:", "status: done"):
        assert line in done.stdout
    assert re.search(r"3 model call\(s\), 2 tool call\(s\); tokens in \d+", done.stdout)
