"""AsyncRunner never blocks its event loop: 64 concurrent runs, on SQLite and on PostgreSQL.

The runs are driven on a loop in asyncio's debug mode (``slow_callback_duration`` 10 ms), watched
by :class:`LoopProbe`: any blocking call made on the loop's thread fails the test, found by what
it is rather than by how long it took. Callbacks that took or computed for over 10 ms are shown
with a failure, not judged: CPU time too follows the machine's speed (the same code computed for
8 ms on one run and 18 ms on a host twice as slow), and how long work holds the loop is measured
in ``scripts/bench`` (the service-scale section's loop lag), as a timing belongs. The
waits a blocking call would spend on the loop are real and long: on SQLite another connection
takes the write lock for 25 ms at a time (as a second process writing would); on PostgreSQL every
byte crosses a proxy that delays it 10 ms each way (a slower network). Each run calls an async
tool, a sync tool (in a thread) and a gated tool whose approver blocks 20 ms (as a terminal prompt
does: it must run in a thread). The controls show the probe catches what AsyncRunner did before
(store calls made on the loop) and an approver that blocks the loop.

Garbage collection is paused while the runs are watched (after a warm-up run): a full collection
of a large heap is the interpreter's work, not a blocking call of ours.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support import LaggyProxy, PgSchema, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Limits, RunResult, tool
from tether.core.approvals import ApprovalRequest, Decision
from tether.models import ModelRequest, ModelResponse
from tether.stores import Store
from tether.stores.sql import AsyncSQLStore, SQLStore
from tether.testing import ScriptedModel

pytestmark = pytest.mark.slow  # sleeps: lock holders, a delaying proxy, blocking approvers

RUNS = 64
SLOW = 0.010


# The workload -------------------------------------------------------------------------------
def reply(request: ModelRequest) -> dict[str, Any]:
    """Three turns of tools (async, sync, gated), then an answer."""
    turns = [
        tool_use_turn(tool_use("t1", "lookup", {"key": "a"})),
        tool_use_turn(tool_use("t2", "compute", {"n": 3})),
        tool_use_turn(tool_use("t3", "publish", {"text": "done"})),
    ]
    if request.invocation < len(turns):
        return turns[request.invocation]
    return {"content": [{"type": "text", "text": "all done"}], "stop_reason": "end_turn"}


class AwaitingModel(ScriptedModel):
    """The scripted model, answering after awaiting 5 ms (as a real model's network call would)."""

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0.005)
        return self.complete(request)


@tool
async def lookup(key: str) -> str:
    """Look a key up (awaits I/O)."""
    await asyncio.sleep(0.005)
    return f"value of {key}"


@tool
def compute(n: int) -> str:
    """A sync tool: AsyncRunner runs it in a thread."""
    time.sleep(0.002)
    return str(n * n)


@tool(approval=True)
def publish(text: str) -> str:
    """Gated: asked about before it runs."""
    return f"published {text}"


class PromptingApprover:
    """A sync approver that takes 20 ms to answer, as a person at a terminal prompt blocks longer."""

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        time.sleep(0.02)
        return {r.call_id: Approve(actor="prompt") for r in requests}


class BlockingAsyncApprover:
    """A control: an async approver that blocks the loop (time.sleep inside a coroutine)."""

    async def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        time.sleep(0.02)
        return {r.call_id: Approve(actor="prompt") for r in requests}


