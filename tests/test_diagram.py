"""Diagrams: each renderer on the IR alone, then the real machine, a real run, and diagrams/.

Mermaid is checked twice. A small line grammar of our own (``check_state_diagram`` and
``check_sequence_diagram`` in diagram_reading.py) runs everywhere and says which line is
wrong. Mermaid's own parser (``mermaid.parse`` under Node.js, with jsdom standing in for the
browser) checks every kind of diagram we write: the graph, a run's overlay, the tools note
and a run's sequence diagram. It is pinned in tests/mermaid/package-lock.json and installed
there by ``scripts/setup`` (``npm ci``; @mermaid-js/parser alone does not cover state or
sequence diagrams). DOT is checked by the real Graphviz ``dot`` (``apt-get install graphviz``)
and the SVG read back with ``xml.etree``. Without Node.js and the modules, or without ``dot``,
those tests skip, except under ``TETHER_REQUIRE_TOOLS=1`` (``scripts/test`` sets it): then
they fail.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from statemachine.contrib.diagram.graphviz import GraphvizNotFoundError
from statemachine.contrib.diagram.model import DiagramGraph, DiagramState, DiagramTransition, StateType

from diagram_reading import (
    check_sequence_diagram,
    check_state_diagram,
    dot_counts,
    dot_edges,
    dot_nodes,
    label_collisions,
    mermaid_counts,
    recorded_counts,
)
from support import mermaid_parse_errors
from tether import AutoApprover, RetryLater, RetryPolicy, Runner, RunNotFound, RunResult, tool
from tether.agent import Agent
from tether.core.machine import AgentMachine
from tether.facts import events
from tether.facts.events import Event
from tether.policy.policies import ApprovalVerdict
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel
from tether.views import diagram as dg

ROOT = Path(__file__).resolve().parents[1]
STATE_IDS = {"thinking", "executing_tool", "awaiting_approval", "done", "failed", "cancelled"}
SVG = "{http://www.w3.org/2000/svg}"
X = dg.COUNT_MARK
needs_dot = pytest.mark.usefixtures("graphviz")


def test_the_grammar_rejects_what_mermaid_rejects() -> None:
    with pytest.raises(AssertionError):
        check_state_diagram("stateDiagram-v2\n    a --> : broken\n")
    with pytest.raises(AssertionError):
        check_state_diagram('stateDiagram-v2\n    state "A" as a\n    a --> b\n')  # b undeclared
    with pytest.raises(AssertionError):
        check_state_diagram('stateDiagram-v2\n    state "A" as a\n    note right of a\n        x\n')
    with pytest.raises(AssertionError):
        check_sequence_diagram("sequenceDiagram\n    participant A\n    A->>A: semi; colon\n")
    with pytest.raises(AssertionError):
        check_sequence_diagram("sequenceDiagram\n    participant A\n    A->>B: to nobody\n")


# Renderers on the IR alone ----------------------------------------------------------------
def small_diagram(*, run: bool = True, tools: bool = True) -> dg.Diagram:
    """Three states written by hand: no machine involved."""
    graph = DiagramGraph(
        name="Small",
        states=[
            DiagramState("idle", f"Idle {X}1", StateType.REGULAR, is_initial=True),
            DiagramState("busy", f"Busy {X}2", StateType.REGULAR),
            DiagramState("stopped", f"Stopped {X}1", StateType.FINAL, is_active=run),
            DiagramState("broken", "Broken", StateType.FINAL),
        ],
        transitions=[
            DiagramTransition("idle", ["busy"], f"Go {X}1"),
            DiagramTransition("busy", ["busy"], f"Again {X}1", guards=["more"]),
            DiagramTransition("busy", ["busy"], "Again", guards=["other"]),
            DiagramTransition("busy", ["stopped"], f"Stop {X}1"),
            DiagramTransition("busy", ["broken"], "Break"),
        ],
    )
    footprint = dg.Footprint(visits={"idle": 1, "busy": 2, "stopped": 1}, taken={0: 1, 1: 1, 3: 1}, current="stopped")
    notes = [dg.ToolNote("fetch", max_attempts=3, timeout=2.5), dg.ToolNote("send", approval="always")]
    return dg.Diagram(graph, tools=notes if tools else [], note_on="busy", run=footprint if run else None)


def test_mermaid_renderer_adds_run_classes_and_the_tools_note() -> None:
    text = dg.render_mermaid(small_diagram())
    check_state_diagram(text)
    assert f"    idle --> busy : Go {X}1\n" in text
    assert f"    busy --> busy : Again {X}1 [more]\n" in text
    assert "    stopped --> [*]\n" in text  # finals drawn as final
    assert "    broken --> [*]\n" in text
    assert "    stopped:::active\n" in text
    assert "    class idle,busy visited\n" in text
    assert "    class broken unvisited\n" in text
    assert "note right of busy\n        Tools\n        fetch: retries, up to 3 attempts, timeout 2.5s\n" in text
    assert "        send: needs approval\n    end note\n" in text


def test_mermaid_renderer_without_a_run_or_tools_is_the_librarys_text() -> None:
    text = dg.render_mermaid(small_diagram(run=False, tools=False))
    check_state_diagram(text)
    assert "classDef" not in text
    assert "note" not in text


def test_dot_renderer_styles_taken_edges_and_visited_states() -> None:
    source = dg.render_dot(small_diagram())
    edges = dot_edges(source)
    assert edges[("idle", "busy", f"Go {X}1")]["penwidth"] == "2"
    assert edges[("busy", "busy", f"Again {X}1")]["color"] == dg.VISITED_STROKE
    assert edges[("busy", "busy", "Again")]["color"] == dg.UNVISITED_STROKE  # same ends, not taken
    assert edges[("busy", "broken", "Break")]["color"] == dg.UNVISITED_STROKE
    nodes = dot_nodes(source)
    assert nodes["busy"]["fillcolor"] == dg.VISITED_FILL
    assert nodes["broken"]["fillcolor"] == dg.UNVISITED_FILL
    assert nodes["stopped"]["fillcolor"] == dg.ACTIVE_FILL
    assert nodes["stopped"]["peripheries"] == "2"  # final
    assert "shape=note" in source
    assert "__tools -> busy" in source
    assert not re.search(r"\d{6,}", source), "a memory address leaked into a node name"


def test_dot_renderer_is_deterministic() -> None:
    assert dg.render_dot(small_diagram()) == dg.render_dot(small_diagram())
    assert "__initial_0 -> idle" in dg.render_dot(small_diagram())


def test_sequence_renderer_spells_out_control_characters() -> None:
    """A tool output's terminal escapes never reach the terminal that prints the diagram."""
    line = dg.Timeline([dg.Participant("User", "User")], [dg.Note(("User",), "a\x1b[31mred\x00\x9b end\n")])
    text = dg.render_sequence(line)
    assert "    Note over User: a\\x1b[31mred\\x00\\x9b end" in text.split("\n")
    assert not any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in text.replace("\n", ""))


