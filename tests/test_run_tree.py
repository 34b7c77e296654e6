"""tether.views.tree on rows written by hand: a child a crash left uncreated, and a tree cut at its limit."""

from __future__ import annotations

import pytest

from tether.facts.events import ChildStarted, Event
from tether.stores import RunRecord
from tether.stores.memory import MemoryStore
from tether.views import tree


def started(seq: int, call_id: str, child: str) -> Event:
    return Event(seq, 1.0, ChildStarted(call_id, "review", child, 1, 1))


def link(parent: str, call_id: str) -> dict[str, object]:
    return {"agent": "reviewer", "parent": {"run_id": parent, "call_id": call_id, "tool": "review", "depth": 1}}


def test_a_child_whose_start_is_committed_but_not_created_is_shown_so() -> None:
    store = MemoryStore()
    store.create_run(RunRecord("root", "executing_tool", 1), [started(0, "c1", "child_1"), started(1, "c2", "child_2")])
    store.create_run(RunRecord("child_1", "done", 1, spec=link("root", "c1")), [])

    root = tree.run_tree(store, "root")

    assert [(c.run_id, c.call_id, c.agent, c.status) for c in root.children] == [
        ("child_1", "c1", "reviewer", "done"),
        ("child_2", "c2", None, tree.NOT_CREATED),  # the parent's next drive creates it
    ]
    assert tree.child_entries(store, "root")[1] == {
        "run_id": "child_2",
        "call_id": "c2",
        "agent": None,
        "status": tree.NOT_CREATED,
    }


def test_a_tree_past_its_limit_is_cut_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    store.create_run(RunRecord("root", "executing_tool", 1), [started(0, "c1", "child_1"), started(1, "c2", "child_2")])
    for index in (1, 2):
        store.create_run(RunRecord(f"child_{index}", "done", 1, spec=link("root", f"c{index}")), [])
    monkeypatch.setattr(tree, "MAX_RUNS", 2)

    root = tree.run_tree(store, "root")

    assert [child.run_id for child in root.children] == ["child_1"]
    assert root.cut
    assert root.to_dict()["cut"] is True
