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
from tether import Agent, Approve, Limits, RetryPolicy, tool
from tether.core import cache, engine
from tether.core.approvals import Decision
from tether.core.engine import CallModel, Step, cancellation, start_events
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
    Landed,
    Launch,
    LoadLog,
    LoadRun,
    LookUpCache,
    Notify,
    Persist,
    RunningTools,
    ShownStatus,
    Sleep,
    StoreCache,
)
from tether.core.machine import AgentMachine
from tether.core.state import RunState
from tether.drivers.runner import record_of
from tether.errors import ModelError, StaleRun, StoreError
from tether.facts.events import Event, HistoryCompacted
from tether.facts.status import status_name
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


@tool(concurrent=True)
def fetch(path: str) -> str:
    """Runs beside the other concurrent calls of its turn."""
    raise AssertionError("the flow never runs a tool itself")


@tool(concurrent=True, retry=RetryPolicy(max_attempts=2, initial_delay=5.0, retry_on=(ValueError,)))
def fetch_flaky(path: str) -> str:
    """Concurrent, and fails now and then."""
    raise AssertionError("the flow never runs a tool itself")


@tool(concurrent=True, retry=RetryPolicy(retry_on=(ValueError,), on_exhausted="fail"))
def fetch_brittle(path: str) -> str:
    """Concurrent; a failure ends the run."""
    raise AssertionError("the flow never runs a tool itself")


@tool(concurrent=True, retry=RetryPolicy(retry_on=(ValueError,), on_exhausted="escalate"))
def fetch_shaky(path: str) -> str:
    """Concurrent; a failure is put to a person."""
    raise AssertionError("the flow never runs a tool itself")


@tool(concurrent=True, cache_ttl=60.0)
def fetch_cached(path: str) -> str:
    """Concurrent, with its results kept."""
    raise AssertionError("the flow never runs a tool itself")


TOOLS = [look, delete, flaky, brittle, finish, cached, fetch, fetch_flaky, fetch_brittle, fetch_shaky, fetch_cached]
AGENT = Agent(model=ScriptedModel([]), tools=TOOLS)
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
    landings: list[list[tuple[str, str | Exception]]] = field(default_factory=list)
    """What each Landed gives back: the calls (by id) whose launched attempts ended, with their outcomes."""
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
            case Launch(attempt):
                return attempt.action.call.call_id  # the handle Landed names it by
            case Landed(handles):
                landed = self.landings.pop(0)
                assert all(call_id in handles for call_id, _ in landed), (landed, handles)
                return landed
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


def flow(agent: Agent = AGENT, *, ahead: bool = False) -> Flow:
    """A flow stepped by hand, or (``ahead``) stepping as a drive does (see ``Flow.starts_ahead``)."""
    made = Flow(agent, owner="test-driver", can_ask=True, clock=lambda: NOW, timer=lambda: 0.0)
    made.starts_ahead = ahead
    return made


Act = Callable[[Flow, RunState], Flowing[Any]]


def step(f: Flow, state: RunState) -> Flowing[Any]:
    return f.step(state)


def commit(made: Step) -> Act:
    return lambda f, state: f.commit(state, made)


def drive(f: Flow, state: RunState) -> Flowing[Any]:
    return f.drive(state, None, force=False, max_wait=None)