def test_sequence_renderer_escapes_what_mermaid_would_read_as_syntax() -> None:
    line = dg.Timeline(
        [dg.Participant("User", "User"), dg.Participant("tool_a_b", "a-b")],
        [
            dg.Message("User", "tool_a_b", "x; y #1 <b>"),
            dg.Message("tool_a_b", "User", "ok", "reply"),
            dg.Message("tool_a_b", "User", "boom", "failed"),
            dg.Note(("User", "tool_a_b"), "end"),
        ],
    )
    text = dg.render_sequence(line)
    check_sequence_diagram(text)
    assert text.split("\n")[1:7] == [
        "    participant User",
        "    participant tool_a_b as a-b",
        "    User->>tool_a_b: x#59; y #35;1 #lt;b#gt;",
        "    tool_a_b-->>User: ok",
        "    tool_a_b--xUser: boom",
        "    Note over User,tool_a_b: end",
    ]


def ev(seq: int, fact: events.Fact) -> Event:
    return Event(seq, 100.0, fact)


def test_timeline_reads_every_kind_of_event() -> None:
    log = [
        ev(0, events.RunStarted({}, [{"role": "user", "content": "hello\nthere"}])),
        ev(1, events.Transition("start", None, "thinking")),
        ev(2, events.ModelResponded([{"type": "tool_use", "id": "c1", "name": "a-b", "input": {"q": 1}}], "tool_use")),
        ev(3, events.ToolStarted("c1", "a-b", 1)),
        ev(4, events.RetryScheduled("c1", "a-b", 1, 0.1, "OSError", 102.5, "Error: flaky", "retryable")),
        ev(5, events.ToolFinished("c1", "a-b", "Error: broke", True, attempt=2)),
        ev(6, events.ApprovalRequested([events.RequestedCall("c2", "a_b", {}, "risky")])),
        ev(7, events.ApprovalDecided("c2", "a_b", False, "ann", "no", None, "f", False)),
        ev(8, events.Warned("cut off")),
        ev(9, events.ModelResponded([], "max_tokens", discarded=True)),
        ev(10, events.RunFinished("failed", "max_steps limit reached", None, None, False)),
    ]
    line = dg.timeline(log)
    assert [p.label for p in line.participants] == ["User", "Model", "a-b", "a_b", "Approver"]
    assert [p.id for p in line.participants][2:4] == ["tool_a_b", "tool_a_b_2"]  # distinct ids
    assert line.steps == [
        dg.Message("User", "Model", "hello there"),
        dg.Message("Model", "tool_a_b", 'c1: a-b({"q": 1})'),
        dg.Note(("tool_a_b",), "runs c1 (attempt 1)"),
        dg.Note(("tool_a_b",), "attempt 1 failed, retry in 2.5s: Error: flaky"),
        dg.Message("tool_a_b", "Model", "Error: broke", "failed"),
        dg.Message("tool_a_b_2", "Approver", "approve c2? {} (risky)"),
        dg.Message("Approver", "tool_a_b_2", "c2 denied by ann: no", "failed"),
        dg.Note(("Model",), "warning: cut off"),
        dg.Message("Model", "User", "response discarded (stop_reason max_tokens)", "failed"),
        dg.Note(("User", "Model"), "run failed: max_steps limit reached"),
    ]
    check_sequence_diagram(dg.render_sequence(line))


