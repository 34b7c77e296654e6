"""Handoffs: the model hands the conversation to another agent, a recorded step of the run.

``Agent(handoffs=[billing, Handoff(refunds, input_filter=without_tool_calls)])`` gives the model
one tool per handoff, ``transfer_to_<name>``. When the model calls one, the flow answers the call
(so the history stays valid) and records a :class:`~tether.facts.events.HandedOff` in the same
write. Once the turn's results go back, the other agent is in charge: its system prompt, tools,
policy and approval gates, model and limits drive every later step, on the history carried over
(through the handoff's ``input_filter``, if it has one, applied once before the next model call
and recorded as a ``history_compacted``, so a resume never runs it again).

The run records the agent in charge by name, so whoever drives it finds that agent among the run's
agents: its own agent and every agent its handoffs reach (:attr:`tether.Agent.reachable_agents`).
A handoff may name an agent instead of holding it (``Handoff("triage")``), which is how agents
hand back to one another: frozen agents cannot hold each other. A handoff naming no agent among
them, one past ``Limits.max_handoffs``, a second one in the same turn, or one to the agent already
in charge gets an ``is_error`` result the model can recover from.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from tether.agent import Agent, Handoff, HandoffTool, handoffs_of, named
from tether.core import engine
from tether.core.compat import check_compatible
from tether.core.flow import Extension, Flow, Flowing
from tether.core.state import RunState
from tether.errors import ConfigError, IncompatibleRun, InvalidHistory
from tether.facts.events import Fact, HandedOff, HistoryCompacted, ToolFinished
from tether.facts.history import Message, check_pairing
from tether.facts.status import RunStatus
from tether.tools import Tool

HANDED_OVER = "(The conversation was handed over to you: carry on from here.)"
"""Closes a filtered history that would otherwise end with the other agent's words."""


class Handoffs(Extension):
    """Handoffs: the driving agent changes (the flow's "a change of the driving agent")."""

    def agent_in_charge(self, root: Agent, state: RunState) -> Agent | None:
        """The agent the run was last handed to; None while its own agent is in charge."""
        return None if state.agent is None else named(root, state.agent, run_id=state.id)

    def check(self, root: Agent, state: RunState) -> None:
        """Refuse a run whose agent in charge cannot go on with the tools it was handed (:func:`check_handed_tools`)."""
        check_handed_tools(root, state)

    def step_due(self, flow: Flow, state: RunState, max_wait: float | None) -> Flowing[bool] | None:
        """The last handoff's ``input_filter``, applied once before the next model call."""
        return _apply_filter(flow, state) if filter_due(state) else None

    def serves(self, tool: Tool) -> bool:
        """Handoff tools' calls, which hand the run over instead of running anything."""
        return isinstance(tool, HandoffTool)

    def serve(self, flow: Flow, state: RunState, action: engine.RunTool, max_wait: float | None) -> Flowing[bool]:
        """Hand the run over (from the turn's end on), or answer why not."""
        return _hand_off(flow, state, action)


def in_charge(root: Agent, state: RunState) -> Agent:
    """The agent in charge of ``state``, a run of ``root``: ``root``, or the agent a handoff handed it to.

    Raises:
        IncompatibleRun: no agent ``root``'s handoffs reach has that name.
    """
    return root if state.agent is None else named(root, state.agent, run_id=state.id)


def check_handed_tools(root: Agent, state: RunState) -> None:
    """Raise :class:`IncompatibleRun` unless the agent the run was last handed to can go on with its tools.

    The run's spec holds the tools of the agent it started with (checked by
    :func:`tether.core.compat.check_compatible`); a handoff records those of the agent it hands to.
    """
    handed = state.last_handoff
    if handed is None or handed.tool_schemas is None:
        return
    agent = named(root, handed.to_agent, run_id=state.id)
    check_compatible(state.id, {"tool_schemas": handed.tool_schemas}, agent.tool_index, whose=f"agent {agent.name!r}")


def _hand_off(flow: Flow, state: RunState, action: engine.RunTool) -> Flowing[bool]:
    """Answer a call of a handoff tool: hand the run over (from the turn's end on), or say why not."""
    tool, call = action.tool, action.call
    assert isinstance(tool, HandoffTool)
    handoff = tool.target
    warnings = [warning for warning in action.warnings if warning not in action.execution_warnings]  # nothing runs
    refusal = _refusal(flow, state, handoff.target)
    if refusal is not None:
        finished = ToolFinished(call.call_id, tool.name, f"Error: not transferred: {refusal}", True)
        yield from flow.commit(state, engine.Step("tool_finished", [*warnings, finished]))
        return True
    note = f"Transferred to {handoff.target}: it takes the conversation over from here."
    filtered = handoff.input_filter is not None
    schemas = named(flow.root, handoff.target, run_id=state.id).tool_schemas()
    records: list[Fact] = [
        *warnings,
        ToolFinished(call.call_id, tool.name, note, False, allowed=action.allowed),
        HandedOff(flow.agent.name, handoff.target, call.call_id, tool.name, filtered=filtered, tool_schemas=schemas),
    ]
    yield from flow.commit(state, engine.Step("tool_finished", records))
    return True