MODEL_STEP = [CheckLease, Announce, CallModel, CheckLease, Persist, Notify]
TOOL_STEP = [CheckLease, Announce, CheckLease, Persist, Notify, Attempt, CheckLease, Persist, Notify]
"""A tool's step stepped by hand: its start committed, then the attempt, then its outcome."""
STARTED_TOOL_STEP = [CheckLease, Announce, Attempt, CheckLease, Persist, Notify]
"""A tool's step in a drive: its start went out with the write before (model answer, decision, call before)."""
DECIDED_STEP = [CheckLease, CheckLease, Persist, Notify]
"""A step the engine decided without I/O (a gate, a final result, a limit)."""
COMMIT = [CheckLease, Persist, Notify]
BATCH_OF_TWO = [CheckLease, Announce, *COMMIT, Launch, *COMMIT, Launch]
"""The start of a batch: each call's start committed before it is launched."""
LANDED = [Announce, Landed, *COMMIT]
"""Waiting for the running calls (announced), then committing the one that ended."""


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
    landings: list[list[tuple[str, str | Exception]]] = field(default_factory=list)
    how: str = ""
    """Told apart from another row of the same transition (``batch``: concurrent calls)."""


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
        ("tool_finished", "executing_tool", "executing_tool"),
        step,
        [*BATCH_OF_TWO, *LANDED, *LANDED],
        model=[asks(("a", "fetch"), ("b", "fetch"))],
        landings=[[("b", "second")], [("a", "first")]],
        setup_steps=1,
        how="batch",
    ),
    Row(
        ("retry_scheduled", "executing_tool", "executing_tool"),
        step,
        [*BATCH_OF_TWO, *LANDED, *LANDED],
        model=[asks(("a", "fetch_flaky"), ("b", "fetch"))],
        landings=[[("a", ValueError("flaky"))], [("b", "read")]],
        setup_steps=1,
        how="batch",
    ),
    # Escalations and failures wait until no call of the batch runs any more, then are
    # committed as one step each: every escalated call shown in one question.
    Row(
        ("approval_needed", "executing_tool", "awaiting_approval"),
        step,
        [*BATCH_OF_TWO, Announce, Landed, Announce, Landed, *COMMIT],
        model=[asks(("a", "fetch_shaky"), ("b", "fetch_shaky"))],
        landings=[[("a", ValueError("down"))], [("b", ValueError("down"))]],
        setup_steps=1,
        how="batch",
    ),
    Row(
        ("fail", "executing_tool", "failed"),
        step,
        [*BATCH_OF_TWO, Announce, Landed, *COMMIT],
        model=[asks(("a", "fetch_brittle"), ("b", "fetch_brittle"))],
        landings=[[("a", ValueError("broken")), ("b", ValueError("broken"))]],
        setup_steps=1,
        how="batch",
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


@pytest.mark.parametrize(
    "row", ROWS, ids=["{}:{}->{}".format(*row.transition) + (f"({row.how})" if row.how else "") for row in ROWS]
)
def test_each_transition_from_canned_outcomes(row: Row) -> None:
    world = World(model=list(row.model), tools=list(row.tools), decisions=row.decisions, landings=list(row.landings))
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
    assert not world.landings


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


def test_a_drive_commits_a_tool_start_with_the_write_before_it() -> None:
    """Driving, the start goes out with the model's answer that asked for the call (one write fewer),
    and with the result of the call before; each next step runs the call it started."""
    world = World(model=[asks(("a", "look"), ("b", "look"))], tools=["one", "two"])
    state = new_run()
    world.run(flow(ahead=True).step(state))
    [answer] = [effect for effect in world.effects if isinstance(effect, Persist)]
    assert [e.data["owner"] for e in answer.events if e.type == "tool_started"] == ["test-driver"]
    assert [e.type for e in answer.events][-1] == "tool_started"  # after the transition into executing_tool
    assert not any(isinstance(effect, Attempt) for effect in world.effects)  # one step: the model call only
    for call_id in ("a", "b"):
        world.effects.clear()
        world.run(flow(ahead=True).step(state))
        assert [type(effect) for effect in world.effects] == STARTED_TOOL_STEP
        [attempt] = [effect for effect in world.effects if isinstance(effect, Attempt)]
        assert attempt.action.call.call_id == call_id
    started = [e.data["call_id"] for e in world.persisted if e.type == "tool_started"]
    assert started == ["a", "b"]  # each once


def test_a_drive_told_to_stop_first_runs_the_call_it_started() -> None:
    """``until`` (a worker's SIGTERM) stops a drive between steps, never between a start and its run."""
    world = World(model=[asks(("a", "look")), ANSWER], tools=["one"])
    state = new_run()
    world.state = state
    driving = flow().drive(state, None, force=False, max_wait=None, until=lambda: len(world.model) < 2)
    world.run(driving)
    assert [type(effect) for effect in world.effects].count(Attempt) == 1
    assert status_name(state.status) == "thinking"  # stopped before the next model call
    assert state.started_here is None
    assert world.model == [ANSWER]


def test_a_start_committed_by_another_drive_is_in_doubt_not_run() -> None:
    """Only the drive that committed a start runs it: the same run loaded anew sees a call in doubt."""
    world = World(model=[asks(("a", "look"))])
    state = new_run()
    world.run(flow(ahead=True).step(state))
    assert state.started_here is not None
    state.started_here = None  # as a fresh load of the run has it
    world.effects.clear()
    world.run(flow(ahead=True).step(state))
    assert not any(isinstance(effect, Attempt) for effect in world.effects)
    assert world.transitions()[-1] == ("approval_needed", "executing_tool", "awaiting_approval")  # asked, not re-run


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
    announced = world.effects[1]
    assert isinstance(announced, Announce)
    assert world.effects[1:] == [Announce(state, announced.activity), Sleep(5.0)]


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


# Concurrent calls ---------------------------------------------------------------------------
def batch_world(*calls: tuple[str, str], landings: list[list[tuple[str, str | Exception]]]) -> World:
    return World(model=[asks(*calls)], landings=landings)


def test_each_concurrent_call_is_started_then_launched_and_waited_for_with_the_others_announced() -> None:
    world = batch_world(("a", "fetch"), ("b", "fetch"), landings=[[("a", "one"), ("b", "two")]])
    state = new_run()
    world.run(flow().step(state))
    world.effects.clear()
    world.run(flow().step(state))
    launches = [i for i, effect in enumerate(world.effects) if isinstance(effect, Launch)]
    starts = [e for e in world.effects if isinstance(e, Persist) and any(x.type == "tool_started" for x in e.events)]
    assert [e.events[-1].data["call_id"] for e in starts] == ["a", "b"]
    for launch, start in zip(launches, starts, strict=True):
        assert world.effects.index(start) < launch  # committed before it runs
    announced = [e.activity for e in world.effects if isinstance(e, Announce)]
    assert [type(a).__name__ for a in announced] == ["RunTool", "RunningTools"]
    running = announced[1]
    assert isinstance(running, RunningTools)
    assert [action.call.call_id for action in running.calls] == ["a", "b"]
    assert state.messages[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "a", "content": "one"},
        {"type": "tool_result", "tool_use_id": "b", "content": "two"},
    ]