def test_preview_keeps_one_short_line() -> None:
    assert dg.preview("a\n b   c") == "a b c"
    assert dg.preview("x" * 100, limit=10) == "x" * 9 + "…"


# The real machine -----------------------------------------------------------------------
def test_mermaid_of_the_machine_names_events_guards_and_finals() -> None:
    text = dg.to_mermaid()
    check_state_diagram(text)
    assert text == dg.to_mermaid(AgentMachine)  # deterministic
    assert "    [*] --> thinking\n" in text
    for final in ("done", "cancelled"):
        assert f"    {final} --> [*]\n" in text
    assert "executing_tool --> done : Tool finished [has_final_result, !has_pending_calls]" in text
    assert "awaiting_approval --> awaiting_approval : Decided [has_undecided_approvals]" in text
    edges = [line for line in text.split("\n") if " --> " in line and "[*]" not in line]
    assert len(edges) == sum(len(s.transitions) for s in AgentMachine.states)


def test_dot_of_the_machine_is_deterministic_without_addresses() -> None:
    source = dg.to_dot()
    assert source == dg.to_dot()
    assert not re.search(r"\d{6,}|0x[0-9a-f]", source)
    assert {name for name in dot_nodes(source)} >= STATE_IDS


def svg_titles(svg: bytes) -> tuple[list[str], list[str]]:
    """Sorted node titles and edge titles of a Graphviz SVG."""
    root = ET.fromstring(svg)
    titles: dict[str, list[str]] = {"node": [], "edge": []}
    for group in root.iter(f"{SVG}g"):
        kind = group.get("class")
        if kind in titles:
            titles[kind].append(group.findtext(f"{SVG}title") or "")
    return sorted(titles["node"]), sorted(titles["edge"])


