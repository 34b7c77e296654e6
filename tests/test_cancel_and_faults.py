"""Many runs in one event loop: cancelling one, or a store failing one, harms no other and loses nothing.

Cancelling the task that drives a run (``task.cancel()``) stops that drive at its next wait: a
write in progress is finished first (the store holds the whole step or none of it), the lease is
given up, and a later drive continues the run (a tool call it had started is in doubt there, as
after a crash: re-run if idempotent). A store failure in one run fails that run's drive alone.
Runs on SQLite and PostgreSQL through AsyncSQLStore, with real cancellations at real waits.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from support import libpq_dsn, tool_use, tool_use_turn
from tether import Agent, AsyncRunner, Limits, RunResult, tool
from tether.errors import StoreError, TetherError
from tether.facts.events import Event
from tether.models import ModelRequest, ModelResponse
from tether.stores import AsyncStore
from tether.stores.sql import AsyncSQLStore
from tether.testing import ScriptedModel


def reply(request: ModelRequest) -> dict[str, Any]:
    """Three tool turns, then an answer."""
    if request.invocation < 3:
        n = request.invocation
        return tool_use_turn(tool_use(f"t{n}", "fetch", {"key": f"k{n}"}))
    return {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}


class AwaitingModel(ScriptedModel):
    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0.003)
        return self.complete(request)


def agent(fetch: Any) -> Agent:
    return Agent(model=AwaitingModel(reply), tools=[fetch], limits=Limits(max_steps=10))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[AsyncSQLStore]:
    sqlite = f"sqlite:///{tmp_path / 'runs.db'}"
    opened = AsyncSQLStore(sqlite if request.param == "sqlite" else request.getfixturevalue("pg_schema").url)
    try:
        yield opened
    finally:
        await opened.close()


async def lease_is_free(store: AsyncStore, run_id: str) -> bool:
    taken = await store.claim_run(run_id, "checker:1:x", now=time.time(), ttl=30)
    await store.release_run(run_id, "checker:1:x")
    return taken.owner == "checker:1:x"


def contiguous(events: Sequence[Event]) -> bool:
    return [e.seq for e in events] == list(range(len(events)))


# Cancelling one run ------------------------------------------------------------------------------
async def test_cancelling_a_run_mid_tool_leaves_it_resumable_and_the_others_untouched(store: AsyncSQLStore) -> None:
    started, calls = asyncio.Event(), []

    @tool(idempotent=True)
    async def fetch(key: str) -> str:
        """Fetch a key; the cancelled run's first call never returns on its own."""
        calls.append(key)
        if len(calls) == 1:
            started.set()
            await asyncio.Event().wait()
        await asyncio.sleep(0.002)
        return f"value of {key}"

    runner = AsyncRunner(agent(fetch), store)
    victim = await runner.create("the one cancelled", run_id="run_victim")
    driving = asyncio.create_task(runner.drive(victim.id))
    await started.wait()
    others = [asyncio.create_task(runner.run(f"other {i}")) for i in range(6)]
    driving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await driving

    assert await lease_is_free(store, "run_victim")
    kinds = [e.type for e in await store.load_events("run_victim")]
    assert kinds[-1] == "tool_started"  # its start was committed; nothing after it was half-written
    finished = await asyncio.gather(*others)
    assert [r.status for r in finished] == ["done"] * 6

    resumed = await AsyncRunner(agent(fetch), store).drive("run_victim")
    assert resumed.status == "done"
    assert resumed.tool_calls == 3
    assert contiguous(await store.load_events("run_victim"))


