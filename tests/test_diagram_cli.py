"""``tether diagram``, run as a user would: ``python -m tether diagram ...`` in a subprocess."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support import run_tether
from tether import diagram as dg

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


@pytest.mark.parametrize("image", ["svg", "png"])
def test_images_need_o(tmp_path: Path, image: str) -> None:
    done = run_tether(tmp_path, "diagram", "--format", image)
    assert done.returncode == 2
    assert "-o FILE" in done.stderr
    assert done.stdout == ""


@needs_dot
def test_svg_and_png_are_written_with_o(tmp_path: Path) -> None:
    assert run_tether(tmp_path, "diagram", "--format", "svg", "-o", "g.svg").returncode == 0
    titles = {t.text for t in ET.parse(tmp_path / "g.svg").getroot().iter("{http://www.w3.org/2000/svg}title")}
    assert {"thinking", "executing_tool", "awaiting_approval", "done", "failed", "cancelled"} <= titles
    assert run_tether(tmp_path, "diagram", "--format", "png", "-o", "g.png").returncode == 0
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


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


def test_run_overlay_without_its_tools_module_still_draws(workdir: Path, run_id: str) -> None:
    (workdir / "mytools.py").unlink()
    done = run_tether(workdir, "diagram", "--run", run_id, "--format", "dot", "--db", "sqlite:///runs.db")
    assert done.returncode == 0, done.stderr
    assert "tools not shown" in done.stderr
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
