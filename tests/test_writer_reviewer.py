"""The writer/reviewer example runs offline: a tree of two runs, the reviewer's verdict in the writer's history."""

from __future__ import annotations

import json

import pytest

from tether.core.approvals import Approve
from tether.core.children import child_run_id
from tether.examples import writer_reviewer


def test_the_writer_gets_the_reviewers_typed_verdict_and_publishes_the_fix() -> None:
    result, runner, drafts, published = writer_reviewer.run(decide=lambda _: Approve(actor="you"))

    assert result.status == "done"
    assert published == ["Hello world, meet tether 1.0!"]
    writer = runner.load(result.run_id)
    verdict = next(
        block["content"]
        for message in writer.messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("tool_use_id") == "toolu_review"
    )
    assert json.loads(verdict) == {"approved": False, "notes": "typo: 'wrld' should be 'world'"}
    assert writer.children == {"toolu_review": child_run_id(result.run_id, "toolu_review", 1)}
    assert drafts == {"greeting": "Hello world, meet tether 1.0!"}


def test_parked_at_the_publish_and_printed_as_a_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert writer_reviewer.main(["--park"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "[writer] awaiting_approval" in lines[0]
    assert lines[1].startswith("  run_")  # the child, one level down
    assert "[reviewer] done" in lines[1]
    assert json.loads(lines[2])["pending"][0]["tool"] == "publish"
