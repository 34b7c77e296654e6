"""The README tells the truth about what it shows."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tether import Agent, Runner
from tether.diagram import COUNT_MARK
from tether.testing import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent


def test_readme_embeds_the_current_machine_graph() -> None:
    readme = (ROOT / "README.md").read_text()
    graph = (ROOT / "diagrams" / "agent-machine.mmd").read_text()
    assert f"```mermaid\n{graph}```" in readme, "README's graph is stale: paste diagrams/agent-machine.mmd"


def test_readme_quick_start_is_the_two_scripts() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Quick start")
    block = readme[readme.index("```bash", start) : readme.index("```\n", readme.index("```bash", start) + 7)]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["scripts/demo", "scripts/test"]
    for script in commands:
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"


def test_readme_diagram_example_runs_on_a_real_run() -> None:
    """The ``from tether import diagram`` block, run on a finished run of a scripted agent."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\nfrom tether import diagram\n")
    block = readme[start + len("```python\n") : readme.index("```\n", start + 10)]
    agent = Agent(model=ScriptedModel([{"content": [{"type": "text", "text": "Hi."}], "stop_reason": "end_turn"}]))
    runner = Runner(agent)
    result = runner.run("Say hi.")
    found: dict[str, Any] = {"result": result, "runner": runner, "agent": agent}
    if shutil.which("dot") is None:  # render needs Graphviz: check the rest without it
        block = "\n".join(line for line in block.splitlines() if "diagram.render(" not in line)
    exec(compile(block, "README.md", "exec"), found)
    assert found["graph"].startswith("stateDiagram-v2\n")
    assert f"thinking --> done : Answered {COUNT_MARK}1" in found["path"]
    assert found["timeline"].endswith("Note over User,Model: run done\n")
    assert "penwidth" in found["dot"]
    if "svg" in found:
        assert found["svg"].startswith(b"<?xml")


def test_readme_lists_exactly_the_keys_json_prints() -> None:
    """``--json prints exactly one object: `a, b, ...``` names the keys of every run's object;
    ``next_due_at`` is said to come only while a retry waits, as it does."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    listed = readme.split("`--json` prints exactly one object: `", 1)[1].split("`", 1)[0]
    agent = Agent(model=ScriptedModel([{"content": [{"type": "text", "text": "Hi."}], "stop_reason": "end_turn"}]))
    shown = Runner(agent).run("Say hi.").to_dict()
    assert [key.strip() for key in listed.split(",")] == list(shown)
    assert "next_due_at" not in shown
    assert "`next_due_at` only while" in readme