def test_at_most_max_concurrent_tools_attempts_are_out_at_once() -> None:
    agent = Agent(model=ScriptedModel([]), tools=TOOLS, max_concurrent_tools=2)
    world = batch_world(
        ("a", "fetch"), ("b", "fetch"), ("c", "fetch"), landings=[[("b", "2")], [("a", "1")], [("c", "3")]]
    )
    state = new_run()
    world.run(flow(agent).step(state))
    world.effects.clear()
    world.run(flow(agent).step(state))
    out = [
        (type(e).__name__, e.attempt.action.call.call_id if isinstance(e, Launch) else len(e.handles))
        for e in world.effects
        if isinstance(e, Launch | Landed)
    ]
    assert out == [("Launch", "a"), ("Launch", "b"), ("Landed", 2), ("Launch", "c"), ("Landed", 2), ("Landed", 1)]
    assert [block["content"] for block in state.messages[-1]["content"]] == ["1", "2", "3"]


def test_a_call_running_alone_is_attempted_as_before() -> None:
    """A concurrent call with no concurrent sibling ready is one plain attempt."""
    world = World(model=[asks(("a", "fetch"), ("b", "look"))], tools=["one", "two"])
    state = new_run()
    world.run(flow().step(state))
    world.effects.clear()
    world.run(flow().step(state))
    assert [type(effect) for effect in world.effects] == TOOL_STEP


