"""Agents as tools: a call served by a child run linked to its parent (tether.core.children)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pydantic
import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Deny, Runner, RunResult, tool
from tether.core.approvals import CallbackApprover, DecideLater
from tether.core.children import ChildFailed, child_run_id
from tether.policy.policies import Budget, Limits, RetryPolicy
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel
from tether.tools.output import OUTPUT_TOOL
from tether.views.pending import pending_approvals


def answer(text: str) -> dict[str, Any]:
    return model_reply([{"type": "text", "text": text}], "end_turn")


EFFECTS: list[str] = []


@tool
def read_draft(name: str) -> str:
    """Read a draft (the reviewer may)."""
    EFFECTS.append(f"read {name}")
    return f"draft {name}: hello wrld"


@tool(approval=True)
def publish(name: str) -> str:
    """Publish a draft (a person decides)."""
    EFFECTS.append(f"publish {name}")
    return f"published {name}"


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()


def reviewer(script: list[Any], **options: Any) -> Agent:
    return Agent(ScriptedModel(script), tools=[read_draft, publish], name="reviewer", **options)


def writer(child: Agent, script: list[Any], **options: Any) -> Agent:
    review = child.as_tool("review", "Have the reviewer check a draft.")
    return Agent(ScriptedModel(script), tools=[review], name="writer", **options)


REVIEW_CALL = tool_use_turn(tool_use("toolu_review", "review", {"task": "check draft a"}))


def test_a_child_run_answers_the_parents_call_and_is_linked_to_it() -> None:
    child = reviewer([tool_use_turn(tool_use("toolu_read", "read_draft", {"name": "a"})), answer("one typo: wrld")])
    parent_agent = writer(child, [REVIEW_CALL, answer("fixed the typo")])
    store = MemoryStore()
    runner = Runner(parent_agent, store)

    result = runner.run("write and review")

    assert result.status == "done"
    assert result.output == "fixed the typo"
    parent = runner.load(result.run_id)
    child_id = child_run_id(result.run_id, "toolu_review", 1)
    assert parent.children == {"toolu_review": child_id}
    assert parent.messages[-2]["content"][0]["content"] == "one typo: wrld"
    linked = store.load_run(child_id)
    assert linked.status == "done"
    assert linked.spec["parent"] == {
        "run_id": result.run_id,
        "call_id": "toolu_review",
        "tool": "review",
        "depth": 1,
        "chain": [result.run_id],
    }
    first_prompt = child.model.requests[0].messages[0]["content"]  # type: ignore[attr-defined]
    assert "check draft a" in json.dumps(first_prompt)
    assert EFFECTS == ["read a"]


def test_a_childs_typed_result_becomes_the_tool_result() -> None:
    @tool(final=True)
    def verdict(ok: bool, note: str) -> str:
        """The review's verdict."""
        return note

    child = Agent(
        ScriptedModel([tool_use_turn(tool_use("toolu_v", "verdict", {"ok": False, "note": "typo"}))]), tools=[verdict]
    )
    runner = Runner(writer(child, [REVIEW_CALL, answer("ok")]))
    result = runner.run("go")
    parent = runner.load(result.run_id)
    assert json.loads(parent.messages[-2]["content"][0]["content"]) == {"ok": False, "note": "typo"}


class Verdict(pydantic.BaseModel):
    """A review's verdict."""

    ok: bool
    note: str


def test_a_childs_output_type_result_becomes_the_tool_result_as_json() -> None:
    child = Agent(
        ScriptedModel([tool_use_turn(tool_use("toolu_v", OUTPUT_TOOL, {"ok": True, "note": "fine"}))]),
        output_type=Verdict,
    )
    runner = Runner(writer(child, [REVIEW_CALL, answer("ok")]))
    result = runner.run("go")
    parent = runner.load(result.run_id)
    assert json.loads(parent.messages[-2]["content"][0]["content"]) == {"ok": True, "note": "fine"}


def test_a_failed_child_is_an_error_result_retried_with_a_new_child() -> None:
    child = Agent(ScriptedModel([answer("never")]), limits=Limits(max_steps=0), name="broken")  # fails at once
    retry = RetryPolicy(max_attempts=2, initial_delay=0, retry_on=(ChildFailed,))
    review = child.as_tool("review", "Review.", retry=retry)
    parent_agent = Agent(ScriptedModel([REVIEW_CALL, answer("gave up")]), tools=[review])
    store = MemoryStore()
    result = Runner(parent_agent, store).run("go")

    assert result.status == "done"
    runner = Runner(parent_agent, store)
    parent = runner.load(result.run_id)
    shown = parent.messages[-2]["content"][0]
    assert shown["is_error"] is True
    assert "max_steps" in shown["content"]
    for attempt in (1, 2):
        assert store.load_run(child_run_id(result.run_id, "toolu_review", attempt)).status == "failed"


def test_a_gated_call_in_the_child_parks_both_and_a_decision_resumes_the_tree() -> None:
    child = reviewer([tool_use_turn(tool_use("toolu_pub", "publish", {"name": "a"})), answer("published")])
    parent_agent = writer(child, [REVIEW_CALL, answer("all done")])
    store = MemoryStore()
    runner = Runner(parent_agent, store, approver=DecideLater())

    parked = runner.run("publish it")

    assert parked.status == "awaiting_approval"
    child_id = child_run_id(parked.run_id, "toolu_review", 1)
    assert [(p["run_id"], p["call_id"], p["chain"]) for p in parked.pending_approvals] == [
        (child_id, "toolu_pub", [parked.run_id, child_id])
    ]
    listed = pending_approvals(store)
    assert [(p.run_id, p.call_id, p.chain) for p in listed] == [(child_id, "toolu_pub", (parked.run_id, child_id))]
    assert EFFECTS == []

    elsewhere = Runner(parent_agent, store, approver=DecideLater())  # another process decides
    elsewhere.decide(child_id, "toolu_pub", Approve(actor="ann"))
    resumed = Runner(parent_agent, store, approver=DecideLater()).drive(parked.run_id)

    assert resumed.status == "done"
    assert resumed.output == "all done"
    assert store.load_run(child_id).status == "done"
    assert EFFECTS == ["publish a"]


