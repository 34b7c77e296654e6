"""What reaches a terminal from models and tools: control sequences are shown, never executed;
``tether pending`` shows the exact input; ``show`` and ``audit`` read well at 80 columns and
keep whole values when piped; statuses are spelled one way.

The runs use a scripted model (``--model scripted:script.json``) and a tools module written
beside them, driven by the real ``tether`` command in a pipe or a pseudo-terminal.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import textwrap
import time
from pathlib import Path

import pexpect
import pytest
from rich.console import Console  # noqa: TID251 - the live view is checked on a rich console writing to a buffer

from support import (
    ANSI,
    TETHER,
    CliResult,
    finish_all,
    finish_terminal,
    model_reply,
    spawn_tether,
    start_tether,
    tool_use,
    transcript,
)
from tether.core.children import child_run_id
from tether.core.engine import CallModel
from tether.core.state import RunState
from tether.surfaces.terminal import LiveView, render_audit, render_runs
from tether.views.audit import AuditEntry
from tether.views.printable import printable

NASTY = "T\x1b]0;pwned\x07 C\x1b[2J R\x1b[31mRED X\rCR S\x9b6n"
"""A window title (OSC), a screen clear and a colour (CSI), a carriage return and an 8-bit CSI."""
RAW = ("\x1b]0;pwned", "\x07", "\x1b[2J", "\x1b[31mRED", "X\rCR", "\x9b")
"""What must never reach a terminal from :data:`NASTY`."""
SHOWN = r"T\u001b]0;pwned\u0007 C\u001b[2J R\u001b[31mRED X\rCR S\u009b6n"
""":data:`NASTY` as it is shown instead: each control character as its JSON escape."""
DEL_ID = "toolu_del\x1b[2J"
"""The gated call's id, as a model could send it: ids reach the hints printed after a run."""
SPACED = "rm -rf    /important " + "x" * 300 + " && echo done"
"""An input whose whitespace and length matter to the person approving it."""

TOOLS_MODULE = textwrap.dedent(
    '''
    """Tools for the terminal output tests."""

    from tether import tool


    @tool
    def echo(text: str) -> str:
        """Say the text back."""
        return text


    @tool(approval=True)
    def delete(path: str, why: str = "") -> str:
        """Delete a file (pretend)."""
        return f"deleted {path}"


    TOOLS = [echo, delete]
    '''
)
SCRIPT = [
    model_reply(
        [
            {"type": "text", "text": "Let me see. " + NASTY},
            tool_use("toolu_echo", "echo", {"text": NASTY + " " + "y" * 400 + " END-OF-ECHO"}),
            tool_use(DEL_ID, "delete", {"path": SPACED, "why": NASTY}),
        ],
        "tool_use",
    ),
    model_reply([{"type": "text", "text": "Done: " + NASTY}], "end_turn"),
]


def assert_safe(output: str, *, whole: bool = True) -> None:
    """Nothing of :data:`NASTY` reached the output raw; its shown form did (on one line if ``whole``)."""
    for raw in RAW:
        assert raw not in output, (raw, output)
    if whole:
        assert SHOWN in output.replace("\r\n", "\n"), output


# The one helper ------------------------------------------------------------------------------
def test_printable_shows_every_control_character_as_its_escape() -> None:
    assert printable(NASTY) == SHOWN
    assert printable("two\tcolumns\nnext line, été ✓") == "two\tcolumns\nnext line, été ✓"
    controls = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])
    shown = printable(controls)
    assert [c for c in shown if c not in "\n\t" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)] == []
    assert shown.startswith(r"\u0000\u0001")
    assert "\\b\t\n\\u000b\\f\\r" in shown
    assert shown.endswith(r"\u009f")


def test_printable_shows_invisible_and_direction_changing_characters_as_their_escapes() -> None:
    """What the approver sees is what runs: a right-to-left override would show ``fdp.exe`` as ``exe.pdf``."""
    hidden = "/srv/\u202efdp.exe\u202c -rf /\u2028; rm\u200b -rf\u2066 \ufeff\U000e0041"
    assert printable(hidden) == r"/srv/\u202efdp.exe\u202c -rf /\u2028; rm\u200b -rf\u2066 \ufeff\udb40\udc41"
    assert json.loads(f'"{printable(hidden)}"') == hidden  # still the JSON of the same text
    assert printable("café 中文 😀 عربي") == "café 中文 😀 عربي"  # visible text, any script, is left as it is
    assert printable("lone \ud800 surrogate") == r"lone \ud800 surrogate"  # as wide as it is drawn


def test_streamed_text_is_shown_not_executed_even_split_mid_sequence() -> None:
    out = io.StringIO()
    tty = Console(file=out, force_terminal=True, width=200, color_system="standard")
    view = LiveView(tty)
    try:
        view.on_action(RunState(id="r", status="thinking"), CallModel(request=None))  # type: ignore[arg-type]
        for start in range(0, len(NASTY), 3):  # pieces cut inside the escape sequences
            view.on_text(NASTY[start : start + 3])
    finally:
        view.stop()
    assert_safe(out.getvalue())


