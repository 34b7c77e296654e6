"""Concurrent tool calls: the calls of one model turn marked ``concurrent`` run at once.

Concurrency is proven without timing: tools that each wait for the other (a
``threading.Barrier``, events) can only finish if they run at the same time; run one after
another, the first would wait out its barrier's timeout and the run would carry its error.
Every scenario runs on :class:`Runner` and :class:`AsyncRunner`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from support import done, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, ConfigError, RetryPolicy, Runner, RunResult, Tool, tool
from tether.core.state import RunState
from tether.errors import ToolDefinitionError
from tether.facts.events import Event
from tether.models.scripted import ScriptedModel
from tether.stores.memory import MemoryStore
from tether.testing import RecordingApprover

KINDS = ["sync", "async"]
MEET_TIMEOUT = 10.0
"""Seconds a tool waits for its partner before giving up: only reached if they did not run at once."""
ANSWER = {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}


def asks(*calls: tuple[str, str]) -> dict[str, Any]:
    """The model asks for these (call id, tool) calls in one turn."""
    return tool_use_turn(*(tool_use(call_id, name, {}) for call_id, name in calls))


def meeting(*names: str, concurrent: bool | None = True, **options: Any) -> list[Tool]:
    """Tools that return only once all of them are running at the same time (one barrier)."""
    barrier = threading.Barrier(len(names), timeout=MEET_TIMEOUT)

    def make(name: str) -> Tool:
        def meet() -> str:
            barrier.wait()
            return f"{name} met the others"

        meet.__doc__ = f"Meet the others ({name})."
        return tool(name=name, concurrent=concurrent, **options)(meet)

    return [make(name) for name in names]


class Run:
    """One agent driven to its end by the sync or the async runner, with its store kept."""

    def __init__(
        self,
        kind: str,
        script: Sequence[dict[str, Any]],
        tools: Sequence[Tool],
        *,
        approver: Any = None,
        listeners: Sequence[Callable[[RunState, Event], None]] = (),
        clock: Callable[[], float] | None = None,
        **agent_options: Any,
    ) -> None:
        self.kind = kind
        self.store = MemoryStore()
        self.agent = Agent(model=ScriptedModel(list(script)), tools=list(tools), **agent_options)
        runner_class = Runner if kind == "sync" else AsyncRunner
        extra: dict[str, Any] = {} if clock is None else {"clock": clock}
        self.runner = runner_class(self.agent, self.store, approver=approver, listeners=listeners, **extra)
        self.run_id = ""

    def start(self, *, max_wait: float | None = None) -> RunResult:
        result: RunResult = done(self.runner.run("go", max_wait=max_wait))
        self.run_id = result.run_id
        return result

    def resume(self) -> RunResult:
        result: RunResult = done(self.runner.drive(self.run_id))
        return result

    def events(self, *kinds: str) -> list[Event]:
        return [e for e in self.store.load_events(self.run_id) if not kinds or e.type in kinds]


def results_of(run: Run) -> list[list[tuple[str, str, bool]]]:
    """Each user message of tool results: (call id, content, is_error), in message order."""
    messages = done(run.runner.load(run.run_id)).messages
    blocks = [[b for b in m["content"] if b["type"] == "tool_result"] for m in messages if m["role"] == "user"]
    return [[(b["tool_use_id"], b["content"], bool(b.get("is_error"))) for b in found] for found in blocks if found]


def order(run: Run, kind: str) -> list[str]:
    """Call ids of the run's events of ``kind``, in the order they were committed."""
    return [e.data["call_id"] for e in run.events(kind)]


# The option ----------------------------------------------------------------------------------
def test_a_tool_says_whether_it_may_run_concurrently_and_the_agent_sets_the_default() -> None:
    @tool
    def plain() -> str:
        """Plain."""
        return ""

    @tool(concurrent=True)
    def parallel() -> str:
        """Parallel."""
        return ""

    @tool(concurrent=False)
    def alone() -> str:
        """Always alone."""
        return ""

    assert (plain.concurrent, parallel.concurrent, alone.concurrent) == (None, True, False)
    serial = Agent(model=ScriptedModel([]), tools=[plain, parallel, alone])
    assert [serial.runs_concurrently(t) for t in (plain, parallel, alone)] == [False, True, False]
    eager = Agent(model=ScriptedModel([]), tools=[plain, parallel, alone], concurrent_tools=True)
    assert [eager.runs_concurrently(t) for t in (plain, parallel, alone)] == [True, True, False]
    assert serial.max_concurrent_tools == 8