class OnTheLoop:
    """A control: a sync store's calls made on the loop itself, as AsyncRunner made them before."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return call


def agent() -> Agent:
    model = AwaitingModel(reply)
    return Agent(model=model, tools=[lookup, compute, publish], limits=Limits(max_steps=10))


# The probe ----------------------------------------------------------------------------------
class LoopProbe:
    """Watches an event loop for blocking calls and for callbacks that hold it.

    Blocking calls are found by what they are, not by how long they took (which would depend
    on how busy the machine is): ``blockbuster`` raises on any blocking Python-level call made
    on the loop's thread (``time.sleep``, a blocking socket, sqlite3, a file), and a SQLAlchemy
    statement executed on that thread outside SQLAlchemy's asyncio greenlet is one a sync driver
    made there (libpq's waits happen in C, out of blockbuster's sight). Every callback's time is
    measured too, and shown with a failure but not judged: wall time (what asyncio's debug mode
    reports, machine noise included, in ``slow``) and the loop thread's CPU time, which depends on
    the machine's speed (in ``busy``: the callbacks that computed for longer than ``SLOW``).
    """

    def __init__(self) -> None:
        self.blocking: list[str] = []
        self.busy: list[str] = []
        self.slow: list[str] = []
        """Callbacks over ``SLOW`` in wall time (noise included): shown with a failure, not judged."""

    @contextmanager
    def watching(self) -> Iterator[None]:
        """While inside, on this thread (the loop's)."""
        import sqlalchemy as sa  # noqa: TID251 - the probe listens to every engine's statements
        from blockbuster import BlockBuster
        from sqlalchemy.util.concurrency import in_greenlet  # noqa: TID251

        loop_thread = threading.get_ident()
        run_handle = asyncio.events.Handle._run

        def timed_run(handle: asyncio.Handle) -> None:
            wall, cpu = time.perf_counter(), time.thread_time()
            run_handle(handle)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            if wall > SLOW:
                self.slow.append(f"{describe(handle)} took {wall * 1000:.1f} ms ({cpu * 1000:.1f} ms of CPU)")
            if cpu > SLOW:
                self.busy.append(f"{describe(handle)} computed for {cpu * 1000:.1f} ms")

        def executing(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if threading.get_ident() == loop_thread and not in_greenlet():
                self.blocking.append(f"a sync driver's statement on the loop: {statement[:60]!r}")

        buster = BlockBuster()
        for name in ("threading.Lock.acquire", "threading.Lock.acquire_lock"):
            buster.functions.pop(name)  # a lock held for microseconds by another thread is no blocking call
        asyncio.events.Handle._run = timed_run  # type: ignore[method-assign,assignment]  # on purpose: timing every callback
        sa.event.listen(sa.Engine, "before_cursor_execute", executing)
        buster.activate()
        try:
            yield
        finally:
            buster.deactivate()
            sa.event.remove(sa.Engine, "before_cursor_execute", executing)
            asyncio.events.Handle._run = run_handle  # type: ignore[method-assign]

    def verdict(self, results: list[RunResult | BaseException]) -> list[str]:
        """What blocked the loop (empty: nothing), with the runs a blocking call broke."""
        broken = [repr(r) for r in results if isinstance(r, BaseException)]
        return [*self.blocking, *broken]


def describe(handle: asyncio.Handle) -> str:
    """A callback as a person finds it: the task it steps and where that task stopped, else the handle."""
    task = getattr(handle._callback, "__self__", None)  # type: ignore[attr-defined]
    if not isinstance(task, asyncio.Task):
        return f"{handle!r:.120}"
    where = [f"{f.f_code.co_name}:{f.f_lineno}" for f in task.get_stack(limit=8)]
    return f"task {task.get_coro().__qualname__} (now at {' < '.join(reversed(where)) or 'its end'})"  # type: ignore[union-attr]


async def all_at_once(runner: AsyncRunner, runs: int) -> list[RunResult | BaseException]:
    """Start ``runs`` runs, one per turn of the loop (as requests arrive), and wait for them all."""
    started = []
    for i in range(runs):
        started.append(asyncio.create_task(runner.run(f"run {i}")))
        await asyncio.sleep(0)
    return await asyncio.gather(*started, return_exceptions=True)


def drive_under_debug(make_runner: Callable[[], AsyncRunner], runs: int) -> tuple[list[RunResult], LoopProbe]:
    """Drive ``runs`` runs at once on a debug-mode loop (after a warm-up run); their results and the probe."""
    loop = asyncio.new_event_loop()
    loop.set_debug(True)  # besides reporting slow callbacks, it refuses loop calls from other threads
    loop.slow_callback_duration = SLOW
    probe = LoopProbe()
    try:
        runner = make_runner()
        warm = loop.run_until_complete(runner.run("warm up"))  # first use: the schema, compiled statements
        assert warm.status == "done", warm.error
        gc.collect()
        gc.disable()
        try:
            with probe.watching():
                results = loop.run_until_complete(all_at_once(runner, runs))
        finally:
            gc.enable()
        loop.run_until_complete(runner.store.close())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    problems = probe.verdict(results)
    done = [r for r in results if not isinstance(r, BaseException)]
    probe.blocking = problems  # what the tests judge
    return done, probe


def assert_all_done(results: list[RunResult], runs: int) -> None:
    assert [r.status for r in results] == ["done"] * runs, [r.error for r in results if r.error]
    assert all(r.tool_calls == 3 for r in results)


# Making waits long and certain ------------------------------------------------------------
@contextmanager
def another_writer(path: Path, *, hold: float = 0.025, every: float = 0.25) -> Iterator[None]:
    """Another connection taking SQLite's write lock for ``hold`` seconds, every ``every`` seconds."""
    stop = threading.Event()

    def write() -> None:
        connection = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            while not stop.wait(every - hold):
                connection.execute("BEGIN IMMEDIATE")
                time.sleep(hold)
                connection.execute("COMMIT")
        finally:
            connection.close()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "runs.db"
    store = SQLStore(f"sqlite:///{path}")
    store.cache_purge(0.0)  # the tables exist (and the file is in WAL mode) before the other writer starts
    store.close()
    with another_writer(path):
        yield f"sqlite:///{path}"


@pytest.fixture
def slow_pg_url(pg_schema: PgSchema) -> Iterator[str]:
    with LaggyProxy(pg_schema.url, delay=0.010) as proxy:
        yield proxy.url


# The runs -----------------------------------------------------------------------------------
def test_sixty_four_runs_on_sqlite_never_block_the_loop(sqlite_url: str) -> None:
    results, probe = drive_under_debug(
        lambda: AsyncRunner(agent(), AsyncSQLStore(sqlite_url), approver=PromptingApprover()), RUNS
    )
    assert probe.blocking == [], (probe.busy, probe.slow)
    assert_all_done(results, RUNS)


@pytest.mark.postgres
def test_sixty_four_runs_on_postgres_never_block_the_loop(slow_pg_url: str) -> None:
    results, probe = drive_under_debug(
        lambda: AsyncRunner(agent(), AsyncSQLStore(slow_pg_url), approver=PromptingApprover()), RUNS
    )
    assert probe.blocking == [], (probe.busy, probe.slow)
    assert_all_done(results, RUNS)


def test_a_sync_sql_store_is_called_off_the_loop(sqlite_url: str) -> None:
    """AsyncRunner(agent, store=SQLStore(...)): the sync store's calls run in worker threads."""
    results, probe = drive_under_debug(
        lambda: AsyncRunner(agent(), SQLStore(sqlite_url), approver=PromptingApprover()), RUNS // 4
    )
    assert probe.blocking == [], (probe.busy, probe.slow)
    assert_all_done(results, RUNS // 4)


# The controls: the probe sees blocking ---------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_probe_catches_store_calls_made_on_the_loop(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "slow_pg_url")
    _, probe = drive_under_debug(
        lambda: AsyncRunner(agent(), OnTheLoop(SQLStore(url)), approver=PromptingApprover()),
        RUNS // 4,
    )
    assert any("statement on the loop" in problem or "sqlite3" in problem for problem in probe.blocking)


def test_the_probe_catches_an_approver_that_blocks_the_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    _, probe = drive_under_debug(lambda: AsyncRunner(agent(), AsyncSQLStore(url), approver=BlockingAsyncApprover()), 4)
    assert any("time.sleep" in problem for problem in probe.blocking), probe.blocking