def svg_texts(svg: bytes) -> list[str]:
    return sorted(t.text or "" for t in ET.fromstring(svg).iter(f"{SVG}text"))


@needs_dot
def test_dot_renders_with_graphviz_to_an_svg_holding_every_state_and_edge() -> None:
    completed = subprocess.run(["dot", "-Tsvg"], input=dg.to_dot().encode(), capture_output=True, check=True)
    nodes, edges = svg_titles(completed.stdout)
    assert set(nodes) == STATE_IDS | {"__initial_0"}
    assert len(edges) == 19 + 1  # every transition, and the initial arrow
    assert "thinking->executing_tool" in edges
    without_ports = Counter(re.sub(r":[nsew]+\b", "", edge) for edge in edges)  # a self-loop's title names its ports
    assert without_ports["executing_tool->executing_tool"] == 2  # tool_finished and retry_scheduled
    assert "Retry scheduled" in svg_texts(completed.stdout)


@needs_dot
def test_render_gives_svg_and_png_bytes() -> None:
    svg = dg.render(format="svg")
    assert svg == dg.render(format="svg")
    assert set(svg_titles(svg)[0]) == STATE_IDS | {"__initial_0"}
    assert dg.render(format="png").startswith(b"\x89PNG\r\n\x1a\n")


def test_missing_graphviz_is_a_clear_error_naming_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GraphvizNotFoundError, match=r"Debian package `graphviz` \(apt-get install graphviz\)"):
        dg.render(format="png")


def test_an_unknown_image_format_is_refused() -> None:
    with pytest.raises(dg.DiagramError, match="unknown image format 'gif'"):
        dg.render(format="gif")  # type: ignore[arg-type]


def test_agent_tools_are_annotated() -> None:
    @tool(approval=True)
    def send(to: str) -> str:
        """Send."""
        return to

    @tool(approval=lambda args, context: ApprovalVerdict("allow"), retry=RetryPolicy(max_attempts=4), timeout=3)
    def fetch(url: str) -> str:
        """Fetch."""
        return url

    @tool(final=True)
    def answer(text: str) -> str:
        """Answer."""
        return text

    agent = Agent(model=ScriptedModel([]), tools=[send, fetch, answer])
    text = dg.to_mermaid(agent=agent)
    check_state_diagram(text)
    assert "note right of executing_tool" in text
    assert "        send: needs approval\n" in text
    assert "        fetch: approval decided per call, retries, up to 4 attempts, timeout 3s\n" in text
    assert "        answer: final, ends the run\n" in text
    source = dg.to_dot(agent=agent)
    assert "<b>answer</b>: final, ends the run" in source
    assert "__tools -> executing_tool" in source


def test_events_from_another_machine_are_refused() -> None:
    log = [ev(0, events.Transition("start", None, "sleeping"))]
    with pytest.raises(dg.DiagramError, match="no state 'sleeping'"):
        dg.to_mermaid(events=log)
    log = [
        ev(0, events.Transition("start", None, "thinking")),
        ev(1, events.Transition("decided", "thinking", "done")),
    ]
    with pytest.raises(dg.DiagramError, match="no transition thinking -> done on 'decided'"):
        dg.to_dot(events=log)


