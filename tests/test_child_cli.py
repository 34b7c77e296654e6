"""The CLI on a tree of runs: deciding a child's call by the child's id or the root's, resuming the root,
``tether show``'s tree and ``--json``'s children (in process: ``main()`` with a tools module on disk)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tether.core.children import child_run_id
from tether.surfaces.cli import main

TOOLS = '''
from pathlib import Path

from tether import Agent, tool
from tether.testing import ScriptedModel

HERE = Path(__file__).parent


@tool(approval=True)
def publish(name: str) -> str:
    """Publish a draft: a person approves it."""
    with (HERE / "effects.log").open("a") as log:
        log.write(f"publish {name}\\n")
    return f"published {name}"


def turn(*content, stop="tool_use"):
    return {"content": list(content), "stop_reason": stop, "usage": {"input_tokens": 3, "output_tokens": 2}}


def review(request):
    """Publish, then answer with what publishing said (a result, or why it did not run)."""
    if request.invocation == 0:
        return turn({"type": "tool_use", "id": "toolu_pub", "name": "publish", "input": {"name": "a"}})
    return turn({"type": "text", "text": request.messages[-1]["content"][0]["content"]}, stop="end_turn")


class ClosedModel(ScriptedModel):
    """Says in closed.log when it is closed (an SDK client's connections would be let go there)."""

    def close(self):
        with (HERE / "closed.log").open("a") as log:
            log.write("reviewer's model\\n")


REVIEWER = Agent(ClosedModel(review), tools=[publish], name="reviewer")
TOOLS = [REVIEWER.as_tool("review", "Have the reviewer check and publish a draft.")]
'''

SCRIPT = [
    {
        "content": [{"type": "tool_use", "id": "toolu_review", "name": "review", "input": {"task": "publish a"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 4},
    },
    {"content": [{"type": "text", "text": "the reviewer is done"}], "stop_reason": "end_turn"},
]


class Tether:
    """``tether ARGS --db ...`` in process, in a directory holding the tools module and the model's script."""

    def __init__(self, cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.db = f"sqlite:///{cwd / 'runs.db'}"
        self.cwd = cwd
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main([*args, "--db", self.db])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code in (0, 3), err
        return json.loads(out)

    def effects(self) -> list[str]:
        log = self.cwd / "effects.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def tether(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Tether:
    (tmp_path / "treetools.py").write_text(TOOLS, encoding="utf-8")
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return Tether(tmp_path, capsys)


def parked(tether: Tether) -> tuple[str, str]:
    """A writer's run parked on the reviewer's publish: (root run id, child run id)."""
    result = tether.json("run", "publish a", "--tools", "treetools:TOOLS", "--model", "scripted:script.json")
    assert result["status"] == "awaiting_approval"
    root = result["run_id"]
    child = child_run_id(root, "toolu_review", 1)
    assert [(p["run_id"], p["call_id"]) for p in result["pending_approvals"]] == [(child, "toolu_pub")]
    assert result["children"] == [
        {"run_id": child, "call_id": "toolu_review", "agent": "reviewer", "status": "awaiting_approval"}
    ]
    return root, child


@pytest.mark.parametrize("by", ["root", "child"])
def test_a_childs_call_approved_by_either_run_id_then_resuming_the_root_finishes_both(tether: Tether, by: str) -> None:
    root, child = parked(tether)

    code, out, err = tether("approve", root if by == "root" else child, "toolu_pub", "--by", "ann")

    assert code == 0, err
    assert f"approved toolu_pub in run {child} (a child run of {root})" in " ".join(out.split())
    assert f"resume {root}" in out
    assert tether.effects() == []
    done = tether.json("resume", root)
    assert done["status"] == "done"
    assert done["output"] == "the reviewer is done"
    assert done["children"] == [{"run_id": child, "call_id": "toolu_review", "agent": "reviewer", "status": "done"}]
    assert tether.effects() == ["publish a"]


def test_a_childs_call_denied_by_the_child_id_reaches_the_child_and_the_parent(tether: Tether) -> None:
    root, child = parked(tether)

    code, _, err = tether("deny", child, "toolu_pub", "--reason", "not yet")
    assert code == 0, err

    done = tether.json("resume", root)
    assert done["status"] == "done"
    assert tether.effects() == []
    shown = tether.json("show", child)
    assert "denied by" in shown["output"]
    assert "not yet" in shown["output"]


def test_resuming_a_child_run_names_its_root_and_changes_nothing(tether: Tether) -> None:
    root, child = parked(tether)

    code, _, err = tether("resume", child)

    assert code == 2
    assert f"resume {root}" in " ".join(err.split())
    assert tether.json("show", child)["status"] == "awaiting_approval"


def test_show_pending_and_diagram_draw_the_tree_of_runs(tether: Tether) -> None:
    root, child = parked(tether)

    _, pending, _ = tether("pending")
    assert f"chain  {root} → {child}" in pending
    assert [p["run_id"] for p in tether.json("pending", "--run", root)["pending"]] == [child]  # the tree's calls
    assert "then go on with (RUN: the first run of a call's chain):" in pending
    _, shown, _ = tether("show", root)
    assert f"└── {child} reviewer for review toolu_review awaiting_approval" in " ".join(shown.split())
    told = [" ".join(line.split()) for line in shown.splitlines()]
    call = told.index("▸ review toolu_review")  # the conversation places the child under the call it serves
    assert f"child run {child} reviewer awaiting_approval" in told[call:]
    _, shown_child, _ = tether("show", child)
    assert f"child run of {root} (its call toolu_review of review)" in " ".join(shown_child.split())
    tree = tether.json("show", root)["children"]
    assert tree == [
        {
            "run_id": child,
            "call_id": "toolu_review",
            "agent": "reviewer",
            "status": "awaiting_approval",
            "tool": "review",
            "attempt": 1,
            "tokens": 5,
            "cost_usd": None,
            "tool_calls": 0,
            "children": [],
        }
    ]
    assert tether.json("show", child)["parent"]["chain"] == [root]
    listed = {row["run_id"]: row["parent"] for row in tether.json("runs")["runs"]}
    assert listed == {root: None, child: root}
    _, table, _ = tether("runs")
    lines = [line for line in table.splitlines() if root in line or child in line]
    assert root in lines[0]
    assert f"└ {child}" in lines[1]  # under its parent, whatever their order by time
    _, drawn, _ = tether("diagram", "--run", root)
    assert f"        review toolu_review → {child} (reviewer): awaiting_approval\n" in drawn


def test_run_prints_a_childs_progress_under_its_agent_and_the_tree_at_the_end(tether: Tether) -> None:
    code, out, _ = tether("run", "publish a", "--tools", "treetools:TOOLS", "--model", "scripted:script.json")

    assert code == 3
    lines = out.splitlines()
    assert 'call   review {"task": "publish a"}' in lines  # the writer's own line
    assert '  reviewer call   publish {"name": "a"}' in lines  # the child's, indented under its agent
    assert "reviewer for review toolu_review awaiting_approval" in " ".join(out.split())


def test_the_cli_closes_a_child_agents_model_when_it_ends(tether: Tether) -> None:
    parked(tether)
    assert (tether.cwd / "closed.log").read_text().splitlines() == ["reviewer's model"]


def test_the_inspectors_drive_closes_the_agent_it_made(tether: Tether) -> None:
    """`tether ui` makes an agent per drive after a decision: its team's models and servers go with it."""
    from tether.stores.sql import SQLStore
    from tether.surfaces.web.decisions import InProcess

    root, child = parked(tether)
    assert tether("approve", child, "toolu_pub", "--by", "ann")[0] == 0
    (tether.cwd / "closed.log").unlink()  # the CLI's own closes, tested above
    store = SQLStore(tether.db)
    try:
        InProcess(store, max_wait=0).drive(root, None)
        assert store.load_run(root).status == "done"
    finally:
        store.close()
    assert (tether.cwd / "closed.log").read_text().splitlines() == ["reviewer's model"]


@pytest.mark.parametrize("action", ["approve", "deny"])
def test_the_inspector_decides_a_childs_call_and_drives_the_root_to_its_end(tether: Tether, action: str) -> None:
    """As `tether approve`: the root's agent (whose agent tool leads to the child's) checks it, the root goes on."""
    from starlette.testclient import TestClient

    from tether.core.approvals import fingerprint
    from tether.policy.access import Credentials
    from tether.stores.sql import SQLStore
    from tether.surfaces.web.app import create_app
    from tether.surfaces.web.decisions import InProcess

    root, child = parked(tether)
    store = SQLStore(tether.db)
    try:
        app = create_app(store, Credentials({"operator-token-0123456789": None}), resume=InProcess(store).drive)
        browser = TestClient(app, follow_redirects=False)
        assert browser.get("/?token=operator-token-0123456789").status_code == 303
        page = browser.get(f"/runs/{child}").text
        csrf = page.split('name="csrf" value="')[1].split('"')[0]
        form = {"csrf": csrf, "run_id": child, "call_id": "toolu_pub", "fingerprint": fingerprint({"name": "a"})}
        decided = browser.post("/decide", data={**form, "action": action, "reason": "not yet"})
        assert decided.status_code == 303, decided.text
        assert store.load_run(root).status == "done"
        assert store.load_run(child).status == "done"
    finally:
        store.close()
    assert tether.effects() == (["publish a"] if action == "approve" else [])
    said = tether.json("show", child)["output"]
    if action == "approve":
        assert said == "published a"
    else:
        assert "not yet" in said


def test_a_fork_of_a_child_run_is_driven_with_the_childs_agent_from_the_cli_and_the_inspector(tether: Tether) -> None:
    """Its record names no tools module (the child's agent is an agent tool's): the tree's root's agent is rebuilt."""
    from tether.stores.sql import SQLStore
    from tether.surfaces.web.decisions import InProcess

    root, child = parked(tether)
    assert tether("approve", child, "toolu_pub", "--by", "ann")[0] == 0
    assert tether.json("resume", root)["status"] == "done"
    forks = [tether.json("fork", child, "--at", "1")["run_id"] for _ in range(2)]

    by_cli = tether.json("resume", forks[0], "--approve-all")
    assert (by_cli["status"], by_cli["output"]) == ("done", "published a")
    store = SQLStore(tether.db)
    try:
        InProcess(store, max_wait=0).drive(forks[1], None)  # parks at the publish, as the child did
        assert store.load_run(forks[1]).status == "awaiting_approval"
    finally:
        store.close()
    assert tether.effects() == ["publish a", "publish a"]


def test_the_inspector_links_a_child_run_and_its_parent(tether: Tether) -> None:
    from starlette.testclient import TestClient

    from tether.policy.access import Credentials
    from tether.stores.sql import SQLStore
    from tether.surfaces.web.app import create_app

    root, child = parked(tether)
    store = SQLStore(tether.db)
    try:
        browser = TestClient(create_app(store, Credentials({"operator-token-0123456789": None})))
        assert browser.get("/?token=operator-token-0123456789").status_code == 200
        parent_page = browser.get(f"/runs/{root}").text
        child_page = browser.get(f"/runs/{child}").text
    finally:
        store.close()
    children = parent_page.split('data-testid="children"')[1].split("</section>")[0]
    assert f'<a href="/runs/{child}">' in children
    assert "reviewer" in children
    assert "awaiting_approval" in children
    assert f'child of <a href="/runs/{root}">' in child_page
    assert "serving its call <code>toolu_review</code>" in child_page
