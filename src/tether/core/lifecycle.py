"""A run's life outside a drive, as flows: created, read back, decided on, cancelled.

Like a drive (:meth:`tether.core.flow.Flow.drive`), each is a generator that yields effects
(read the log, create the run, persist a step) and decides nothing by I/O, so
:class:`~tether.drivers.runner.Runner` performs them with plain calls and
:class:`~tether.drivers.runner.AsyncRunner` awaits them: one logic, two shells.
"""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from tether.core import children, engine
from tether.core.approvals import Decision, Deny
from tether.core.compat import check_versions
from tether.core.flow import CreateRun, Flow, Flowing, LoadLog, LoadRun, Notify
from tether.core.history import append_user_text, close_unanswered
from tether.core.machine import MACHINE_VERSION
from tether.core.state import RunState
from tether.core.status import ENDED, RunStatus, status_name
from tether.errors import RunEnded, RunNotFound
from tether.stores import SCHEMA_VERSION, RunLog, RunRecord

if TYPE_CHECKING:
    from tether.agent import Agent


def read(run_id: str, tenant: str | None) -> Flowing[RunState]:
    """The run rebuilt from its events, read with its version in one consistent read (no agent needed)."""
    log: RunLog = yield LoadLog(run_id, tenant)
    return RunState.rebuild(run_id, log.events, version=log.version, tenant=log.tenant)


def create(
    flow: Flow,
    prompt: str,
    *,
    continue_from: str | None,
    tenant: str | None,
    run_id: str | None,
    parent: dict[str, Any] | None = None,
) -> Flowing[RunState]:
    """Persist a new run of ``flow``'s agent (its prompt, spec and any earlier history) without driving it.

    ``parent``: a child run's link to the run and call it serves (see :mod:`tether.core.children`).
    """
    agent = flow.agent
    messages: list[dict[str, Any]] = []
    spec = {
        **agent.recorded_spec,
        "model": agent.model_name,
        "model_settings": agent.settings.to_dict() or None,
        "max_steps": agent.limits.max_steps,
        "max_tool_calls": agent.limits.max_tool_calls,
        "budget": budget.to_dict() if (budget := agent.limits.budget) is not None else None,
        "machine_version": MACHINE_VERSION,
        "schema_version": SCHEMA_VERSION,
        "tool_schemas": {tool.name: tool.input_schema() for tool in agent.all_tools},
        "tool_settings": {tool.name: tool.settings() for tool in agent.all_tools},
    }
    if parent is not None:
        spec["parent"] = parent
    if continue_from is not None:
        earlier = yield from read(continue_from, tenant)
        messages = [dict(m) for m in earlier.messages]
        close_unanswered(messages, f"Not run: the earlier run ended ({earlier.status}) before this call ran.")
        spec["continued_from"] = continue_from
        spec["conversation"] = _conversation_spent(earlier)
    append_user_text(messages, prompt)
    state = RunState(id=run_id or f"run_{uuid.uuid4().hex[:20]}", tenant=tenant)
    produced = engine.start_events(state, spec=spec, messages=messages, now=flow.clock())
    yield CreateRun(state, produced)
    yield Notify(state, produced)
    return state


def _conversation_spent(parent: RunState) -> dict[str, float]:
    """What a conversation spent up to and including ``parent`` (for conversation budgets)."""
    earlier = parent.spec.get("conversation") or {}
    usage = parent.usage
    tokens = (
        usage.input_tokens + usage.output_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
    )
    return {
        "tokens": float(earlier.get("tokens", 0)) + tokens,
        "cost_usd": float(earlier.get("cost_usd", 0.0)) + parent.cost_usd,
        "model_calls": int(earlier.get("model_calls", 0)) + parent.steps,
        "tool_calls": int(earlier.get("tool_calls", 0)) + parent.tool_calls,
        "started_at": float(earlier.get("started_at", parent.created_at)),
    }


def decide(
    flow: Flow, run_id: str, call_id: str, decision: Decision, *, fingerprint: str | None, tenant: str | None
) -> Flowing[RunState]:
    """Record one decision on a stored run (see :meth:`tether.Runner.decide`); the run as it is now."""
    state = yield from read(run_id, tenant)
    if isinstance(decision, Deny):  # runs nothing: needs no tools (they may be gone or changed)
        check_versions(state.id, state.spec)
    else:  # a child run of this agent's tree is decided with the child's agent
        flow = flow.for_agent((yield from agent_of(flow.agent, state.spec, tenant)))
        yield from flow.load(state, tenant)
    yield from flow.decide(state, call_id, decision, fingerprint)
    return state


def agent_of(root: Agent, spec: dict[str, Any], tenant: str | None) -> Flowing[Agent]:
    """The agent of a run in ``root``'s tree: down the agent tools its chain of parents went through."""
    link = children.link_of(spec)
    if link is None:
        return root
    parent: RunRecord = yield LoadRun(str(link["run_id"]), tenant)
    return children.child_agent((yield from agent_of(root, parent.spec, tenant)), link)


def create_child(flow: Flow, child: children.DriveChild) -> Flowing[None]:
    """Create ``child``'s run with ``flow`` (the child's agent's) unless it exists: a resumed parent finds its child."""
    try:
        yield LoadRun(child.run_id, child.tenant)
    except RunNotFound:
        yield from create(
            flow, child.prompt, continue_from=None, tenant=child.tenant, run_id=child.run_id, parent=child.link
        )


def cancel(flow: Flow, run_id: str, reason: str, tenant: str | None) -> Flowing[RunState]:
    """Stop a run that has not ended (see :meth:`tether.Runner.cancel`), then its child runs; the run as it is now."""
    state = yield from read(run_id, tenant)
    if state.status in ENDED and not (state.status == RunStatus.failed and state.can_retry):
        raise RunEnded(state.id, status_name(state.status), "cancel")  # ended: no retry is due, the status says it
    yield from flow.commit(state, engine.cancellation(reason))
    for child in state.children.values():  # then the runs it started, down the tree
        with suppress(RunEnded, RunNotFound):
            yield from cancel(flow, child, f"its parent run {state.id} was cancelled", tenant)
    return state
