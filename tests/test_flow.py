"""The flow on its own: canned outcomes in, effects out; no store, no model, no tool runs.

:class:`World` performs a flow's effects from a script (the model's answers, the tools'
outcomes, the approver's decisions) and keeps what it was asked to do. One row per
transition of :class:`~tether.core.machine.AgentMachine` reaches the transition's source state by
stepping the flow, takes one more step (or commits one step, or drives), and checks the
effects yielded, in order, and the transition recorded. A test fails if a transition of the
machine has no row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from support import tool_use
from tether import Agent, Approve, RetryPolicy, tool
from tether.core.approvals import Decision
from tether.core.engine import CallModel, Step, cancellation, start_events
from tether.core.events import Event, HistoryCompacted
from tether.core.flow import (
    STORE_RETRY_WAITS,
    Announce,
    Ask,
    Attempt,
    CheckLease,
    Driven,
    Effect,
    Flow,
    Flowing,
    LoadLog,
    LoadRun,
    LookUpCache,
    Notify,
    Persist,
    ShownStatus,
    Sleep,
    StoreCache,
)
from tether.core.machine import AgentMachine
from tether.core.state import RunState
from tether.core.status import status_name
from tether.drivers.runner import record_of
from tether.errors import ModelError, StaleRun, StoreError
from tether.models import ModelResponse
from tether.models.scripted import ScriptedModel
from tether.stores import RunLog

NOW = 1_000.0


@tool
def look(path: str) -> str:
    """Read a file."""
    raise AssertionError("the flow never runs a tool itself")


@tool(approval=True)
def delete(path: str) -> str:
    """Delete a file."""
    raise AssertionError("the flow never runs a tool itself")


@tool(retry=RetryPolicy(max_attempts=2, initial_delay=5.0, retry_on=(ValueError,)))
def flaky(path: str) -> str:
    """Fails now and then."""
    raise AssertionError("the flow never runs a tool itself")


@tool(retry=RetryPolicy(retry_on=(ValueError,), on_exhausted="fail"))
def brittle(path: str) -> str:
    """A failure ends the run."""
    raise AssertionError("the flow never runs a tool itself")


@tool(final=True)
def finish(answer: str) -> str:
    """Give the final answer."""
    raise AssertionError("a final tool is never run")


@tool(cache_ttl=60.0)
def cached(path: str) -> str:
    """Slow, so its results are kept."""
    raise AssertionError("the flow never runs a tool itself")


AGENT = Agent(model=ScriptedModel([]), tools=[look, delete, flaky, brittle, finish, cached])
"""The model is never called: :class:`World` answers every ``CallModel``."""


def reply(content: list[dict[str, Any]], stop_reason: str) -> ModelResponse:
    return ModelResponse(content=content, stop_reason=stop_reason)


def asks(*calls: tuple[str, str]) -> ModelResponse:
    """The model asks for these (call id, tool) calls."""
    return reply(
        [tool_use(call_id, name, {"path" if name != "finish" else "answer": "x"}) for call_id, name in calls],
        "tool_use",
    )


ANSWER = reply([{"type": "text", "text": "done"}], "end_turn")


@dataclass
class World:
    """Performs effects from canned outcomes and records every effect it was handed."""

    model: list[ModelResponse | ModelError] = field(default_factory=list)
    tools: list[str | Exception] = field(default_factory=list)
    decisions: Mapping[str, Decision] = field(default_factory=dict)
    cache: dict[str, str] = field(default_factory=dict)
    store_errors: list[StoreError] = field(default_factory=list)
    """Raised by the next Persist effects, one each."""
    effects: list[Effect] = field(default_factory=list)
    persisted: list[Event] = field(default_factory=list)
    state: RunState | None = None

    def perform(self, effect: Effect) -> Any:
        self.effects.append(effect)
        match effect:
            case Persist(state, events):
                if self.store_errors:
                    raise self.store_errors.pop(0)
                self.persisted.extend(events)
                self.state = state
            case CallModel():
                answer = self.model.pop(0)
                if isinstance(answer, Exception):
                    raise answer
                return answer
            case Attempt():
                outcome = self.tools.pop(0)
                if isinstance(outcome, Exception):
                    raise outcome
                return outcome
            case Ask():
                return self.decisions
            case LookUpCache(key):
                return self.cache.get(key)
            case LoadRun():
                assert self.state is not None
                return record_of(self.state)
            case LoadLog():
                assert self.state is not None
                return RunLog(version=self.state.version, tenant=None, events=list(self.persisted))
        return None

    def run(self, flow: Flowing[Any]) -> Any:
        driven = Driven(flow)
        while (effect := driven.next()) is not None:
            with driven.reporting():
                driven.outcome = self.perform(effect)
        return driven.result

    def transitions(self) -> list[tuple[str, str, str]]:
        """(event, source, target) of each transition persisted, in machine ids."""
        return [
            (e.data["event"], status_name(e.data["source"]), status_name(e.data["target"]))
            for e in self.persisted
            if e.type == "transition" and e.data["source"] is not None
        ]


def new_run() -> RunState:
    state = RunState(id="run_flow")
    start_events(state, spec={}, messages=[{"role": "user", "content": "go"}], now=NOW)
    return state


def flow() -> Flow:
    return Flow(AGENT, owner="test-driver", can_ask=True, clock=lambda: NOW, timer=lambda: 0.0)


Act = Callable[[Flow, RunState], Flowing[Any]]


def step(f: Flow, state: RunState) -> Flowing[Any]:
    return f.step(state)


def commit(made: Step) -> Act:
    return lambda f, state: f.commit(state, made)


def drive(f: Flow, state: RunState) -> Flowing[Any]:
    return f.drive(state, None, force=False, max_wait=None)


MODEL_STEP = [CheckLease, Announce, CallModel, CheckLease, Persist, Notify]
TOOL_STEP = [CheckLease, Announce, CheckLease, Persist, Notify, Attempt, CheckLease, Persist, Notify]
DECIDED_STEP = [CheckLease, CheckLease, Persist, Notify]
"""A step the engine decided without I/O (a gate, a final result, a limit)."""
COMMIT = [CheckLease, Persist, Notify]


@dataclass(frozen=True)
class Row:
    transition: tuple[str, str, str]
    """(event, source, target), as the machine names them."""
    act: Act
    effects: list[type]
    model: list[ModelResponse | ModelError] = field(default_factory=list)
    tools: list[str | Exception] = field(default_factory=list)
    decisions: Mapping[str, Decision] = field(default_factory=dict)
    setup_steps: int = 0
    """Steps taken (answered from the same script) to reach the source state."""


ROWS = [
    Row(("tools_requested", "thinking", "executing_tool"), step, MODEL_STEP, model=[asks(("a", "look"))]),
    Row(("answered", "thinking", "done"), step, MODEL_STEP, model=[ANSWER]),
    Row(("reinvoked", "thinking", "thinking"), step, MODEL_STEP, model=[reply([], "pause_turn")]),
    Row(("fail", "thinking", "failed"), step, MODEL_STEP, model=[ModelError("bad request")]),
    Row(
        ("compacted", "thinking", "thinking"),
        commit(Step("compacted", [HistoryCompacted("keep_last_turns", [{"role": "user", "content": "go"}], 0)])),
        COMMIT,
    ),
    Row(("cancel", "thinking", "cancelled"), commit(cancellation("stop")), COMMIT),
    Row(("tool_finished", "executing_tool", "done"), step, DECIDED_STEP, model=[asks(("a", "finish"))], setup_steps=1),
    Row(
        ("tool_finished", "executing_tool", "executing_tool"),
        step,
        TOOL_STEP,
        model=[asks(("a", "look"), ("b", "look"))],
        tools=["read"],
        setup_steps=1,
    ),
    Row(
        ("tool_finished", "executing_tool", "thinking"),
        step,
        TOOL_STEP,
        model=[asks(("a", "look"))],
        tools=["read"],
        setup_steps=1,
    ),
    Row(
        ("retry_scheduled", "executing_tool", "executing_tool"),
        step,
        TOOL_STEP,
        model=[asks(("a", "flaky"))],
        tools=[ValueError("flaky")],
        setup_steps=1,
    ),
    Row(
        ("approval_needed", "executing_tool", "awaiting_approval"),
        step,
        DECIDED_STEP,
        model=[asks(("a", "delete"))],
        setup_steps=1,
    ),
    Row(
        ("fail", "executing_tool", "failed"),
        step,
        TOOL_STEP,
        model=[asks(("a", "brittle"))],
        tools=[ValueError("broken")],
        setup_steps=1,
    ),
    Row(
        ("cancel", "executing_tool", "cancelled"),
        commit(cancellation("stop")),
        COMMIT,
        model=[asks(("a", "look"))],
        setup_steps=1,
    ),
    Row(
        ("decided", "awaiting_approval", "awaiting_approval"),
        step,
        [CheckLease, Ask, *COMMIT],
        model=[asks(("a", "delete"), ("b", "delete"))],
        decisions={"a": Approve()},
        setup_steps=2,
    ),
    Row(
        ("decided", "awaiting_approval", "executing_tool"),
        step,
        [CheckLease, Ask, *COMMIT],
        model=[asks(("a", "delete"))],
        decisions={"a": Approve()},
        setup_steps=2,
    ),
    # Nothing in the engine fails a parked run today; the machine allows it, so a caller's
    # failure step is committed as any other.
    Row(
        ("fail", "awaiting_approval", "failed"),
        commit(Step("fail", error="given up")),
        COMMIT,
        model=[asks(("a", "delete"))],
        setup_steps=2,
    ),
    Row(
        ("cancel", "awaiting_approval", "cancelled"),
        commit(cancellation("stop")),
        COMMIT,
        model=[asks(("a", "delete"))],
        setup_steps=2,
    ),
    Row(
        ("retried", "failed", "thinking"),
        drive,
        [LoadRun, *COMMIT, *MODEL_STEP, CheckLease],
        model=[ModelError("overloaded", retryable=True), ANSWER],
        setup_steps=1,
    ),
    Row(
        ("cancel", "failed", "cancelled"),
        commit(cancellation("stop")),
        COMMIT,
        model=[ModelError("overloaded", retryable=True)],
        setup_steps=1,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=["{}:{}->{}".format(*row.transition) for row in ROWS])
def test_each_transition_from_canned_outcomes(row: Row) -> None:
    world = World(model=list(row.model), tools=list(row.tools), decisions=row.decisions)
    state = new_run()
    for _ in range(row.setup_steps):
        world.run(flow().step(state))
    assert status_name(state.status) == row.transition[1]
    world.effects.clear()
    world.persisted.clear()

    world.run(row.act(flow(), state))

    assert [type(effect) for effect in world.effects] == row.effects
    assert world.transitions()[0] == row.transition
    assert not world.model  # every canned outcome was asked for
    assert not world.tools


def test_every_machine_transition_has_a_row() -> None:
    machine = {(t.event, t.source.id, t.target.id) for state in AgentMachine.states for t in state.transitions}
    assert machine == {row.transition for row in ROWS}


def test_a_tool_start_is_persisted_before_the_attempt_and_names_the_driver() -> None:
    world = World(model=[asks(("a", "look"))], tools=["read"])
    state = new_run()
    world.run(flow().step(state))
    world.effects.clear()
    world.run(flow().step(state))
    attempt = next(i for i, effect in enumerate(world.effects) if isinstance(effect, Attempt))
    first_write = next(effect for effect in world.effects if isinstance(effect, Persist))
    assert world.effects.index(first_write) < attempt
    started = [e for e in first_write.events if e.type == "tool_started"]
    assert [e.data["owner"] for e in started] == ["test-driver"]


def test_a_cached_result_answers_without_an_attempt_and_a_fresh_one_is_stored() -> None:
    world = World(model=[asks(("a", "cached"), ("b", "cached"))], tools=["fresh"])
    state = new_run()
    world.run(flow().step(state))
    world.run(flow().step(state))  # a miss: the attempt runs, its result is stored
    stored = [effect for effect in world.effects if isinstance(effect, StoreCache)]
    assert [(s.tool, s.value, s.expires_at) for s in stored] == [("cached", "fresh", NOW + 60.0)]
    world.cache[stored[0].key] = "fresh"
    world.effects.clear()
    world.run(flow().step(state))  # the same input again: a hit
    assert [type(effect) for effect in world.effects] == [CheckLease, Announce, LookUpCache, *COMMIT]


def test_a_retry_due_later_than_max_wait_parks_and_a_sooner_one_is_slept() -> None:
    world = World(model=[asks(("a", "flaky"))], tools=[ValueError("flaky")])
    state = new_run()
    world.run(flow().step(state))
    world.run(flow().step(state))  # retry due at NOW + 5
    world.effects.clear()
    assert world.run(flow().step(state, max_wait=1.0)) is False
    assert [type(effect) for effect in world.effects] == [CheckLease]
    world.effects.clear()
    assert world.run(flow().step(state, max_wait=10.0)) is True
    assert world.effects[1:] == [Announce(state, world.effects[1].activity), Sleep(5.0)]  # type: ignore[attr-defined]


def test_a_transient_store_error_is_tried_again_after_a_sleep() -> None:
    world = World(model=[ANSWER], store_errors=[StoreError("locked", transient=True)])
    state = new_run()
    world.run(flow().step(state))
    kinds = [type(effect) for effect in world.effects]
    assert kinds == [CheckLease, Announce, CallModel, CheckLease, Persist, Sleep, Persist, Notify]
    assert world.effects[5] == Sleep(STORE_RETRY_WAITS[0])
    assert state.status == "done"


def test_a_write_that_landed_before_its_connection_dropped_counts_as_done() -> None:
    """A retry refused as stale after a dropped commit reads the log: this very write is there."""
    state = new_run()
    world = World(model=[ANSWER])
    world.state = state
    outcomes: list[Any] = [StoreError("connection dropped", transient=True), StaleRun(state.id, 1)]

    def perform(effect: Effect) -> Any:
        if isinstance(effect, Persist) and outcomes:
            world.effects.append(effect)
            world.persisted.extend(effect.events)  # the first try landed, though it said otherwise
            raise outcomes.pop(0)
        return World.perform(world, effect)

    world.perform = perform  # type: ignore[method-assign]
    world.run(flow().step(state))
    kinds = [type(effect) for effect in world.effects]
    assert kinds == [CheckLease, Announce, CallModel, CheckLease, Persist, Sleep, Persist, LoadLog, Notify]


def test_a_stale_write_during_a_drive_says_what_the_run_is_now() -> None:
    state = new_run()
    world = World(model=[ANSWER])
    world.state = state

    def perform(effect: Effect) -> Any:
        if isinstance(effect, Persist):
            raise StaleRun(state.id, state.version - 1)  # a cancel from elsewhere landed first
        if isinstance(effect, ShownStatus):
            return "cancelled"
        return World.perform(world, effect)

    world.perform = perform  # type: ignore[method-assign]
    with pytest.raises(StaleRun, match=r"changed by another process while this one drove it \(it is now cancelled\)"):
        world.run(drive(flow(), state))
