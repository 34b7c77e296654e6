"""``tether diagram``, run as a user would: ``tether diagram ...`` (support.run_tether; a real
process where bytes or a terminal matter), on runs made by ``tether run`` and by ``tether demo``
(whose overlays are checked against the counts their event logs record)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pexpect
import pytest

from diagram_reading import check_state_diagram, dot_counts, dot_nodes, mermaid_counts, recorded_counts
from support import (
    clean_env,
    demo_db_url,
    finish_tether,
    mermaid_parse_errors,
    run_tether,
    screen_text,
    spawn_tether,
    start_tether,
)
from tether.facts.events import Event
from tether.stores import open_store
from tether.views import diagram as dg

pytestmark = pytest.mark.slow  # `tether diagram` processes, Graphviz and Mermaid's parser

needs_dot = pytest.mark.usefixtures("graphviz")
X = dg.COUNT_MARK

TOOLS = '''
from tether import tool

@tool(approval=True)
def send_email(to: str) -> str:
    """Send an email."""
    return f"sent to {to}"

@tool
def lookup(name: str) -> str:
    """Look a name up."""
    return name.upper()

TOOLS = [send_email, lookup]
'''

SCRIPT = [
    {
        "content": [
            {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"name": "ann"}},
            {"type": "tool_use", "id": "c2", "name": "send_email", "input": {"to": "ann@example.com"}},
        ],
        "stop_reason": "tool_use",
    },
    {"content": [{"type": "text", "text": "Mailed ANN."}], "stop_reason": "end_turn"},
]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "mytools.py").write_text(TOOLS, encoding="utf-8")
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")
    return tmp_path


@pytest.fixture
def run_id(workdir: Path) -> str:
    """A finished run in workdir/runs.db: two tool calls, one approved."""
    done = run_tether(
        workdir, "run", "Mail Ann", "--tools", "mytools:TOOLS", "--model", "scripted:script.json",
        "--approve-all", "--json", "--db", "sqlite:///runs.db",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["run_id"])


def test_default_is_the_mermaid_graph_on_stdout_and_touches_no_database(tmp_path: Path) -> None:
    done = run_tether(tmp_path, "diagram")
    assert done.returncode == 0, done.stderr
    assert done.stdout == dg.to_mermaid()
    assert list(tmp_path.iterdir()) == []  # no tether.db created just to draw the class


def test_dot_goes_to_stdout(tmp_path: Path) -> None:
    done = run_tether(tmp_path, "diagram", "--format", "dot")
    assert done.returncode == 0
    assert done.stdout == dg.to_dot()


def test_text_goes_to_a_file_with_o(tmp_path: Path) -> None:
    done = run_tether(tmp_path, "diagram", "-o", "graph.mmd")
    assert done.returncode == 0
    assert done.stdout == ""
    assert (tmp_path / "graph.mmd").read_text(encoding="utf-8") == dg.to_mermaid()


@pytest.mark.parametrize("target", ["no-such-dir/graph.mmd", "."])
def test_an_unwritable_o_is_a_one_line_error(tmp_path: Path, target: str) -> None:
    done = run_tether(tmp_path, "diagram", "-o", target)
    assert done.returncode == 2, done
    assert done.stderr.startswith(f"error: cannot write {target}: "), done
    assert len(done.stderr.strip().splitlines()) == 1, done  # no traceback
    assert done.stdout == ""


@needs_dot
def test_svg_is_text_on_stdout(tmp_path: Path) -> None:
    done = run_tether(tmp_path, "diagram", "--format", "svg")
    assert done.returncode == 0, done.stderr
    assert done.stdout == dg.render(format="svg").decode()
    titles = {t.text for t in ET.fromstring(done.stdout).iter("{http://www.w3.org/2000/svg}title")}
    assert "executing_tool" in titles


@needs_dot
def test_png_goes_to_a_pipe_as_bytes(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tether", "diagram", "--format", "png"]
    done = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"\x89PNG\r\n\x1a\n")


def test_png_is_refused_on_a_terminal(tmp_path: Path) -> None:
    child = spawn_tether(tmp_path, "diagram", "--format", "png")
    child.expect(pexpect.EOF)
    child.close()
    shown = screen_text(child.before or "")
    assert child.exitstatus == 2
    assert "--format png is binary: write it to a file with -o FILE" in shown
    assert "PNG" not in shown.replace("--format png", "")  # no image bytes thrown at the terminal


@needs_dot
def test_svg_and_png_are_written_with_o(tmp_path: Path) -> None:
    assert run_tether(tmp_path, "diagram", "--format", "svg", "-o", "g.svg").returncode == 0
    titles = {t.text for t in ET.parse(tmp_path / "g.svg").getroot().iter("{http://www.w3.org/2000/svg}title")}
    assert {"thinking", "executing_tool", "awaiting_approval", "done", "failed", "cancelled"} <= titles
    assert run_tether(tmp_path, "diagram", "--format", "png", "-o", "g.png").returncode == 0
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@needs_dot
def test_o_takes_the_format_from_the_files_extension(tmp_path: Path) -> None:
    for name in ("g.png", "g.svg", "g.dot", "g.mmd", "G.PNG"):
        done = run_tether(tmp_path, "diagram", "-o", name)
        assert done.returncode == 0, done
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")  # never Mermaid text in a .png
    assert (tmp_path / "G.PNG").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert ET.parse(tmp_path / "g.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    assert (tmp_path / "g.dot").read_text(encoding="utf-8") == dg.to_dot()
    assert (tmp_path / "g.mmd").read_text(encoding="utf-8") == dg.to_mermaid()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-o", "g.png", "--format", "mermaid"], "-o g.png names a png file but --format is mermaid: make them agree"),
        (["-o", "g.mmd", "--format", "svg"], "-o g.mmd names a mermaid file but --format is svg: make them agree"),
        (["-o", "g.jpg"], "-o g.jpg: cannot tell the format from '.jpg'"),
    ],
)
def test_a_format_the_files_name_contradicts_is_refused_in_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    done = run_tether(tmp_path, "diagram", *args)
    assert done.returncode == 2, done
    assert done.stderr.startswith(f"error: {said}"), done
    assert len(done.stderr.strip().splitlines()) == 1, done
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_missing_graphviz_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    done = run_tether(tmp_path, "diagram", "--format", "svg", "-o", "g.svg", env={"PATH": str(empty)})
    assert done.returncode == 1
    assert "apt-get install graphviz" in done.stderr
    assert not (tmp_path / "g.svg").exists()


def test_sequence_needs_a_run(tmp_path: Path) -> None:
    done = run_tether(tmp_path, "diagram", "--kind", "sequence")
    assert done.returncode == 2
    assert "--run" in done.stderr


def test_an_unknown_run_is_a_usage_error(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 'runs.db'}").list_runs()  # a database without that run
    done = run_tether(tmp_path, "diagram", "--run", "nope", "--db", "sqlite:///runs.db")
    assert done.returncode == 2
    assert "not found" in done.stderr


def test_run_overlay_with_the_agents_tools(workdir: Path, run_id: str) -> None:
    done = run_tether(workdir, "diagram", "--run", run_id, "--db", "sqlite:///runs.db")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"    executing_tool --> awaiting_approval : Approval needed {X}1\n" in text
    assert f"    awaiting_approval --> executing_tool : Decided {X}1\n" in text
    assert f"    thinking --> done : Answered {X}1\n" in text
    assert "    done:::active\n" in text
    assert "        send_email: needs approval\n" in text
    assert "        lookup: runs directly\n" in text


def test_run_overlay_draws_the_tools_the_run_recorded_without_importing_them(workdir: Path, run_id: str) -> None:
    (workdir / "mytools.py").write_text("raise SystemExit(3)\n", encoding="utf-8")  # never imported
    done = run_tether(workdir, "diagram", "--run", run_id, "--format", "dot", "--db", "sqlite:///runs.db")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert f"Answered {X}1" in done.stdout
    assert "<b>send_email</b>: needs approval" in done.stdout
    assert "<b>lookup</b>: runs directly" in done.stdout


def test_run_overlay_of_a_run_that_recorded_no_tool_settings_draws_without_them(workdir: Path, run_id: str) -> None:
    with sqlite3.connect(workdir / "runs.db") as db:  # as an older tether wrote it
        db.execute("UPDATE tether_run SET spec = json_remove(spec, '$.tool_settings') WHERE id = ?", (run_id,))
    done = run_tether(workdir, "diagram", "--run", run_id, "--format", "dot", "--db", "sqlite:///runs.db")
    assert done.returncode == 0, done.stderr
    assert "tools not shown: the run did not record them" in done.stderr
    assert f"Answered {X}1" in done.stdout
    assert "__tools" not in done.stdout


def test_run_sequence(workdir: Path, run_id: str) -> None:
    done = run_tether(workdir, "diagram", "--run", run_id, "--kind", "sequence", "--db", "sqlite:///runs.db")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("sequenceDiagram\n")
    assert "    participant tool_lookup as lookup\n" in text
    assert '    tool_send_email->>Approver: approve c2? {"to": "ann@example.com"}' in text
    assert "    Approver-->>tool_send_email: c2 approved by approve-all\n" in text
    assert text.endswith("    Note over User,Model: run done\n")


def test_sequence_is_mermaid_only(workdir: Path, run_id: str) -> None:
    done = run_tether(
        workdir, "diagram", "--run", run_id, "--kind", "sequence", "--format", "dot", "--db", "sqlite:///runs.db"
    )
    assert done.returncode == 2
    assert "drawn in Mermaid only, not --format dot" in done.stderr  # the run was given: not asked for again
    into_png = run_tether(
        workdir, "diagram", "--run", run_id, "--kind", "sequence", "-o", "seq.png", "--db", "sqlite:///runs.db"
    )
    assert into_png.returncode == 2
    assert "drawn in Mermaid only, not -o seq.png" in into_png.stderr
    assert not (workdir / "seq.png").exists()


# The demo's runs, drawn and checked against their events ----------------------------------------
@dataclass(frozen=True)
class DemoRun:
    """A run ``tether demo`` made, and where its database is."""

    cwd: Path
    run_id: str
    db: str
    status: str


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DemoRun]:
    """Two demo runs, started together: one approved to the end, one parked at its gate
    (no terminal and no --approve-all: the approval is persisted and the command exits 3)."""
    commands = {"approved": ("--approve-all",), "parked": ()}
    started = {}
    for name, options in commands.items():
        cwd = tmp_path_factory.mktemp(f"demo-{name}")
        started[name] = (cwd, start_tether(cwd, "demo", *options, "--json"))
    runs = {}
    for name, (cwd, process) in started.items():
        done = finish_tether(process)
        assert done.returncode == {"approved": 0, "parked": 3}[name], done
        runs[name] = DemoRun(cwd, done.data["run_id"], demo_db_url(cwd / "tether-demo"), done.data["status"])
    return runs


def events_of(run: DemoRun) -> list[Event]:
    """The run's event log, read from its database by this process."""
    store = open_store(run.db)
    try:
        return store.load_events(run.run_id)
    finally:
        store.close()


