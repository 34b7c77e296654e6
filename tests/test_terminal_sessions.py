"""Whole terminal sessions in a real pseudo-terminal (pexpect): a batch of gated calls, an edit
to other input, EOF and Ctrl-C at every prompt, narrow terminals, and Ctrl-C while work runs.

Runs use a tools module written beside them (each tool run leaves a line in ``effects.log``)
and a scripted model (``--model scripted:script.json``), or Claude's client against
FakeMessagesAPI where a model call must hang.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from support import (
    ANSI,
    DEMO_PROMPT,
    FIBONACCI,
    TETHER,
    demo_db_url,
    events_of,
    fake_api_env,
    finish_terminal,
    model_reply,
    run_tether,
    screen_text,
    spawn_tether,
    tool_results,
    tool_use,
    tool_use_turn,
    transcript,
)
from support import EFFECT_TOOLS as TOOLS_MODULE
from tether.testing import FakeMessagesAPI

pytestmark = pytest.mark.slow  # real pseudo-terminals

LONG_BODY = "Hello Bob, " + "this line goes on and on " * 12 + "END-OF-BODY"
LONG_ANSWER = "Cleaned up as asked: " + "every word of this answer must reach the screen " * 5 + "THE-END"
BOX = re.compile(r"[│╭╮╰╯─]")


class Workspace:
    """A directory with the tools module, a model script and a SQLite database."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = f"sqlite:///{root / 'runs.db'}"
        (root / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")

    def spawn_run(self, script: list[dict[str, Any]], *extra: str, columns: int = 200) -> pexpect.spawn:
        (self.root / "script.json").write_text(json.dumps(script), encoding="utf-8")
        model = ["--model", "scripted:script.json"]
        return spawn_tether(
            self.root, "run", "Clean up.", "--tools", "mytools:TOOLS", *model, "--db", self.db, *extra, columns=columns
        )

    def effects(self) -> list[str]:
        log = self.root / "effects.log"
        return log.read_text(encoding="utf-8").splitlines() if log.exists() else []

    def show(self, run_id: str) -> dict[str, Any]:
        shown = run_tether(self.root, "show", run_id, "--json", "--db", self.db)
        assert shown.returncode == 0, shown
        return shown.data

    def only_run(self) -> str:
        listed = run_tether(self.root, "runs", "--json", "--db", self.db)
        assert listed.returncode == 0, listed
        [row] = listed.data["runs"]
        return str(row["run_id"])


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


@pytest.fixture
def children() -> Iterator[list[pexpect.spawn]]:
    """Spawned commands, killed at the end whatever happened."""
    spawned: list[pexpect.spawn] = []
    yield spawned
    for child in spawned:
        child.close(force=True)


def prompt(label: str) -> str:
    """The approval prompt of one call (a pexpect pattern); escape codes may sit in between."""
    return re.escape(label) + r"[^\n]*: approve[^\n]*> "


STOPPED_EXIT = {"eof": 3, "ctrl-c": 130}
"""The exit status once the person stops answering: parked (3), or parked and interrupted (128 + SIGINT)."""


def stop_answering(child: pexpect.spawn, how: str) -> tuple[int | None, str]:
    """Press Ctrl-D (``how="eof"``) or Ctrl-C at a prompt; the command's exit status and screen."""
    if how == "eof":
        child.sendeof()
    else:
        child.sendintr()
    return finish_terminal(child)


def panel_text(child: pexpect.spawn) -> str:
    """What the session showed, escape codes and panel borders removed, whitespace normalised."""
    return " ".join(BOX.sub(" ", ANSI.sub("", transcript(child))).split())


# A batch of gated calls, on an 80-column terminal ------------------------------------------------
BATCH = [
    tool_use_turn(
        tool_use("toolu_1", "delete", {"path": "/a"}),
        tool_use("toolu_2", "send", {"to": "bob", "body": LONG_BODY}),
        tool_use("toolu_3", "delete", {"path": "/c"}),
    ),
    model_reply([{"type": "text", "text": LONG_ANSWER}], "end_turn"),
]


def test_a_batch_shows_every_call_asks_each_by_position_and_a_covers_same_tool_siblings(
    ws: Workspace, children: list[pexpect.spawn]
) -> None:
    child = ws.spawn_run(BATCH, columns=80)
    children.append(child)
    child.expect("3 calls need your approval")
    child.expect(prompt("[1/3] delete toolu_1"))
    child.sendline("A")
    child.expect(prompt("[2/3] send toolu_2"))
    child.sendline("d")
    child.expect(r"reason[^\n]*> ")
    child.sendline("too chatty")
    child.expect(re.escape("[3/3] delete toolu_3: approved (delete approved for the run with toolu_1)"))
    status, _ = finish_terminal(child)
    assert status == 0, transcript(child)

    shown = panel_text(child)
    for call in ("toolu_1", "toolu_2", "toolu_3"):
        assert f"call: {call}" in shown  # one panel per call, all before the first question
    assert shown.index("call: toolu_3") < shown.index("[1/3] delete toolu_1")
    assert "END-OF-BODY" in shown  # the long argument wraps inside its panel, never cut at the edge
    prompts = [line for line in ANSI.sub("", transcript(child)).splitlines() if ": approve? [a/d/e/A] > " in line]
    assert len(prompts) == 2
    assert all(len(line) <= 80 for line in prompts), prompts

    assert ws.effects() == ["delete /a", "delete /c"]
    data = ws.show(ws.only_run())
    results = tool_results(data)
    assert results["toolu_2"]["is_error"] is True
    assert "too chatty" in results["toolu_2"]["content"]
    decided = {d["call_id"]: d for d in events_of(data, "approval_decided")}
    assert decided["toolu_3"]["approved"] is True
    assert decided["toolu_3"]["reason"] == "delete approved for the run with toolu_1"


@pytest.mark.parametrize("how", ["eof", "ctrl-c"])
def test_no_answer_partway_through_a_batch_keeps_the_decisions_given(
    ws: Workspace, children: list[pexpect.spawn], how: str
) -> None:
    child = ws.spawn_run(BATCH, columns=80)
    children.append(child)
    child.expect(prompt("[1/3] delete toolu_1"))
    child.sendline("a")
    child.expect(prompt("[2/3] send toolu_2"))
    child.sendline("d")
    child.expect(r"reason[^\n]*> ")
    child.sendline("too chatty")
    child.expect(prompt("[3/3] delete toolu_3"))
    status, output = stop_answering(child, how)
    assert status == STOPPED_EXIT[how], output
    assert "the 2 decision(s) given are kept; 1 call(s) stay pending and the run is parked" in output
    assert panel_text(child).count("3 calls need your approval") == 1  # not asked again
    assert "1 call needs" not in output
    assert ws.effects() == []  # the batch runs once every call of it is decided

    data = ws.show(ws.only_run())
    assert data["status"] == "awaiting_approval"
    decided = {d["call_id"]: d["approved"] for d in events_of(data, "approval_decided")}
    assert decided == {"toolu_1": True, "toolu_2": False}
    assert [p["call_id"] for p in data["pending_approvals"]] == ["toolu_3"]


@pytest.mark.parametrize("columns", [80, 120])
def test_the_results_panel_wraps_the_answer_and_the_usage_line(
    ws: Workspace, children: list[pexpect.spawn], columns: int
) -> None:
    child = ws.spawn_run([model_reply([{"type": "text", "text": LONG_ANSWER}], "end_turn")], columns=columns)
    children.append(child)
    status, _ = finish_terminal(child)
    assert status == 0, transcript(child)
    shown = panel_text(child)
    assert f"status: done {LONG_ANSWER}" in shown
    usage = "1 model call(s), 0 tool call(s); tokens in 10, out 5, cache write 0, cache read 0; cost"
    assert usage in shown
    assert "(model not priced)" in shown
    panel = [line for line in ANSI.sub("", transcript(child)).splitlines() if line[:1] in ("╭", "│", "╰")]
    assert panel
    assert all(len(line) <= columns for line in panel), panel


def test_an_edit_denied_by_a_rule_is_asked_again_at_the_terminal(ws: Workspace, children: list[pexpect.spawn]) -> None:
    rules = '[[rules]]\nname = "keep-etc"\ntool = "delete"\nwhen = { path = { matches = "^/etc" } }\naction = "deny"\n'
    (ws.root / "rules.toml").write_text(rules, encoding="utf-8")
    script = [tool_use_turn(tool_use("toolu_1", "delete", {"path": "/tmp/x"})), model_reply([], "end_turn")]
    child = ws.spawn_run(script, "--policy", "rules.toml")
    children.append(child)
    child.expect(prompt("delete toolu_1"))
    child.sendline("e")
    child.expect(r"JSON[^\n]*> ")
    child.sendline('{"path": "/etc/passwd"}')
    child.expect(re.escape("Not allowed: rule 1 (keep-etc): this call is not allowed"))
    child.expect(r"JSON[^\n]*> ")
    child.sendline('{"path": "/tmp/y"}')
    status, _ = finish_terminal(child)
    assert status == 0, transcript(child)
    assert ws.effects() == ["delete /tmp/y"]


def test_an_empty_line_at_the_edit_prompt_goes_back_and_mistakes_are_said_in_plain_words(
    ws: Workspace, children: list[pexpect.spawn]
) -> None:
    script = [tool_use_turn(tool_use("toolu_1", "delete", {"path": "/tmp/x"})), model_reply([], "end_turn")]
    child = ws.spawn_run(script, columns=80)
    children.append(child)
    child.expect(prompt("delete toolu_1"))
    child.sendline("e")
    child.expect(r"JSON[^\n]*> ")
    child.sendline('{"path": 5, "force": true}')
    plain = "Not valid for delete: path: Input should be a valid string; force: Extra inputs are not permitted"
    child.expect(r"(?:\s|\x1b\[[0-9;]*m)+".join(map(re.escape, plain.split())))  # wrapped between words
    child.expect(r"JSON[^\n]*> ")
    child.sendline("{")
    child.expect(re.escape("Not valid JSON: Expecting property name enclosed in double quotes"))
    child.expect(r"JSON[^\n]*> ")
    child.sendline("")
    child.expect(prompt("delete toolu_1"))  # back to the question, nothing decided
    child.sendline("d")
    child.expect(r"reason[^\n]*> ")
    child.sendline("")
    status, output = finish_terminal(child)
    assert status == 0, output
    assert "pydantic.dev" not in output
    assert "type=" not in output
    assert ws.effects() == []
    [decided] = events_of(ws.show(ws.only_run()), "approval_decided")
    assert decided["approved"] is False


# The demo: an edit to other input, and no decision at the later prompts ----------------------------
def test_an_edit_to_other_input_runs_the_tool_with_it_and_the_result_says_so(
    tmp_path: Path, children: list[pexpect.spawn]
) -> None:
    workspace = tmp_path / "tether-demo"
    workspace.mkdir()
    (workspace / "hello.py").write_text("print('hello from the edit')\n", encoding="utf-8")
    child = spawn_tether(tmp_path, "demo")
    children.append(child)
    child.expect(DEMO_PROMPT)
    child.sendline("e")
    child.expect(r"JSON[^\n]*> ")
    child.sendline('{"path": "hello.py"}')
    status, output = finish_terminal(child)
    assert status == 0, output
    assert "printed: hello from the edit" in output

    db = demo_db_url(workspace)
    [row] = run_tether(tmp_path, "runs", "--json", "--db", db).data["runs"]
    shown = run_tether(tmp_path, "show", row["run_id"], "--json", "--db", db).data
    [decided] = events_of(shown, "approval_decided")
    assert decided["input"] == {"path": "hello.py"}
    result = tool_results(shown)["toolu_demo_run"]
    assert result["content"].startswith("(Note: a reviewer edited the input before running the tool.)")
    assert "hello from the edit" in result["content"]


# e in the person's editor ------------------------------------------------------------------------
FAKE_EDITOR = """
import json, sys
from pathlib import Path

here = Path(__file__).parent
path = Path(sys.argv[-1])
with (here / "seen.jsonl").open("a", encoding="utf-8") as seen:
    seen.write(json.dumps({"argv": sys.argv[1:-1], "name": path.name, "text": path.read_text("utf-8")}) + "\\n")
answers = json.loads((here / "answers.json").read_text("utf-8"))
path.write_text(answers.pop(0), encoding="utf-8")
(here / "answers.json").write_text(json.dumps(answers), encoding="utf-8")
"""
"""An editor that writes the next of answers.json into the file and notes what it was given."""


def fake_editor(where: Path, *answers: str) -> tuple[str, Path]:
    """The command of an editor that leaves each of ``answers`` in turn, and the log of what it saw."""
    (where / "editor.py").write_text(FAKE_EDITOR, encoding="utf-8")
    (where / "answers.json").write_text(json.dumps(list(answers)), encoding="utf-8")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(where / 'editor.py'))} --wait", where / "seen.jsonl"


