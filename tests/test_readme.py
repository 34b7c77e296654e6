"""The README and the docs (docs/) tell the truth about what they show."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tether import Agent, Runner, tool
from tether.testing import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of a docs page (``docs/NAME``)."""
    return (DOCS / name).read_text(encoding="utf-8")


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


def test_the_docs_call_a_step_what_steps_in_json_counts() -> None:
    """The mission's step is one model invocation: ``steps`` counts those, and so do the README and docs."""

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    def turn(call_id: str) -> dict[str, Any]:
        use = {"type": "tool_use", "id": call_id, "name": "add", "input": {"a": 1, "b": 2}}
        return {"content": [use], "stop_reason": "tool_use"}

    answer = {"content": [{"type": "text", "text": "3"}], "stop_reason": "end_turn"}
    result = Runner(Agent(model=ScriptedModel([turn("t1"), turn("t2"), answer]), tools=[add])).run("Add twice.")
    assert (result.steps, result.tool_calls) == (3, 2)  # three model invocations, two tool executions

    pages = [ROOT / "README.md", *(p for p in sorted(DOCS.rglob("*.md")) if "benchmarks" not in p.parts)]
    body = " ".join(" ".join(p.read_text(encoding="utf-8").split()) for p in pages)  # benchmarks define their own unit
    definitions = re.findall(r"(?:A step is|Each step \() [^.]*", body)
    assert definitions, "the docs no longer say what a step is"
    assert all("model invocation" in d and "tool attempt" not in d for d in definitions), definitions
    assert "its own step" not in body  # a tool attempt is not a step


def test_the_reference_lists_exactly_the_keys_json_prints() -> None:
    """``prints the run as it stands when the command ends: `a, b, ...``` names the keys of every run's
    object; ``next_due_at`` is said to come only while a retry waits, as it does."""
    readme = " ".join(page("reference/json.md").split())
    listed = readme.split("prints the run as it stands when the command ends: `", 1)[1].split("`", 1)[0]
    agent = Agent(model=ScriptedModel([{"content": [{"type": "text", "text": "Hi."}], "stop_reason": "end_turn"}]))
    shown = Runner(agent).run("Say hi.").to_dict()
    assert [key.strip() for key in listed.split(",")] == list(shown)
    assert "next_due_at" not in shown
    assert "`next_due_at` only while" in readme


def test_the_pictures_of_tether_ui_are_committed() -> None:
    """Each screenshot the inspector's guide shows is a PNG in diagrams/ (``scripts/ui-screenshots`` retakes them)."""
    shown = re.findall(r"\]\(\.\./(diagrams/ui-[a-z-]+\.png)\)", page("guides/inspector.md"))
    assert sorted(shown) == ["diagrams/ui-inbox.png", "diagrams/ui-run.png", "diagrams/ui-runs.png"]
    for picture in shown:
        assert (ROOT / picture).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), picture


def test_the_readmes_links_into_the_repository_lead_somewhere() -> None:
    """The README introduces and links into docs/: each relative link names a file that is there."""
    readme = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert "docs/tutorial.md" in targets
    assert [t for t in targets if not (ROOT / t).is_file()] == []


def test_the_api_reference_of_tether_lists_every_public_name() -> None:
    """docs/reference/api/tether.md names its members (in the order a reader needs them); the errors
    have their own page. Together they are ``tether.__all__``, so a new public name shows up there."""
    import tether
    from tether import errors

    listed = re.findall(r"^::: tether\.(\w+)$", page("reference/api/tether.md"), re.M)
    exported_errors = {name for name in tether.__all__ if hasattr(errors, name)}
    assert sorted([*listed, *exported_errors]) == sorted(tether.__all__)