async def test_cancelling_runs_at_random_moments_leaves_every_one_resumable(store: AsyncSQLStore) -> None:
    """Wherever a cancellation lands (a model call, a tool, a read, a write, the lease), the run goes on later."""
    ran: dict[str, int] = {}

    @tool(idempotent=True)
    async def fetch(key: str) -> str:
        """Fetch a key (idempotent: a call a cancelled drive left in doubt runs again)."""
        ran[key] = ran.get(key, 0) + 1
        await asyncio.sleep(0.02)
        return f"value of {key}"

    runner = AsyncRunner(agent(fetch), store)
    ids = [(await runner.create(f"run {i}", run_id=f"run_{i}")).id for i in range(12)]
    draws = random.Random(12)
    drives = [asyncio.create_task(runner.drive(run_id)) for run_id in ids]

    async def cancel_later(task: asyncio.Task[RunResult], delay: float) -> None:
        await asyncio.sleep(delay)
        task.cancel()

    await asyncio.gather(*(cancel_later(task, draws.uniform(0.0, 0.05)) for task in drives))
    outcomes = await asyncio.gather(*drives, return_exceptions=True)
    assert all(isinstance(o, asyncio.CancelledError | RunResult) for o in outcomes), outcomes
    assert any(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes

    for run_id in ids:
        assert await lease_is_free(store, run_id)
    resumed = await asyncio.gather(*(AsyncRunner(agent(fetch), store).drive(run_id) for run_id in ids))
    assert [r.status for r in resumed] == ["done"] * len(ids)
    for run_id in ids:
        assert contiguous(await store.load_events(run_id))


class DatabaseBusy:
    """Another session holding what a step's write needs (SQLite's write lock; on PostgreSQL the run's row)."""

    def __init__(self, store: AsyncSQLStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.connection: Any = None

    def hold(self) -> None:
        if self.store.engine.dialect.name == "sqlite":
            import sqlite3

            self.connection = sqlite3.connect(self.store.engine.url.database or "", isolation_level=None)
            self.connection.execute("BEGIN IMMEDIATE")
        else:
            import psycopg

            self.connection = psycopg.connect(libpq_dsn(self.store.url))
            self.connection.execute("SELECT 1 FROM tether_run WHERE id = %s FOR UPDATE", (self.run_id,))

    def let_go(self) -> None:
        self.connection.execute("ROLLBACK")
        self.connection.close()


async def test_a_write_in_progress_is_finished_before_a_cancelled_drive_lets_the_run_go(store: AsyncSQLStore) -> None:
    @tool
    async def fetch(key: str) -> str:
        """Fetch a key."""
        return f"value of {key}"

    state = await AsyncRunner(agent(fetch), store).create("go")
    busy = DatabaseBusy(store, state.id)
    held = asyncio.Event()

    def lock_before_the_model_answers(_state: Any, _activity: Any) -> None:
        if not held.is_set():
            busy.hold()  # the model's answer is then written while the database is busy
            held.set()

    runner = AsyncRunner(agent(fetch), store, on_action=lock_before_the_model_answers)
    driving = asyncio.create_task(runner.drive(state.id))
    await held.wait()
    await asyncio.sleep(0.05)  # the model answered; its step waits for the database
    driving.cancel()
    await asyncio.sleep(0.05)
    assert not driving.done()  # held until the write ends
    busy.let_go()
    with pytest.raises(asyncio.CancelledError):
        await driving
    assert (await store.load_run(state.id)).version == 2  # the whole step landed, then the drive stopped
    assert await lease_is_free(store, state.id)
    resumed = await AsyncRunner(agent(fetch), store).drive(state.id)
    assert resumed.status == "done"


# A store failing one run ----------------------------------------------------------------------
FAIL_ON_SQLITE = """
CREATE TRIGGER fail_one_run BEFORE INSERT ON tether_event
WHEN NEW.run_id = 'run_unlucky' AND NEW.type = 'tool_finished'
BEGIN SELECT RAISE(ABORT, 'the disk holding this run failed'); END
"""
FAIL_ON_POSTGRES = """
CREATE FUNCTION fail_one_run() RETURNS trigger AS $$
BEGIN
  IF NEW.run_id = 'run_unlucky' AND NEW.type = 'tool_finished' THEN
    RAISE EXCEPTION 'the disk holding this run failed';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER fail_one_run BEFORE INSERT ON tether_event FOR EACH ROW EXECUTE FUNCTION fail_one_run();
"""


async def fail_one_run(store: AsyncSQLStore) -> None:
    """Make the database refuse one run's tool results, as a failing disk or a broken row would."""
    await store.cache_purge(0.0)  # the tables exist
    if store.engine.dialect.name == "sqlite":
        import sqlite3

        with sqlite3.connect(store.engine.url.database or "") as connection:
            connection.execute(FAIL_ON_SQLITE)
    else:
        import psycopg

        url = store.url
        async with await psycopg.AsyncConnection.connect(libpq_dsn(url), autocommit=True) as connection:
            await connection.execute(FAIL_ON_POSTGRES)


async def test_a_store_failure_in_one_run_loses_no_other_run_s_work(store: AsyncSQLStore) -> None:
    ran: list[str] = []

    @tool
    async def fetch(key: str) -> str:
        """Fetch a key."""
        ran.append(key)
        await asyncio.sleep(0.002)
        return f"value of {key}"

    await fail_one_run(store)
    runner = AsyncRunner(agent(fetch), store)
    ids = ["run_unlucky", *(f"run_{i}" for i in range(7))]
    for run_id in ids:
        await runner.create(f"go {run_id}", run_id=run_id)
    outcomes = await asyncio.gather(*(runner.drive(run_id) for run_id in ids), return_exceptions=True)

    unlucky, *others = outcomes
    assert isinstance(unlucky, TetherError), unlucky
    if isinstance(unlucky, StoreError):
        assert "its result could not be saved" in str(unlucky)
    assert [o.status for o in others if isinstance(o, RunResult)] == ["done"] * 7
    for run_id in ids[1:]:
        events = await store.load_events(run_id)
        assert contiguous(events)
        assert [e.type for e in events].count("tool_finished") == 3
    assert await lease_is_free(store, "run_unlucky")
