"""Reading generated diagrams back, for the diagram tests: a small Mermaid grammar of our own,
DOT statements as dicts, and the counts a run overlay draws next to those its events record.

The grammar accepts exactly the Mermaid lines tether writes and says which line is wrong;
Mermaid's own parser (tests/mermaid) is the authority on what Mermaid accepts.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tether.core.machine import AgentMachine
from tether.facts.events import Event
from tether.facts.status import RunStatus
from tether.views import diagram as dg

Move = tuple[str, str, str]
"""(source state id, target state id, event display name)."""
COUNTED = re.compile(rf"(?P<label>.+?) {dg.COUNT_MARK}(?P<n>\d+)(?: \[.*\])?")
"""A label with the overlay's count: ``Decided <COUNT_MARK>1 [guard]``."""


# A small Mermaid grammar of our own --------------------------------------------------------
ID = r"[A-Za-z_][A-Za-z0-9_]*"
CSS = r"[a-z-]+:[#A-Za-z0-9.%-]+(,[a-z-]+:[#A-Za-z0-9.%-]+)*"
STATE_LINE = {
    "direction": re.compile(r"direction (LR|RL|TB|BT)"),
    "state": re.compile(rf'state "(?P<label>[^"]+)" as (?P<id>{ID})'),
    "edge": re.compile(rf"(?P<src>{ID}|\[\*\]) --> (?P<dst>{ID}|\[\*\])( : (?P<label>[^:;\"]+))?"),
    "classDef": re.compile(rf"classDef (?P<name>{ID}) {CSS}"),
    "styled": re.compile(rf"(?P<id>{ID}):::(?P<cls>{ID})"),
    "class": re.compile(rf"class (?P<ids>{ID}(,{ID})*) (?P<cls>{ID})"),
    "note": re.compile(rf"note (left|right) of (?P<id>{ID})"),
}


def body(text: str, header: str) -> list[str]:
    """The lines after the diagram's header line, which must be ``header``."""
    lines = text.rstrip("\n").split("\n")
    assert lines[0] == header, f"expected {header!r} first, got {lines[0]!r}"
    return lines[1:]


def read_line(raw: str, grammar: dict[str, re.Pattern[str]], header: str) -> tuple[str, re.Match[str]]:
    """Which kind of line ``raw`` is, and its match; an assertion names a line the grammar lacks."""
    for kind, pattern in grammar.items():
        if match := pattern.fullmatch(raw.strip()):
            return kind, match
    raise AssertionError(f"not Mermaid {header} as we write it: {raw!r}")


def check_state_diagram(text: str) -> None:
    """Every line is one we know how Mermaid reads; every id and class used is declared."""
    declared: set[str] = set()
    used: set[str] = set()
    classes_defined: set[str] = set()
    classes_used: set[str] = set()
    in_note = False
    for raw in body(text, "stateDiagram-v2"):
        line = raw.strip()
        if in_note:
            assert line, "an empty line inside a note"
            in_note = line != "end note"
            continue
        if not line:
            continue
        kind, match = read_line(raw, STATE_LINE, "stateDiagram-v2")
        if kind == "state":
            declared.add(match["id"])
        elif kind == "edge":
            used.update(x for x in (match["src"], match["dst"]) if x != "[*]")
        elif kind == "classDef":
            classes_defined.add(match["name"])
        elif kind in ("styled", "note"):
            used.add(match["id"])
            if kind == "styled":
                classes_used.add(match["cls"])
            in_note = kind == "note"
        elif kind == "class":
            used.update(match["ids"].split(","))
            classes_used.add(match["cls"])
    assert not in_note, "a note is not closed with 'end note'"
    assert used <= declared, f"undeclared states: {used - declared}"
    assert classes_used <= classes_defined, f"classes without classDef: {classes_used - classes_defined}"


TEXT = r"(?:[^;#<>\n]|#(?:\d+|[a-z]+);)+"  # Mermaid reads ; # < > as syntax: they must be entity codes
SEQUENCE_LINE = {
    "participant": re.compile(rf"participant (?P<id>{ID})( as [^;#<>:\n]+)?"),
    "message": re.compile(rf"(?P<src>{ID})(->>|-->>|--x|-x)(?P<dst>{ID}): {TEXT}"),
    "note": re.compile(rf"Note over (?P<ids>{ID}(,{ID})?): {TEXT}"),
}


def check_sequence_diagram(text: str) -> None:
    """Participants are declared before use; message text cannot be read as syntax."""
    declared: set[str] = set()
    for raw in body(text, "sequenceDiagram"):
        kind, match = read_line(raw, SEQUENCE_LINE, "sequenceDiagram")
        if kind == "participant":
            declared.add(match["id"])
        elif kind == "message":
            assert {match["src"], match["dst"]} <= declared, raw
        else:
            assert set(match["ids"].split(",")) <= declared, raw


# A run's counts: recorded and drawn ------------------------------------------------------------
def recorded_counts(events: Sequence[Event]) -> tuple[Counter[Move], Counter[str]]:
    """What the run's transition events say: moves taken, and entries by state id."""
    # The metaclass's events property (a list of the class's events); mypy sees only the instance's.
    names = {event.id: event.name for event in AgentMachine.events}  # type: ignore[attr-defined]
    moves: Counter[Move] = Counter()
    entries: Counter[str] = Counter()
    for event in events:
        if event.type != "transition":
            continue
        target = RunStatus(event.data["target"]).shown
        entries[target] += 1
        if event.data["source"] is not None:
            key = (RunStatus(event.data["source"]).shown, target, names[event.data["event"]])
            moves[key] += 1
    return moves, entries