def test_a_child_deeper_than_the_limit_is_not_started() -> None:
    child = reviewer([answer("never")])
    parent_agent = writer(child, [REVIEW_CALL, answer("ok")], limits=Limits(max_depth=0))
    store = MemoryStore()
    result = Runner(parent_agent, store).run("go")
    parent = Runner(parent_agent, store).load(result.run_id)
    shown = parent.messages[-2]["content"][0]
    assert shown["is_error"] is True
    assert "max_depth 0" in shown["content"]
    assert parent.children == {}


def test_a_childs_spending_rolls_up_into_the_parent() -> None:
    child = reviewer([tool_use_turn(tool_use("toolu_read", "read_draft", {"name": "a"})), answer("ok")])
    store = MemoryStore()
    result = Runner(writer(child, [REVIEW_CALL, answer("ok")]), store).run("go")
    child_row = store.load_run(child_run_id(result.run_id, "toolu_review", 1))
    # the parent's two model calls (1+1, then 10+5 tokens) and the child's (1+1, 10+5)
    assert result.usage.input_tokens == 22
    assert result.usage.output_tokens == 12
    assert child_row.summary["tool_calls"] == 1
    assert result.tool_calls == 2  # its own call of review, and the child's read_draft


def test_cancelling_a_parent_cancels_its_parked_child() -> None:
    child = reviewer([tool_use_turn(tool_use("toolu_pub", "publish", {"name": "a"})), answer("published")])
    parent_agent = writer(child, [REVIEW_CALL, answer("all done")])
    store = MemoryStore()
    runner = Runner(parent_agent, store, approver=DecideLater())
    parked = runner.run("publish it")

    cancelled = Runner(parent_agent, store).cancel(parked.run_id, "changed my mind")

    assert cancelled.status == "cancelled"
    assert store.load_run(child_run_id(parked.run_id, "toolu_review", 1)).status == "cancelled"
    assert pending_approvals(store) == []


def test_a_childs_approver_is_the_parents_and_both_agents_permissions_hold() -> None:
    denied = Agent(
        ScriptedModel([tool_use_turn(tool_use("toolu_pub", "publish", {"name": "a"})), answer("could not")]),
        tools=[read_draft, publish],
        name="reviewer",
    )
    parent_agent = writer(
        denied, [tool_use_turn(tool_use("toolu_x", "publish", {"name": "a"})), REVIEW_CALL, answer("ok")]
    )
    seen: list[str] = []

    def ask(request: Any) -> Any:
        seen.append(f"{request.run_id[:4]}:{request.tool}")
        return Deny("no", actor="ann")

    result = Runner(parent_agent, approver=CallbackApprover(ask)).run("go")

    assert result.status == "done"
    assert seen == ["run_:publish"]  # the writer has no publish tool; the reviewer's gated call was asked
    assert EFFECTS == []


def test_a_childs_tokens_count_toward_the_parents_budget() -> None:
    child = reviewer([tool_use_turn(tool_use("toolu_read", "read_draft", {"name": "a"})), answer("ok")])
    parent_model = ScriptedModel([REVIEW_CALL, answer("final")])
    budget = Budget(max_total_tokens=10)  # the parent alone spends 2 before its last answer; the child 17
    review = child.as_tool("review", "Review.")
    result = Runner(Agent(parent_model, tools=[review], limits=Limits(budget=budget))).run("go")

    assert result.status == "done"
    assert parent_model.requests[1].tool_choice == {"type": "none"}  # asked for a final answer, tools off


def test_an_async_runner_drives_the_child_and_the_decision_resumes_the_tree() -> None:
    child = reviewer([tool_use_turn(tool_use("toolu_pub", "publish", {"name": "a"})), answer("published")])
    parent_agent = writer(child, [REVIEW_CALL, answer("all done")])
    store = MemoryStore()
    runner = AsyncRunner(parent_agent, store, approver=DecideLater())

    async def scenario() -> tuple[RunResult, RunResult]:
        parked = await runner.run("publish it")
        (waiting,) = pending_approvals(store)
        await runner.decide(waiting.run_id, waiting.call_id, Approve(actor="ann"))
        return parked, await runner.drive(parked.run_id)

    parked, resumed = asyncio.run(scenario())

    assert parked.status == "awaiting_approval"
    assert resumed.status == "done"
    assert EFFECTS == ["publish a"]


def test_an_async_runner_cancels_a_parent_and_its_parked_child() -> None:
    child = reviewer([tool_use_turn(tool_use("toolu_pub", "publish", {"name": "a"})), answer("published")])
    parent_agent = writer(child, [REVIEW_CALL, answer("all done")])
    store = MemoryStore()
    runner = AsyncRunner(parent_agent, store, approver=DecideLater())

    async def scenario() -> RunResult:
        parked = await runner.run("publish it")
        return await AsyncRunner(parent_agent, store).cancel(parked.run_id, "changed my mind")

    cancelled = asyncio.run(scenario())

    assert cancelled.status == "cancelled"
    assert store.load_run(child_run_id(cancelled.run_id, "toolu_review", 1)).status == "cancelled"
    assert pending_approvals(store) == []
    assert EFFECTS == []
