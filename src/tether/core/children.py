"""Agents as tools: a call served by a child run, linked to its parent by (run, call, depth).

:meth:`tether.Agent.as_tool` makes an :class:`AgentTool`. When the model calls one, the flow
does not run a function: it commits the call's start with a :class:`~tether.facts.events.ChildStarted`
naming the child run, then yields :class:`~tether.core.flow.DriveRun`, which a driver performs by creating
that child (if it does not exist yet) and driving it like any run, with the child's own agent
(its tools, policy and limits), the same store and the same approver. The parent's call stays in
``executing_tool`` meanwhile. What the child gives back becomes the call's result:

- done: its typed result (as JSON) or its answer, an ordinary result;
- parked awaiting a person: the parent parks too (``approval_needed`` with a
  :class:`~tether.facts.events.ChildParked`), listing the child's calls with their chain; once they
  are decided (on the child, from any process), a drive of the parent drives the child to its end
  (``decided``, with a :class:`~tether.facts.events.ChildResumed`), then goes on;
- failed or cancelled: an ``is_error`` result under the tool's retry policy (a retry is a new
  child, for the next attempt).

The child's id is derived from (parent run, call, attempt), and an agent tool counts as
idempotent, so a crash anywhere resumes the same child: it is created at most once and its own
steps keep their exactly-once rules. Its spending rolls up into the parent's
(:class:`~tether.facts.events.ChildEnded`), where the parent's budget counts it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from tether.agent import Agent, AgentTool, named
from tether.core import budgets, engine
from tether.core.flow import DriveRun, Extension, Flow, Flowing, LoadRun, RunReport
from tether.core.links import agent_link, chain_of, depth_of, link_of
from tether.core.state import RunState
from tether.errors import ToolDefinitionError
from tether.facts.events import ChildEnded, ChildParked, ChildResumed, ChildStarted, ChildWaiting, ToolFinished
from tether.facts.status import RunStatus
from tether.policy.policies import Limits
from tether.policy.pricing import price_for
from tether.stores import RunRecord
from tether.tools import Tool


class ChildFailed(Exception):
    """The child run serving a call ended without an answer: the tool's retry policy decides what follows."""


def child_run_id(parent: str, call_id: str, attempt: int) -> str:
    """The id of the child serving ``attempt`` of ``call_id`` in ``parent``: the same in every process."""
    digest = hashlib.sha256(f"{parent}\0{call_id}\0{attempt}".encode(errors="surrogatepass")).hexdigest()
    return f"run_{digest[:20]}"


def child_agent(parent: Agent, link: dict[str, Any]) -> Agent:
    """The agent of the child run ``link`` names: the agent of the parent's agent tool it serves."""
    tool = parent.tool_index.get(str(link["tool"]))
    if not isinstance(tool, AgentTool):
        raise ToolDefinitionError(f"tool {link['tool']!r} is no agent tool of the parent's agent", tool=link["tool"])
    return tool.child_agent


class AgentTools(Extension):
    """Calls of an agent tool served by child runs (the flow's "a call that drives a sub-flow")."""

    def agent_of_run(self, flow: Flow, state: RunState, tenant: str | None) -> Flowing[Agent] | None:
        """A child run's agent, or a fork of one's: down the agent tools its chain of parents went through.

        A fork of a child run whose tools are ``flow``'s agent's (``tether resume`` builds the agent
        from the run's spec) is that agent's to drive.
        """
        if agent_link(state.spec) is None or (link_of(state.spec) is None and flow.fits(state)):
            return None
        return agent_of(flow.agent, state.spec, tenant)

    def step_due(self, flow: Flow, state: RunState, max_wait: float | None) -> Flowing[bool] | None:
        """A parent parked on its children: drive them on first (a decision may have freed one)."""
        if state.status == RunStatus.awaiting_approval and state.waiting_on:
            return _resume_parked(flow, state, max_wait)
        return None

    def serves(self, tool: Tool) -> bool:
        """Agent tools' calls, which child runs serve."""
        return isinstance(tool, AgentTool)

    def serve(self, flow: Flow, state: RunState, action: engine.RunTool, max_wait: float | None) -> Flowing[bool]:
        """Serve the call with its child run, as far as the child goes now (see :func:`_serve`)."""
        return _serve(flow, state, action, max_wait)


def agent_of(root: Agent, spec: dict[str, Any], tenant: str | None) -> Flowing[Agent]:
    """The agent a run in ``root``'s tree started with: down the agent tools its chain of parents went through.

    A parent handed off when it called the agent tool names the agent then in charge in the link.
    A fork of a child run is driven with the child's agent (see :func:`tether.core.links.agent_link`).
    """
    link = agent_link(spec)
    if link is None:
        return root
    parent: RunRecord = yield LoadRun(str(link["run_id"]), tenant)
    caller = yield from agent_of(root, parent.spec, tenant)
    if link.get("agent") is not None:
        caller = named(caller, str(link["agent"]), run_id=parent.id)
    return child_agent(caller, link)


