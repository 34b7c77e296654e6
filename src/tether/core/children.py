"""Agents as tools: a call served by a child run, linked to its parent by (run, call, depth).

:meth:`tether.Agent.as_tool` makes an :class:`AgentTool`. When the model calls one, the flow
does not run a function: it commits the call's start with a :class:`~tether.core.events.ChildStarted`
naming the child run, then yields :class:`DriveChild`, which a driver performs by creating
that child (if it does not exist yet) and driving it like any run, with the child's own agent
(its tools, policy and limits), the same store and the same approver. The parent's call stays in
``executingTool`` meanwhile. What the child gives back becomes the call's result:

- done: its typed result (as JSON) or its answer, an ordinary result;
- parked awaiting a person: the parent parks too (``approval_needed`` with a
  :class:`~tether.core.events.ChildParked`), listing the child's calls with their chain; once they
  are decided (on the child, from any process), a drive of the parent drives the child to its end
  (``decided``, with a :class:`~tether.core.events.ChildResumed`), then goes on;
- failed or cancelled: an ``is_error`` result under the tool's retry policy (a retry is a new
  child, for the next attempt).

The child's id is derived from (parent run, call, attempt), and an agent tool counts as
idempotent, so a crash anywhere resumes the same child: it is created at most once and its own
steps keep their exactly-once rules. Its spending rolls up into the parent's
(:class:`~tether.core.events.ChildEnded`), where the parent's budget counts it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from tether.core import engine
from tether.core.events import ChildEnded, ChildParked, ChildResumed, ChildStarted, ChildWaiting, ToolFinished
from tether.core.state import RunState
from tether.core.status import RunStatus
from tether.errors import ToolDefinitionError
from tether.models import Usage
from tether.policy import budgets
from tether.policy.policies import ApprovalSetting, Limits, RetryPolicy
from tether.policy.pricing import price_for
from tether.stores import PARENT_KEY
from tether.tools import Tool, make_tool

if TYPE_CHECKING:
    from tether.agent import Agent
    from tether.core.flow import Flow, Flowing


class ChildFailed(Exception):
    """The child run serving a call ended without an answer: the tool's retry policy decides what follows."""


@dataclass(frozen=True)
class AgentTool(Tool):
    """A tool whose calls are served by child runs of ``agent`` (see :meth:`tether.Agent.as_tool`)."""

    agent: Agent | None = None
    """The agent each call starts a child run of (never None once made by :func:`agent_tool`)."""

    @property
    def child_agent(self) -> Agent:
        """The child's agent."""
        assert self.agent is not None  # agent_tool always sets it
        return self.agent

    def settings(self) -> dict[str, Any]:
        """The tool's settings, and whose child runs serve its calls (``tether diagram --run`` says so)."""
        return {**super().settings(), "agent": self.child_agent.name or self.name}


def agent_tool(
    agent: Agent, name: str, description: str, *, approval: ApprovalSetting = False, retry: RetryPolicy | None = None
) -> AgentTool:
    """A tool that hands ``task`` to ``agent`` in a child run (what :meth:`tether.Agent.as_tool` returns)."""

    def delegate(task: str) -> str:
        """Never called: a driver serves the call with a child run."""
        raise ToolDefinitionError(
            f"tool {name!r} runs agent {agent.name or name!r} as a child run: drive its caller with a Runner",
            tool=name,
        )

    base = make_tool(delegate, name=name, description=description, approval=approval, retry=retry, concurrent=False)
    settings = {field.name: getattr(base, field.name) for field in fields(Tool)}
    # idempotent: a resumed call finds its child by id and drives it on; nothing runs twice
    return AgentTool(**{**settings, "idempotent": True}, agent=agent)


@dataclass(frozen=True)
class DriveChild:
    """Create the child run (unless it exists) and drive it as far as it goes; gives back its :class:`ChildReport`.

    The child is created with ``prompt``, ``link`` as its spec's ``parent`` entry and the id
    ``run_id``; it is driven with ``agent``, this driver's store and approver.
    """

    agent: Agent
    run_id: str
    prompt: str
    link: dict[str, Any]
    tenant: str | None
    max_wait: float | None


class ChildReport(Protocol):
    """Where a child stands after a drive (a :class:`tether.RunResult`)."""

    @property
    def status(self) -> str: ...  # noqa: D102 - the fields of RunResult
    @property
    def output(self) -> str | None: ...  # noqa: D102
    @property
    def result(self) -> Any: ...  # noqa: D102
    @property
    def error(self) -> str | None: ...  # noqa: D102
    @property
    def usage(self) -> Usage: ...  # noqa: D102
    @property
    def cost_usd(self) -> float | None: ...  # noqa: D102
    @property
    def tool_calls(self) -> int: ...  # noqa: D102
    @property
    def pending_approvals(self) -> list[dict[str, Any]]: ...  # noqa: D102
    @property
    def next_due_at(self) -> float | None: ...  # noqa: D102