def _refusal(flow: Flow, state: RunState, target: str) -> str | None:
    """Why this handoff cannot happen, in the model's words; None: it can."""
    if state.handing_to is not None:
        return f"this turn already hands the conversation over to {state.handing_to!r}"
    if target == flow.agent.name:
        return f"{target!r} is in charge already"
    limit = flow.agent.limits.max_handoffs
    if state.handoffs >= limit:
        return f"this run was handed off {state.handoffs} time(s) already (max_handoffs {limit}); carry on yourself"
    agents: Mapping[str, Agent] = flow.root.reachable_agents
    if target not in agents:
        known = ", ".join(repr(name) for name in agents if name != flow.agent.name) or "none"
        return f"no agent named {target!r} is among this run's agents (others: {known})"
    return None


def filter_due(state: RunState) -> bool:
    """Whether the last handoff's ``input_filter`` is still to be applied (the next model call waits for it)."""
    return state.filter_due and state.status == RunStatus.thinking


def _apply_filter(flow: Flow, state: RunState) -> Flowing[bool]:
    """Apply the last handoff's ``input_filter`` to the history, recorded as a ``history_compacted``.

    The filter's history is checked first (every ``tool_use`` answered, ending with the user): a
    filter that breaks it is a :class:`~tether.errors.ConfigError`, and nothing is recorded.
    """
    handoff = _last_handoff(flow, state)
    assert handoff.input_filter is not None  # filter_due says it has one
    messages = list(handoff.input_filter(copy.deepcopy(state.messages)))
    problem = "it is empty" if not messages else None
    if messages and messages[-1].get("role") != "user":
        problem = "it ends with the agent's words, not the user's"
    try:
        check_pairing(messages, run_id=state.id)
    except InvalidHistory as error:
        problem = problem or str(error)
    if problem is not None:
        raise ConfigError(
            f"the input_filter of handoff {handoff.target!r} gave run {state.id} a history the model cannot take "
            f"({problem}); nothing was recorded: fix the filter and resume the run"
        )
    removed = len(state.messages) - len(messages)
    step = engine.Step("compacted", [HistoryCompacted(f"handoff:{handoff.target}", messages, removed)])
    yield from flow.commit(state, step)
    return True


def _last_handoff(flow: Flow, state: RunState) -> Handoff:
    """The handoff that handed ``state`` to the agent now in charge (the handing agent's tool of that name)."""
    handed = state.last_handoff
    assert handed is not None  # filter_due is only set by one
    handing = flow.root if handed.from_agent is None else named(flow.root, handed.from_agent, run_id=state.id)
    for tool in handoffs_of(handing):
        if tool.name == handed.tool:
            return tool.target
    raise IncompatibleRun(
        f"run {state.id} was handed off with tool {handed.tool!r}, which agent {handed.from_agent!r} no longer has",
        run_id=state.id,
    )


# History filters --------------------------------------------------------------------------
KEPT_BLOCKS = frozenset({"text", "image", "document"})


def without_tool_calls(messages: list[Message]) -> list[Message]:
    """A history filter: the conversation's words only, without tool calls and their results.

    Messages left empty are dropped and neighbours of the same role joined, so roles still
    alternate; a history left ending with an assistant's words gets a short user note (the model
    goes on from a user's turn).
    """
    kept: list[Message] = []
    for message in messages:
        content = message["content"]
        blocks = (
            [{"type": "text", "text": content}]
            if isinstance(content, str)
            else [b for b in content if b.get("type") in KEPT_BLOCKS]
        )
        if not blocks:
            continue
        if kept and kept[-1]["role"] == message["role"]:
            kept[-1] = {"role": message["role"], "content": [*kept[-1]["content"], *blocks]}
        else:
            kept.append({"role": message["role"], "content": blocks})
    if kept and kept[-1]["role"] == "assistant":
        kept.append({"role": "user", "content": [{"type": "text", "text": HANDED_OVER}]})
    return kept


__all__ = ["HANDED_OVER", "Handoff", "Handoffs", "in_charge", "without_tool_calls"]