# A real run -------------------------------------------------------------------------------
def drive_a_run() -> tuple[MemoryStore, Runner, RunResult]:
    """Tool calls with a retry, an error and one approval (approved), then an answer."""
    failures = iter([RetryLater("busy")])

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0))
    def search(query: str) -> str:
        """Search."""
        for failure in failures:
            raise failure
        return f"results for {query}"

    @tool(approval=True)
    def send_email(to: str) -> str:
        """Send an email."""
        return f"sent to {to}"

    @tool
    def broken(x: int) -> str:
        """Always fails."""
        raise ValueError("nope")

    def use(call_id: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}

    script: list[dict[str, object]] = [
        {
            "content": [
                {"type": "text", "text": "Searching; then mailing <you>."},
                use("c1", "search", {"query": "cats"}),
                use("c2", "send_email", {"to": "a@b.c"}),
                use("c3", "broken", {"x": 1}),
            ],
            "stop_reason": "tool_use",
        },
        {"content": [use("c4", "search", {"query": "dogs"})], "stop_reason": "tool_use"},
        {"content": [{"type": "text", "text": "Done #1."}], "stop_reason": "end_turn"},
    ]
    store = MemoryStore()
    agent = Agent(model=ScriptedModel(script), tools=[search, send_email, broken])
    runner = Runner(agent, store, approver=AutoApprover(approve=True))
    result = runner.run("Find cats, mail a@b.c")
    assert result.status == "done"
    return store, runner, result


@pytest.fixture(scope="module")
def stored_run() -> tuple[MemoryStore, Runner, RunResult]:
    return drive_a_run()


@pytest.fixture(scope="module")
def run(stored_run: tuple[MemoryStore, Runner, RunResult]) -> tuple[list[Event], Agent]:
    store, runner, result = stored_run
    return store.load_events(result.run_id), runner.agent


def test_mermaid_overlay_counts_equal_the_runs_transition_events(run: tuple[list[Event], Agent]) -> None:
    events, agent = run
    text = dg.to_mermaid(events=events, agent=agent)
    check_state_diagram(text)
    assert text == dg.to_mermaid(events=events, agent=agent)
    moves, entries = recorded_counts(events)
    assert mermaid_counts(text) == (moves, entries)
    assert moves[("executing_tool", "executing_tool", "Retry scheduled")] == 1
    assert moves[("awaiting_approval", "executing_tool", "Decided")] == 1
    assert "    done:::active\n" in text
    assert "    class thinking,executing_tool,awaiting_approval visited\n" in text
    assert "    class failed,cancelled unvisited\n" in text


def test_dot_overlay_counts_and_colours_equal_the_runs_transition_events(run: tuple[list[Event], Agent]) -> None:
    events, agent = run
    source = dg.to_dot(events=events, agent=agent)
    assert source == dg.to_dot(events=events, agent=agent)
    assert dot_counts(source) == recorded_counts(events)[0]
    assert dot_nodes(source)["done"]["fillcolor"] == dg.ACTIVE_FILL


@needs_dot
def test_overlay_renders_with_graphviz(run: tuple[list[Event], Agent]) -> None:
    events, agent = run
    nodes, _ = svg_titles(dg.render(events=events, agent=agent))
    assert set(nodes) == STATE_IDS | {"__initial_0", "__tools"}


@needs_dot
def test_every_label_of_the_machine_is_clear_of_other_labels_states_and_edges() -> None:
    """As Graphviz lays it out: the two self-loops of Executing tool once ran through their labels."""
    assert label_collisions(dg.to_dot()) == []


@needs_dot
def test_every_label_of_a_run_overlay_is_clear_too(run: tuple[list[Event], Agent]) -> None:
    events, agent = run  # both self-loops of Executing tool taken: their labels carry counts
    assert label_collisions(dg.to_dot(events=events, agent=agent)) == []


def test_a_states_self_loops_are_drawn_on_alternate_sides() -> None:
    loops = [attributes for (src, dst, _), attributes in dot_edges(dg.to_dot()).items() if src == dst]
    ports = Counter((a.get("tailport"), a.get("headport")) for a in loops)
    assert ports == Counter({(None, None): 1, ("n", "n"): 2, ("s", "s"): 2})  # a lone loop keeps its place