def _serve(flow: Flow, state: RunState, action: engine.RunTool, max_wait: float | None) -> Flowing[bool]:
    """Serve a call of an agent tool with its child run, as far as the child goes now.

    False when the child stopped short of an end (parked until a retry is due): the call stays
    in flight and the next drive of the parent goes on with the same child.
    """
    tool, call = action.tool, action.call
    assert isinstance(tool, AgentTool)
    child = state.children.get(call.call_id)
    if child is not None and call.call_id in state.in_flight:
        action = replace(action, attempt=state.attempts[call.call_id])  # the attempt under way, resumed
    else:
        depth = depth_of(state.spec) + 1
        limit = flow.agent.limits.max_depth
        limited = _limited(flow, state, tool)
        why = None
        if depth > limit:
            why = f"agent tool {tool.name!r} would start a run at depth {depth} (max_depth {limit})"
        elif isinstance(limited, budgets.Reading):
            why = f"the budget is used up ({limited.describe()})"
        if why is not None:
            finished = ToolFinished(call.call_id, tool.name, f"Error: not run: {why}", True)
            yield from flow.commit(state, engine.Step("tool_finished", [finished]))
            return True
        child = child_run_id(state.id, call.call_id, action.attempt)
        started = ChildStarted(call.call_id, tool.name, child, action.attempt, depth)
        yield from flow.record(state, [*flow.start_of(state, action), started])
    began = flow.timer()
    report: RunReport = yield _drive(flow, state, call.call_id, tool, child, max_wait=max_wait)
    duration = flow.timer() - began
    if report.status == RunStatus.awaiting_approval.shown:
        chain = [*chain_of(state.id, state.spec), child]
        pending = [
            {**item, "run_id": item.get("run_id", child), "chain": item.get("chain", chain)}
            for item in report.pending_approvals
        ]
        parked = ChildParked(call.call_id, child, pending)
        yield from flow.commit(state, engine.Step("approval_needed", [parked]))
        return False
    if report.status not in (RunStatus.done.shown, RunStatus.failed.shown, RunStatus.cancelled.shown):
        due = report.next_due_at
        if due is not None and state.child_due.get(call.call_id) != due:  # the parent is due when the child is
            yield from flow.record(state, [ChildWaiting(call.call_id, child, due)])
        return False  # waiting for a retry (or moved on elsewhere): the call stays in flight
    ended = ChildEnded(call.call_id, child, report.status, report.usage, report.cost_usd, report.tool_calls)
    outcome: str | Exception
    if report.status == RunStatus.done.shown:
        result = report.result.model_dump(mode="json") if isinstance(report.result, BaseModel) else report.result
        outcome = report.output or "" if result is None else json.dumps(result, ensure_ascii=False)
    else:
        outcome = ChildFailed(f"child run {child} ended {report.status}: {report.error or 'no reason given'}")
    step = flow.outcome_step(action, outcome, duration)
    step.records.insert(0, ended)
    yield from flow.finish(state, action, step, outcome)
    return True


def _resume_parked(flow: Flow, state: RunState, max_wait: float | None) -> Flowing[bool]:
    """A parent parked on its children: drive each on (a decision may have freed it); False while one still waits."""
    moved = False
    for call_id, child in list(state.waiting_on.items()):
        call = state.call(call_id)
        tool = flow.agent.tool_index.get(call.tool) if call is not None else None
        if not isinstance(tool, AgentTool):
            continue  # the engine's compatibility check refuses such a run before this
        report: RunReport = yield _drive(flow, state, call_id, tool, child, max_wait=max_wait)
        if report.status == RunStatus.awaiting_approval.shown:
            continue
        yield from flow.commit(state, engine.Step("decided", [ChildResumed(call_id, child)]))
        moved = True
    return moved


def _drive(
    flow: Flow, state: RunState, call_id: str, tool: AgentTool, child: str, *, max_wait: float | None
) -> DriveRun:
    call = state.call(call_id)
    arguments = tool.validate(state.input_to_run(call) if call is not None else {})
    link = {
        "run_id": state.id,
        "call_id": call_id,
        "tool": tool.name,
        "depth": depth_of(state.spec) + 1,
        "chain": chain_of(state.id, state.spec),
    }
    if state.agent is not None:  # the caller was handed off: its agent tool is that agent's
        link["agent"] = state.agent
    limited = _limited(flow, state, tool)
    agent = tool.child_agent if isinstance(limited, budgets.Reading) else limited  # started before they shrank
    return DriveRun(agent, child, str(getattr(arguments, "task", "")), link, state.tenant, max_wait)


def _limited(flow: Flow, state: RunState, tool: AgentTool) -> Agent | budgets.Reading:
    """The child's agent with its limits capped by what the parent has left, or the parent's limit used up.

    The parent spends nothing while its child runs, so every drive of the child computes the same caps.
    """
    agent = tool.child_agent
    priced = price_for(agent.model_name, agent.prices) is not None
    limits = budgets.child_limits(flow.agent, state, agent.limits, now=flow.clock(), priced=priced)
    return agent.with_limits(limits) if isinstance(limits, Limits) else limits


__all__ = ["AgentTool", "AgentTools", "ChildFailed", "agent_of", "child_agent", "child_run_id"]
