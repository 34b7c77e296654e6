"""A child run seen from its tree: a retry due later makes the root due, the parent's remainder caps the child,
a call waiting deep in the tree is decided by the root's id."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Runner, RunResult, tool
from tether.core.approvals import DecideLater
from tether.core.children import child_run_id
from tether.policy.policies import Budget, Limits, RetryLater, RetryPolicy
from tether.policy.pricing import Price
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel
from tether.views.tree import run_tree

REVIEW_CALL = tool_use_turn(tool_use("toolu_review", "review", {"task": "check draft a"}))
FETCH_CALL = tool_use_turn(tool_use("toolu_fetch", "fetch", {"name": "a"}))


def answer(text: str) -> dict[str, Any]:
    return model_reply([{"type": "text", "text": text}], "end_turn")


class Clock:
    """Time as the test sets it: retries come due when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def flaky_fetch(failures: int) -> Any:
    """A tool that asks for another attempt (due a minute later) ``failures`` times, then answers."""
    left = [failures]

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=60, max_delay=60, jitter=0))
    def fetch(name: str) -> str:
        """Fetch a draft from a flaky service."""
        if left[0]:
            left[0] -= 1
            raise RetryLater("the service is busy")
        return f"draft {name}"

    return fetch


def tree(
    child_script: list[Any], parent_script: list[Any], *, child_tools: list[Any], child: Any = None, **parent: Any
) -> Agent:
    reviewer = Agent(ScriptedModel(child_script), tools=child_tools, name="reviewer", **(child or {}))
    return Agent(ScriptedModel(parent_script), tools=[reviewer.as_tool("review", "Review a draft.")], **parent)


def costly(*uses: dict[str, Any]) -> dict[str, Any]:
    """A model turn asking for tools that spends 15 tokens (10 in, 5 out)."""
    return model_reply(list(uses), "tool_use")


def test_a_child_waiting_for_a_retry_makes_its_root_due_and_resuming_the_root_finishes_both() -> None:
    agent = tree([FETCH_CALL, answer("looks fine")], [REVIEW_CALL, answer("reviewed")], child_tools=[flaky_fetch(1)])
    store, clock = MemoryStore(), Clock()
    runner = Runner(agent, store, clock=clock)

    parked = runner.run("review a", max_wait=0)

    child = child_run_id(parked.run_id, "toolu_review", 1)
    assert parked.status == "waiting_retry"
    assert parked.next_due_at == 1060.0
    assert store.list_due(1059.0) == []
    assert [r.id for r in store.list_due(1060.0)] == [parked.run_id]  # the root, not the child it waits on
    assert store.load_run(child).summary["next_due_at"] == 1060.0

    logged = len(store.load_events(parked.run_id))
    again = runner.drive(parked.run_id, max_wait=0)  # early: nothing new is recorded
    assert again.status == "waiting_retry"
    assert len(store.load_events(parked.run_id)) == logged

    clock.now = 1060.0
    done = Runner(agent, store, clock=clock).drive(parked.run_id, max_wait=0)

    assert done.status == "done"
    assert done.output == "reviewed"
    assert store.load_run(child).status == "done"
    assert store.list_due(2000.0) == []


def test_on_an_async_runner_a_waiting_child_makes_its_root_due_too() -> None:
    agent = tree([FETCH_CALL, answer("looks fine")], [REVIEW_CALL, answer("reviewed")], child_tools=[flaky_fetch(1)])
    store, clock = MemoryStore(), Clock()

    async def scenario() -> tuple[RunResult, RunResult]:
        parked = await AsyncRunner(agent, store, clock=clock).run("review a", max_wait=0)
        clock.now = 1060.0
        return parked, await AsyncRunner(agent, store, clock=clock).drive(parked.run_id, max_wait=0)

    parked, done = asyncio.run(scenario())

    assert (parked.status, parked.next_due_at) == ("waiting_retry", 1060.0)
    assert done.status == "done"


# Budgets: the parent's remainder caps the child -------------------------------------------------
PRICED: dict[str, Any] = {"model_name": "m", "prices": {"m": Price(1000.0, 1000.0, 0.0, 0.0)}}
"""A model priced so each 15-token turn costs $0.015."""


def child_of(store: MemoryStore, run_id: str) -> Any:
    return store.load_run(child_run_id(run_id, "toolu_review", 1))