def test_sequence_diagram_of_a_real_run(run: tuple[list[Event], Agent]) -> None:
    events, _ = run
    text = dg.to_sequence(events)
    check_sequence_diagram(text)
    assert text == dg.to_sequence(events)
    assert "    participant tool_search as search\n" in text
    assert "    participant tool_send_email as send_email\n" in text
    assert "    participant Approver\n" in text
    assert "    User->>Model: Find cats, mail a@b.c\n" in text
    assert "    Model-->>User: Searching#59; then mailing #lt;you#gt;.\n" in text
    assert '    Model->>tool_search: c1: search({"query": "cats"})\n' in text
    retry = "attempt 1 failed, retry in 0s: Error (retryable): tool 'search' raised RetryLat…"
    assert f"    Note over tool_search: {retry}\n" in text
    assert '    tool_send_email->>Approver: approve c2? {"to": "a@b.c"} (the tool is marked approval=True)\n' in text
    assert "    Approver-->>tool_send_email: c2 approved by approve-all\n" in text
    assert "    tool_broken--xModel: Error (retryable): tool 'broken' raised ValueError: nope\n" in text
    assert text.endswith("    Model-->>User: Done #35;1.\n    Note over User,Model: run done\n")


# The Python API takes a run as well as a machine -------------------------------------------------
def test_a_run_is_drawn_from_its_result_state_row_or_id(stored_run: tuple[MemoryStore, Runner, RunResult]) -> None:
    store, runner, result = stored_run
    events, agent = store.load_events(result.run_id), runner.agent
    mermaid, dot = dg.to_mermaid(events=events, agent=agent), dg.to_dot(events=events, agent=agent)
    for run in (result, result.run_id, store.load_run(result.run_id), runner.load(result.run_id)):
        assert dg.to_mermaid(run, store=store, agent=agent) == mermaid, type(run)
        assert dg.to_dot(run, store=store, agent=agent) == dot, type(run)
        assert dg.to_sequence(run, store=store) == dg.to_sequence(events), type(run)
    assert f"thinking --> done : Answered {X}1" in dg.to_mermaid(result, store=store)


@needs_dot
def test_a_run_renders_to_svg(stored_run: tuple[MemoryStore, Runner, RunResult]) -> None:
    store, _, result = stored_run
    events = store.load_events(result.run_id)
    assert dg.render(result, store=store, format="svg") == dg.render(events=events, format="svg")


def test_what_is_neither_a_machine_nor_a_run_is_a_clear_error(
    stored_run: tuple[MemoryStore, Runner, RunResult],
) -> None:
    store, _, result = stored_run
    for draw in (dg.to_mermaid, dg.to_dot, dg.render):
        with pytest.raises(dg.DiagramError, match=r"cannot draw int 42: give a machine class or instance, or a run"):
            draw(42, store=store)  # type: ignore[arg-type]  # on purpose: nothing drawable
    with pytest.raises(dg.DiagramError, match=f"run {result.run_id}: its path is in its events; pass store="):
        dg.to_mermaid(result)
    with pytest.raises(dg.DiagramError, match="store= reads a run's events"):
        dg.to_dot(AgentMachine, store=store)
    with pytest.raises(dg.DiagramError, match="give a run or events=, not both"):
        dg.to_mermaid(result, store=store, events=[])
    with pytest.raises(RunNotFound):
        dg.to_mermaid("run_nope", store=store)
    with pytest.raises(dg.DiagramError, match=r"takes a run \(with store=\) or a list of Event"):
        dg.to_sequence([{"type": "transition"}])  # type: ignore[list-item]
    with pytest.raises(dg.DiagramError, match="cannot draw float"):
        dg.to_sequence(1.5)  # type: ignore[arg-type]


