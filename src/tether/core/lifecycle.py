"""A run's life outside a drive, as flows: created, read back, forked, decided on, cancelled.

Like a drive (:meth:`tether.core.flow.Flow.drive`), each is a generator that yields effects
(read the log, create the run, persist a step) and decides nothing by I/O, so
:class:`~tether.drivers.runner.Runner` performs them with plain calls and
:class:`~tether.drivers.runner.AsyncRunner` awaits them: one logic, two shells.
"""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import Any

from tether.core import engine, forks, snapshots
from tether.core.approvals import Decision, Deny
from tether.core.compat import check_versions
from tether.core.flow import DECISION_TRIES, CreateRun, DriveRun, Flow, Flowing, LoadLog, LoadRun, Notify
from tether.core.links import pending_below
from tether.core.machine import MACHINE_VERSION
from tether.core.state import RunState
from tether.errors import RunEnded, RunNotFound, StaleRun
from tether.facts.history import append_user_text, close_unanswered, text_of
from tether.facts.status import ENDED, RunStatus, status_name
from tether.stores import PARENT_KEY, SCHEMA_VERSION, RunLog


def read(run_id: str, tenant: str | None) -> Flowing[RunState]:
    """The run rebuilt from its events, read with its version in one consistent read (no agent needed)."""
    log: RunLog = yield LoadLog(run_id, tenant)
    return snapshots.rebuild(run_id, log)


PROMPT_KEPT = 2000
"""Characters of a run's prompt its spec keeps (``spec["prompt"]``; the whole text is in its first event)."""


def create(
    flow: Flow,
    prompt: str,
    *,
    continue_from: str | None,
    tenant: str | None,
    run_id: str | None,
    parent: dict[str, Any] | None = None,
    trace: dict[str, Any] | None = None,
    dispatch: dict[str, Any] | None = None,
) -> Flowing[RunState]:
    """Persist a new run of ``flow``'s agent (its prompt, spec and any earlier history) without driving it.

    ``parent``: a child run's link to the run and call it serves (see :mod:`tether.core.children`).
    ``trace``: the run's trace context (a W3C ``traceparent``), kept so that every later drive, in
    any process, continues the same trace (see :mod:`tether.drivers.otel`); opaque here.
    ``dispatch``: the queue a submitted run waits in for a worker (see :mod:`tether.drivers.queue`).
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
        "tool_schemas": agent.tool_schemas(),
        "tool_descriptions": {tool.name: tool.description for tool in agent.all_tools},  # for people deciding
        "tool_settings": {tool.name: tool.settings() for tool in agent.all_tools},
    }
    if agent.system is not None:  # the spec of an agent made in Python names none; the inspector shows it
        spec.setdefault("system", agent.system)
    if agent.name is not None:  # who the run's agent is, for people (the audit names each call's)
        spec["agent"] = agent.name
    if parent is not None:
        spec[PARENT_KEY] = parent
    if trace is not None:
        spec["trace"] = trace
    if dispatch is not None:
        spec["dispatch"] = dispatch
    if continue_from is not None:
        earlier = yield from read(continue_from, tenant)
        messages = [dict(m) for m in earlier.messages]
        close_unanswered(messages, f"Not run: the earlier run ended ({earlier.status}) before this call ran.")
        spec["continued_from"] = continue_from
        if earlier.agent is not None:  # the conversation goes on with the agent it was handed to
            spec["handed_to"] = earlier.agent
        spec["conversation"] = _conversation_spent(earlier)
    append_user_text(messages, prompt)
    return (yield from _start(flow, spec, messages, tenant, run_id))


def _start(
    flow: Flow, spec: dict[str, Any], messages: list[dict[str, Any]], tenant: str | None, run_id: str | None
) -> Flowing[RunState]:
    """Persist a new run with this spec and opening history, in thinking: driving it asks the model."""
    prompt = prompt_of(messages)
    if prompt is not None:  # what it was asked, on its row: listed and searched without reading the log
        spec = {**spec, "prompt": prompt[:PROMPT_KEPT]}
    state = RunState(id=run_id or f"run_{uuid.uuid4().hex[:20]}", tenant=tenant)
    produced = engine.start_events(state, spec=spec, messages=messages, now=flow.clock())
    yield CreateRun(state, produced)
    yield Notify(state, produced)
    return state


def prompt_of(messages: list[dict[str, Any]]) -> str | None:
    """The prompt a run's opening history asks the model to answer: its last user text; None if it has none."""
    for message in reversed(messages):
        if message.get("role") == "user" and (text := text_of(message)):
            return text
    return None


def fork(
    flow: Flow,
    run_id: str,
    at_event: int,
    *,
    edit: forks.MessageEdit | None,
    tenant: str | None,
    new_run_id: str | None = None,
    trace: dict[str, Any] | None = None,
) -> Flowing[RunState]:
    """A new run whose history is ``run_id``'s once event ``at_event`` was recorded (a message's text edited, if asked).

    The original is only read. The fork keeps the original's spec (so it is driven with the same
    tools and model, and checked against them), links back to it (``spec["forked_from"]``) and is
    not driven. ``trace``: the fork's own trace context, when a driver traces runs.

    Raises:
        InvalidForkPoint: no such event, an event in the middle of a turn, or an edit that does not apply.
    """
    log: RunLog = yield LoadLog(run_id, tenant, whole=True)
    then = forks.state_at(run_id, log.events, at_event)
    messages = [dict(message) for message in then.messages]
    if edit is not None:
        messages = forks.edited(run_id, messages, edit)
    spec = forks.spec_of(run_id, log.events, then, at_event)
    if trace is not None:
        spec["trace"] = trace
    return (yield from _start(flow, spec, messages, log.tenant, new_run_id))


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
    """Record one decision on a stored run (see :meth:`tether.Runner.decide`); the run decided on, as it is now.

    A call that waits in a child run may be decided on any run above it (its root included):
    the decision is recorded on the child's run, and that run is given back.

    Two people deciding two calls of one batch at once both write the run: the one refused
    (:class:`StaleRun`) reads the run again and decides on it, up to :data:`~tether.core.flow.DECISION_TRIES` times.
    Its own call is checked afresh each time, so a decision someone else made on that very
    call (or a run that moved on) is still refused, saying so.
    """
    tries_left = DECISION_TRIES
    while True:
        tries_left -= 1
        state = yield from read(run_id, tenant)
        below = pending_below(state, call_id)
        if below is not None:
            state = yield from read(below, tenant)
        deciding = flow
        if isinstance(decision, Deny):  # runs nothing: needs no tools (they may be gone or changed)
            check_versions(state.id, state.spec)
        else:  # a child run of this agent's tree is decided with the child's agent (the one in charge, after a handoff)
            deciding = yield from flow.for_run(state, tenant)
            yield from deciding.load(state, tenant)
            deciding = deciding.in_charge(state)
        try:
            yield from deciding.decide(state, call_id, decision, fingerprint)
            return state
        except StaleRun:
            if not tries_left:
                raise


def create_child(flow: Flow, child: DriveRun, trace: dict[str, Any] | None = None) -> Flowing[None]:
    """Create ``child``'s run with ``flow`` (the child's agent's) unless it exists: a resumed parent finds its child."""
    try:
        yield LoadRun(child.run_id, child.tenant)
    except RunNotFound:
        yield from create(
            flow,
            child.prompt,
            continue_from=None,
            tenant=child.tenant,
            run_id=child.run_id,
            parent=child.link,
            trace=trace,
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
