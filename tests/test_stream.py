"""A run's events as a stream: typed, each with its cursor; a consumer that reconnects misses nothing.

``AsyncRunner.stream`` and ``Runner.stream`` follow a run driven here (woken by each commit, the
model's text as it arrives) or in another process (reading the log every ``poll`` seconds); a
consumer that goes away and comes back with its last cursor sees every event once. The SSE
endpoint of the example service is tested in test_service_stream.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from support import DONE, EFFECT_TOOLS, finish_tether, start_tether, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, RetryPolicy, Runner, tool
from tether.core.approvals import DecideLater
from tether.drivers import stream
from tether.errors import RunBusy, RunNotFound, UnknownCursor
from tether.facts import stream as events
from tether.facts.events import Event
from tether.facts.stream import (
    ApprovalNeeded,
    CallDecided,
    ChildRunStarted,
    ModelStepDone,
    RunEnded,
    StatusChanged,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
)
from tether.models import ModelRequest, ModelResponse, TextListener
from tether.stores import AsyncStore, Store
from tether.stores.memory import MemoryStore
from tether.stores.sql import AsyncSQLStore, SQLStore
from tether.testing import ScriptedModel

ANSWER = {"content": [{"type": "text", "text": "All three added."}], "stop_reason": "end_turn"}


def adding_script(calls: int = 3) -> list[dict[str, Any]]:
    """One add call per turn, then an answer."""
    return [*(tool_use_turn(tool_use(f"toolu_{n}", "add", {"a": n, "b": n})) for n in range(calls)), ANSWER]


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def stored_stream(store: Store, run_id: str) -> list[StreamEvent]:
    """What a consumer following the run from its first event gets (text deltas aside)."""
    return [shown for event in store.load_events(run_id) if (shown := events.stream_event(run_id, event))]


def cursors(seen: list[StreamEvent]) -> list[int]:
    return [event.cursor for event in seen if event.cursor is not None]


# The events ---------------------------------------------------------------------------------
def test_each_recorded_step_is_one_typed_event_with_its_seq_as_cursor() -> None:
    @tool(approval=True)
    def refund(invoice: str) -> str:
        """Refund an invoice (a person decides)."""
        return f"refunded {invoice}"

    script = [
        tool_use_turn(tool_use("toolu_r", "refund", {"invoice": "INV-7"})),
        {"content": [{"type": "text", "text": "Refunded."}], "stop_reason": "end_turn"},
    ]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[refund]), approver=DecideLater())
    parked = runner.run("Refund INV-7.")
    runner.decide(parked.run_id, "toolu_r", Approve(actor="alice"))
    runner.drive(parked.run_id)

    log = runner.store.load_events(parked.run_id)
    seen = stored_stream(runner.store, parked.run_id)
    assert [type(event) for event in seen] == [
        StatusChanged,  # start → thinking
        ModelStepDone,
        StatusChanged,  # → executing_tool
        ApprovalNeeded,  # a step's facts, then the move they lead to
        StatusChanged,  # → awaiting_approval
        CallDecided,
        StatusChanged,  # → executing_tool
        ToolCallStarted,
        ToolCallFinished,
        StatusChanged,  # → thinking
        ModelStepDone,
        StatusChanged,  # → done
        RunEnded,
    ]
    by_seq = {event.seq: event for event in log}
    for event in seen:
        assert event.cursor is not None
        assert events.stream_event(parked.run_id, by_seq[event.cursor]) == event  # the cursor is its event's seq
    asked = next(event for event in seen if isinstance(event, ApprovalNeeded))
    assert [(call.call_id, call.tool, call.input) for call in asked.calls] == [
        ("toolu_r", "refund", {"invoice": "INV-7"})
    ]
    first = next(event for event in seen if isinstance(event, ModelStepDone))
    assert first.tool_calls == (ToolCall("toolu_r", "refund", {"invoice": "INV-7"}),)
    ended = seen[-1]
    assert isinstance(ended, RunEnded)
    assert (ended.status, ended.output, ended.error, ended.retryable) == ("done", "Refunded.", None, False)
    passed_over = {event.type for event in log if events.stream_event(parked.run_id, event) is None}
    assert passed_over == {"run_started", "results_returned"}  # the run's opening, the batch's results message


def test_a_retry_is_an_attempt_that_finished_with_when_the_next_is_due() -> None:
    attempts: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=0.0, retry_on=(ConnectionError,)))
    def flaky() -> str:
        """Fails once."""
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("down")
        return "up"

    script = [tool_use_turn(tool_use("toolu_f", "flaky", {})), DONE]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[flaky]))
    done = runner.run("try")
    finished = [e for e in stored_stream(runner.store, done.run_id) if isinstance(e, ToolCallFinished)]
    assert [(e.attempt, e.is_error, e.retry_at is not None) for e in finished] == [(1, True, True), (2, False, False)]
    assert "down" in finished[0].content


def test_a_call_served_by_a_child_run_names_the_run_whose_stream_holds_its_work() -> None:
    reviewer = Agent(model=ScriptedModel([ANSWER]), name="reviewer")
    review = reviewer.as_tool("review", "Have the reviewer check a draft.")
    script = [tool_use_turn(tool_use("toolu_review", "review", {"task": "check"})), DONE]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[review], name="writer"))
    done = runner.run("write")
    parents = stored_stream(runner.store, done.run_id)
    started = [event for event in parents if isinstance(event, ChildRunStarted)]
    assert [(event.call_id, event.tool) for event in started] == [("toolu_review", "review")]
    childs = list(runner.stream(started[0].child_run_id))
    assert [e.text for e in childs if isinstance(e, ModelStepDone)] == ["All three added."]
    assert isinstance(childs[-1], RunEnded)


def test_to_json_gives_kind_cursor_and_fields() -> None:
    delta = TextDelta("run_1", "Hel")
    assert events.to_json(delta) == {"kind": "text_delta", "cursor": None, "run_id": "run_1", "text": "Hel"}
    started = ToolCallStarted("run_1", 7, 1.5, "toolu_1", "add", 1)
    assert events.to_json(started) == {
        "kind": "tool_call_started",
        "cursor": 7,
        "run_id": "run_1",
        "at": 1.5,
        "call_id": "toolu_1",
        "tool": "add",
        "attempt": 1,
    }
    json.dumps(events.to_json(stored_stream_of_a_run()[1]))  # a model step, usage and all, is JSON


def stored_stream_of_a_run() -> list[StreamEvent]:
    runner = Runner(Agent(model=ScriptedModel(adding_script(1)), tools=[add]))
    return stored_stream(runner.store, runner.run("add").run_id)


# Following: the decisions --------------------------------------------------------------------
def _replay(run_id: str, log: list[Event], after: int | None) -> list[StreamEvent]:
    """:func:`stream.following` driven by hand over a finished log (what a shell does)."""
    steps = stream.following(run_id, after)
    seen: list[StreamEvent] = []
    outcome: Any = None
    while True:
        try:
            effect = steps.send(outcome)
        except StopIteration:
            return seen
        outcome = None
        if isinstance(effect, stream.Read):
            outcome = [event for event in log if event.seq > effect.after][: effect.limit]
        elif isinstance(effect, stream.Deliver):
            seen += effect.events
        else:
            raise AssertionError(f"a finished run's stream waited: {effect}")


def test_a_finished_run_streams_whole_then_ends_and_from_its_end_ends_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Runner(Agent(model=ScriptedModel(adding_script(3)), tools=[add]))
    run_id = runner.run("add").run_id
    log = runner.store.load_events(run_id)
    monkeypatch.setattr(stream, "BATCH", 4)  # many reads, each a batch
    whole = _replay(run_id, log, None)
    assert whole == stored_stream(runner.store, run_id)
    middle = whole[5].cursor
    assert middle is not None
    assert _replay(run_id, log, middle) == whole[6:]
    assert _replay(run_id, log, log[-1].seq) == []  # asked again after the end: nothing, and no wait


def test_a_cursor_the_log_lacks_is_refused() -> None:
    runner = Runner(Agent(model=ScriptedModel(adding_script(1)), tools=[add]))
    run_id = runner.run("add").run_id
    with pytest.raises(UnknownCursor, match=f"run '{run_id}' has no event 999") as caught:
        list(runner.stream(run_id, after=999))
    assert caught.value.cursor == 999
    with pytest.raises(RunNotFound):
        list(runner.stream("run_nope"))


# Following a run driven here -----------------------------------------------------------------
async def test_stream_drive_yields_every_event_as_it_is_recorded_then_ends() -> None:
    store = MemoryStore()
    runner = AsyncRunner(Agent(model=ScriptedModel(adding_script(2)), tools=[add]), store)
    state = await runner.create("add")
    seen = [event async for event in runner.stream(state.id, drive=True)]
    assert [e for e in seen if not isinstance(e, TextDelta)] == stored_stream(store, state.id)
    assert isinstance(seen[-1], RunEnded)


async def test_a_drive_that_parks_ends_its_stream_and_the_next_goes_on_from_the_cursor() -> None:
    @tool(approval=True)
    async def publish(text: str) -> str:
        """Publish (a person decides)."""
        return f"published {text}"

    script = [tool_use_turn(tool_use("toolu_p", "publish", {"text": "hi"})), DONE]
    store = MemoryStore()
    runner = AsyncRunner(Agent(model=ScriptedModel(script), tools=[publish]), store, approver=DecideLater())
    state = await runner.create("publish")
    first = [event async for event in runner.stream(state.id, drive=True)]
    assert isinstance(first[-2], ApprovalNeeded)
    assert isinstance(first[-1], StatusChanged)  # the drive parked: the stream ends there
    assert first[-1].status == "awaiting_approval"
    await runner.decide(state.id, "toolu_p", Approve(actor="alice"))
    rest = [event async for event in runner.stream(state.id, after=first[-1].cursor, drive=True)]
    assert isinstance(rest[0], CallDecided)
    assert cursors(first) + cursors(rest) == cursors(stored_stream(store, state.id))


class GatedText:
    """A model whose answer's text arrives in two pieces, the second once the test let it (``go``)."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = ScriptedModel(script)
        self.go = threading.Event()
        self.agate = asyncio.Event()

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self.script.complete(request)

    def stream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        response = self.script.complete(request)
        if response.stop_reason == "end_turn":
            on_text("All three")
            assert self.go.wait(30)
            on_text(" added.")
        return response

    async def astream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        response = self.script.complete(request)
        if response.stop_reason == "end_turn":
            on_text("All three")
            await asyncio.wait_for(self.agate.wait(), 30)
            on_text(" added.")
        return response


