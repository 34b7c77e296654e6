"""What only the SQL store has: SQLite's WAL and locks, PostgreSQL's JSONB, failures, races.

PostgreSQL comes from TETHER_TEST_PG_URL (default: the local test server); each test gets
its own schema (the pg_schema fixture, conftest.py), dropped afterwards.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support import PgSchema, fresh_pg_schema, libpq_dsn
from tether import Agent, Limits, Runner, tool
from tether.errors import ConfigError, StaleRun, StoreError, TetherError
from tether.facts.events import Event, Warned
from tether.models import ModelRequest
from tether.stores import RunRecord, open_store
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel


# Helpers ------------------------------------------------------------------------------
def record(version: int, run_id: str = "run_1", **changes: Any) -> RunRecord:
    values: dict[str, Any] = {
        "id": run_id,
        "status": "thinking",
        "version": version,
        "spec": {"model": "claude-test"},
        "summary": {"steps": version - 1},
        "created_at": 1000.0,
        "updated_at": 1000.0 + version,
    }
    values.update(changes)
    return RunRecord(**values)


def event(seq: int, message: str | None = None) -> Event:
    return Event(seq, float(seq), Warned(f"n{seq}" if message is None else message))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tether.db"


@pytest.fixture
def sqlite_store(db_path: Path) -> Iterator[SQLStore]:
    store = SQLStore(f"sqlite:///{db_path}", busy_timeout=0.2)
    yield store
    store.close()


@contextmanager
def raw_sqlite(path: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        yield connection
    finally:
        connection.close()


# SQLite -------------------------------------------------------------------------------
def test_sqlite_uses_wal_and_the_busy_timeout(sqlite_store: SQLStore, db_path: Path) -> None:
    sqlite_store.create_run(record(1), [event(0)])
    with raw_sqlite(db_path) as connection:  # WAL is a property of the file
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    with sqlite_store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 200
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_default_busy_timeout_is_ten_seconds(db_path: Path) -> None:
    store = SQLStore(f"sqlite:///{db_path}")
    try:
        with store.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
    finally:
        store.close()


def test_locked_database_is_a_store_error_and_the_run_keeps_its_version(sqlite_store: SQLStore, db_path: Path) -> None:
    sqlite_store.create_run(record(1), [event(0)])
    sqlite_store.append(record(2), 1, [event(1)])

    with raw_sqlite(db_path) as locker:
        locker.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"is locked.*busy timeout \(0\.2 s\)") as caught:
            sqlite_store.append(record(3, status="done"), 2, [event(2), event(3)])
        assert time.monotonic() - started < 3
        assert "Traceback" not in str(caught.value)
        assert str(db_path) in str(caught.value)
        locker.execute("ROLLBACK")

    loaded = sqlite_store.load_run("run_1")
    assert (loaded.version, loaded.status) == (2, "thinking")
    assert [e.seq for e in sqlite_store.load_events("run_1")] == [0, 1]
    sqlite_store.append(record(3, status="done"), 2, [event(2), event(3)])  # usable again
    assert sqlite_store.load_run("run_1").version == 3


def test_a_pinned_thread_writes_on_one_connection_that_survives_failed_writes(
    sqlite_store: SQLStore, db_path: Path
) -> None:
    pool: Any = sqlite_store.engine.pool  # a QueuePool
    with sqlite_store.pinned(), sqlite_store.pinned():  # nested: the outer one's connection
        sqlite_store.create_run(record(1), [event(0)])
        sqlite_store.append(record(2), 1, [event(1)])
        assert pool.checkedout() == 1  # kept between operations, not returned to the pool
        with pytest.raises(StaleRun):
            sqlite_store.append(record(3), 1, [event(2)])
        with raw_sqlite(db_path) as locker:
            locker.execute("BEGIN EXCLUSIVE")
            with pytest.raises(StoreError, match="is locked"):
                sqlite_store.append(record(3), 2, [event(2)])
            locker.execute("ROLLBACK")
        sqlite_store.append(record(3, status="done"), 2, [event(2), event(3)])
        with raw_sqlite(db_path) as reader:  # committed before the block ends, seen by another connection
            assert reader.execute("SELECT version, status FROM tether_run").fetchone() == (3, "done")
        assert pool.checkedout() == 1
    assert pool.checkedout() == 0
    assert [e.seq for e in sqlite_store.load_events("run_1")] == [0, 1, 2, 3]


def test_no_more_threads_keep_a_connection_than_the_pool_holds(sqlite_store: SQLStore) -> None:
    sqlite_store.create_run(record(1), [event(0)])
    pool: Any = sqlite_store.engine.pool  # a QueuePool
    threads_in, done = threading.Barrier(8), threading.Event()
    seen: list[int] = []

    def drive() -> None:
        with sqlite_store.pinned():
            sqlite_store.load_run("run_1")
            threads_in.wait(timeout=30)
            done.wait(timeout=30)

    threads = [threading.Thread(target=drive) for _ in range(7)]
    for thread in threads:
        thread.start()
    threads_in.wait(timeout=30)
    seen.append(pool.checkedout())
    assert sqlite_store.load_run("run_1").version == 1  # the pool still serves a thread that keeps none
    done.set()
    for thread in threads:
        thread.join(timeout=30)
    assert seen == [pool.size()]  # five kept; the other two gave theirs back
    assert pool.checkedout() == 0


def test_locked_database_on_first_use_is_a_store_error(db_path: Path) -> None:
    with raw_sqlite(db_path) as locker:
        locker.execute("PRAGMA journal_mode=WAL")
        locker.execute("BEGIN EXCLUSIVE")
        store = SQLStore(f"sqlite:///{db_path}", busy_timeout=0.1)
        try:
            with pytest.raises(StoreError, match="locked"):
                store.create_run(record(1), [event(0)])
        finally:
            locker.execute("ROLLBACK")
            store.close()


def test_a_set_up_database_is_read_while_another_connection_holds_the_write_lock(db_path: Path) -> None:
    """`tether runs` / `show` open the store: with the tables in place, opening takes no lock (WAL readers read)."""
    first = SQLStore(f"sqlite:///{db_path}")
    first.create_run(record(1), [event(0)])
    first.close()
    with raw_sqlite(db_path) as locker:
        locker.execute("BEGIN EXCLUSIVE")
        reader = SQLStore(f"sqlite:///{db_path}", busy_timeout=0.1)
        try:
            assert [run.id for run in reader.list_runs()] == ["run_1"]
            assert [e.seq for e in reader.load_events("run_1")] == [0]
            with pytest.raises(StoreError, match="locked"):  # a write still waits for the lock, and says so
                reader.append(record(2), 1, [event(1)])
        finally:
            locker.execute("ROLLBACK")
            reader.close()


def test_a_directory_is_named_for_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory, not a database file"):
        SQLStore(f"sqlite:///{tmp_path}")


def test_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(ConfigError, match=r"directory .*no/such/dir.* does not exist"):
        SQLStore(f"sqlite:///{missing / 'tether.db'}")
    with pytest.raises(ConfigError, match="does not exist"):
        open_store(f"sqlite:///{missing / 'tether.db'}")


def test_directory_removed_after_construction_is_a_store_error(tmp_path: Path) -> None:
    directory = tmp_path / "gone"
    directory.mkdir()
    store = SQLStore(f"sqlite:///{directory / 'tether.db'}")
    directory.rmdir()
    try:
        with pytest.raises(StoreError, match="cannot open database") as caught:
            store.load_run("run_1")
        assert isinstance(caught.value, TetherError)
    finally:
        store.close()


def test_relative_and_memory_sqlite_urls_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///relative.db", "sqlite://"):
        store = SQLStore(url)
        try:
            store.create_run(record(1), [event(0)])
            assert store.load_run("run_1").version == 1
        finally:
            store.close()


def test_invalid_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        SQLStore("not a url")
    with pytest.raises(ConfigError):
        SQLStore("nosuchdialect://x/y")


WRITE_LOG_TRIGGERS = """
CREATE TABLE write_log (version INTEGER, what TEXT, bytes INTEGER);
CREATE TRIGGER log_row AFTER UPDATE ON tether_run BEGIN
    INSERT INTO write_log VALUES (new.version, 'row',
        length(CAST(new.summary AS BLOB)) + length(CAST(new.status AS BLOB)));