@pytest.mark.parametrize(("width", "table"), [(80, False), (200, True)])
def test_audit_is_a_table_only_where_every_column_fits_whole(width: int, table: bool) -> None:
    pending = {"verdict": "pending", "by": None, "at": None, "reason": None, "asked_because": "approval=True"}
    entry = AuditEntry("run_1", "toolu_1", "transfer", {"amount": 5}, 0.0, "awaiting_approval", pending)
    out = io.StringIO()
    render_audit(Console(file=out, force_terminal=True, width=width, color_system=None), [entry])
    screen = out.getvalue()
    assert ("┃ when " in screen) is table
    assert "awaiting_approval" in screen  # never cut to "awaiting_ap…"
    assert "…" not in screen
    assert all(len(line) <= width for line in screen.splitlines())


# The CLI ---------------------------------------------------------------------------------------
class Workspace:
    """A directory with the tools module, the model script and a SQLite database."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = f"sqlite:///{root / 'runs.db'}"
        (root / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")
        (root / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")

    def start(self, *args: str) -> subprocess.Popen[str]:
        """A command in a pipe, rich told the screen is 80 columns wide (see :func:`finish_all`)."""
        return start_tether(self.root, *args, "--db", self.db, env={"COLUMNS": "80"})

    def park(self) -> tuple[str, CliResult]:
        """Start a run, piped: the echo runs, then the run parks on the gated call (nobody is asked)."""
        [started] = finish_all(
            self.start("run", "Look.", "--tools", "mytools:TOOLS", "--model", "scripted:script.json")
        )
        assert started.returncode == 3, started
        [listed] = finish_all(self.start("runs", "--json"))
        [row] = listed.data["runs"]
        return str(row["run_id"]), started

    def spawn(self, *args: str, columns: int = 80) -> pexpect.spawn:
        return spawn_tether(self.root, *args, "--db", self.db, columns=columns)

    def screen(self, *args: str, columns: int = 80) -> str:
        """What a command showed on a pseudo-terminal ``columns`` wide (it must exit 0), lines
        ending in \\n, escape codes left in."""
        child = self.spawn(*args, columns=columns)
        try:
            status, _ = finish_terminal(child)
        finally:
            child.close(force=True)
        assert status == 0, transcript(child)
        return transcript(child).replace("\r\n", "\n")


@pytest.fixture(scope="module")
def parked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, str, CliResult]:
    """A parked run, only read by the tests that share it: (workspace, run id, the run's output)."""
    ws = Workspace(tmp_path_factory.mktemp("parked"))
    run_id, started = ws.park()
    return ws, run_id, started


@pytest.mark.slow  # processes on a pipe or a pseudo-terminal
def test_a_piped_run_prints_model_and_tool_text_safely(parked: tuple[Workspace, str, CliResult]) -> None:
    _, _, started = parked
    assert_safe(started.stdout)
    assert "state  thinking → executing_tool" in started.stdout
    assert f"Decide with:\n  {TETHER} approve {parked[1]} {printable(DEL_ID)} --db" in started.stdout
    assert "executingTool" not in started.stdout
    assert "awaitingApproval" not in started.stdout


@pytest.mark.slow  # processes on a pipe or a pseudo-terminal
def test_an_error_quoting_a_name_prints_it_safely(tmp_path: Path) -> None:
    [failed] = finish_all(Workspace(tmp_path).start("run", "Hi.", "--model", "scripted:bad\x1b[2J.json"))
    assert failed.returncode == 2, failed
    assert "\x1b[2J" not in failed.stderr
    assert "cannot read scripted model file" in failed.stderr
    assert "bad\\u001b[2J.json" in failed.stderr


@pytest.mark.slow  # processes on a pipe or a pseudo-terminal
def test_pending_shows_the_exact_input_as_pretty_json(parked: tuple[Workspace, str, CliResult]) -> None:
    ws, run_id, _ = parked
    exact = json.dumps({"path": SPACED, "why": NASTY}, indent=2, ensure_ascii=False)
    [piped] = finish_all(ws.start("pending"))
    assert piped.returncode == 0, piped
    for output in (piped.stdout, ws.screen("pending")):
        assert_safe(output)
        block = printable(exact).replace("\n", "\n" + " " * 9)  # whitespace inside the value kept, nothing cut
        assert f"  input  {block}\n" in ANSI.sub("", output), output
        assert "…" not in output
        assert f"{run_id}  {printable(DEL_ID)}  delete" in ANSI.sub("", output)


@pytest.mark.slow  # processes on a pipe or a pseudo-terminal
def test_show_and_audit_piped_keep_every_value_whole(parked: tuple[Workspace, str, CliResult]) -> None:
    ws, run_id, _ = parked
    audit, show = finish_all(ws.start("audit"), ws.start("show", run_id))
    echoed = printable(NASTY + " " + "y" * 400 + " END-OF-ECHO")
    for done in (audit, show):
        assert done.returncode == 0, done
        assert_safe(done.stdout)
        assert "…" not in done.stdout, done
        assert echoed in done.stdout, done  # on one line: neither cut nor wrapped
        assert "executingTool" not in done.stdout
        assert "awaitingApproval" not in done.stdout
    assert printable(json.dumps({"path": SPACED, "why": NASTY}, ensure_ascii=False)) in audit.stdout
    assert f"{run_id} toolu_del" in audit.stdout


@pytest.mark.slow  # processes on a pipe or a pseudo-terminal
@pytest.mark.parametrize("columns", [80, 160])
@pytest.mark.parametrize("command", ["audit", "show", "show --events"])
def test_show_and_audit_fit_the_terminal(parked: tuple[Workspace, str, CliResult], command: str, columns: int) -> None:
    ws, run_id, _ = parked
    name, *flags = command.split()
    screen = ws.screen(*(["audit"] if name == "audit" else ["show", run_id, *flags]), columns=columns)
    assert_safe(screen, whole=False)  # wrapped to the screen
    lines = ANSI.sub("", screen).split("\n")
    assert all(len(line) <= columns for line in lines), [line for line in lines if len(line) > columns]
    text = " ".join(lines)
    words = {
        "audit": ["input", "decision", "outcome", "echo", "delete", "toolu_echo", "toolu_del"],
        "show": ["step 1", "toolu_echo", "toolu_del", "awaiting_approval", "waiting for a person"],
        "show --events": ["tool_finished", "toolu_echo", "executing_tool", "awaiting_approval"],
    }
    for word in words[command]:
        assert word in text, (word, screen)  # whole: never squeezed to "to…"
    assert "executingTool" not in text


@pytest.mark.slow  # processes on a pipe or a pseudo-terminal
def test_the_approval_and_the_rest_of_the_run_are_safe_in_a_terminal(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    run_id, _ = ws.park()
    child = ws.spawn("resume", run_id)
    try:
        child.expect(r"delete toolu_del[^\n]*: approve[^\n]*> ")
        child.sendline("a")
        status, _ = finish_terminal(child)
    finally:
        child.close(force=True)
    assert status == 0, transcript(child)
    screen = transcript(child).replace("\r\n", "\n")
    assert_safe(screen)
    assert "Done: " + SHOWN in ANSI.sub("", screen).replace("\n", "")


def test_the_runs_table_shows_whole_ids_the_date_and_the_prompt_cut_to_the_screen() -> None:
    """Dates as ``ls -l`` gives them (this year's day and minute, an older run's date); ids never cut (they
    are copied); the prompt on one line, beside its run on a wide screen, under it at 80 columns."""
    now = time.time()
    parent = "run_" + "a" * 20
    child = child_run_id(parent, "toolu_review", 1)
    asked = "Review the\npull request " + "and explain every change " * 10
    rows = [
        {"run_id": parent, "status": "awaiting_approval", "steps": 120, "tool_calls": 48, "updated_at": now},
        {
            "run_id": child,
            "parent": parent,
            "status": "awaiting_approval",
            "steps": 3,
            "tool_calls": 1,
            "updated_at": now,
            "prompt": asked,
        },
        {
            "run_id": "run_" + "c" * 20,
            "status": "waiting_retry",
            "steps": 7,
            "tool_calls": 2,
            "updated_at": now - 400 * 86400,
            "prompt": "Fetch the report",
        },
    ]

    def shown(width: int) -> list[str]:
        out = io.StringIO()
        render_runs(Console(file=out, width=width, color_system=None, force_terminal=True), rows)
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width
        return lines

    wide = shown(140)
    assert len(wide) == 1 + len(rows)  # the header, a line per run
    assert wide[0].split() == ["status", "steps", "tools", "updated", "run", "prompt"]
    assert re.search(rf"awaiting_approval .* \d\d-\d\d \d\d:\d\d +{parent} +-$", wide[1])
    assert re.search(rf"└ {child}  Review the pull request and explain every change .*…$", wide[2])
    assert re.search(r"waiting_retry .* \d{4}-\d\d-\d\d .* run_c{20} +Fetch the report$", wide[3])

    narrow = shown(80)
    assert len(narrow) == 1 + len(rows) + 2  # the two prompts on lines of their own
    assert parent in narrow[1]
    assert f"└ {child}" in narrow[2]
    assert narrow[3].startswith("    Review the pull request and explain")
    assert narrow[3].endswith("…")
    assert "run_" + "c" * 20 in narrow[4]
    assert narrow[5] == "    Fetch the report"
    none = io.StringIO()
    render_runs(Console(file=none, width=80, color_system=None), [])
    assert none.getvalue() == "No runs match.\n"  # as audit and pending say it, not an empty table


def test_show_says_an_events_moments_as_local_times_and_json_keeps_the_number() -> None:
    from tether.facts.events import Event, RetryScheduled
    from tether.surfaces.terminal import _detail

    at = time.mktime((2026, 11, 25, 1, 16, 6, 0, 0, -1)) + 0.882
    fact = RetryScheduled("toolu_1", "fetch", 1, 0.1, "OSError", due_at=at, error="boom", error_class="transient")
    event = Event(3, at, fact)
    assert _detail(event, whole=True)["due_at"] == "2026-11-25 01:16:06.882"
    assert event.data["due_at"] == at