async def test_the_answer_s_text_arrives_as_it_is_written_before_its_step() -> None:
    model = GatedText(adding_script(1))
    store = MemoryStore()
    runner = AsyncRunner(Agent(model=model, tools=[add]), store)
    state = await runner.create("add")
    seen: list[StreamEvent] = []
    async with aclosing(runner.stream(state.id, drive=True)) as following:
        async for event in following:
            seen.append(event)
            if isinstance(event, TextDelta):
                model.agate.set()  # the first piece came while the model was still writing
    deltas = [event for event in seen if isinstance(event, TextDelta)]
    assert [delta.text for delta in deltas] == ["All three", " added."]
    step = next(event for event in seen if isinstance(event, ModelStepDone) and event.text == "All three added.")
    assert seen.index(deltas[-1]) < seen.index(step)  # live text first, then the step that holds it whole
    assert [e for e in seen if not isinstance(e, TextDelta)] == stored_stream(store, state.id)


def test_runner_stream_follows_a_drive_in_another_thread_text_and_all() -> None:
    model = GatedText(adding_script(2))
    runner = Runner(Agent(model=model, tools=[add]))
    state = runner.create("add")
    driving = threading.Thread(target=runner.drive, args=(state.id,))
    seen: list[StreamEvent] = []
    following = runner.stream(state.id, poll=3600)  # woken by each commit: a lost wake would hang here
    seen.append(next(following))  # listening before the drive begins
    driving.start()
    for event in following:
        seen.append(event)
        if isinstance(event, TextDelta):
            model.go.set()
    driving.join()
    assert [event.text for event in seen if isinstance(event, TextDelta)] == ["All three", " added."]
    assert [e for e in seen if not isinstance(e, TextDelta)] == stored_stream(runner.store, state.id)