# diagrams/ --------------------------------------------------------------------------------
def test_generated_mermaid_file_is_fresh() -> None:
    committed = (ROOT / "diagrams" / dg.MERMAID_FILE).read_text(encoding="utf-8")
    assert committed == dg.to_mermaid(), "diagrams/ is stale: run scripts/diagrams"


def test_generated_dot_file_is_fresh() -> None:
    """The SVG's source, compared exactly: every node, edge, label, colour and width."""
    committed = (ROOT / "diagrams" / dg.DOT_FILE).read_text(encoding="utf-8")
    assert committed == dg.to_dot(), "diagrams/ is stale: run scripts/diagrams"


def svg_drawing(svg: bytes) -> list[tuple[str, str, tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]]:
    """What each node and edge of a Graphviz SVG looks like, without coordinates (which move
    between Graphviz versions): (class, title, shapes as tag/fill/stroke/width, texts as
    text/size/colour), sorted."""
    drawn = []
    for group in ET.fromstring(svg).iter(f"{SVG}g"):
        if group.get("class") not in ("node", "edge"):
            continue
        shapes = tuple(
            (child.tag.removeprefix(SVG), *(child.get(key, "") for key in ("fill", "stroke", "stroke-width")))
            for child in group
            if child.tag.removeprefix(SVG) in ("ellipse", "polygon", "path", "polyline")
        )
        texts = tuple(
            (text.text or "", text.get("font-size", ""), text.get("fill", "")) for text in group.iter(f"{SVG}text")
        )
        drawn.append((group.get("class", ""), group.findtext(f"{SVG}title") or "", shapes, texts))
    return sorted(drawn)


@needs_dot
def test_generated_svg_file_is_fresh() -> None:
    """Compared by what is drawn, not where, so another Graphviz version does not count as stale."""
    committed = (ROOT / "diagrams" / dg.SVG_FILE).read_bytes()
    fresh = dg.render(format="svg")
    assert svg_drawing(committed) == svg_drawing(fresh), "diagrams/ is stale: run scripts/diagrams"
    assert svg_texts(committed) == svg_texts(fresh), "diagrams/ is stale: run scripts/diagrams"


@needs_dot
def test_svg_freshness_check_sees_a_changed_colour() -> None:
    """So the check above cannot pass on titles and text alone."""
    fresh = dg.render(format="svg")
    recoloured = dg.graphviz(dg.to_dot().replace("fillcolor=white", "fillcolor=yellow", 1), "svg")
    assert svg_titles(recoloured) == svg_titles(fresh)
    assert svg_drawing(recoloured) != svg_drawing(fresh)