END;
CREATE TRIGGER log_spec AFTER UPDATE OF spec, tenant, created_at, id ON tether_run BEGIN
    INSERT INTO write_log VALUES (new.version, 'spec', length(new.spec));
END;
CREATE TRIGGER log_event AFTER INSERT ON tether_event BEGIN
    INSERT INTO write_log VALUES (
        (SELECT version FROM tether_run WHERE id = new.run_id), 'event',
        length(CAST(new.data AS BLOB)) + length(CAST(new.type AS BLOB)));
END;
CREATE TRIGGER log_rewrite AFTER UPDATE ON tether_event BEGIN
    INSERT INTO write_log VALUES (NULL, 'rewrite', 0);
END;
CREATE TRIGGER log_delete AFTER DELETE ON tether_event BEGIN
    INSERT INTO write_log VALUES (NULL, 'delete', 0);
END;
"""
"""Triggers recording what each transaction writes: the bytes of the row's changed columns
and of each new event (by the run's new version), and any rewrite of spec or old events."""


def test_bytes_written_per_step_do_not_grow_with_history(sqlite_store: SQLStore, db_path: Path) -> None:
    """A run of 500 tool calls driven by the Runner: a step writes its own events and the small
    row, never the spec or the history, so the 500th tool call writes what the 5th did."""
    calls = 500

    @tool
    def lookup(n: int) -> str:
        """Look a number up."""
        return f"value {n}"

    def reply(request: ModelRequest) -> dict[str, Any]:
        n = request.invocation
        if n == calls:
            return {"content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn"}
        use = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": "lookup", "input": {"n": n}}
        return {"content": [use], "stop_reason": "tool_use", "usage": {"input_tokens": 50, "output_tokens": 9}}

    system = "Be brief. " * 2_000  # ~20 KB in the spec: a rewrite would show
    agent = Agent(model=ScriptedModel(reply), tools=[lookup], system=system, limits=Limits(max_steps=None))
    runner = Runner(agent, sqlite_store)
    state = runner.create("Look up 500 numbers.")
    with raw_sqlite(db_path) as connection:
        connection.executescript(WRITE_LOG_TRIGGERS)
    assert runner.drive(state.id).status == "done"

    with raw_sqlite(db_path) as connection:
        rows = connection.execute("SELECT version, what, bytes FROM write_log").fetchall()
    assert [what for _, what, _ in rows if what not in {"row", "event"}] == []
    per_version: dict[int, int] = {}
    for version, _what, size in rows:
        per_version[version] = per_version.get(version, 0) + size
    # after the run's creation (version 1) each tool call is 2 writes: the model's turn with the
    # tool's start, its result; then the final answer
    assert sorted(per_version) == list(range(2, 2 * calls + 3))

    def call_bytes(k: int) -> int:
        return sum(per_version[v] for v in range(2 + 2 * k, 4 + 2 * k))

    early, late = call_bytes(5), call_bytes(calls - 1)
    assert late - early <= 40, (early, late)  # only counters' extra digits (steps, tool calls, tokens)
    assert early < 3_000
    assert len(sqlite_store.load_events(state.id)) > 3 * calls


# Races ------------------------------------------------------------------------------
def race(append: Callable[[int], None]) -> list[str]:
    """Run ``append(i)`` in two threads released at once; what each got."""
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        try:
            append(i)
            outcome = "ok"
        except StaleRun:
            outcome = "stale"
        except Exception as error:  # reported through the assertion below
            outcome = f"{type(error).__name__}: {error}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return sorted(outcomes)


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "two-stores"])
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_concurrent_appends_with_the_same_version_one_wins(
    request: pytest.FixtureRequest, db_path: Path, backend: str, shared: bool
) -> None:
    url = f"sqlite:///{db_path}" if backend == "sqlite" else request.getfixturevalue("pg_schema").url
    first = SQLStore(url)
    second = first if shared else SQLStore(url)
    stores = [first, second]
    try:
        rounds = 15
        first.create_run(record(1), [event(0)])
        for version in range(1, rounds + 1):
            seq = version

            def append(i: int, version: int = version, seq: int = seq) -> None:
                stores[i].append(
                    record(version + 1, summary={"writer": i}),
                    version,
                    [event(seq, f"writer {i}"), event(seq + 1000, f"writer {i}")],
                )

            assert race(append) == ["ok", "stale"]
            loaded = first.load_run("run_1")
            assert loaded.version == version + 1
            winner = loaded.summary["writer"]
            log = first.load_events("run_1")
            assert {e.data["message"] for e in log if e.seq in {seq, seq + 1000}} == {f"writer {winner}"}
        assert len(first.load_events("run_1")) == 1 + 2 * rounds
    finally:
        first.close()
        second.close()