async def test_leaving_a_driving_stream_early_stops_the_drive_and_a_later_one_finishes_the_run() -> None:
    store = MemoryStore()
    model = GatedText(adding_script(1))
    runner = AsyncRunner(Agent(model=model, tools=[add]), store)
    state = await runner.create("add")
    async with aclosing(runner.stream(state.id, drive=True)) as following:
        async for event in following:
            if isinstance(event, TextDelta):
                break  # the drive waits in its model call: it is cancelled there
    assert store.load_run(state.id).status == "thinking"
    model.agate.set()
    done = await runner.drive(state.id)  # the lease was given up: no wait
    assert done.status == "done"


async def test_a_driving_stream_raises_what_the_drive_raised_after_what_was_recorded() -> None:
    store = MemoryStore()
    runner = AsyncRunner(Agent(model=ScriptedModel(adding_script(1)), tools=[add]), store)
    state = await runner.create("add")
    store.claim_run(state.id, "host:1:other", now=0.0, ttl=10**10)  # another process drives it
    seen: list[StreamEvent] = []

    async def follow() -> None:
        async for event in runner.stream(state.id, drive=True):
            seen.append(event)

    with pytest.raises(RunBusy):
        await follow()
    assert seen == stored_stream(store, state.id)  # its start, all there is


