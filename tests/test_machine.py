"""The full transition table of AgentMachine, one (state, event) pair at a time.

Every pair is sent under every combination of the four guard attributes, so each guard
branch is exercised and no pair can silently gain or lose a transition.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from statemachine.exceptions import TransitionNotAllowed

from tether.core.machine import AgentMachine, bind
from tether.errors import IncompatibleRun
from tether.facts.status import FINAL, RunStatus

STATES = ["thinking", "executing_tool", "awaiting_approval", "done", "failed", "cancelled"]
EVENTS = [
    "tools_requested",
    "answered",
    "reinvoked",
    "compacted",
    "tool_finished",
    "retry_scheduled",
    "approval_needed",
    "decided",
    "fail",
    "cancel",
    "retried",
]


@dataclass
class Run:
    """A minimal model object: the persisted status plus the four guard attributes."""

    status: str | None
    has_pending_calls: bool = False
    has_final_result: bool = False
    has_undecided_approvals: bool = False
    can_retry: bool = False


Guards = tuple[bool, bool, bool, bool]  # (pending calls, final result, undecided approvals, can retry)
Target = str | Callable[[Guards], str | None]  # None: refused under these guards
BOOLS = (False, True)
GUARD_COMBINATIONS: list[Guards] = list(itertools.product(BOOLS, BOOLS, BOOLS, BOOLS))


def _tool_finished(guards: Guards) -> str:
    pending, final, _, _ = guards
    if final and not pending:
        return "done"
    if pending:
        return "executing_tool"
    return "thinking"


def _decided(guards: Guards) -> str:
    _, _, undecided, _ = guards
    return "awaiting_approval" if undecided else "executing_tool"


def _retried(guards: Guards) -> str | None:
    return "thinking" if guards[3] else None


def _cancelled_after_failure(guards: Guards) -> str | None:
    """A transient failure has not ended the run: it can still be cancelled for good."""
    return "cancelled" if guards[3] else None


# The whole table: a (state, event) pair missing here must be refused by the machine.
LEGAL: dict[tuple[str, str], Target] = {
    ("thinking", "tools_requested"): "executing_tool",
    ("thinking", "answered"): "done",
    ("thinking", "reinvoked"): "thinking",
    ("thinking", "compacted"): "thinking",
    ("thinking", "fail"): "failed",
    ("thinking", "cancel"): "cancelled",
    ("executing_tool", "tool_finished"): _tool_finished,
    ("executing_tool", "retry_scheduled"): "executing_tool",
    ("executing_tool", "approval_needed"): "awaiting_approval",
    ("executing_tool", "fail"): "failed",
    ("executing_tool", "cancel"): "cancelled",
    ("awaiting_approval", "decided"): _decided,
    ("awaiting_approval", "fail"): "failed",
    ("awaiting_approval", "cancel"): "cancelled",
    ("failed", "retried"): _retried,
    ("failed", "cancel"): _cancelled_after_failure,
}


def test_the_table_covers_exactly_the_machine_states_and_events() -> None:
    assert {state.value for state in AgentMachine.states} == set(STATES)
    # The metaclass's events property (a list of the class's events); mypy sees only the instance's.
    assert {event.id for event in AgentMachine.events} == set(EVENTS)  # type: ignore[attr-defined]
    assert {source for source, _ in LEGAL} == {"thinking", "executing_tool", "awaiting_approval", "failed"}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, EVENTS)))
def test_transition(state: str, event: str) -> None:
    expected = LEGAL.get((state, event))
    for guards in GUARD_COMBINATIONS:
        run = Run(state, *guards)
        machine = bind(run)
        target = expected(guards) if callable(expected) else expected
        if target is None:
            with pytest.raises(TransitionNotAllowed):
                machine.send(event)
            assert run.status == state, f"a refused {event} moved {state} (guards {guards})"
        else:
            machine.send(event)
            assert run.status == target, f"{state} --{event}--> with guards {guards}"


@pytest.mark.parametrize(
    ("guards", "target"),
    [
        pytest.param((False, True, False), "done", id="final-result-and-nothing-pending"),
        pytest.param((True, True, False), "executing_tool", id="final-result-but-calls-pending"),
        pytest.param((True, False, False), "executing_tool", id="calls-pending"),
        pytest.param((False, False, False), "thinking", id="batch-complete"),
    ],
)
def test_tool_finished_guard_branches(guards: tuple[bool, bool, bool], target: str) -> None:
    run = Run("executing_tool", *guards, False)
    bind(run).send("tool_finished")
    assert run.status == target


@pytest.mark.parametrize(
    ("undecided", "target"),
    [
        pytest.param(True, "awaiting_approval", id="others-still-undecided"),
        pytest.param(False, "executing_tool", id="all-decided"),
    ],
)
def test_decided_guard_branches(undecided: bool, target: str) -> None:
    run = Run("awaiting_approval", has_undecided_approvals=undecided)
    bind(run).send("decided")
    assert run.status == target


@pytest.mark.parametrize("final", sorted(FINAL))
@pytest.mark.parametrize("event", EVENTS)
def test_final_states_refuse_every_event(final: str, event: str) -> None:
    run = Run(final, has_pending_calls=True, has_final_result=True, has_undecided_approvals=True)
    with pytest.raises(TransitionNotAllowed):
        bind(run).send(event)
    assert run.status == final


def test_final_values_are_done_and_cancelled() -> None:
    assert frozenset({"done", "cancelled"}) == FINAL
    assert {state.value for state in AgentMachine.states if state.final} == FINAL


def test_a_failed_run_moves_only_when_its_failure_was_transient() -> None:
    stuck = Run("failed")
    with pytest.raises(TransitionNotAllowed):
        bind(stuck).send("retried")
    resumable = Run("failed", can_retry=True)
    bind(resumable).send("retried")
    assert resumable.status == "thinking"


def test_bind_keeps_the_stored_state() -> None:
    run = Run("awaiting_approval")
    machine = bind(run)
    assert machine.awaiting_approval.is_active
    assert run.status == "awaiting_approval"
    assert sorted(event.id for event in machine.allowed_events) == ["cancel", "decided", "fail"]


def test_bind_without_a_status_enters_thinking() -> None:
    run = Run(None)
    machine = bind(run)
    assert run.status == "thinking"
    assert machine.thinking.is_active


@pytest.mark.parametrize("bad", ["executingTool", "awaitingApproval", "Done", "", "bogus"])
def test_bind_refuses_an_unknown_stored_status(bad: str) -> None:
    with pytest.raises(IncompatibleRun, match="unknown run status"):
        bind(Run(bad))


def test_the_machine_is_built_from_run_status() -> None:
    """Each state's Python id is a status's name, and so is its value: one spelling everywhere."""
    assert [(state.id, state.value) for state in AgentMachine.states] == [(s.name, s.value) for s in RunStatus]
    assert AgentMachine.initial_state.value == RunStatus.thinking
    assert all(status.value == status.name == status.shown for status in RunStatus)


def test_state_is_kept_as_the_value_people_read() -> None:
    run = Run("thinking")
    machine = bind(run)
    machine.send("tools_requested")
    assert run.status == "executing_tool"
    machine.send("approval_needed")
    assert run.status == "awaiting_approval"
    machine.send("decided")
    assert run.status == "executing_tool"
    machine.send("tool_finished")
    assert run.status == "thinking"
    machine.send("answered")
    assert run.status == "done"
