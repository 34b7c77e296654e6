"""A writer agent that has a reviewer agent check its draft: two agents, two sets of permissions, one tree of runs.

The writer may write drafts and call ``review``, which is the reviewer agent as a tool
(:meth:`tether.Agent.as_tool`): each call starts a child run of the reviewer, linked to the
writer's run. The reviewer may only read drafts, and answers with a typed verdict (a ``final``
tool), which becomes the writer's tool result. Publishing is the writer's and needs a person.
Offline, scripted models play both agents::

    python -m tether.examples.writer_reviewer            # the tree, approving the publish here
    python -m tether.examples.writer_reviewer --park     # parks at the publish, like a service would
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from tether.agent import Agent
from tether.core.approvals import Approve, CallbackApprover, DecideLater, PendingApproval
from tether.drivers.runner import Runner, RunResult
from tether.models.scripted import ScriptedModel
from tether.stores import Store
from tether.stores.memory import MemoryStore
from tether.tools import Tool, tool
from tether.views.tree import RunNode, run_tree

PROMPT = "Write a one-line greeting for the release notes, have it reviewed, fix it, and publish it."


def _use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    usage = {"input_tokens": 40, "output_tokens": 12}
    return {
        "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}],
        "stop_reason": "tool_use",
        "usage": usage,
    }


def _say(text: str) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 60, "output_tokens": 9},
    }


def tools_for(drafts: dict[str, str], published: list[str]) -> tuple[list[Tool], list[Tool]]:
    """The writer's own tools and the reviewer's, over one shared set of drafts."""

    @tool
    def write_draft(name: str, text: str) -> str:
        """Write (or replace) a draft."""
        drafts[name] = text
        return f"saved {name} ({len(text)} characters)"

    @tool(approval=True)
    def publish(name: str) -> str:
        """Publish a draft: a person approves it."""
        published.append(drafts[name])
        return f"published {name}"

    @tool
    def read_draft(name: str) -> str:
        """Read a draft."""
        return drafts.get(name, f"no draft named {name}")

    @tool(final=True)
    def verdict(approved: bool, notes: str) -> str:
        """The review's verdict: the run's typed result."""
        return notes

    return [write_draft, publish], [read_draft, verdict]


def agents(drafts: dict[str, str], published: list[str]) -> Agent:
    """The writer, with the reviewer as its ``review`` tool, both played by scripted models."""
    writer_tools, reviewer_tools = tools_for(drafts, published)
    reviewer = Agent(
        ScriptedModel(
            [
                _use("toolu_read", "read_draft", {"name": "greeting"}),
                _use("toolu_verdict", "verdict", {"approved": False, "notes": "typo: 'wrld' should be 'world'"}),
            ]
        ),
        tools=reviewer_tools,
        system="You review drafts. You may read them, never change them.",
        name="reviewer",
    )
    review = reviewer.as_tool("review", "Have the reviewer check a draft; answers with a verdict and notes.")
    return Agent(
        ScriptedModel(
            [
                _use("toolu_write1", "write_draft", {"name": "greeting", "text": "Hello wrld, meet tether 1.0!"}),
                _use("toolu_review", "review", {"task": "Review the draft named greeting."}),
                _use("toolu_write2", "write_draft", {"name": "greeting", "text": "Hello world, meet tether 1.0!"}),
                _use("toolu_publish", "publish", {"name": "greeting"}),
                _say("Reviewed, fixed the typo the reviewer found, and published the greeting."),
            ]
        ),
        tools=[*writer_tools, review],
        system="You write short texts, have them reviewed, and publish them.",
        name="writer",
    )


def run(
    store: Store | None = None,
    *,
    decide: Callable[[PendingApproval], Approve | None] | None = None,
) -> tuple[RunResult, Runner, dict[str, str], list[str]]:
    """Run the writer; ``decide`` answers the publish (None: the run parks for a decision later)."""
    drafts: dict[str, str] = {}
    published: list[str] = []
    approver = CallbackApprover(decide) if decide is not None else DecideLater()
    runner = Runner(agents(drafts, published), store or MemoryStore(), approver=approver)
    return runner.run(PROMPT), runner, drafts, published


def tree(runner: Runner, run_id: str) -> list[str]:
    """Lines showing a run and the child runs it started (:func:`~tether.views.tree.run_tree`), indented by depth."""

    def lines(node: RunNode, depth: int) -> list[str]:
        state = runner.load(node.run_id)
        shown = [
            f"{'  ' * depth}{node.run_id} [{node.agent or 'writer'}] {node.status}: {state.output or state.result}"
        ]
        return shown + [line for child in node.children for line in lines(child, depth + 1)]

    return lines(run_tree(runner.store, run_id), 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example and print the tree of runs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--park", action="store_true", help="leave the publish for a decision later")
    args = parser.parse_args(argv)
    result, runner, _drafts, published = run(decide=None if args.park else (lambda _: Approve(actor="you")))
    print("\n".join(tree(runner, result.run_id)))
    print(json.dumps({"status": result.status, "published": published, "pending": result.pending_approvals}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