def test_bad_concurrency_settings_are_refused_with_a_clear_error() -> None:
    def f() -> str:
        """F."""
        return ""

    with pytest.raises(ToolDefinitionError, match="concurrent must be True, False or None"):
        tool(concurrent="yes")(f)  # type: ignore[call-overload]  # on purpose: not a bool
    with pytest.raises(ConfigError, match="max_concurrent_tools must be at least 1"):
        Agent(model=ScriptedModel([]), max_concurrent_tools=0)


# Running at once -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_calls_of_one_turn_run_at_once_and_answer_in_one_message(kind: str) -> None:
    run = Run(kind, [asks(("a", "left"), ("b", "right")), ANSWER], meeting("left", "right"))
    assert run.start().status == "done"
    assert results_of(run) == [[("a", "left met the others", False), ("b", "right met the others", False)]]
    assert order(run, "tool_started") == ["a", "b"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_agent_default_makes_plain_tools_concurrent(kind: str) -> None:
    run = Run(
        kind,
        [asks(("a", "left"), ("b", "right")), ANSWER],
        meeting("left", "right", concurrent=None),
        concurrent_tools=True,
    )
    assert run.start().status == "done"
    assert [r[2] for r in results_of(run)[0]] == [False, False]


@pytest.mark.parametrize("kind", KINDS)
def test_sync_and_async_tools_run_at_once(kind: str) -> None:
    sync_started, async_started = threading.Event(), threading.Event()

    @tool(concurrent=True)
    def blocking() -> str:
        """A sync tool."""
        sync_started.set()
        return "sync saw async" if async_started.wait(MEET_TIMEOUT) else "alone"

    @tool(concurrent=True)
    async def awaiting() -> str:
        """An async tool."""
        async_started.set()
        met = await asyncio.to_thread(sync_started.wait, MEET_TIMEOUT)
        return "async saw sync" if met else "alone"

    run = Run(kind, [asks(("a", "awaiting"), ("b", "blocking")), ANSWER], [blocking, awaiting])
    assert run.start().status == "done"
    assert results_of(run) == [[("a", "async saw sync", False), ("b", "sync saw async", False)]]


def test_async_tools_run_as_tasks_on_the_async_runner() -> None:
    ping, pong = asyncio.Event(), asyncio.Event()

    @tool(concurrent=True)
    async def first() -> str:
        """Waits for second."""
        ping.set()
        await asyncio.wait_for(pong.wait(), MEET_TIMEOUT)
        return "first"

    @tool(concurrent=True)
    async def second() -> str:
        """Waits for first."""
        pong.set()
        await asyncio.wait_for(ping.wait(), MEET_TIMEOUT)
        return "second"

    run = Run("async", [asks(("a", "first"), ("b", "second")), ANSWER], [first, second])
    assert run.start().status == "done"
    assert results_of(run) == [[("a", "first", False), ("b", "second", False)]]


@pytest.mark.parametrize("kind", KINDS)
def test_results_are_recorded_as_they_land_and_returned_in_the_models_order(kind: str) -> None:
    """c lands first, then b, then a: each waits for the one after it to be committed."""
    committed = {name: threading.Event() for name in "abc"}

    def listener(state: RunState, event: Event) -> None:
        if event.type == "tool_finished":
            committed[event.data["call_id"]].set()

    def waits_for(after: str | None) -> Callable[[], str]:
        def wait() -> str:
            if after is not None and not committed[after].wait(MEET_TIMEOUT):
                return f"{after} was never committed"
            return "ok"

        return wait

    tools = [
        tool(name="ta", description="a", concurrent=True)(waits_for("b")),
        tool(name="tb", description="b", concurrent=True)(waits_for("c")),
        tool(name="tc", description="c", concurrent=True)(waits_for(None)),
    ]
    run = Run(kind, [asks(("a", "ta"), ("b", "tb"), ("c", "tc")), ANSWER], tools, listeners=[listener])
    assert run.start().status == "done"
    assert order(run, "tool_finished") == ["c", "b", "a"]
    assert results_of(run) == [[("a", "ok", False), ("b", "ok", False), ("c", "ok", False)]]


@pytest.mark.parametrize("kind", KINDS)
def test_calls_not_marked_concurrent_run_alone_in_the_models_order(kind: str) -> None:
    active: set[str] = set()
    alone: dict[str, bool] = {}
    lock = threading.Lock()

    def solo(name: str) -> Tool:
        def run_alone() -> str:
            with lock:
                alone[name] = not active
                active.add(name)
            with lock:
                active.discard(name)
            return name

        return tool(name=name, description=name)(run_alone)

    script = [asks(("s1", "first"), ("c1", "left"), ("s2", "second"), ("c2", "right")), ANSWER]
    run = Run(kind, script, [solo("first"), solo("second"), *meeting("left", "right")])
    assert run.start().status == "done"
    assert alone == {"first": True, "second": True}
    # the concurrent calls run together when the first of them comes up; the others one by one
    assert order(run, "tool_started") == ["s1", "c1", "c2", "s2"]
    assert [r[0] for r in results_of(run)[0]] == ["s1", "c1", "s2", "c2"]
    assert not any(r[2] for r in results_of(run)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_at_most_max_concurrent_tools_run_at_once(kind: str) -> None:
    active, peak = [0], [0]
    lock = threading.Lock()
    barrier = threading.Barrier(2, timeout=MEET_TIMEOUT)

    def counted(name: str, *, meets: bool) -> Tool:
        def run() -> str:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            if meets:
                barrier.wait()
            with lock:
                active[0] -= 1
            return name

        return tool(name=name, description=name, concurrent=True)(run)

    tools = [counted("one", meets=True), counted("two", meets=True), counted("three", meets=False)]
    script = [asks(("a", "one"), ("b", "two"), ("c", "three")), ANSWER]
    run = Run(kind, script, tools, max_concurrent_tools=2)
    assert run.start().status == "done"
    assert peak[0] == 2
    assert [r[1] for r in results_of(run)[0]] == ["one", "two", "three"]


# Failures among concurrent calls ---------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_due_later_does_not_hold_back_the_others_results(kind: str) -> None:
    barrier = threading.Barrier(2, timeout=MEET_TIMEOUT)
    tries: list[int] = []
    now = [1_000.0]

    @tool(concurrent=True, retry=RetryPolicy(max_attempts=2, initial_delay=60.0, retry_on=(ConnectionError,)))
    def flaky() -> str:
        """Fails the first time."""
        tries.append(1)
        if len(tries) == 1:
            barrier.wait()
            raise ConnectionError("reset by peer")
        return "flaky at last"

    @tool(concurrent=True)
    def steady() -> str:
        """Always works."""
        barrier.wait()
        return "steady"

    run = Run(kind, [asks(("a", "flaky"), ("b", "steady")), ANSWER], [flaky, steady], clock=lambda: now[0])
    parked = run.start(max_wait=0)
    assert parked.status == "waiting_retry"
    assert order(run, "retry_scheduled") == ["a"]
    assert order(run, "tool_finished") == ["b"]  # recorded now, not after the retry
    now[0] += 600
    assert run.resume().status == "done"
    assert results_of(run) == [[("a", "flaky at last", False), ("b", "steady", False)]]


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_call_gets_its_error_and_the_others_their_results(kind: str) -> None:
    barrier = threading.Barrier(2, timeout=MEET_TIMEOUT)

    @tool(concurrent=True)
    def broken() -> str:
        """Raises."""
        barrier.wait()
        raise ValueError("no such thing")

    @tool(concurrent=True)
    def steady() -> str:
        """Works."""
        barrier.wait()
        return "steady"

    run = Run(kind, [asks(("a", "broken"), ("b", "steady")), ANSWER], [broken, steady])
    assert run.start().status == "done"
    [[(a, error, a_failed), (b, steady_result, b_failed)]] = results_of(run)
    assert (a, a_failed, b, steady_result, b_failed) == ("a", True, "b", "steady", False)
    assert "ValueError: no such thing" in error


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_that_fails_the_run_waits_for_the_others_to_be_recorded(kind: str) -> None:
    barrier = threading.Barrier(2, timeout=MEET_TIMEOUT)

    @tool(concurrent=True, retry=RetryPolicy(retry_on=(ValueError,), on_exhausted="fail"))
    def brittle() -> str:
        """Its failure ends the run."""
        barrier.wait()
        raise ValueError("broken for good")

    @tool(concurrent=True)
    def steady() -> str:
        """Works."""
        barrier.wait()
        return "steady"

    run = Run(kind, [asks(("a", "brittle"), ("b", "steady"))], [brittle, steady])
    result = run.start()
    assert result.status == "failed"
    assert "broken for good" in (result.error or "")
    assert order(run, "tool_finished") == ["b", "a"]  # the other result first, then the failure
    assert [e.type for e in run.events()][-2:] == ["transition", "run_finished"]


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_calls_escalated_together_are_asked_about_together(kind: str) -> None:
    barrier = threading.Barrier(3, timeout=MEET_TIMEOUT)
    tries: dict[str, int] = {}

    def shaky(name: str) -> Tool:
        def run() -> str:
            tries[name] = tries.get(name, 0) + 1
            if tries[name] == 1:
                barrier.wait()
                raise ConnectionError(f"{name} is down")
            return f"{name} is back"

        policy = RetryPolicy(retry_on=(ConnectionError,), on_exhausted="escalate")
        return tool(name=name, description=name, concurrent=True, retry=policy)(run)

    @tool(concurrent=True)
    def steady() -> str:
        """Works."""
        barrier.wait()
        return "steady"

    approver = RecordingApprover({"one": Approve(), "two": Approve()})
    script = [asks(("a", "one"), ("b", "steady"), ("c", "two")), ANSWER]
    run = Run(kind, script, [shaky("one"), steady, shaky("two")], approver=approver)
    assert run.start().status == "done"
    assert [[r.call_id for r in batch] for batch in approver.seen] == [["a", "c"]]
    assert results_of(run) == [[("a", "one is back", False), ("b", "steady", False), ("c", "two is back", False)]]


@pytest.mark.parametrize("kind", KINDS)
def test_a_timed_out_call_among_concurrent_ones_times_out_alone(kind: str) -> None:
    @tool(concurrent=True, timeout=0.2)
    def hangs(cancel: threading.Event) -> str:
        """Waits until its attempt is cancelled."""
        cancel.wait()
        return "late"

    @tool(concurrent=True)
    def quick() -> str:
        """Returns at once."""
        return "quick"

    run = Run(kind, [asks(("a", "hangs"), ("b", "quick")), ANSWER], [hangs, quick])
    assert run.start().status == "done"
    [[(_, timed_out, a_failed), (_, quick_result, b_failed)]] = results_of(run)
    assert (a_failed, quick_result, b_failed) == (True, "quick", False)
    assert "timed out after 0.2s" in timed_out


# Approvals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_gated_calls_of_a_batch_are_asked_together_then_run_at_once(kind: str) -> None:
    """The ungated calls run (at once) first; then every gated call is shown in one question;
    no gated call starts before all of them are decided; the approved ones then run at once."""
    left, right = meeting("left", "right")
    careful, bold = meeting("careful", "bold", approval=True)
    approver = RecordingApprover({"careful": Approve(), "bold": Approve()})
    script = [asks(("g1", "careful"), ("a", "left"), ("g2", "bold"), ("b", "right")), ANSWER]
    run = Run(kind, script, [left, right, careful, bold], approver=approver)
    assert run.start().status == "done"
    assert [[r.call_id for r in batch] for batch in approver.seen] == [["g1", "g2"]]
    kinds = [(e.type, e.data.get("call_id")) for e in run.events("tool_started", "approval_requested")]
    assert kinds == [
        ("tool_started", "a"),
        ("tool_started", "b"),
        ("approval_requested", None),
        ("tool_started", "g1"),
        ("tool_started", "g2"),
    ]
    assert [(r[0], r[2]) for r in results_of(run)[0]] == [("g1", False), ("a", False), ("g2", False), ("b", False)]


def test_cancelling_an_async_drive_cancels_its_concurrent_attempts_and_the_run_resumes() -> None:
    started = {name: asyncio.Event() for name in ("hold_a", "hold_b")}
    cancelled: list[str] = []

    def holding(name: str) -> Tool:
        async def hold() -> str:
            started[name].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise
            return "never"

        return tool(name=name, description=name, concurrent=True)(hold)

    run = Run("async", [asks(("a", "hold_a"), ("b", "hold_b")), ANSWER], [holding("hold_a"), holding("hold_b")])
    runner = run.runner
    assert isinstance(runner, AsyncRunner)
    state = done(runner.create("go"))
    run.run_id = state.id

    async def cancel_mid_batch() -> None:
        drive = asyncio.create_task(runner.drive(state))
        for event in started.values():
            await asyncio.wait_for(event.wait(), MEET_TIMEOUT)
        drive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drive

    asyncio.run(cancel_mid_batch())
    assert sorted(cancelled) == ["hold_a", "hold_b"]
    stored = done(runner.load(state.id))
    assert set(stored.in_flight) == {"a", "b"}  # started, never finished: in doubt
    result = run.resume()  # no approver: the model is told neither call was re-run
    assert result.status == "done"
    assert [(call_id, is_error) for call_id, _, is_error in results_of(run)[0]] == [("a", True), ("b", True)]
    assert all("interrupted mid-run" in content for _, content, _ in results_of(run)[0])