@needs_dot
def test_the_entry_point_writes_every_file(tmp_path: Path) -> None:
    assert dg.main([str(tmp_path)]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(dg.generated())
    assert (tmp_path / dg.MERMAID_FILE).read_text(encoding="utf-8") == dg.to_mermaid()
    assert (tmp_path / dg.DOT_FILE).read_text(encoding="utf-8") == dg.to_dot()
    assert svg_drawing((tmp_path / dg.SVG_FILE).read_bytes()) == svg_drawing(dg.render())


# A tree of runs: the child runs a run's agent tools started ---------------------------------------
@pytest.fixture(scope="module")
def tree_run() -> tuple[MemoryStore, RunResult, str]:
    """A writer whose ``review`` call was served by a reviewer's child run (it read a draft, then answered)."""
    from tether.core.children import child_run_id

    @tool
    def read_draft(name: str) -> str:
        """Read a draft."""
        return f"draft {name}"

    def turn(*content: dict[str, object], stop: str = "tool_use") -> dict[str, object]:
        return {"content": list(content), "stop_reason": stop}

    def use(call_id: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}

    reviewer = Agent(
        ScriptedModel(
            [turn(use("r1", "read_draft", {"name": "a"})), turn({"type": "text", "text": "ok"}, stop="end_turn")]
        ),
        tools=[read_draft],
        name="reviewer",
    )
    writer = Agent(
        ScriptedModel(
            [turn(use("w1", "review", {"task": "a"})), turn({"type": "text", "text": "reviewed"}, stop="end_turn")]
        ),
        tools=[reviewer.as_tool("review", "Review a draft.")],
    )
    store = MemoryStore()
    result = Runner(writer, store).run("write and review")
    assert result.status == "done"
    return store, result, child_run_id(result.run_id, "w1", 1)


def test_a_runs_child_runs_are_a_note_by_the_state_their_calls_ran_in(
    tree_run: tuple[MemoryStore, RunResult, str],
) -> None:
    store, result, child = tree_run
    mermaid = dg.to_mermaid(result, store=store)
    check_state_diagram(mermaid)
    note = mermaid[mermaid.index("    note left of executing_tool") :].split("    end note")[0]
    assert note.splitlines()[1:] == [
        "        Child runs",
        f"        review w1 → {child} (reviewer): done",
        f"          thinking {X}2 → executing_tool {X}1 → done {X}1",
    ]
    tools = dg.ToolNote.of_run(store.load_run(result.run_id).spec) or []  # what `tether diagram --run` notes
    assert [note.describe() for note in tools] == ["review: child runs of agent reviewer"]
    dot = dg.to_dot(result, store=store)
    assert dg.CHILDREN_NODE in dot_nodes(dot)
    assert (dg.CHILDREN_NODE, "executing_tool") in {(src, dst) for src, dst, _ in dot_edges(dot)}
    sequence = dg.to_sequence(result, store=store)
    check_sequence_diagram(sequence)
    assert f"    Note over tool_review: w1: child run {child} (attempt 1)\n" in sequence
    assert f"    Note over tool_review: child run {child} ended done\n" in sequence


@needs_dot
def test_a_run_with_child_runs_renders_with_graphviz(tree_run: tuple[MemoryStore, RunResult, str]) -> None:
    store, result, _ = tree_run
    nodes, _ = svg_titles(dg.render(result, store=store, format="svg"))
    assert set(nodes) == STATE_IDS | {"__initial_0", "__children"}
    assert dg.render(result, store=store, format="png").startswith(b"\x89PNG")


# Mermaid's own parser ---------------------------------------------------------------------------
@pytest.mark.slow
def test_mermaids_own_parser_accepts_every_diagram(
    run: tuple[list[Event], Agent], tree_run: tuple[MemoryStore, RunResult, str], mermaid_dir: Path, tmp_path: Path
) -> None:
    events, agent = run
    texts = {
        "plain.mmd": dg.to_mermaid(),
        "overlay.mmd": dg.to_mermaid(events=events, agent=agent),
        "small.mmd": dg.render_mermaid(small_diagram()),
        "sequence.mmd": dg.to_sequence(events),
        "children.mmd": dg.to_mermaid(tree_run[1], store=tree_run[0]),
        "children-sequence.mmd": dg.to_sequence(tree_run[1], store=tree_run[0]),
        "committed.mmd": (ROOT / "diagrams" / dg.MERMAID_FILE).read_text(encoding="utf-8"),
    }
    assert mermaid_parse_errors(mermaid_dir, texts, tmp_path) == {}


@pytest.mark.slow
def test_mermaids_own_parser_rejects_what_we_must_escape(mermaid_dir: Path, tmp_path: Path) -> None:
    """So the check above can fail: a broken edge, and a raw ``;`` in a message (see ``_ENTITIES``)."""
    texts = {
        "bad-state.mmd": "stateDiagram-v2\n    a --> : broken\n",
        "bad-sequence.mmd": "sequenceDiagram\n    participant A\n    A->>A: semi; colon\n",
    }
    errors = mermaid_parse_errors(mermaid_dir, texts, tmp_path)
    assert list(errors) == list(texts)
    assert all(error.startswith("Parse error") for error in errors.values()), errors