def test_a_childs_budget_is_capped_by_what_its_parent_has_left_and_it_stops_there() -> None:
    fetch = flaky_fetch(0)
    child_script = [costly(tool_use("t1", "fetch", {"name": "a"})), costly(tool_use("t2", "fetch", {"name": "b"}))]
    child_script.append(answer("a and b look fine"))
    budget = Budget(max_total_tokens=30, conversation_max_tokens=40, max_tool_calls=5, on_limit="fail", warn_at=0.5)
    agent = tree(
        child_script, [REVIEW_CALL, answer("done")], child_tools=[fetch], limits=Limits(budget=budget, max_tool_calls=3)
    )
    store = MemoryStore()

    result = Runner(agent, store).run("review")

    child = child_of(store, result.run_id)
    # the parent spent 2 tokens of 30 (and of 40 over the conversation) before its call of review
    assert child.spec["budget"]["max_total_tokens"] == 28
    assert (child.spec["budget"]["on_limit"], child.spec["budget"]["warn_at"]) == ("fail", 0.5)  # the parent's
    assert child.spec["budget"]["max_tool_calls"] == 5  # none spent (its call of review may take it one past)
    assert child.spec["max_tool_calls"] == 2  # the hard cap of 3, less the parent's own call of review
    assert child.status == "failed"  # at 30 tokens of its 28: on_limit "fail", as the parent's budget says
    assert "max_total_tokens: 30 of 28" in child.summary["error"]


def test_a_childs_own_lower_limits_stay_and_an_unpriced_child_gets_no_cost_cap() -> None:
    budget = Budget(max_total_tokens=100, max_cost_usd=1.0)
    own = Limits(budget=Budget(max_total_tokens=5), max_tool_calls=1)
    agent = tree([answer("fine")], [REVIEW_CALL, answer("done")], child_tools=[], child={"limits": own})
    agent = Agent(agent.model, tools=agent.tools, limits=Limits(budget=budget), **PRICED)
    store = MemoryStore()

    result = Runner(agent, store).run("review")

    child = child_of(store, result.run_id)
    assert child.spec["budget"]["max_total_tokens"] == 5
    assert child.spec["budget"]["max_cost_usd"] is None  # its model has no price: its cost cannot count
    assert child.spec["max_tool_calls"] == 1


def test_a_priced_childs_cost_is_capped_by_the_parents_cost_left() -> None:
    budget = Budget(max_cost_usd=0.1)
    agent = tree(
        [answer("fine")],
        [costly(tool_use("toolu_review", "review", {"task": "a"})), answer("done")],
        child_tools=[],
        child=PRICED,
        limits=Limits(budget=budget),
        **PRICED,
    )
    store = MemoryStore()
    result = Runner(agent, store).run("review")
    assert child_of(store, result.run_id).spec["budget"]["max_cost_usd"] == pytest.approx(0.085)


def test_no_child_starts_when_the_parent_has_used_up_what_it_would_spend() -> None:
    budget = Budget(max_total_tokens=10)  # the parent's first turn alone spends 15
    agent = tree(
        [answer("never")],
        [costly(tool_use("toolu_review", "review", {"task": "a"})), answer("done")],
        child_tools=[],
        limits=Limits(budget=budget),
    )
    store = MemoryStore()
    result = Runner(agent, store).run("review")

    parent = Runner(agent, store).load(result.run_id)
    shown = parent.messages[2]["content"][0]
    assert shown["is_error"] is True
    assert shown["content"] == "Error: not run: the budget is used up (max_total_tokens: 15 of 10)"
    assert parent.children == {}
    assert len(store.list_runs()) == 1


# Deciding by any run of the chain -----------------------------------------------------------------
def test_a_grandchilds_call_is_decided_by_the_roots_id_and_the_root_drives_the_tree_to_its_end() -> None:
    published: list[str] = []

    @tool(approval=True)
    def publish(name: str) -> str:
        """Publish a draft: a person approves it."""
        published.append(name)
        return f"published {name}"

    checker = Agent(
        ScriptedModel([tool_use_turn(tool_use("toolu_pub", "publish", {"name": "a"})), answer("published")]),
        tools=[publish],
        name="checker",
    )
    check_call = tool_use_turn(tool_use("toolu_check", "check", {"task": "publish a"}))
    reviewer = Agent(
        ScriptedModel([check_call, answer("checked")]), tools=[checker.as_tool("check", "Check.")], name="reviewer"
    )
    writer = Agent(ScriptedModel([REVIEW_CALL, answer("reviewed")]), tools=[reviewer.as_tool("review", "Review.")])
    store = MemoryStore()
    parked = Runner(writer, store, approver=DecideLater()).run("write")

    child = child_run_id(parked.run_id, "toolu_review", 1)
    grandchild = child_run_id(child, "toolu_check", 1)
    assert [(p["run_id"], p["chain"]) for p in parked.pending_approvals] == [
        (grandchild, [parked.run_id, child, grandchild])
    ]
    decided = Runner(writer, store).decide(parked.run_id, "toolu_pub", Approve(actor="ann"))  # by the root's id
    assert decided.run_id == grandchild  # recorded where the call waits
    assert published == []

    done = Runner(writer, store, approver=DecideLater()).drive(parked.run_id)

    assert done.status == "done"
    assert published == ["a"]
    root = run_tree(store, parked.run_id)
    assert [(n.run_id, n.agent, n.status) for n in (root.children[0], root.children[0].children[0])] == [
        (child, "reviewer", "done"),
        (grandchild, "checker", "done"),
    ]
    assert store.list_due(1e12) == []