def test_a_batch_commits_the_others_results_before_the_failure_that_ends_the_run() -> None:
    world = batch_world(("a", "fetch_brittle"), ("b", "fetch"), landings=[[("a", ValueError("broken"))], [("b", "ok")]])
    state = new_run()
    world.run(flow().step(state))
    world.persisted.clear()
    world.run(flow().step(state))
    assert world.transitions() == [
        ("tool_finished", "executing_tool", "executing_tool"),
        ("fail", "executing_tool", "failed"),
    ]
    finished = [(e.data["call_id"], e.data["is_error"]) for e in world.persisted if e.type == "tool_finished"]
    assert finished == [("b", False), ("a", True)]
    assert "broken" in (state.error or "")


def test_a_failure_held_back_stops_further_launches() -> None:
    agent = Agent(model=ScriptedModel([]), tools=TOOLS, max_concurrent_tools=2)
    calls = (("a", "fetch_brittle"), ("b", "fetch"), ("c", "fetch"))
    world = batch_world(*calls, landings=[[("a", ValueError("broken"))], [("b", "ok")]])
    state = new_run()
    world.run(flow(agent).step(state))
    world.run(flow(agent).step(state))
    assert [e.attempt.action.call.call_id for e in world.effects if isinstance(e, Launch)] == ["a", "b"]
    assert state.status == "failed"


def test_escalations_of_one_batch_are_asked_about_in_one_question() -> None:
    world = batch_world(
        ("a", "fetch_shaky"), ("b", "fetch"), ("c", "fetch_shaky"),
        landings=[[("a", ValueError("down")), ("b", "ok"), ("c", ValueError("down"))]],
    )  # fmt: skip
    state = new_run()
    world.run(flow().step(state))
    world.persisted.clear()
    world.run(flow().step(state))
    asked = [e.data for e in world.persisted if e.type == "approval_requested"]
    assert [[c["call_id"] for c in a["calls"]] for a in asked] == [["a", "c"]]
    assert asked[0]["escalation"] is True
    assert state.pending_approvals() == [state.batch[0], state.batch[2]]
    assert state.in_flight == {}  # each escalated attempt ended; nothing is in doubt


def test_a_cached_concurrent_call_is_answered_without_a_launch() -> None:
    uses = [tool_use("a", "fetch_cached", {"path": "x"}), tool_use("b", "fetch_cached", {"path": "y"})]
    world = World(model=[reply([*uses, tool_use("c", "fetch", {"path": "z"})], "tool_use")])
    world.landings = [[("b", "2"), ("c", "3")]]
    state = new_run()
    world.run(flow().step(state))
    hit = cache_key_of(state, "a")
    world.cache[hit] = "1"
    world.effects.clear()
    world.run(flow().step(state))
    assert [e.attempt.action.call.call_id for e in world.effects if isinstance(e, Launch)] == ["b", "c"]
    assert [block["content"] for block in state.messages[-1]["content"]] == ["1", "2", "3"]
    stored = [effect.value for effect in world.effects if isinstance(effect, StoreCache)]
    assert stored == ["2"]  # a fresh result of a cached tool is kept


def cache_key_of(state: RunState, call_id: str) -> str:
    action = engine.next_action(state, AGENT, now=NOW)
    assert isinstance(action, engine.RunTool)
    assert action.call.call_id == call_id
    return cache.key_for(action, tenant=state.tenant)


def test_calls_under_way_count_against_the_tool_call_limit() -> None:
    """With max_tool_calls=2, a third concurrent call is not launched beside two running ones:
    once they are recorded, it fails the run at the limit, as it would one call at a time."""
    agent = Agent(model=ScriptedModel([]), tools=TOOLS, limits=Limits(max_tool_calls=2))
    world = batch_world(("a", "fetch"), ("b", "fetch"), ("c", "fetch"), landings=[[("a", "1"), ("b", "2")]])
    state = new_run()
    world.run(flow(agent).step(state))
    world.run(flow(agent).step(state))
    assert [e.attempt.action.call.call_id for e in world.effects if isinstance(e, Launch)] == ["a", "b"]
    world.run(flow(agent).step(state))
    assert state.status == "failed"
    assert state.error == "max_tool_calls limit reached: 2 tool executions"