@pytest.mark.parametrize(("name", "current"), [("approved", "done"), ("parked", "awaiting_approval")])
def test_demo_run_overlay_draws_the_counts_its_events_record(
    demo_runs: dict[str, DemoRun], name: str, current: str
) -> None:
    run = demo_runs[name]
    assert run.status == current
    moves, entries = recorded_counts(events_of(run))
    assert moves[("executing_tool", "awaiting_approval", "Approval needed")] == 1  # the demo's gate
    mermaid = run_tether(run.cwd, "diagram", "--run", run.run_id, "--db", run.db)
    assert mermaid.returncode == 0, mermaid
    check_state_diagram(mermaid.stdout)
    assert mermaid_counts(mermaid.stdout) == (moves, entries)
    assert f"    {current}:::active\n" in mermaid.stdout
    assert "        run_python: needs approval, timeout 30s\n" in mermaid.stdout
    dot = run_tether(run.cwd, "diagram", "--run", run.run_id, "--format", "dot", "--db", run.db)
    assert dot.returncode == 0, dot
    assert dot_counts(dot.stdout) == moves
    assert dot_nodes(dot.stdout)[current]["fillcolor"] == dg.ACTIVE_FILL


def test_demo_run_diagrams_pass_mermaids_own_parser(
    demo_runs: dict[str, DemoRun], mermaid_dir: Path, tmp_path: Path
) -> None:
    texts = {}
    for name, run in demo_runs.items():
        for kind in ("graph", "sequence"):
            done = run_tether(run.cwd, "diagram", "--run", run.run_id, "--kind", kind, "--db", run.db)
            assert done.returncode == 0, done
            texts[f"{name}-{kind}.mmd"] = done.stdout
    assert mermaid_parse_errors(mermaid_dir, texts, tmp_path) == {}
