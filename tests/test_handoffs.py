"""Handoffs: the model hands the run to another agent, whose prompt, tools, policy and model then apply."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, ConfigError, Handoff, Runner, tool
from tether.core.approvals import DecideLater
from tether.core.handoffs import without_tool_calls
from tether.errors import IncompatibleRun
from tether.facts.events import HandedOff, HistoryCompacted
from tether.facts.history import check_pairing, tool_uses
from tether.policy.policies import Limits
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel
from tether.views import audit, diagram

EFFECTS: list[str] = []


@tool
def look_up_order(order: str) -> str:
    """Find an order (triage may)."""
    EFFECTS.append(f"look up {order}")
    return f"order {order}: paid twice"


@tool(approval=True)
def refund(order: str) -> str:
    """Refund an order (billing may; a person decides)."""
    EFFECTS.append(f"refund {order}")
    return f"refunded {order}"


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()


def answer(text: str) -> dict[str, Any]:
    return model_reply([{"type": "text", "text": text}], "end_turn")


TRANSFER = tool_use_turn(tool_use("toolu_t1", "transfer_to_billing", {}))


def team(script: list[Any], **options: Any) -> tuple[Agent, Agent]:
    """Triage (looks orders up, hands to billing) and billing (refunds, gated); both play ``script``
    (a scripted model answers by the run's invocation, so each plays its own turns of it)."""
    billing = Agent(
        ScriptedModel(script, name="billing-model"),
        tools=[refund],
        system="You are billing.",
        name="billing",
        model_name="billing-model",
        handoffs=[Handoff("triage")],
    )
    triage = Agent(
        ScriptedModel(script, name="triage-model"),
        tools=[look_up_order],
        system="You are triage.",
        name="triage",
        handoffs=[Handoff(billing, **options)],
    )
    return triage, billing


def requests(agent: Agent) -> list[Any]:
    assert isinstance(agent.model, ScriptedModel)
    return agent.model.requests


def handoffs_of(runner: Runner, run_id: str) -> list[HandedOff]:
    return [event.fact for event in runner.store.load_events(run_id) if isinstance(event.fact, HandedOff)]


def test_a_handoff_is_recorded_and_the_other_agent_answers_from_then_on() -> None:
    triage, billing = team([TRANSFER, answer("Billing here: I can refund that.")])
    runner = Runner(triage, MemoryStore())

    result = runner.run("I was charged twice")

    assert result.status == "done"
    assert result.output == "Billing here: I can refund that."
    assert [len(requests(triage)), len(requests(billing))] == [1, 1]
    sent = requests(billing)[0]
    assert sent.system == "You are billing."
    assert sent.model == "billing-model"
    assert [item["name"] for item in sent.tools] == ["refund", "transfer_to_triage"]
    assert [item["name"] for item in requests(triage)[0].tools] == ["look_up_order", "transfer_to_billing"]
    [handed] = handoffs_of(runner, result.run_id)
    assert replace(handed, tool_schemas=None) == HandedOff("triage", "billing", "toolu_t1", "transfer_to_billing")
    assert handed.tool_schemas == {tool.name: tool.input_schema() for tool in billing.all_tools}
    state = runner.load(result.run_id)
    assert state.agent == "billing"
    check_pairing(sent.messages, run_id=result.run_id)  # the transfer call has its result: valid history
    (result_block,) = sent.messages[-1]["content"]
    assert result_block["tool_use_id"] == "toolu_t1"
    assert result_block["content"].startswith("Transferred to billing")
    assert not result_block.get("is_error")


def test_the_agent_taken_over_has_its_own_tools_and_gates() -> None:
    script = [
        TRANSFER,
        tool_use_turn(tool_use("toolu_l", "look_up_order", {"order": "o1"})),  # triage's tool, not billing's
        tool_use_turn(tool_use("toolu_r", "refund", {"order": "o1"})),  # billing's, gated
        answer("Refunded."),
    ]
    triage, _ = team(script)
    store = MemoryStore()

    parked = Runner(triage, store, approver=DecideLater()).run("I was charged twice")

    assert parked.status == "awaiting_approval"
    assert [(p["call_id"], p["tool"]) for p in parked.pending_approvals] == [("toolu_r", "refund")]
    lookup = Runner(triage, store).load(parked.run_id).messages[4]["content"][0]
    assert lookup["is_error"] is True
    assert "unknown tool 'look_up_order'" in lookup["content"]
    assert EFFECTS == []

    fresh, fresh_billing = team(script)  # another process: new agents, the same team
    Runner(fresh, store).decide(parked.run_id, "toolu_r", Approve(actor="ann"))
    done = Runner(fresh, store, approver=DecideLater()).drive(parked.run_id)

    assert done.status == "done"
    assert EFFECTS == ["refund o1"]
    assert len(requests(fresh)) == 0
    assert len(requests(fresh_billing)) == 1


def stepped_past_the_handoff(store: MemoryStore, script: list[Any]) -> str:
    """A run stopped right after its handoff was committed (as a process killed then would leave it)."""
    triage, _ = team(script)
    runner = Runner(triage, store)
    state = runner.create("I was charged twice")
    with runner.hold(state.id):
        assert runner.step(state)  # triage's turn: the transfer call
        assert runner.step(state)  # the handoff, answered and recorded
    assert state.agent == "billing"
    return state.id


@pytest.mark.parametrize("shell", ["Runner", "AsyncRunner"])
def test_a_fresh_runner_resumes_a_handed_off_run_with_the_agent_taken_over(shell: str) -> None:
    script = [TRANSFER, answer("Billing here.")]
    store = MemoryStore()
    run_id = stepped_past_the_handoff(store, script)

    triage, billing = team(script)  # another process: new agents, the same team
    if shell == "Runner":
        result = Runner(triage, store).drive(run_id)
    else:
        result = asyncio.run(AsyncRunner(triage, store).drive(run_id))

    assert result.status == "done"
    assert result.output == "Billing here."
    assert [len(requests(triage)), len(requests(billing))] == [0, 1]


def test_resuming_with_an_agent_that_cannot_reach_the_one_in_charge_is_refused_clearly() -> None:
    script = [TRANSFER, answer("Billing here.")]
    store = MemoryStore()
    run_id = stepped_past_the_handoff(store, script)
    alone = Agent(ScriptedModel(script), tools=[look_up_order], name="triage", handoffs=[Handoff("billing")])

    with pytest.raises(IncompatibleRun, match=r"handed off to agent 'billing'.*cannot reach"):
        Runner(alone, store).drive(run_id)

    assert Runner(alone, store).load(run_id).status == "thinking"  # nothing was recorded


def test_resuming_with_the_taken_over_agent_s_tools_changed_incompatibly_is_refused() -> None:
    """The run's spec checks the agent it started with; the handoff records the tools of the one it hands to."""
    script = [TRANSFER, answer("Billing here.")]
    store = MemoryStore()
    run_id = stepped_past_the_handoff(store, script)
    [handed] = handoffs_of(Runner(team(script)[0], store), run_id)
    assert handed.tool_schemas is not None
    assert set(handed.tool_schemas) == {"refund", "transfer_to_triage"}

    @tool(name="refund", approval=True)
    def refund_in_part(order: str, amount: int) -> str:
        """Refund part of an order (a required field more than the run's billing had)."""
        return f"refunded {amount} of {order}"

    billing = Agent(ScriptedModel(script), tools=[refund_in_part], name="billing", handoffs=[Handoff("triage")])
    triage = Agent(ScriptedModel(script), tools=[look_up_order], name="triage", handoffs=[Handoff(billing)])
    with pytest.raises(IncompatibleRun, match=r"cannot be resumed with agent 'billing': tool 'refund'.*amount"):
        Runner(triage, store).drive(run_id)
    assert EFFECTS == []
    assert Runner(team(script)[0], store).drive(run_id).status == "done"  # the team as it was goes on


def test_an_agent_at_its_tool_call_limit_may_still_hand_off() -> None:
    """A handoff runs nothing and is not counted as a tool execution, so max_tool_calls does not stop it."""
    script = [
        tool_use_turn(tool_use("toolu_l", "look_up_order", {"order": "o1"})),
        TRANSFER,
        answer("Billing here."),
    ]
    triage, _ = team(script)
    limited = Agent(
        triage.model, tools=triage.tools, name="triage", handoffs=triage.handoffs, limits=Limits(max_tool_calls=1)
    )

    result = Runner(limited, MemoryStore()).run("I was charged twice")

    assert result.status == "done", result.error
    assert result.output == "Billing here."
    assert result.tool_calls == 1
    assert EFFECTS == ["look up o1"]


def test_a_handoff_to_no_agent_of_the_run_is_an_error_the_model_recovers_from() -> None:
    lost = Agent(ScriptedModel([]), name="nobody-reached")
    script = [
        tool_use_turn(tool_use("toolu_x", "transfer_to_legal", {})),
        tool_use_turn(tool_use("toolu_y", "transfer_to_sales", {})),
        answer("I will handle it myself."),
    ]
    triage = Agent(
        ScriptedModel(script),
        tools=[look_up_order],
        name="triage",
        handoffs=[Handoff("legal"), Handoff(lost, tool_name="transfer_to_sales_desk")],
    )
    runner = Runner(triage, MemoryStore())

    result = runner.run("help")

    assert result.status == "done"
    messages = runner.load(result.run_id).messages
    unknown_target, unknown_tool = messages[2]["content"][0], messages[4]["content"][0]
    assert unknown_target["is_error"] is True
    assert "not transferred: no agent named 'legal'" in unknown_target["content"]
    assert unknown_tool["is_error"] is True
    assert "unknown tool 'transfer_to_sales'" in unknown_tool["content"]
    assert handoffs_of(runner, result.run_id) == []


def test_agents_may_hand_back_and_forth_but_max_handoffs_bounds_it() -> None:
    back = tool_use_turn(tool_use("toolu_b", "transfer_to_triage", {}))
    again = tool_use_turn(tool_use("toolu_a", "transfer_to_billing", {}))
    triage, billing = team([TRANSFER, back, again, answer("triage again")])
    triage = Agent(
        triage.model, tools=triage.tools, name="triage", handoffs=triage.handoffs, limits=Limits(max_handoffs=2)
    )
    runner = Runner(triage, MemoryStore())

    result = runner.run("ping pong")

    assert result.status == "done"
    assert [(h.from_agent, h.to_agent) for h in handoffs_of(runner, result.run_id)] == [
        ("triage", "billing"),
        ("billing", "triage"),
    ]
    state = runner.load(result.run_id)
    assert state.agent == "triage"
    refused = state.messages[-2]["content"][0]
    assert refused["is_error"] is True
    assert "max_handoffs 2" in refused["content"]
    assert [len(requests(triage)), len(requests(billing))] == [3, 1]


def test_the_other_calls_of_the_handing_turn_are_the_handing_agents_and_one_handoff_a_turn() -> None:
    turn = tool_use_turn(
        tool_use("toolu_t1", "transfer_to_billing", {}),
        tool_use("toolu_l", "look_up_order", {"order": "o1"}),
        tool_use("toolu_t2", "transfer_to_billing", {}),
    )
    triage, billing = team([turn, answer("Billing here.")])
    runner = Runner(triage, MemoryStore())

    result = runner.run("charged twice")

    assert result.status == "done"
    assert EFFECTS == ["look up o1"]  # still triage's turn: its tool ran
    sent = requests(billing)[0].messages[-1]["content"]
    assert [(block["tool_use_id"], bool(block.get("is_error"))) for block in sent] == [
        ("toolu_t1", False),
        ("toolu_l", False),
        ("toolu_t2", True),
    ]
    assert "already hands the conversation over to 'billing'" in sent[2]["content"]
    assert len(handoffs_of(runner, result.run_id)) == 1


def test_an_input_filter_gives_the_other_agent_a_filtered_history_applied_once() -> None:
    applied: list[int] = []

    def words_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        applied.append(len(messages))
        return without_tool_calls(messages)

    script = [
        tool_use_turn(tool_use("toolu_l", "look_up_order", {"order": "o1"})),
        model_reply(
            [{"type": "text", "text": "Passing you on."}, tool_use("toolu_t1", "transfer_to_billing", {})], "tool_use"
        ),
        answer("Billing here."),
    ]
    store = MemoryStore()
    triage, _ = team(script, input_filter=words_only)
    runner = Runner(triage, store)
    state = runner.create("I was charged twice")
    with runner.hold(state.id):
        for _ in range(5):  # two turns, the look-up, the handoff, the filter
            runner.step(state)

    fresh, fresh_billing = team(script, input_filter=words_only)
    result = Runner(fresh, store).drive(state.id)

    assert result.status == "done"
    assert applied == [5]  # once, before billing's first call; not again on resume
    (sent,) = requests(fresh_billing)
    assert sent.messages == [
        {"role": "user", "content": [{"type": "text", "text": "I was charged twice"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Passing you on."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "(The conversation was handed over to you: carry on from here.)"}],
        },
    ]
    compacted = [e.fact for e in store.load_events(state.id) if isinstance(e.fact, HistoryCompacted)]
    assert [(c.processor, c.removed) for c in compacted] == [("handoff:billing", 2)]
    assert not any(tool_uses(message) for message in sent.messages)


def test_a_filter_that_breaks_the_history_is_refused_and_nothing_is_recorded() -> None:
    def broken(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return messages[:-1]  # drops the transfer's result: a tool_use left unanswered

    triage, _ = team([TRANSFER, answer("never")], input_filter=broken)
    runner = Runner(triage, MemoryStore())
    state = runner.create("help")

    with pytest.raises(ConfigError, match=r"input_filter of handoff 'billing'.*nothing was recorded"):
        runner.drive(state.id)

    assert runner.load(state.id).filter_due is True  # fixed filter, resume: it is applied then


def test_a_handoff_needs_a_named_agent_and_a_free_tool_name() -> None:
    with pytest.raises(ConfigError, match="needs a name"):
        Agent(ScriptedModel([]), handoffs=[Agent(ScriptedModel([]))])

    @tool(name="transfer_to_billing")
    def clash() -> str:
        """Not a handoff."""
        return "x"

    with pytest.raises(ConfigError, match="already named 'transfer_to_billing'"):
        Agent(ScriptedModel([]), tools=[clash], handoffs=["billing"])


def test_the_audit_names_the_agent_of_each_call() -> None:
    script = [
        tool_use_turn(tool_use("toolu_l", "look_up_order", {"order": "o1"})),
        TRANSFER,
        tool_use_turn(tool_use("toolu_r", "refund", {"order": "o1"})),
        answer("Refunded."),
    ]
    triage, _ = team(script)
    store = MemoryStore()
    result = Runner(triage, store, approver=DecideLater()).run("charged twice")

    found = audit.query(store, run_id=result.run_id)

    assert [(entry.agent, entry.tool) for entry in found] == [
        ("triage", "look_up_order"),
        ("triage", "transfer_to_billing"),
        ("billing", "refund"),
    ]


def test_a_child_run_started_after_a_handoff_is_decided_with_the_right_agents_from_another_process() -> None:
    def tree(script: list[Any], child_script: list[Any]) -> Agent:
        checker = Agent(ScriptedModel(child_script), tools=[refund], name="checker")
        billing = Agent(ScriptedModel(script), tools=[checker.as_tool("check", "Have it checked.")], name="billing")
        return Agent(ScriptedModel(script), tools=[look_up_order], name="triage", handoffs=[billing])

    script = [TRANSFER, tool_use_turn(tool_use("toolu_c", "check", {"task": "refund o1"})), answer("All sorted.")]
    child_script = [tool_use_turn(tool_use("toolu_r", "refund", {"order": "o1"})), answer("refunded")]
    store = MemoryStore()
    parked = Runner(tree(script, child_script), store, approver=DecideLater()).run("charged twice")
    assert parked.status == "awaiting_approval"
    (waiting,) = parked.pending_approvals

    elsewhere = tree(script, child_script)  # the child's agent is found through billing, the agent in charge
    Runner(elsewhere, store).decide(waiting["run_id"], "toolu_r", Approve(actor="ann"))
    done = Runner(elsewhere, store, approver=DecideLater()).drive(parked.run_id)

    assert done.status == "done"
    assert EFFECTS == ["refund o1"]
    child = audit.query(store, run_id=waiting["run_id"])
    assert [(entry.agent, entry.tool) for entry in child] == [("checker", "refund")]


def test_a_conversation_continued_after_a_handoff_goes_on_with_the_agent_in_charge() -> None:
    store = MemoryStore()
    first = Runner(team([TRANSFER, answer("Billing here.")])[0], store).run("I was charged twice")
    triage, billing = team([answer("Billing again.")])
    runner = Runner(triage, store)

    second = runner.run("And the other order?", continue_from=first.run_id)

    assert second.output == "Billing again."
    assert [len(requests(triage)), len(requests(billing))] == [0, 1]
    assert runner.load(second.run_id).spec["handed_to"] == "billing"


def test_the_sequence_diagram_notes_the_handoff() -> None:
    triage, _ = team([TRANSFER, answer("Billing here.")])
    runner = Runner(triage, MemoryStore())
    result = runner.run("charged twice")

    drawn = diagram.render_sequence(diagram.timeline(runner.store.load_events(result.run_id)))

    assert "Note over Model: handed off: triage → billing" in drawn


def test_show_and_the_tree_name_the_agent_in_charge_and_whom_it_took_over_from(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from tether.stores.sql import SQLStore
    from tether.surfaces.cli import main
    from tether.views.tree import run_tree

    transfer = tool_use_turn(tool_use("toolu_t1", "transfer_to_billing", {}))
    billing = Agent(
        ScriptedModel([model_reply([{"type": "text", "text": "billing here"}], "end_turn")]), name="billing"
    )
    triage = Agent(ScriptedModel([transfer]), name="triage", handoffs=[Handoff(billing)])
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SQLStore(db)
    try:
        run_id = Runner(triage, store).run("I was charged twice").run_id
        tree = run_tree(store, run_id)
    finally:
        store.close()

    assert (tree.agent, tree.handed_off_from) == ("billing", "triage")
    assert main(["show", run_id, "--db", db]) == 0
    assert "agent in charge: billing (handed off from triage)" in capsys.readouterr().out
    assert main(["show", run_id, "--json", "--db", db]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["agent"], shown["handed_off_from"]) == ("billing", "triage")


def test_an_agents_team_is_every_agent_a_run_of_it_may_drive_each_once() -> None:
    """Handed to, or called as a tool (a child run); a handoff back by name adds no one."""
    reviewer = Agent(ScriptedModel([]), name="reviewer")
    review = reviewer.as_tool("review", "Review.")
    billing = Agent(ScriptedModel([]), name="billing", handoffs=["support"], tools=[review])
    ask = billing.as_tool("ask", "Ask billing.")
    support = Agent(ScriptedModel([]), name="support", handoffs=[billing], tools=[ask])
    assert [agent.name for agent in support.team] == ["support", "billing", "reviewer"]


class ClosableModel(ScriptedModel):
    """Records its closes, as an SDK adapter's sync and async clients would be let go."""

    def __init__(self, closed: list[str], name: str) -> None:
        super().__init__([])
        self.closed, self.label = closed, name

    def close(self) -> None:
        self.closed.append(f"{self.label} sync")

    async def aclose(self) -> None:
        self.closed.append(f"{self.label} async")


async def test_closing_an_agent_closes_each_model_of_its_team_once() -> None:
    closed: list[str] = []
    shared = ClosableModel(closed, "shared")
    reviewer = Agent(shared, name="reviewer")
    billing = Agent(shared, name="billing", tools=[reviewer.as_tool("review", "Review.")])
    support = Agent(ClosableModel(closed, "support"), name="support", handoffs=[billing])

    support.close()
    assert closed == ["support sync", "shared sync"]
    closed.clear()
    await support.aclose()
    assert closed == ["support sync", "shared sync", "support async", "shared async"]


class AsyncCloseModel(ScriptedModel):
    """A user's model whose only closer is ``async def close``, as some async SDK clients have it."""

    def __init__(self, closed: list[str]) -> None:
        super().__init__([])
        self.closed = closed

    async def close(self) -> None:
        self.closed.append("awaited")


async def test_aclose_awaits_a_close_that_is_a_coroutine_function_and_close_leaves_it() -> None:
    closed: list[str] = []
    agent = Agent(AsyncCloseModel(closed), name="async")
    agent.close()
    assert closed == []
    await agent.aclose()
    assert closed == ["awaited"]
