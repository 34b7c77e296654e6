"""A finished tool's result survives a passing store failure: the write is retried, never dropped.

A SQLite lock held past the busy timeout, or a PostgreSQL connection dropped while the result
is written, fail that one write. The runner holds the result and tries again (bounded, with
backoff): once the store recovers the result is saved and the tool ran once. If it never
recovers, the error says that the tool ran and what a resume will do.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa  # noqa: TID251 - the tests break the store's own connections, as a network would
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: TID251 - the async store's engine, as above

from support import PgSchema, libpq_dsn, tool_use
from tether import Agent, AsyncRunner, Runner, tool
from tether.core import flow
from tether.core.flow import STORE_RETRY_WAITS
from tether.errors import StoreError
from tether.models import ModelRequest
from tether.stores.sql import AsyncSQLStore, SQLStore
from tether.testing import ScriptedModel

SCRIPT: list[dict[str, Any]] = [
    {"content": [tool_use("t1", "send", {"to": "ops"})], "stop_reason": "tool_use"},
    {"content": [{"type": "text", "text": "sent"}], "stop_reason": "end_turn"},
]


class RetryWatch(logging.Handler):
    """Sets ``retried`` when the runner says it will try a store write again."""

    def __init__(self) -> None:
        super().__init__()
        self.retried = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.retried.set()


@pytest.fixture
def watch() -> Iterator[RetryWatch]:
    handler = RetryWatch()
    logger = logging.getLogger("tether.store")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def sending_tool(sent: list[str], on_send: Any) -> Any:
    @tool
    def send(to: str) -> str:
        """Send a message (a side effect that must not happen twice)."""
        sent.append(to)
        on_send()
        return f"sent to {to}"

    return send


@pytest.mark.parametrize("driver", ["sync", "async", "async-store"])
def test_a_result_written_while_sqlite_is_locked_is_saved_once_the_lock_goes(
    tmp_path: Path, watch: RetryWatch, driver: str
) -> None:
    path = tmp_path / "runs.db"
    locked, failures = threading.Event(), []

    def hold_the_lock_until_a_retry() -> None:
        locker = sqlite3.connect(path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            locked.set()
            if not watch.retried.wait(30):  # held past the busy timeout until the runner retries
                failures.append("the runner never retried")
            locker.execute("ROLLBACK")
        finally:
            locker.close()

    holder = threading.Thread(target=hold_the_lock_until_a_retry)

    def lock_the_database() -> None:
        holder.start()
        assert locked.wait(10)

    sent: list[str] = []
    store = SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[sending_tool(sent, lock_the_database)])

    async def on_the_async_store() -> Any:
        native = AsyncSQLStore(f"sqlite:///{path}", busy_timeout=0.2)
        try:
            return await AsyncRunner(agent, native).run("go")
        finally:
            await native.close()

    try:
        if driver == "sync":
            result = Runner(agent, store).run("go")
        elif driver == "async":
            result = asyncio.run(AsyncRunner(agent, store).run("go"))
        else:
            result = asyncio.run(on_the_async_store())
    finally:
        watch.retried.set()
        holder.join()
        store.close()
    assert failures == []
    assert result.status == "done", result.error
    assert sent == ["ops"]
    assert "locked" in watch.messages[0]
    reader = SQLStore(f"sqlite:///{path}")
    finished = [e for e in reader.load_events(result.run_id) if e.type == "tool_finished"]
    reader.close()
    assert [e.data["content"] for e in finished] == ["sent to ops"]


def _backend_killer(engine: sa.Engine, url: str, *, after_commit: bool) -> None:
    """Drop the store's connection while it writes the ``tool_finished`` event, once.

    Before the commit, the write is lost with the connection; ``after_commit``: the server
    has committed it (the step's write is one statement, committed alone), but the connection
    drops before the client hears so. ``engine``: a sync engine, or an async one's sync side.
    """
    import psycopg

    armed = {"done": False}

    def kill(connection: sa.Connection) -> None:
        pid = connection.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
        with psycopg.connect(libpq_dsn(url), autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def before_execute(connection: sa.Connection, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if armed["done"] or "INSERT INTO tether_event" not in statement:
            return
        if not isinstance(parameters, dict) or '"tool_finished"' not in parameters.get("b_events", ""):
            return
        armed["done"] = True
        if after_commit:
            cursor.execute(statement, parameters)  # the server has the result...
        kill(connection)  # ...or not, and the connection drops before the client hears

    sa.event.listen(engine, "before_cursor_execute", before_execute)


@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("after_commit", [False, True], ids=["before-commit", "after-commit"])
def test_a_result_written_while_postgres_drops_the_connection_is_saved_once(
    pg_schema: PgSchema, pg_url: str, watch: RetryWatch, after_commit: bool, kind: str
) -> None:
    sent: list[str] = []
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[sending_tool(sent, lambda: None)])
    if kind == "sync":
        store = SQLStore(pg_schema.url)
        try:
            _backend_killer(store.engine, pg_url, after_commit=after_commit)
            result = Runner(agent, store).run("go")
            finished = [e for e in store.load_events(result.run_id) if e.type == "tool_finished"]
        finally:
            store.close()
    else:

        async def run_async() -> tuple[Any, list[Any]]:
            store = AsyncSQLStore(pg_schema.url)
            try:
                assert isinstance(store.engine, AsyncEngine)  # on PostgreSQL
                _backend_killer(store.engine.sync_engine, pg_url, after_commit=after_commit)
                result = await AsyncRunner(agent, store).run("go")
                return result, [e for e in await store.load_events(result.run_id) if e.type == "tool_finished"]
            finally:
                await store.close()

        result, finished = asyncio.run(run_async())
    assert result.status == "done", result.error
    assert sent == ["ops"]
    assert [e.data["content"] for e in finished] == ["sent to ops"]
    assert watch.messages  # the write did fail once


@pytest.mark.parametrize(
    ("locked_by", "said"),
    [
        ("tool", ["tool 'send' (call t1) ran, so whatever it does has happened", "treats the call as in doubt"]),
        ("model", ["the model answered", "asks the model again"]),
    ],
)
def test_a_result_that_cannot_be_saved_says_what_happened(
    tmp_path: Path, watch: RetryWatch, locked_by: str, said: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock that outlasts every retry: the error says what ran and what a resume will do."""
    monkeypatch.setattr(flow, "STORE_RETRY_WAITS", tuple(0.01 for _ in STORE_RETRY_WAITS))  # as many, not as long
    path = tmp_path / "runs.db"
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def lock_for_good() -> None:
        locker.execute("BEGIN EXCLUSIVE")

    def model(request: ModelRequest) -> dict[str, Any]:
        if locked_by == "model":
            lock_for_good()
        return SCRIPT[request.invocation]

    sent: list[str] = []
    store = SQLStore(f"sqlite:///{path}", busy_timeout=0.05)
    on_send = lock_for_good if locked_by == "tool" else (lambda: None)
    runner = Runner(Agent(model=ScriptedModel(model), tools=[sending_tool(sent, on_send)]), store)
    try:
        with pytest.raises(StoreError) as caught:
            runner.run("go")
    finally:
        locker.execute("ROLLBACK")
        locker.close()
        store.close()
    message = str(caught.value)
    assert sent == (["ops"] if locked_by == "tool" else [])
    for words in [*said, "its result could not be saved", "is locked"]:
        assert words in message, message
    assert "nothing was changed" not in message, message
    assert len(watch.messages) == len(STORE_RETRY_WAITS)  # tried again that often, then gave up