# A consumer that goes away and comes back -------------------------------------------------
class Gate:
    """Holds each call of ``step`` until the test opens it (one call per opening)."""

    def __init__(self) -> None:
        self.opened = asyncio.Semaphore(0)

    def tool(self) -> Any:
        @tool
        async def step(n: int) -> str:
            """One step of the work."""
            await self.opened.acquire()
            return f"step {n} done"

        return step


def stepping_script(steps: int) -> list[dict[str, Any]]:
    return [*(tool_use_turn(tool_use(f"toolu_{n}", "step", {"n": n})) for n in range(steps)), ANSWER]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_consumer_that_reconnects_with_its_cursor_misses_nothing_and_sees_nothing_twice(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite" else request.getfixturevalue("pg_schema").url
    store: AsyncStore = AsyncSQLStore(url)
    gate = Gate()
    runner = AsyncRunner(Agent(model=ScriptedModel(stepping_script(4)), tools=[gate.tool()]), store)
    state = await runner.create("work")
    driving = asyncio.create_task(runner.drive(state.id))

    first: list[StreamEvent] = []
    async with aclosing(runner.stream(state.id, poll=0.05)) as following:
        async for event in following:
            first.append(event)
            if isinstance(event, ToolCallStarted):
                break  # gone mid-run, while the first call runs
    for _ in range(2):  # the run goes on meanwhile: two calls finish and the third starts
        gate.opened.release()
    await until_recorded(store, state.id, lambda log: sum(e.type == "tool_started" for e in log) == 3)

    last = first[-1].cursor
    second = [event async for event in runner.stream(state.id, after=last, poll=0.05) if not opens(gate, event)]
    await driving
    await store.close()

    together = cursors(first) + cursors(second)
    assert together == sorted(set(together))  # nothing twice, in order
    sync = SQLStore(url)
    assert together == cursors(stored_stream(sync, state.id))  # nothing missed
    sync.close()
    assert isinstance(second[-1], RunEnded)


def opens(gate: Gate, event: StreamEvent) -> bool:
    """Let each call the consumer sees start run on (so the run ends while it listens)."""
    if isinstance(event, ToolCallStarted):
        gate.opened.release()
    return False


async def until_recorded(store: AsyncStore, run_id: str, done: Any) -> None:
    for _ in range(600):
        if done(await store.load_events(run_id)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the run did not get there")


# A run driven by another process ------------------------------------------------------------
@pytest.mark.slow
def test_a_run_driven_by_another_process_is_followed_by_polling_its_log(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(EFFECT_TOOLS, encoding="utf-8")
    script = [
        tool_use_turn(tool_use("toolu_w1", "wait_for", {"flag": "one"})),
        tool_use_turn(tool_use("toolu_w2", "wait_for", {"flag": "two"})),
        DONE,
    ]
    (tmp_path / "script.json").write_text(json.dumps(script), encoding="utf-8")
    args = ["run", "wait", "--tools", "mytools:TOOLS", "--model", "scripted:script.json", "--db", db_url, "--json"]
    process = start_tether(tmp_path, *args)
    store = SQLStore(db_url)
    try:
        run_id = wait_for_run(store)
        first: list[StreamEvent] = []
        for event in store_stream(store, run_id):
            first.append(event)
            if isinstance(event, ToolCallStarted):
                break  # gone while the other process's tool waits for its flag
        (tmp_path / "one").touch()
        (tmp_path / "two").touch()
        second = list(Runner(Agent(model=ScriptedModel([])), store).stream(run_id, after=first[-1].cursor, poll=0.05))
        assert finish_tether(process).returncode == 0
        together = cursors(first) + cursors(second)
        assert together == cursors(stored_stream(store, run_id))
        assert isinstance(second[-1], RunEnded)
    finally:
        process.kill()
        store.close()


def store_stream(store: Store, run_id: str) -> Any:
    return Runner(Agent(model=ScriptedModel([])), store).stream(run_id, poll=0.05)


def wait_for_run(store: Store) -> str:
    import time

    for _ in range(600):
        try:
            runs = store.list_runs()
        except Exception:
            runs = []
        if runs:
            return runs[0].id
        time.sleep(0.05)
    raise AssertionError("the other process made no run")


# tether ui's run pages ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_the_inspector_s_run_page_listens_to_the_run_s_stream(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pytest.importorskip("starlette", reason="tether ui needs the 'ui' extra")
    from tether.surfaces.web import live

    url = f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite" else request.getfixturevalue("pg_schema").url
    store = SQLStore(url)

    @tool(approval=True)
    def publish(text: str) -> str:
        """Publish (a person decides)."""
        return f"published {text}"

    script = [tool_use_turn(tool_use("toolu_p", "publish", {"text": "hi"})), DONE]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[publish]), store, approver=DecideLater())
    parked = runner.run("publish")
    shown = store.load_run(parked.run_id).version  # the version the page was rendered at

    async def gone() -> bool:
        return False

    def decide_elsewhere() -> None:  # as another request (or process) would, while the page listens
        runner.decide(parked.run_id, "toolu_p", Approve(actor="alice"))
        runner.drive(parked.run_id)

    following = live.run_changes(store, parked.run_id, None, shown, poll=0.05, gone=gone)
    deciding = asyncio.create_task(asyncio.to_thread(decide_elsewhere))
    said = [message async for message in following]  # to the run's end
    await deciding
    assert said[0].startswith("event: changed\n")
    final = store.load_run(parked.run_id)
    assert said[-1] == f'event: end\ndata: {{"version": {final.version}, "status": "done"}}\n\n'
    assert all(message.startswith("event: changed\n") for message in said[:-1])
    store.close()


# The service guide's example -------------------------------------------------------------------
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "service.md"


async def test_the_guide_s_watch_example_drives_a_run_to_its_gate_and_on(capsys: pytest.CaptureFixture[str]) -> None:
    readme = GUIDE.read_text()
    start = readme.index("```python\nfrom tether import AsyncRunner\nfrom tether.facts.stream import")
    block = readme[start + len("```python\n") : readme.index("```\n", start + 10)]
    found: dict[str, Any] = {}
    exec(compile(block, str(GUIDE), "exec"), found)

    @tool(approval=True)
    async def publish(text: str) -> str:
        """Publish (a person decides)."""
        return f"published {text}"

    script = [tool_use_turn(tool_use("toolu_p", "publish", {"text": "hi"})), DONE]
    runner = AsyncRunner(Agent(model=ScriptedModel(script), tools=[publish]), approver=DecideLater())
    state = await runner.create("publish")
    cursor = await found["watch"](runner, state.id)
    assert "waiting for a decision on publish" in capsys.readouterr().out
    await runner.decide(state.id, "toolu_p", Approve(actor="alice"))
    last = await found["watch"](runner, state.id, cursor)
    assert last == (await runner.store.load_events(state.id))[-1].seq  # the run's end: nothing more to come
    assert "the run ended done" in capsys.readouterr().out