# PostgreSQL -------------------------------------------------------------------------
@pytest.mark.postgres
def test_postgres_uses_jsonb_for_content(pg_url: str) -> None:
    import psycopg

    with fresh_pg_schema(pg_url) as (schema, url):
        store = SQLStore(url)
        try:
            store.create_run(record(1), [event(0)])
            assert store.load_events("run_1") == [event(0)]
        finally:
            store.close()
        with psycopg.connect(libpq_dsn(pg_url), connect_timeout=3) as connection:
            found = connection.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = %s AND column_name IN ('data', 'spec', 'summary') "
                "ORDER BY table_name, column_name",
                (schema,),
            ).fetchall()
            tables = connection.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY table_name",
                (schema,),
            ).fetchall()
    assert found == [
        ("tether_event", "data", "jsonb"),
        ("tether_run", "spec", "jsonb"),
        ("tether_run", "summary", "jsonb"),
    ]
    names = ["tether_event", "tether_meta", "tether_run", "tether_run_lease", "tether_snapshot", "tether_tool_cache"]
    assert tables == [(name,) for name in names]


@pytest.mark.postgres
def test_postgres_stores_json_queryable_as_jsonb(pg_schema: PgSchema) -> None:
    store = SQLStore(pg_schema.url)
    try:
        store.create_run(record(1, summary={"usage": {"input_tokens": 7}}), [event(0)])
        with store.engine.connect() as connection:
            tokens = connection.exec_driver_sql("SELECT summary -> 'usage' ->> 'input_tokens' FROM tether_run").scalar()
            kind = connection.exec_driver_sql("SELECT jsonb_typeof(data) FROM tether_event").scalar()
        assert (tokens, kind) == ("7", "object")
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2", {}),
        ("postgresql+psycopg://postgres@127.0.0.1:1/test", {"connect_timeout": 2}),
    ],
    ids=["url-query", "option"],
)
def test_unreachable_postgres_is_a_quick_store_error(url: str, options: dict[str, Any]) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    store = SQLStore(url, **options)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"cannot open database .*127\.0\.0\.1:1"):
            store.load_run("run_1")
        with pytest.raises(StoreError):
            store.create_run(record(1), [event(0)])
        assert time.monotonic() - started < 6
    finally:
        store.close()


def test_postgres_password_is_not_shown_in_errors() -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    store = SQLStore("postgresql+psycopg://someone:s3cret-pw@127.0.0.1:1/test?connect_timeout=2")
    try:
        with pytest.raises(StoreError) as caught:
            store.load_run("run_1")
        assert "s3cret-pw" not in str(caught.value)
    finally:
        store.close()


def test_json_text_in_sqlite_is_plain_json(sqlite_store: SQLStore, db_path: Path) -> None:
    sqlite_store.create_run(record(1), [event(0, "héllo")])
    with raw_sqlite(db_path) as connection:
        (data,) = connection.execute("SELECT data FROM tether_event").fetchone()
    assert json.loads(data) == {"message": "héllo"}
