"""Pictures of the run graph, drawn from the machine class itself so they cannot drift.

The pipeline is python-statemachine's own (``statemachine.contrib.diagram``): ``extract()``
turns the machine into the library's small IR (a ``DiagramGraph``); :func:`build` adjusts
that IR for a run (counts in the labels, the current state active) and adds what the IR has
no words for (the agent's tools, a run's footprint) in a :class:`Diagram`. The library's
Mermaid and DOT renderers draw it; :func:`render_mermaid` and :func:`render_dot` post-process
only what they cannot express: classes of visited states, edge colours and widths, the tools
note, and node names that do not depend on memory addresses. Each renderer takes a
:class:`Diagram` alone, so it is tested without a machine or a run.

The public functions (:func:`to_mermaid`, :func:`to_dot`, :func:`render`, :func:`to_sequence`)
take a machine or a run (:data:`RunRef`: a result, state, stored row or id, with the store that
holds its events) and refuse anything else with a :class:`DiagramError`.

A run's timeline is built the same way: :func:`timeline` folds its events into a small
:class:`Timeline` of arrows and notes, and :func:`render_sequence` writes a Mermaid
``sequenceDiagram``.

``python -m tether.views.diagram [DIR]`` writes ``agent-machine.mmd``, ``agent-machine.dot`` and
``agent-machine.svg`` (what ``scripts/diagrams`` runs to refresh ``diagrams/``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html import escape as html_escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

from statemachine import StateChart
from statemachine.contrib.diagram.extract import extract
from statemachine.contrib.diagram.graphviz import GraphvizNotFoundError, run_graphviz
from statemachine.contrib.diagram.model import DiagramGraph, DiagramState
from statemachine.contrib.diagram.renderers.mermaid import MermaidRenderer, MermaidRendererConfig

from tether.agent import Agent
from tether.core.machine import AgentMachine
from tether.core.state import RunState
from tether.drivers.runner import RunResult
from tether.errors import TetherError
from tether.facts.events import (
    ApprovalDecided,
    ApprovalRequested,
    ChildEnded,
    ChildParked,
    ChildStarted,
    ChildWaiting,
    Event,
    Fact,
    HandedOff,
    ModelResponded,
    RetryScheduled,
    RunFinished,
    RunStarted,
    ToolFinished,
    ToolStarted,
    Transition,
    Warned,
)
from tether.facts.history import text_of
from tether.facts.status import ENDED, status_name
from tether.stores import RunRecord, Store
from tether.tools import Tool
from tether.views.tree import NOT_CREATED, RunNode, run_tree

if TYPE_CHECKING:
    import pydot

MachineRef = type[StateChart[Any]] | StateChart[Any]
"""A machine class (or an instance, whose active state is then highlighted)."""
RunRef = RunResult | RunState | RunRecord | str
"""A run to draw: what a runner returned, its folded state, its stored row, or its id; its
events are read from the store passed beside it."""
Drawable = MachineRef | RunRef
ImageFormat = Literal["svg", "png"]
IMAGE_FORMATS: tuple[ImageFormat, ...] = ("svg", "png")
GRAPHVIZ_HINT = (
    "Graphviz's `dot` program was not found on PATH; SVG and PNG output need it. "
    "Install the Debian package `graphviz` (apt-get install graphviz), "
    "or see https://graphviz.org/download/ elsewhere."
)
TOOLS_STATE = AgentMachine.executing_tool.id
"""The state the tools note is attached to (when the machine has it)."""
DOT_SPACING = {"nodesep": "0.5", "ranksep": "0.9"}
"""Room between states (the library's 0.3 packs edges through the labels of their neighbours; with
two self-loops on Thinking, less rank separation runs the edge to Failed through one's label)."""
ENDED_IDS = frozenset(status.shown for status in ENDED)
"""States where a drive stops (done, failed, cancelled), by id."""
SELF_LOOP_SIDES = ("n", "s")
"""Where the self-loops of a state that has several are drawn, in turn (above, below)."""
COUNT_MARK = "\N{MULTIPLICATION SIGN}"
"""Between a label and how many times the run took it."""

# Colours of a run overlay, shared by both renderers so the two pictures agree.
ACTIVE_FILL, ACTIVE_STROKE = "#40E0D0", "#333333"
VISITED_FILL, VISITED_STROKE = "#DBEAFE", "#1D4ED8"
UNVISITED_FILL, UNVISITED_STROKE, UNVISITED_TEXT = "#F5F5F5", "#BDBDBD", "#9E9E9E"
NOTE_FILL = "#FFF8DC"
CHILDREN_NODE = "__children"
"""The DOT node of the child runs' note."""


class DiagramError(TetherError):
    """A diagram cannot be drawn: the events do not fit the machine, or pydot is missing."""


# The IR tether adds to the library's -----------------------------------------------------
@dataclass(frozen=True)
class ToolNote:
    """What the graph says about one tool: the traits that change the run's path."""

    name: str
    approval: Literal["always", "per call"] | None = None
    """``always`` for ``approval=True``; ``per call`` when a callable decides."""
    max_attempts: int = 1
    """Above 1, the tool has a retry policy."""
    final: bool = False
    """Its input is the run's result and the run ends."""
    timeout: float | None = None
    """Seconds one attempt may take."""
    agent: str | None = None
    """The agent whose child runs serve its calls (an agent tool: see :meth:`tether.Agent.as_tool`)."""

    @classmethod
    def of(cls, tool: Tool) -> ToolNote:
        """Read the traits off a tool."""
        return cls.recorded(tool.name, tool.settings())

    @classmethod
    def recorded(cls, name: str, settings: dict[str, Any]) -> ToolNote:
        """The traits from a tool's :meth:`~tether.tools.Tool.settings`, as a run records them."""
        approval = settings.get("approval")
        return cls(
            name,
            approval if approval in ("always", "per call") else None,
            int(settings.get("max_attempts") or 1),
            bool(settings.get("final")),
            settings.get("timeout"),
            settings.get("agent"),
        )

    @classmethod
    def of_run(cls, spec: dict[str, Any]) -> list[ToolNote] | None:
        """The tools a run's spec recorded (None: an older tether recorded none)."""
        settings = spec.get("tool_settings")
        if not isinstance(settings, dict):
            return None
        return [cls.recorded(name, dict(s)) for name, s in settings.items()]

    def traits(self) -> list[str]:
        """Plain words, one per trait (``runs directly`` when it has none)."""
        words = []
        if self.approval == "always":
            words.append("needs approval")
        elif self.approval == "per call":
            words.append("approval decided per call")
        if self.max_attempts > 1:
            words.append(f"retries, up to {self.max_attempts} attempts")
        if self.final:
            words.append("final, ends the run")
        if self.timeout is not None:
            words.append(f"timeout {self.timeout:g}s")
        if self.agent is not None:
            words.append(f"child runs of agent {self.agent}")
        return words or ["runs directly"]

    def describe(self) -> str:
        """One line: ``name: trait, trait``."""
        return f"{self.name}: {', '.join(self.traits())}"


@dataclass(frozen=True)
class ChildNote:
    """A child run one of the drawn run's calls started (see :mod:`tether.core.children`): what it did."""

    call_id: str
    tool: str | None
    run_id: str
    agent: str | None
    status: str
    path: tuple[tuple[str, int], ...] = ()
    """The states it entered, in the order first entered, each with how many times."""
    below: tuple[ChildNote, ...] = ()
    """The child runs it started in turn."""

    @classmethod
    def of_run(cls, store: Store, run_id: str, *, tenant: str | None = None) -> list[ChildNote]:
        """The child runs ``run_id`` started, and theirs, read from ``store`` (their rows and events)."""
        return [cls._of(store, node, tenant) for node in run_tree(store, run_id, tenant=tenant).children]

    @classmethod
    def _of(cls, store: Store, node: RunNode, tenant: str | None) -> ChildNote:
        path: dict[str, int] = {}
        if node.status != NOT_CREATED:
            for event in store.load_events(node.run_id, tenant=tenant):
                if isinstance(event.fact, Transition):
                    name = status_name(event.fact.target)
                    path[name] = path.get(name, 0) + 1
        below = tuple(cls._of(store, child, tenant) for child in node.children)
        return cls(node.call_id or "?", node.tool, node.run_id, node.agent, node.status, tuple(path.items()), below)

    def lines(self, depth: int = 0) -> list[str]:
        """``review toolu_1 → run_… (reviewer): done``, its path below, then its own children's, indented."""
        pad = "  " * depth
        agent = f" ({self.agent})" if self.agent else ""
        lines = [f"{pad}{self.tool or '?'} {self.call_id} → {self.run_id}{agent}: {self.status}"]
        if self.path:
            lines.append(pad + "  " + " → ".join(f"{state} {COUNT_MARK}{count}" for state, count in self.path))
        for child in self.below:
            lines.extend(child.lines(depth + 1))
        return lines


@dataclass
class Footprint:
    """Where one run went: counts keyed by the IR's own state ids and transitions."""

    visits: dict[str, int] = field(default_factory=dict)
    """State id → times entered (the entry into the initial state included)."""
    taken: dict[int, int] = field(default_factory=dict)
    """Index in ``DiagramGraph.transitions`` → times taken."""
    current: str | None = None
    """The state id the run is in now."""


@dataclass
class Diagram:
    """The library's IR plus tether's additions; what the renderers take."""

    graph: DiagramGraph
    """The machine's graph, already adjusted for a run (labels with counts, active state)."""
    tools: list[ToolNote] = field(default_factory=list)
    note_on: str | None = None
    """State id the tools note is attached to; None: free-standing in DOT, by the initial state in Mermaid."""
    run: Footprint | None = None
    """A run's footprint, to highlight; None draws the bare graph."""
    children: list[ChildNote] = field(default_factory=list)
    """The child runs the drawn run started: a note beside the state their calls ran in."""


# Building ----------------------------------------------------------------------------------
def build(
    machine: MachineRef = AgentMachine,
    *,
    events: Sequence[Event] | None = None,
    agent: Agent | None = None,
    tools: Sequence[ToolNote] | None = None,
    children: Sequence[ChildNote] = (),
) -> Diagram:
    """Extract the machine's graph and adjust it for an agent's tools (or ``tools``), a run and its child runs."""
    graph = extract(machine)
    diagram = Diagram(graph, children=list(children))
    if agent is not None:
        tools = [ToolNote.of(tool) for tool in agent.all_tools]
    if tools is not None:
        diagram.tools = list(tools)
        ids = {state.id for state in _states(graph.states)}
        diagram.note_on = TOOLS_STATE if TOOLS_STATE in ids else None
    if events is not None:
        diagram.run = footprint(machine, graph, events)
        _mark(graph, diagram.run)
    return diagram


def footprint(machine: MachineRef, graph: DiagramGraph, events: Sequence[Event]) -> Footprint:
    """Count the run's ``transition`` events against the graph's states and transitions.

    Raises:
        DiagramError: a recorded state or move is not in this machine (another version?).
    """
    ids = {str(value): state.id for value, state in machine.states_map.items()}
    names = {
        event.id: str(event.name) if event.name else event.id
        for state in machine.states_map.values()
        for transition in state.transitions
        for event in transition.events
    }
    run = Footprint()
    for event in events:
        if not isinstance(event.fact, Transition):
            continue
        moved = event.fact
        target = _state_id(ids, moved.target, graph, event)
        run.visits[target] = run.visits.get(target, 0) + 1
        run.current = target
        if moved.source is None:  # entering the initial state: no edge to count
            continue
        source = _state_id(ids, moved.source, graph, event)
        name = moved.event
        index = _transition_index(graph, source, target, names.get(name, name))
        if index is None:
            raise DiagramError(
                f"event #{event.seq}: {graph.name} has no transition {source} -> {target} on {name!r} "
                "(were these events recorded by another version of the machine?)"
            )
        run.taken[index] = run.taken.get(index, 0) + 1
    return run


def _state_id(ids: dict[str, str], value: str, graph: DiagramGraph, event: Event) -> str:
    if value not in ids:
        raise DiagramError(f"event #{event.seq}: {graph.name} has no state {value!r}; known: {', '.join(sorted(ids))}")
    return ids[value]


def _transition_index(graph: DiagramGraph, source: str, target: str, label: str) -> int | None:
    """The first transition drawn for this move (a log does not say which guard held)."""
    for index, transition in enumerate(graph.transitions):
        if transition.is_initial or transition.source != source:
            continue
        if target in (transition.targets or [source]) and _names(transition.event, label):
            return index
    return None


def _names(event_text: str, label: str) -> bool:
    """Whether the IR's event text (display names joined by spaces) includes ``label``."""
    return f" {label} " in f" {event_text} "


def _mark(graph: DiagramGraph, run: Footprint) -> None:
    """Adjust the IR for a run: counts in state and edge labels, the current state active."""
    for state in _states(graph.states):
        state.is_active = state.id == run.current
        if run.visits.get(state.id):
            state.name = f"{state.name} {COUNT_MARK}{run.visits[state.id]}"
    for index, count in run.taken.items():
        transition = graph.transitions[index]
        transition.event = f"{transition.event} {COUNT_MARK}{count}"


def _states(states: Sequence[DiagramState]) -> Iterator[DiagramState]:
    for state in states:
        yield state
        yield from _states(state.children)


# Mermaid ------------------------------------------------------------------------------------
def render_mermaid(diagram: Diagram) -> str:
    """Mermaid ``stateDiagram-v2``: the library's text plus the tools note and run classes."""
    config = MermaidRendererConfig(active_fill=ACTIVE_FILL, active_stroke=ACTIVE_STROKE)
    lines = MermaidRenderer(config).render(diagram.graph).rstrip("\n").split("\n")
    if diagram.tools:
        anchor = diagram.note_on or _first_state(diagram.graph)
        lines.append(f"    note right of {anchor}")
        lines.append("        Tools")
        lines.extend(f"        {note.describe()}" for note in diagram.tools)
        lines.append("    end note")
    if diagram.children:
        lines.append(f"    note left of {_children_anchor(diagram.graph)}")
        lines.append("        Child runs")
        lines.extend(f"        {line}" for child in diagram.children for line in child.lines())
        lines.append("    end note")
    if diagram.run is not None:
        lines.extend(_mermaid_run_classes(diagram.graph, diagram.run))
    return "\n".join(lines) + "\n"


def _children_anchor(graph: DiagramGraph) -> str:
    """Where the child runs' note goes: the state their calls ran in (the machine's first, if it has none)."""
    return TOOLS_STATE if TOOLS_STATE in {state.id for state in _states(graph.states)} else _first_state(graph)


def _first_state(graph: DiagramGraph) -> str:
    initial = next((s for s in graph.states if s.is_initial), None)
    return (initial or graph.states[0]).id


def _mermaid_run_classes(graph: DiagramGraph, run: Footprint) -> list[str]:
    """Mermaid's stateDiagram cannot style edges, so the run shows as state classes (and label counts)."""
    ids = [state.id for state in _states(graph.states) if state.id != run.current]
    visited = [sid for sid in ids if run.visits.get(sid)]
    unvisited = [sid for sid in ids if not run.visits.get(sid)]
    lines = [
        "",
        f"    classDef visited fill:{VISITED_FILL},stroke:{VISITED_STROKE}",
        f"    classDef unvisited fill:{UNVISITED_FILL},stroke:{UNVISITED_STROKE},color:{UNVISITED_TEXT}",
    ]
    if visited:
        lines.append(f"    class {','.join(visited)} visited")
    if unvisited:
        lines.append(f"    class {','.join(unvisited)} unvisited")
    return lines


# DOT ----------------------------------------------------------------------------------------
def render_dot(diagram: Diagram) -> str:
    """Graphviz DOT: the library's graph, restyled for a run, with the tools note added."""
    try:
        from statemachine.contrib.diagram.renderers.dot import DotRenderer, DotRendererConfig
    except ImportError as error:  # pragma: no cover - pydot is a dependency
        raise DiagramError(f"DOT output needs pydot ({error}): pip install pydot") from error
    config = DotRendererConfig(state_active_fillcolor=ACTIVE_FILL, state_active_penwidth=3, graph_attrs=DOT_SPACING)
    dot = DotRenderer(config).render(diagram.graph)
    _spread_self_loops(dot)
    _unrank_moves_between_ends(dot)
    if diagram.run is not None:
        _style_run(dot, diagram.graph, diagram.run)
    if diagram.tools:
        _add_tools_note(dot, diagram)
    if diagram.children:
        _add_children_note(dot, diagram)
    return _stable_names(dot.to_string())


def _unrank_moves_between_ends(dot: pydot.Dot) -> None:
    """A move from one end of a run to another (failed → cancelled) does not rank the states.

    Ranked, it pulls Cancelled beside Failed and Graphviz routes other edges through labels;
    unranked, the layout is the main flow's and the edge finds its way around it.
    """
    for part in _graphs(dot):
        for edge in part.get_edge_list():
            if {_name(str(edge.get_source())), _name(str(edge.get_destination()))} <= ENDED_IDS:
                edge.set("constraint", "false")


def _spread_self_loops(dot: pydot.Dot) -> None:
    """Draw the self-loops of a state that has several on alternate sides: stacked, their labels collide."""
    for part in _graphs(dot):
        loops: dict[str, list[pydot.Edge]] = {}
        for edge in part.get_edge_list():
            source = _name(str(edge.get_source()))
            if source == _name(str(edge.get_destination())):
                loops.setdefault(source, []).append(edge)
        for edges in loops.values():
            if len(edges) < 2:
                continue  # one loop keeps the place Graphviz gives it
            for index, edge in enumerate(edges):
                side = SELF_LOOP_SIDES[index % len(SELF_LOOP_SIDES)]
                edge.set("tailport", side)
                edge.set("headport", side)


def _graphs(graph: pydot.Graph) -> Iterator[pydot.Graph]:
    yield graph
    for subgraph in graph.get_subgraph_list():
        yield from _graphs(subgraph)


def _name(node_id: str) -> str:
    return node_id.strip('"')


def _style_run(dot: pydot.Dot, graph: DiagramGraph, run: Footprint) -> None:
    """Colour visited states and taken edges (pen width grows with the count); grey the rest."""
    state_ids = {state.id for state in _states(graph.states)}
    for part in _graphs(dot):
        for node in part.get_node_list():
            sid = _name(node.get_name())
            if sid not in state_ids or sid == run.current:
                continue  # pseudo-nodes, and the current state the library already styled
            if run.visits.get(sid):
                node.set("fillcolor", VISITED_FILL)
                node.set("color", VISITED_STROKE)
            else:
                node.set("fillcolor", UNVISITED_FILL)
                node.set("color", UNVISITED_STROKE)
                node.set("fontcolor", UNVISITED_TEXT)
        for edge in part.get_edge_list():
            index = _edge_index(edge, graph)
            if index is None:
                continue  # the initial arrow
            count = run.taken.get(index, 0)
            if count:
                edge.set("color", VISITED_STROKE)
                edge.set("fontcolor", VISITED_STROKE)
                edge.set("penwidth", str(min(1 + count, 5)))
            else:
                edge.set("color", UNVISITED_STROKE)
                edge.set("fontcolor", UNVISITED_TEXT)


def _edge_index(edge: pydot.Edge, graph: DiagramGraph) -> int | None:
    """Which IR transition the library drew as this edge: same ends, and its text in the label."""
    source, target = (_state_of(_name(str(end)), graph) for end in (edge.get_source(), edge.get_destination()))
    label = str(edge.get("label") or "")
    candidates: list[tuple[int, int]] = []
    for index, transition in enumerate(graph.transitions):
        if transition.is_initial or transition.source != source:
            continue
        if target not in (transition.targets or [transition.source]):
            continue
        texts = [html_escape(transition.event, quote=False), html_escape(", ".join(transition.guards), quote=False)]
        if all(text in label for text in texts):
            candidates.append((sum(map(len, texts)), index))
    return max(candidates)[1] if candidates else None


def _state_of(node_id: str, graph: DiagramGraph) -> str:
    """The state a node stands for (compound states are drawn through anchor nodes)."""
    for suffix in ("_anchor_in", "_anchor_out", "_anchor"):
        if node_id.endswith(suffix) and node_id[: -len(suffix)] in graph.compound_state_ids:
            return node_id[: -len(suffix)]
    return node_id


def _add_tools_note(dot: pydot.Dot, diagram: Diagram) -> None:
    rows = [f"<b>{html_escape(note.name)}</b>: {html_escape(', '.join(note.traits()))}" for note in diagram.tools]
    _add_note(dot, "__tools", "Tools", rows, diagram.note_on)


def _add_children_note(dot: pydot.Dot, diagram: Diagram) -> None:
    """The child runs, in a note linked to the state their calls ran in."""
    rows = [html_escape(line).replace("  ", "&nbsp;&nbsp;") for child in diagram.children for line in child.lines()]
    _add_note(dot, CHILDREN_NODE, "Child runs", rows, _children_anchor(diagram.graph))


def _add_note(dot: pydot.Dot, name: str, title: str, rows: Sequence[str], anchor: str | None) -> None:
    """A note node: a bold title over left-aligned rows (HTML), tied to ``anchor`` by a dashed line."""
    import pydot

    cells = "".join(f'<tr><td align="left">{row}</td></tr>' for row in [f"<b>{title}</b>", *rows])
    label = f'<<table border="0" cellspacing="0" cellpadding="2">{cells}</table>>'
    dot.add_node(pydot.Node(name, label=label, shape="note", style="filled", fillcolor=NOTE_FILL, fontsize="10"))
    if anchor is not None:
        dot.add_edge(pydot.Edge(name, anchor, style="dashed", arrowhead="none", color="gray50"))


_ADDRESS = re.compile(r"(?<=__initial_)\d+|(?<=cluster___atomic_)\d+")


def _stable_names(source: str) -> str:
    """Replace the ``id()`` numbers the library puts in pseudo-node names with ordinals."""
    ordinals: dict[str, str] = {}

    def ordinal(match: re.Match[str]) -> str:
        return ordinals.setdefault(match.group(), str(len(ordinals)))

    return _ADDRESS.sub(ordinal, source)


# Public API: the machine graph, or a run's path on it ------------------------------------
def to_mermaid(
    machine_or_run: Drawable = AgentMachine,
    *,
    store: Store | None = None,
    events: Sequence[Event] | None = None,
    agent: Agent | None = None,
) -> str:
    """Mermaid ``stateDiagram-v2`` of a machine or of a run's path, optionally with the agent's tools.

    ``machine_or_run`` is a machine class or instance (``events=`` then overlays a run), or a
    run (:data:`RunRef`), whose events are read from ``store``.

    Raises:
        DiagramError: not a machine or a run, a run without ``store=``, or events that do
            not fit the machine.
        RunNotFound: the store has no such run.
    """
    return render_mermaid(_build_for(machine_or_run, store, events, agent))


def to_dot(
    machine_or_run: Drawable = AgentMachine,
    *,
    store: Store | None = None,
    events: Sequence[Event] | None = None,
    agent: Agent | None = None,
) -> str:
    """Graphviz DOT of a machine or of a run's path; arguments and errors as :func:`to_mermaid`."""
    return render_dot(_build_for(machine_or_run, store, events, agent))


def render(
    machine_or_run: Drawable = AgentMachine,
    *,
    store: Store | None = None,
    events: Sequence[Event] | None = None,
    agent: Agent | None = None,
    format: ImageFormat = "svg",
) -> bytes:
    """SVG or PNG bytes, drawn by Graphviz's ``dot`` from :func:`to_dot` (same arguments).

    Raises:
        GraphvizNotFoundError: ``dot`` is not installed (the message names the package).
        DiagramError: an unknown format, or as :func:`to_mermaid`.
    """
    if format not in IMAGE_FORMATS:
        raise DiagramError(f"unknown image format {format!r}; one of {', '.join(IMAGE_FORMATS)}")
    return graphviz(to_dot(machine_or_run, store=store, events=events, agent=agent), format)


def _build_for(
    machine_or_run: Drawable, store: Store | None, events: Sequence[Event] | None, agent: Agent | None
) -> Diagram:
    """:func:`build` for what the public functions were given: a machine, or a run in a store."""
    if _is_machine(machine_or_run):
        if store is not None:
            raise DiagramError("store= reads a run's events: pass the run (or its id) with it, not a machine")
        return build(machine_or_run, events=events, agent=agent)
    if events is not None:
        raise DiagramError("give a run or events=, not both: a run's events are read from its store")
    run_log = run_events(machine_or_run, store)
    assert store is not None  # run_events refuses a run without one
    children = ChildNote.of_run(store, _run_id(machine_or_run))
    return build(AgentMachine, events=run_log, agent=agent, children=children)


def _is_machine(value: object) -> TypeGuard[MachineRef]:
    return isinstance(value, StateChart) or (isinstance(value, type) and issubclass(value, StateChart))


def run_events(run: object, store: Store | None) -> list[Event]:
    """The events of a run (:data:`RunRef`), read from ``store``.

    Raises:
        DiagramError: ``run`` is not a run, or no store was given.
        RunNotFound: the store has no such run.
    """
    run_id = _run_id(run)
    if store is None:
        raise DiagramError(f"run {run_id}: its path is in its events; pass store= to read them")
    return store.load_events(run_id)


def _run_id(run: object) -> str:
    """The id of a run (:data:`RunRef`); :class:`DiagramError` for anything else."""
    if isinstance(run, str):
        return run
    if isinstance(run, RunResult):
        return run.run_id
    if isinstance(run, (RunState, RunRecord)):
        return run.id
    raise DiagramError(
        f"cannot draw {type(run).__name__!s} {run!r:.60}: give a machine class or instance, "
        "or a run (RunResult, RunState, RunRecord or run id) with store="
    )


def graphviz(source: str, format: ImageFormat) -> bytes:
    """Run ``dot``, turning the library's not-found error into one that says what to install."""
    try:
        return run_graphviz(source, format)
    except GraphvizNotFoundError as error:
        raise GraphvizNotFoundError(GRAPHVIZ_HINT) from error


# The run timeline ---------------------------------------------------------------------------
USER, MODEL, APPROVER = "User", "Model", "Approver"
PREVIEW = 80
"""Characters of text kept in an arrow or note."""
Arrow = Literal["call", "reply", "failed"]


@dataclass(frozen=True)
class Participant:
    """One lifeline."""

    id: str
    """Safe as a Mermaid id (letters, digits, underscores)."""
    label: str


@dataclass(frozen=True)
class Message:
    """An arrow: a request (``call``), an answer (``reply``) or one that failed."""

    sender: str
    receiver: str
    text: str
    kind: Arrow = "call"


@dataclass(frozen=True)
class Note:
    """A note over one or two participants."""

    over: tuple[str, ...]
    text: str


@dataclass
class Timeline:
    """A run's events as lifelines, arrows and notes, in order; plain text, not yet Mermaid."""

    participants: list[Participant] = field(default_factory=list)
    steps: list[Message | Note] = field(default_factory=list)


def timeline(events: Sequence[Event]) -> Timeline:
    """Fold a run's events into a timeline: prompt, responses, tool runs, approvals, the end."""
    folder = _TimelineFolder()
    for event in events:
        folder.add(event.fact, event.at)
    return folder.result()


class _TimelineFolder:
    """Collects steps and names one lifeline per tool, in order of first appearance."""

    def __init__(self) -> None:
        self.tools: dict[str, str] = {}
        self.steps: list[Message | Note] = []
        self.agent_tools: dict[str, str] = {}
        """The agent tool each call served by a child run called, by call id."""

    def tool(self, name: str) -> str:
        if name not in self.tools:
            base = pid = "tool_" + re.sub(r"\W", "_", name)
            suffix = 1
            while pid in self.tools.values():  # "a-b" and "a_b" would share an id
                suffix += 1
                pid = f"{base}_{suffix}"
            self.tools[name] = pid
        return self.tools[name]

    def result(self) -> Timeline:
        participants = [Participant(USER, USER), Participant(MODEL, MODEL)]
        participants += [Participant(pid, name) for name, pid in self.tools.items()]
        if any(isinstance(s, Message) and APPROVER in (s.sender, s.receiver) for s in self.steps):
            participants.append(Participant(APPROVER, APPROVER))
        return Timeline(participants, self.steps)

    def add(self, fact: Fact, at: float) -> None:
        """The steps a fact adds (a handoff a note); transitions, results_returned and the cache add nothing here."""
        match fact:
            case RunStarted(messages=messages):
                prompt = next((text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
                if len(messages) > 1:
                    earlier = f"continues a conversation of {len(messages) - 1} earlier messages"
                    self.steps.append(Note((USER, MODEL), earlier))
                self.steps.append(Message(USER, MODEL, preview(prompt) or "(no text)"))
            case ModelResponded():
                self.model_responded(fact)
            case ToolStarted(call_id=call_id, tool=tool, attempt=attempt):
                self.steps.append(Note((self.tool(tool),), f"runs {call_id} (attempt {attempt})"))
            case ChildStarted() | ChildParked() | ChildWaiting() | ChildEnded():
                self.child(fact, at)
            case ToolFinished(tool=tool, content=content, is_error=is_error):
                kind: Arrow = "failed" if is_error else "reply"
                self.steps.append(Message(self.tool(tool), MODEL, preview(content) or "(empty)", kind))
            case RetryScheduled(tool=tool, attempt=attempt, due_at=due_at, error=error):
                text = f"attempt {attempt} failed, retry in {max(0.0, due_at - at):.3g}s: {error}"
                self.steps.append(Note((self.tool(tool),), preview(text)))
            case ApprovalRequested(calls=calls):
                for call in calls:
                    why = f" ({call.reason})" if call.reason else ""
                    request = f"approve {call.call_id}? {_json_preview(call.input)}{why}"
                    self.steps.append(Message(self.tool(call.tool), APPROVER, preview(request)))
            case ApprovalDecided():
                self.approval_decided(fact)
            case Warned(message=message):
                self.steps.append(Note((MODEL,), preview(f"warning: {message}")))
            case HandedOff(from_agent=from_agent, to_agent=to_agent):
                self.steps.append(Note((MODEL,), preview(f"handed off: {from_agent or 'its agent'} → {to_agent}")))
            case RunFinished(status=status, error=error, result=result):
                text = f"run {status}"
                if error:
                    text += f": {error}"
                elif result is not None:
                    text += f", result {_json_preview(result)}"
                self.steps.append(Note((USER, MODEL), preview(text)))

    def child(self, fact: ChildStarted | ChildParked | ChildWaiting | ChildEnded, at: float) -> None:
        """A child run serving a call of an agent tool: a note on that tool's lifeline."""
        match fact:
            case ChildStarted(call_id=call_id, tool=tool, run_id=child, attempt=attempt):
                self.agent_tools[call_id] = tool
                text = f"{call_id}: child run {child} (attempt {attempt})"
            case ChildParked(run_id=child, pending=pending):
                calls = ", ".join(str(item.get("call_id")) for item in pending)
                text = f"child run {child} waits for approval of {calls}"
            case ChildWaiting(run_id=child, due_at=due_at):
                text = f"child run {child} waits for a retry due in {max(0.0, due_at - at):.3g}s"
            case ChildEnded(run_id=child, status=status):
                text = f"child run {child} ended {status}"
        lifeline = self.tool(self.agent_tools.get(fact.call_id, "agent tool"))
        self.steps.append(Note((lifeline,), preview(text)))

    def model_responded(self, fact: ModelResponded) -> None:
        reason = fact.stop_reason
        if fact.discarded:
            self.steps.append(Message(MODEL, USER, f"response discarded (stop_reason {reason})", "failed"))
            return
        text = preview(text_of({"content": fact.content}))
        uses = [block for block in fact.content if block.get("type") == "tool_use"]
        if text or not uses:
            suffix = "" if reason in ("end_turn", "tool_use") else f" [{reason}]"
            self.steps.append(Message(MODEL, USER, (text or "(no text)") + suffix, "reply"))
        for block in uses:
            call = f"{block.get('id')}: {block['name']}({_json_preview(block.get('input'))})"
            self.steps.append(Message(MODEL, self.tool(block["name"]), preview(call)))

    def approval_decided(self, fact: ApprovalDecided) -> None:
        who = fact.actor or "unknown"
        if fact.approved:
            edited = ", with edited input" if fact.input is not None else ""
            text = f"{fact.call_id} approved by {who}{edited}"
            self.steps.append(Message(APPROVER, self.tool(fact.tool), preview(text), "reply"))
        else:
            why = f": {fact.reason}" if fact.reason else ""
            text = f"{fact.call_id} denied by {who}{why}"
            self.steps.append(Message(APPROVER, self.tool(fact.tool), preview(text), "failed"))


def _json_preview(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def preview(text: str, limit: int = PREVIEW) -> str:
    """One line of at most ``limit`` characters, whitespace collapsed."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


_ARROWS: dict[Arrow, str] = {"call": "->>", "reply": "-->>", "failed": "--x"}
_CONTROLS = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
_ENTITIES = str.maketrans({"#": "#35;", ";": "#59;", "<": "#lt;", ">": "#gt;", **_CONTROLS})
"""Characters Mermaid would read as syntax in message text, as its own entity codes; control
characters (a tool's output may hold terminal escapes) spelled out, so printing the diagram
never drives the terminal."""


def render_sequence(line: Timeline) -> str:
    """Mermaid ``sequenceDiagram`` of a timeline."""
    lines = ["sequenceDiagram"]
    for participant in line.participants:
        if participant.id == participant.label:
            lines.append(f"    participant {participant.id}")
        else:
            lines.append(f"    participant {participant.id} as {participant.label}")
    for step in line.steps:
        if isinstance(step, Message):
            lines.append(f"    {step.sender}{_ARROWS[step.kind]}{step.receiver}: {_sequence_text(step.text)}")
        else:
            lines.append(f"    Note over {','.join(step.over)}: {_sequence_text(step.text)}")
    return "\n".join(lines) + "\n"


def _sequence_text(text: str) -> str:
    return " ".join(text.split()).translate(_ENTITIES)


def to_sequence(run_or_events: RunRef | Sequence[Event], *, store: Store | None = None) -> str:
    """Mermaid ``sequenceDiagram`` of one run: its events, or the run (:data:`RunRef`) and its ``store``.

    Raises:
        DiagramError: neither events nor a run, or a run without ``store=``.
        RunNotFound: the store has no such run.
    """
    if isinstance(run_or_events, Sequence) and not isinstance(run_or_events, str):
        if store is not None:
            raise DiagramError("store= reads a run's events: pass the run (or its id) with it, not events")
        if not all(isinstance(event, Event) for event in run_or_events):
            raise DiagramError("to_sequence() takes a run (with store=) or a list of Event")
        return render_sequence(timeline(run_or_events))
    return render_sequence(timeline(run_events(run_or_events, store)))


# Generated files ----------------------------------------------------------------------------
MERMAID_FILE, DOT_FILE, SVG_FILE = "agent-machine.mmd", "agent-machine.dot", "agent-machine.svg"


def generated() -> dict[str, bytes]:
    """The files ``diagrams/`` holds, freshly drawn from :class:`AgentMachine`.

    The DOT text is what the SVG is drawn from; unlike the SVG it does not depend on the
    Graphviz version, so it can be compared exactly to tell whether ``diagrams/`` is stale.
    """
    return {MERMAID_FILE: to_mermaid().encode(), DOT_FILE: to_dot().encode(), SVG_FILE: render(format="svg")}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tether.views.diagram [DIR]``: (re)write the generated diagrams into DIR."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m tether.views.diagram [DIR]  (default: diagrams)", file=sys.stderr)
        return 2
    directory = Path(args[0] if args else "diagrams")
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in generated().items():
        (directory / name).write_bytes(content)
        print(directory / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