def mermaid_counts(text: str) -> tuple[Counter[Move], Counter[str]]:
    """What a Mermaid overlay draws: counts on edge labels, and on state labels."""
    drawn: Counter[Move] = Counter()
    visits: Counter[str] = Counter()
    for line in text.split("\n"):
        edge = STATE_LINE["edge"].fullmatch(line.strip())
        if edge and edge["label"] and (counted := COUNTED.fullmatch(edge["label"])):
            drawn[(edge["src"], edge["dst"], counted["label"])] += int(counted["n"])
        state = STATE_LINE["state"].fullmatch(line.strip())
        if state and (counted := COUNTED.fullmatch(state["label"])):
            visits[state["id"]] = int(counted["n"])
    return drawn, visits


def dot_counts(source: str) -> Counter[Move]:
    """What a DOT overlay draws on its edges; also checks each edge's colour and pen width
    agree with its count (taken edges blue and wider, the rest grey)."""
    drawn: Counter[Move] = Counter()
    for (src, dst, label), attributes in dot_edges(source).items():
        counted = COUNTED.fullmatch(label)
        assert (attributes.get("color") == dg.VISITED_STROKE) == bool(counted), (src, dst, label)
        if counted:
            drawn[(src, dst, counted["label"])] += int(counted["n"])
            assert attributes["penwidth"] == str(min(1 + int(counted["n"]), 5)), (src, dst, label)
    return drawn


# Reading DOT back ------------------------------------------------------------------------
DOT_ATTRIBUTE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|<(?:[^<>]|<[^>]*>)*>|[^,\]\s]+)')


def _attributes(text: str) -> dict[str, str]:
    return {key: value.strip('"') for key, value in DOT_ATTRIBUTE.findall(text)}


def dot_nodes(source: str) -> dict[str, dict[str, str]]:
    """Node name → attributes, for the node statements of a DOT text."""
    found = {}
    for match in re.finditer(r"^(\w+) \[(.*)\];$", source, re.MULTILINE):
        found[match[1]] = _attributes(match[2])
    return found


def dot_edges(source: str) -> dict[tuple[str, str, str], dict[str, str]]:
    """(source, target, label text) → attributes, for the edge statements of a DOT text."""
    found = {}
    for match in re.finditer(r"^(\w+) -> (\w+) \[(.*)\];$", source, re.MULTILINE):
        label = re.search(r'<font point-size="\d+">(.*?)(?:<br/>.*?)?</font>', match[3])
        text = label[1] if label else ""
        attributes = _attributes(re.sub(r"label=<.*>>,", "", match[3]))
        found[(match[1], match[2], text)] = attributes
    return found


# Where Graphviz draws things --------------------------------------------------------------
Box = tuple[float, float, float, float]
"""left, bottom, right, top, in points."""


def _layout(source: str) -> dict[str, Any]:
    """Graphviz's own layout of a DOT text (``dot -Tjson``: positions, label texts, edge curves)."""
    done = subprocess.run(["dot", "-Tjson"], input=source, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def _label_lines(edge: dict[str, Any]) -> list[tuple[str, Box]]:
    """Each text line of an edge's label, with the box its glyphs fill (baseline to cap height)."""
    lines, size = [], 10.0
    for op in edge.get("_ldraw_", []):
        if op["op"] == "F":
            size = float(op["size"])
        elif op["op"] == "T" and op["text"].strip():
            (x, y), width = op["pt"], float(op["width"])
            left = {"l": x, "c": x - width / 2, "r": x - width}[op["align"]]
            lines.append((op["text"], (left, y, left + width, y + 0.7 * size)))
    return lines


def _curve(edge: dict[str, Any], samples: int = 24) -> list[tuple[float, float]]:
    """Points along an edge's Bézier curves."""
    points = []
    for op in edge.get("_draw_", []):
        if op["op"] not in ("b", "B"):
            continue
        controls = op["points"]
        for i in range(0, len(controls) - 3, 3):
            p0, p1, p2, p3 = controls[i : i + 4]
            for k in range(samples + 1):
                t = k / samples
                weights = ((1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t * t, t**3)
                x, y = (sum(w * p[axis] for w, p in zip(weights, (p0, p1, p2, p3), strict=True)) for axis in (0, 1))
                points.append((x, y))
    return points


def _node_box(node: dict[str, Any]) -> Box:
    x, y = (float(v) for v in node["pos"].split(","))
    half_width, half_height = float(node["width"]) * 36, float(node["height"]) * 36  # inches → points, halved
    return (x - half_width, y - half_height, x + half_width, y + half_height)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(point: tuple[float, float], box: Box) -> bool:
    return box[0] < point[0] < box[2] and box[1] < point[1] < box[3]


def label_collisions(source: str) -> list[str]:
    """Where an edge label's text, as Graphviz lays the DOT out, is covered by another label, a
    state or another edge's line: what makes a label unreadable in the picture."""
    layout = _layout(source)
    names = {node["_gvid"]: node["name"] for node in layout.get("objects", [])}
    edges = layout.get("edges", [])
    lines = [(edge["_gvid"], text, box) for edge in edges for text, box in _label_lines(edge)]
    found = []
    for index, (owner, text, box) in enumerate(lines):
        for other, other_text, other_box in lines[index + 1 :]:
            if other != owner and _overlap(box, other_box):
                found.append(f"label {text!r} overlaps label {other_text!r}")
        for node in layout.get("objects", []):
            if "pos" in node and _overlap(box, _node_box(node)):
                found.append(f"label {text!r} overlaps state {node['name']}")
        for edge in edges:
            if edge["_gvid"] != owner and any(_inside(point, box) for point in _curve(edge)):
                found.append(f"the edge {names[edge['tail']]} -> {names[edge['head']]} crosses label {text!r}")
    return found
