"""The run's state machine: the single source of truth for the graph.

The engine moves a run only by sending these events; guards (read from the run) pick the
target where one event has several. The diagram is exported from this class, so the
picture cannot drift from the code. No I/O happens here.
"""

from __future__ import annotations

from typing import Any

from statemachine import State, StateMachine
from statemachine.states import States

from tether.errors import IncompatibleRun
from tether.facts.status import FINAL, INITIAL, RunStatus

MACHINE_VERSION = 3
"""Bumped whenever states or transitions change meaning; stored with each run (2: ``compacted``,
and the ``result_demanded``, ``history_compacted`` and ``context_exceeded`` facts an older tether
cannot fold; 3: the ``handed_off`` fact, after which another agent drives the run)."""

_STATES = States.from_enum(RunStatus, initial=INITIAL, final=FINAL, use_enum_instance=False)
"""One state per :class:`~tether.facts.status.RunStatus`: its name both the Python id and the value.

Plain ``str`` values (not the members), so the status written to a run is a plain string."""


class AgentMachine(StateMachine):
    """thinking → executing_tool → awaiting_approval → done (plus failed / cancelled).

    The model object (a run state) exposes the guard attributes: ``has_pending_calls``,
    ``has_final_result``, ``has_undecided_approvals`` and ``can_retry``; the state lives in its
    ``status`` field (a store maps it to its own spelling). The states come from :class:`RunStatus`
    (see :mod:`tether.facts.status` for what each means).
    """

    thinking: State = _STATES.thinking
    executing_tool: State = _STATES.executing_tool
    awaiting_approval: State = _STATES.awaiting_approval
    done: State = _STATES.done
    failed: State = _STATES.failed
    cancelled: State = _STATES.cancelled

    tools_requested = thinking.to(executing_tool)
    """The model asked for one or more tools."""
    answered = thinking.to(done)
    """The model ended its turn without asking for tools."""
    reinvoked = thinking.to.itself()  # type: ignore[no-untyped-call]
    """pause_turn, a tool_use cut off at max_tokens, a typed result asked for again, or a context
    overflow to compact: call the model again."""
    compacted = thinking.to.itself()  # type: ignore[no-untyped-call]
    """The agent's history processors compacted the history before the next model call."""
    tool_finished = (
        executing_tool.to(done, cond="has_final_result", unless="has_pending_calls")
        | executing_tool.to(executing_tool, cond="has_pending_calls")
        | executing_tool.to(thinking)
    )
    """One call got its result: the next call, or every result back to the model."""
    retry_scheduled = executing_tool.to.itself()  # type: ignore[no-untyped-call]
    """A call failed and will be attempted again at a persisted time."""
    approval_needed = executing_tool.to(awaiting_approval)
    """The next call needs a person's decision."""
    decided = awaiting_approval.to(awaiting_approval, cond="has_undecided_approvals") | (
        awaiting_approval.to(executing_tool)
    )
    """A person approved or denied one call; all calls shown together resume together."""
    fail = thinking.to(failed) | executing_tool.to(failed) | awaiting_approval.to(failed)
    """A limit was hit or an unrecoverable error happened."""
    retried = failed.to(thinking, cond="can_retry")
    """A later drive tries again after a transient model failure (429/529/5xx, network)."""
    cancel = (
        thinking.to(cancelled)
        | executing_tool.to(cancelled)
        | awaiting_approval.to(cancelled)
        | failed.to(cancelled, cond="can_retry")
    )
    """Someone stopped the run (a transient failure too: resuming it would try again)."""


def bind(run_state: Any) -> AgentMachine:
    """A machine driving ``run_state.status``, after checking the stored value is known."""
    value = run_state.status
    if value is not None and value not in _KNOWN:
        known = sorted(_KNOWN)
        raise IncompatibleRun(f"unknown run status {value!r}; known: {known}", run_id=getattr(run_state, "id", "?"))
    # Reuse the machine last bound to this very object while it can still move: it reads and
    # writes the status on the object itself, so it behaves exactly as a fresh one would.
    cached = getattr(run_state, "bound_machine", None)
    if (
        value is not None
        and isinstance(cached, AgentMachine)
        and cached.model is run_state
        and not cached.is_terminated
    ):
        return cached
    machine = AgentMachine(model=run_state, state_field="status")
    if hasattr(run_state, "bound_machine"):
        run_state.bound_machine = machine
    return machine


_KNOWN = frozenset(state.value for state in AgentMachine.states)
"""Every persisted status the machine can restore."""