def seen_by(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def demo_editing(tmp_path: Path, children: list[pexpect.spawn], env: dict[str, str], hello: str) -> pexpect.spawn:
    """The demo, its workspace holding a hello.py that prints ``hello``, once ``e`` was answered."""
    workspace = tmp_path / "tether-demo"
    workspace.mkdir()
    (workspace / "hello.py").write_text(f"print({hello!r})\n", encoding="utf-8")
    child = spawn_tether(tmp_path, "demo", env=env)
    children.append(child)
    child.expect(DEMO_PROMPT)
    child.sendline("e")
    return child


def test_e_opens_the_editor_on_the_pretty_input_and_a_mistake_reopens_it_on_what_was_typed(
    tmp_path: Path, children: list[pexpect.spawn]
) -> None:
    mistake = '{"path": "hello.py",}'
    editor, log = fake_editor(tmp_path, mistake, '{"path": "hello.py"}')
    env = {"EDITOR": "false", "VISUAL": editor}  # VISUAL wins
    child = demo_editing(tmp_path, children, env, "hello from the editor")
    child.expect(re.escape("Not valid JSON: Expecting property name enclosed in double quotes: line 1 column 21"))
    child.expect(r"edit it again[^\n]*> ")
    child.sendline("")
    status, output = finish_terminal(child)
    assert status == 0, output
    assert 'Approving the edited input: { "path": "hello.py" }' in output  # saved in the editor, then shown
    assert "printed: hello from the editor" in output

    first, second = seen_by(log)
    assert first == {"argv": ["--wait"], "name": "input.json", "text": '{\n  "path": "fib.py"\n}\n'}
    assert second["text"] == mistake  # nothing typed is lost
    db = demo_db_url(tmp_path / "tether-demo")
    [row] = run_tether(tmp_path, "runs", "--json", "--db", db).data["runs"]
    [decided] = events_of(run_tether(tmp_path, "show", row["run_id"], "--json", "--db", db).data, "approval_decided")
    assert decided["input"] == {"path": "hello.py"}


@pytest.mark.parametrize(
    ("answer", "said"),
    [("", "The input was emptied"), ('{"path":"fib.py"}', "The input was not changed")],
    ids=["emptied", "unchanged"],
)
def test_an_emptied_or_unchanged_file_goes_back_to_the_question(
    tmp_path: Path, children: list[pexpect.spawn], answer: str, said: str
) -> None:
    editor, _ = fake_editor(tmp_path, answer)
    child = demo_editing(tmp_path, children, {"EDITOR": editor}, "never run")
    child.expect(re.escape(f"{said}: back to the question."))
    child.expect(DEMO_PROMPT)
    child.sendline("d")
    child.expect(r"reason[^\n]*> ")
    child.sendline("")
    status, output = finish_terminal(child)
    assert status == 0, output
    assert FIBONACCI not in output


def test_an_editor_that_fails_falls_back_to_one_line_of_json(tmp_path: Path, children: list[pexpect.spawn]) -> None:
    child = demo_editing(tmp_path, children, {"EDITOR": "false"}, "hello from the line")
    child.expect(re.escape("the editor false exited with status 1: type the input on one line instead"))
    child.expect(r"JSON[^\n]*> ")
    child.sendline('{"path": "hello.py"}')
    status, output = finish_terminal(child)
    assert status == 0, output
    assert "printed: hello from the line" in output


@pytest.mark.parametrize(
    ("choice", "asked", "how"),
    [
        ("d", r"reason[^\n]*> ", "eof"),
        ("d", r"reason[^\n]*> ", "ctrl-c"),
        ("e", r"JSON[^\n]*> ", "eof"),
        ("e", r"JSON[^\n]*> ", "ctrl-c"),
    ],
)
def test_no_answer_at_the_reason_or_edit_prompt_leaves_the_run_parked(
    tmp_path: Path, children: list[pexpect.spawn], choice: str, asked: str, how: str
) -> None:
    child = spawn_tether(tmp_path, "demo")
    children.append(child)
    child.expect(DEMO_PROMPT)
    child.sendline(choice)
    child.expect(asked)
    status, output = stop_answering(child, how)
    assert status == STOPPED_EXIT[how], output
    assert "No decision: the call stays pending and the run is parked." in output

    db = demo_db_url(tmp_path / "tether-demo")
    [row] = run_tether(tmp_path, "runs", "--json", "--db", db).data["runs"]
    shown = run_tether(tmp_path, "show", row["run_id"], "--json", "--db", db).data
    assert shown["status"] == "awaiting_approval"
    assert events_of(shown, "approval_decided") == []


# Ctrl-C while work runs ------------------------------------------------------------------------------
def interrupt_when(child: pexpect.spawn, doing: str, started: Callable[[], bool]) -> str:
    """Press Ctrl-C once the spinner shows ``doing`` and the work has ``started``; the screen after."""
    child.expect(doing)
    deadline = time.monotonic() + 20
    while not started():  # the spinner shows just before the work begins
        assert time.monotonic() < deadline, "the work never started"
        time.sleep(0.02)
    child.sendintr()
    status, output = finish_terminal(child)
    assert status == 130, output
    assert "Traceback" not in output
    assert "KeyboardInterrupt" not in output
    return output


def test_ctrl_c_while_a_tool_runs_exits_130_and_the_run_resumes(ws: Workspace, children: list[pexpect.spawn]) -> None:
    script = [tool_use_turn(tool_use("toolu_1", "wait_for", {"flag": "go"})), model_reply([], "end_turn")]
    child = ws.spawn_run(script)
    children.append(child)
    output = interrupt_when(child, "running wait_for", started=lambda: bool(ws.effects()))
    run_id = ws.only_run()
    assert f"interrupted; resume with: {TETHER} resume {run_id} --db {ws.db}" in output
    assert ws.effects() == ["waiting for go"]

    (ws.root / "go").touch()
    resumed = run_tether(ws.root, "resume", run_id, "--approve-all", "--json", "--db", ws.db)
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert ws.effects() == ["waiting for go", "waiting for go", "wait_for go"]
    [asked] = events_of(ws.show(run_id), "approval_requested")  # not idempotent: a person says run it again
    assert "interrupted mid-run" in asked["calls"][0]["reason"]


def test_ctrl_c_while_the_model_thinks_exits_130_and_the_run_resumes(
    api: FakeMessagesAPI, tmp_path: Path, children: list[pexpect.spawn]
) -> None:
    arrived, released = threading.Event(), threading.Event()

    def hang(request: dict[str, Any]) -> dict[str, Any]:
        arrived.set()
        released.wait(30)
        return {"content": [{"type": "text", "text": "too late"}]}

    api.reply_with(hang)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    env = fake_api_env(api)
    child = spawn_tether(tmp_path, "run", "Hi.", "--model", "claude-test", "--db", db, env=env)
    children.append(child)
    try:
        output = interrupt_when(child, "calling the model", started=arrived.is_set)
    finally:
        released.set()
    [row] = run_tether(tmp_path, "runs", "--json", "--db", db).data["runs"]
    assert row["status"] == "thinking"
    assert f"interrupted; resume with: {TETHER} resume {row['run_id']} --db {db}" in screen_text(output)

    api.reply_text("Hello again.")
    resumed = run_tether(tmp_path, "resume", row["run_id"], "--json", "--db", db, env=env)
    assert resumed.returncode == 0, resumed
    assert resumed.data["output"] == "Hello again."


# Off a terminal ----------------------------------------------------------------------------------------
def test_a_parked_run_prints_commands_with_the_real_call_ids(ws: Workspace) -> None:
    (ws.root / "script.json").write_text(json.dumps(BATCH), encoding="utf-8")
    model = ["--model", "scripted:script.json"]
    parked = run_tether(ws.root, "run", "Clean up.", "--tools", "mytools:TOOLS", *model, "--db", ws.db)
    assert parked.returncode == 3, parked
    run_id = ws.only_run()
    assert parked.stdout.splitlines()[-6:] == [  # a whole command a line, never wrapped mid-sentence
        "Decide with:",
        f"  {TETHER} approve {run_id} toolu_1 --db {ws.db}",
        f"  {TETHER} deny {run_id} toolu_1 --db {ws.db}",
        "(and likewise for toolu_2, toolu_3)",
        "then go on with:",
        f"  {TETHER} resume {run_id} --db {ws.db}",
    ]
