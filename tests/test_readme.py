"""The README tells the truth about what it shows."""

from __future__ import annotations

from pathlib import Path

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