def child_run_id(parent: str, call_id: str, attempt: int) -> str:
    """The id of the child serving ``attempt`` of ``call_id`` in ``parent``: the same in every process."""
    digest = hashlib.sha256(f"{parent}\0{call_id}\0{attempt}".encode(errors="surrogatepass")).hexdigest()
    return f"run_{digest[:20]}"


def link_of(spec: dict[str, Any]) -> dict[str, Any] | None:
    """A run's link to its parent (``run_id``, ``call_id``, ``tool``, ``depth``, ``chain``), or None for a root run."""
    link = spec.get(PARENT_KEY)
    return link if isinstance(link, dict) else None


def parent_of(spec: dict[str, Any]) -> str | None:
    """The id of the run a child run serves; None for a root run."""
    link = link_of(spec)
    return str(link["run_id"]) if link is not None else None


def depth_of(spec: dict[str, Any]) -> int:
    """A run's depth in its tree (a root run is 0)."""
    link = link_of(spec)
    return int(link["depth"]) if link is not None else 0


def chain_of(run_id: str, spec: dict[str, Any]) -> list[str]:
    """The run ids from the root of ``run_id``'s tree down to it."""
    link = link_of(spec)
    return [*(link.get("chain") or []), run_id] if link is not None else [run_id]


def pending_below(state: RunState, call_id: str) -> str | None:
    """The run below ``state`` (a child, or deeper) where ``call_id`` waits for a decision; None if not below.

    ``state``'s own call of that id comes first: call ids are the models', and two runs' may meet.
    """
    if state.call(call_id) is not None:
        return None
    return next((str(item["run_id"]) for item in state.child_pending if item.get("call_id") == call_id), None)


def child_agent(parent: Agent, link: dict[str, Any]) -> Agent:
    """The agent of the child run ``link`` names: the agent of the parent's agent tool it serves."""
    tool = parent.tool_index.get(str(link["tool"]))
    if not isinstance(tool, AgentTool):
        raise ToolDefinitionError(f"tool {link['tool']!r} is no agent tool of the parent's agent", tool=link["tool"])
    return tool.child_agent


# The flow's side --------------------------------------------------------------------------
def run_child(flow: Flow, state: RunState, action: engine.RunTool, max_wait: float | None) -> Flowing[bool]:
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
        yield from flow._record(state, [*flow._start_of(state, action), started])
    began = flow.timer()
    report: ChildReport = yield _drive(flow, state, call.call_id, tool, child, max_wait=max_wait)
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
            yield from flow._record(state, [ChildWaiting(call.call_id, child, due)])
        return False  # waiting for a retry (or moved on elsewhere): the call stays in flight
    ended = ChildEnded(call.call_id, child, report.status, report.usage, report.cost_usd, report.tool_calls)
    outcome: str | Exception
    if report.status == RunStatus.done.shown:
        result = report.result.model_dump(mode="json") if isinstance(report.result, BaseModel) else report.result
        outcome = report.output or "" if result is None else json.dumps(result, ensure_ascii=False)
    else:
        outcome = ChildFailed(f"child run {child} ended {report.status}: {report.error or 'no reason given'}")
    step = flow._outcome_step(action, outcome, duration)
    step.records.insert(0, ended)
    yield from flow._finish(state, action, step, outcome)
    return True


def resume_parked(flow: Flow, state: RunState, max_wait: float | None) -> Flowing[bool]:
    """A parent parked on its children: drive each on (a decision may have freed it); False while one still waits."""
    moved = False
    for call_id, child in list(state.waiting_on.items()):
        call = state.call(call_id)
        tool = flow.agent.tool_index.get(call.tool) if call is not None else None
        if not isinstance(tool, AgentTool):
            continue  # the engine's compatibility check refuses such a run before this
        report: ChildReport = yield _drive(flow, state, call_id, tool, child, max_wait=max_wait)
        if report.status == RunStatus.awaiting_approval.shown:
            continue
        yield from flow.commit(state, engine.Step("decided", [ChildResumed(call_id, child)]))
        moved = True
    return moved


def _drive(
    flow: Flow, state: RunState, call_id: str, tool: AgentTool, child: str, *, max_wait: float | None
) -> DriveChild:
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
    return DriveChild(agent, child, str(getattr(arguments, "task", "")), link, state.tenant, max_wait)


def _limited(flow: Flow, state: RunState, tool: AgentTool) -> Agent | budgets.Reading:
    """The child's agent with its limits capped by what the parent has left, or the parent's limit used up.

    The parent spends nothing while its child runs, so every drive of the child computes the same caps.
    """
    agent = tool.child_agent
    priced = price_for(agent.model_name, agent.prices) is not None
    limits = budgets.child_limits(flow.agent, state, agent.limits, now=flow.clock(), priced=priced)
    return agent.with_limits(limits) if isinstance(limits, Limits) else limits
