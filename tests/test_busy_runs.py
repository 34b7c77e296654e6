"""AsyncRunner's ``max_busy_runs``: how many runs at once do tether's own work (decide, write a step).

The rest queue first come first served, so hundreds of runs ready together cannot hold the event
loop for one long turn (tether.drivers.busy). A run gives its place up while it waits elsewhere
(model, tool, approver, a child run), so the limit can never deadlock runs that wait on each other,
and a run cancelled in the queue leaves the place free and the run resumable.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, AsyncRunner, tool
from tether.drivers.busy import DEFAULT_BUSY_RUNS, BusyRuns
from tether.models import ModelRequest, ModelResponse
from tether.stores.awaitable import AwaitableStore
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel

P = ParamSpec("P")
T = TypeVar("T")

STEP_WORK = {"create_run", "append", "load_log", "load_run"}
"""The store calls a step makes (a lease's claim, renewal and release are not a step's work)."""


def answer(text: str) -> dict[str, Any]:
    return model_reply([{"type": "text", "text": text}], "end_turn")


def two_calls(request: ModelRequest) -> dict[str, Any]:
    """Two tool calls, then an answer (each run's script, whatever the run)."""
    if request.invocation < 2:
        return tool_use_turn(tool_use(f"toolu_{request.invocation}", "note", {"text": "x"}))
    return answer("noted twice")


@tool
async def note(text: str) -> str:
    """Note a text."""
    await asyncio.sleep(0)
    return f"noted {text}"


class WatchedStore(AwaitableStore):
    """A memory store whose step writes take a moment, counting how many are in flight at once.

    ``hold(run_id)`` makes that run's next write wait until ``let_go()``.
    """

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.in_flight = 0
        self.most_in_flight = 0
        self._held_run: str | None = None
        self.holding = asyncio.Event()
        self._released = asyncio.Event()

    def hold(self, run_id: str) -> None:
        self._held_run = run_id

    def let_go(self) -> None:
        self._held_run = None
        self._released.set()

    async def _call(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if method.__name__ not in STEP_WORK:
            return await super()._call(method, *args, **kwargs)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            record = args[0] if args else None
            if method.__name__ == "append" and getattr(record, "id", None) == self._held_run:
                self.holding.set()
                await self._released.wait()
            await asyncio.sleep(0.001)  # the write's round trip: others may start theirs meanwhile
            return await super()._call(method, *args, **kwargs)
        finally:
            self.in_flight -= 1


def noting_agent(model: ScriptedModel | None = None) -> Agent:
    return Agent(model=model or ScriptedModel(two_calls), tools=[note])


async def drive_many(runner: AsyncRunner, count: int) -> list[str]:
    async def one() -> str:
        return (await runner.run("note twice")).status

    async with asyncio.timeout(30):
        return list(await asyncio.gather(*(one() for _ in range(count))))


@pytest.mark.parametrize(("limit", "most"), [(1, 1), (3, 3)])
async def test_no_more_runs_than_the_limit_write_at_once(limit: int, most: int) -> None:
    store = WatchedStore()
    statuses = await drive_many(AsyncRunner(noting_agent(), store, max_busy_runs=limit), 12)
    assert statuses == ["done"] * 12
    assert store.most_in_flight == most


async def test_without_a_limit_every_run_writes_when_it_is_ready() -> None:
    store = WatchedStore()
    statuses = await drive_many(AsyncRunner(noting_agent(), store, max_busy_runs=None), 12)
    assert statuses == ["done"] * 12
    assert store.most_in_flight > 3  # what the limit above held down


async def test_runners_given_one_busy_runs_share_its_limit() -> None:
    shared, store = BusyRuns(2), WatchedStore()
    runners = [AsyncRunner(noting_agent(), store, max_busy_runs=shared) for _ in range(2)]
    statuses = await asyncio.gather(*(drive_many(runner, 6) for runner in runners))
    assert statuses == [["done"] * 6] * 2
    assert store.most_in_flight == 2


async def test_by_default_every_runner_on_a_loop_shares_one_limit() -> None:
    """A service making a runner per request is limited all the same."""
    store = WatchedStore()
    runs = DEFAULT_BUSY_RUNS + 8
    statuses = await asyncio.gather(*(drive_many(AsyncRunner(noting_agent(), store), 1) for _ in range(runs)))
    assert statuses == [["done"]] * runs
    assert store.most_in_flight == DEFAULT_BUSY_RUNS


def test_one_busy_runs_serves_two_event_loops_at_once_each_with_its_own_places() -> None:
    shared = BusyRuns(1)
    ended: list[list[str]] = []

    def drive_in_a_loop() -> None:
        runner = AsyncRunner(noting_agent(), WatchedStore(), max_busy_runs=shared)
        ended.append(asyncio.run(drive_many(runner, 4)))

    threads = [threading.Thread(target=drive_in_a_loop) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert ended == [["done"] * 4] * 2


class MeetingModel(ScriptedModel):
    """Answers each run's first call only once every run is waiting in it (an asyncio.Barrier)."""

    def __init__(self, runs: int) -> None:
        super().__init__(two_calls)
        self.meeting = asyncio.Barrier(runs)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        if request.invocation == 0:
            await self.meeting.wait()
        return await super().acomplete(request)


async def test_a_run_waiting_for_its_model_holds_no_place() -> None:
    """Four runs meet inside their model calls under a limit of one: a held place would deadlock them."""
    model = MeetingModel(4)
    statuses = await drive_many(AsyncRunner(noting_agent(model), WatchedStore(), max_busy_runs=1), 4)
    assert statuses == ["done"] * 4


async def test_a_run_waiting_for_its_tool_holds_no_place() -> None:
    meeting = asyncio.Barrier(3)

    @tool(name="note")
    async def meet(text: str) -> str:
        """Note a text once the other runs' calls are running too."""
        await meeting.wait()
        return f"noted {text}"

    agent = Agent(model=ScriptedModel(two_calls), tools=[meet])
    statuses = await drive_many(AsyncRunner(agent, WatchedStore(), max_busy_runs=1), 3)
    assert statuses == ["done"] * 3


async def test_a_child_run_under_a_limit_of_one_finishes() -> None:
    """The parent waits for its child without its place; the child shares the parent's limit."""
    child = Agent(ScriptedModel([answer("looks good")]), name="reviewer")
    review = child.as_tool("review", "Have the reviewer check a draft.")
    parent = Agent(
        ScriptedModel([tool_use_turn(tool_use("toolu_review", "review", {"task": "check"})), answer("reviewed")]),
        tools=[review],
    )
    store = WatchedStore()
    async with asyncio.timeout(30):
        result = await AsyncRunner(parent, store, max_busy_runs=1).run("write and review")
    assert result.status == "done"
    assert result.output == "reviewed"
    assert store.most_in_flight == 1


async def test_a_run_cancelled_in_the_queue_frees_nothing_it_did_not_hold_and_resumes() -> None:
    store = WatchedStore()
    runner = AsyncRunner(noting_agent(), store, max_busy_runs=1)
    writing, queued = await runner.create("note twice"), await runner.create("note twice")
    store.hold(writing.id)
    async with asyncio.timeout(30):
        first = asyncio.create_task(runner.drive(writing.id))
        await store.holding.wait()  # the first run holds the one place, stuck in its write
        second = asyncio.create_task(runner.drive(queued.id))
        await asyncio.sleep(0.05)
        assert not second.done()  # queued behind the first
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        store.let_go()
        assert (await first).status == "done"
        assert (await runner.drive(queued.id)).status == "done"
    assert store.most_in_flight == 1


async def test_a_place_taken_back_after_a_cancelled_wait_is_not_given_twice() -> None:
    busy = BusyRuns(1)
    inside: list[str] = []
    other_may_leave = asyncio.Event()
    async with busy.place() as place:

        async def wait_elsewhere() -> None:
            async with place.away():
                await asyncio.sleep(3600)

        away = asyncio.create_task(wait_elsewhere())
        await asyncio.sleep(0)
        other = asyncio.create_task(enter(busy, inside, "other", other_may_leave))
        await asyncio.sleep(0.01)
        assert inside == ["other"]  # the place was free while the first waited elsewhere
        away.cancel()  # ends its wait elsewhere: it then waits to take the place back from "other"
        await asyncio.sleep(0.01)
        assert not away.done()
        away.cancel()  # and that wait is cancelled too: the place is not held
        with pytest.raises(asyncio.CancelledError):
            await away
        other_may_leave.set()
        await other
    may_leave = asyncio.Event()
    third = asyncio.create_task(enter(busy, inside, "third", may_leave))
    fourth = asyncio.create_task(enter(busy, inside, "fourth", may_leave))
    await asyncio.sleep(0.01)
    assert inside == ["other", "third"]  # one place: the fourth waits
    may_leave.set()
    await asyncio.gather(third, fourth)
    assert inside == ["other", "third", "fourth"]


async def enter(busy: BusyRuns, inside: list[str], name: str, may_leave: asyncio.Event) -> None:
    async with busy.place():
        inside.append(name)
        await may_leave.wait()


def test_a_runner_outlives_its_event_loop() -> None:
    runner = AsyncRunner(noting_agent(), WatchedStore(), max_busy_runs=1)
    for _ in range(2):  # asyncio.run makes a new loop each time
        statuses = asyncio.run(drive_many(runner, 3))
        assert statuses == ["done"] * 3


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_busy_runs must be at least 1"):
        AsyncRunner(noting_agent(), max_busy_runs=0)
