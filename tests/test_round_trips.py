"""A step's commit costs one statement on PostgreSQL (one round trip) and two on SQLite, sync or async.

Counted, not timed: the statements a store sends are counted with SQLAlchemy's
``before_cursor_execute`` event on PostgreSQL, and on SQLite by SQLite's own trace callback
(the store runs a step's statements on the driver's cursor there; the INSERT runs once per
event, and BEGIN and COMMIT show), and PostgreSQL's round trips from libpq's own protocol trace
(each ``Sync`` or simple ``Query`` the client sends is one wait for the server): BEGIN, COMMIT
and a pool's pre-ping would each show there. A connection idle in the pool for longer than
``IDLE_PING_AFTER`` is pinged first, and a dead one replaced without the caller seeing it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa  # noqa: TID251 - the test counts the store's own statements

from support import libpq_dsn, opened_store
from tether.errors import StaleRun
from tether.facts.events import Event, Warned
from tether.stores import RunRecord
from tether.stores import sql as sql_store


def record(version: int) -> RunRecord:
    return RunRecord("run_1", "thinking", version, spec={"model": "m"}, summary={"steps": version - 1})


def events(*seqs: int) -> list[Event]:
    return [Event(seq, float(seq), Warned(f"n{seq}")) for seq in seqs]


@dataclass
class Wire:
    """What a store sent: SQL statements (SQLAlchemy's count) and, on PostgreSQL, round trips (libpq's trace)."""

    statements: list[str] = field(default_factory=list)
    traces: list[Path] = field(default_factory=list)
    backends: set[int] = field(default_factory=set)
    """The PostgreSQL server processes of the connections used."""

    @property
    def round_trips(self) -> int:
        sent = [line.split("\t") for path in self.traces for line in path.read_text().splitlines()]
        return sum(1 for parts in sent if parts[0] == "F" and parts[2].split(" ")[0] in {"Sync", "Query"})

    def clear(self) -> None:
        self.statements.clear()
        for path in self.traces:
            path.write_text("")


@pytest.fixture
def tracedir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as where:
        yield Path(where)


def watch(engine: sa.Engine, tracedir: Path) -> Wire:
    """Count what ``engine`` (a sync engine, or an async one's sync side) sends from now on."""
    from psycopg import pq

    wire = Wire()

    def executing(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if engine.dialect.name != "sqlite":  # SQLite says what it ran itself (below)
            wire.statements.append(statement)

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if engine.dialect.name == "sqlite":  # every statement SQLite runs, the store's own cursor's too
            dbapi_connection.set_trace_callback(wire.statements.append)
            return
        wire.backends.add(record.driver_connection.info.backend_pid)
        path = tracedir / f"trace{len(wire.traces)}"
        path.touch()
        wire.traces.append(path)
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND)
        pgconn = record.driver_connection.pgconn
        pgconn.trace(descriptor)
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        record.info["trace_descriptor"] = descriptor

    def checked_in(dbapi_connection: Any, record: Any) -> None:
        if engine.dialect.name == "sqlite" and dbapi_connection is not None:
            dbapi_connection.set_trace_callback(None)
        descriptor = record.info.pop("trace_descriptor", None)
        if descriptor is not None and record.driver_connection is not None:
            record.driver_connection.pgconn.untrace()
            os.close(descriptor)

    sa.event.listen(engine, "before_cursor_execute", executing)
    sa.event.listen(engine, "checkout", checked_out)
    sa.event.listen(engine, "checkin", checked_in)
    return wire


def sync_side(store: Any) -> sa.Engine:
    inner = getattr(store, "store", store)  # a Blocking facade holds the async store
    engine = inner.engine
    return engine if isinstance(engine, sa.Engine) else engine.sync_engine


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_commit_on_postgres_is_one_statement_and_one_round_trip(
    kind: str, pg_schema: Any, tracedir: Path
) -> None:
    with opened_store(kind, pg_schema.url) as store:
        store.create_run(record(1), events(0))  # the schema is set up; the pool holds a connection
        wire = watch(sync_side(store), tracedir)
        for version in (2, 3, 4):
            wire.clear()
            store.append(record(version), version - 1, events(2 * version, 2 * version + 1))
            assert len(wire.statements) == 1, wire.statements
            assert wire.round_trips == 1
        wire.clear()
        store.append(record(5), 4, [])  # a step with no events: the same one statement
        assert (len(wire.statements), wire.round_trips) == (1, 1)
        assert [e.seq for e in store.load_events("run_1")] == [0, 4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_commit_on_sqlite_is_two_statements(kind: str, tmp_path: Path, tracedir: Path) -> None:
    with opened_store(kind, f"sqlite:///{tmp_path / 'runs.db'}") as store:
        wire = watch(sync_side(store), tracedir)  # before the async store's thread opens the connection it keeps
        store.create_run(record(1), events(0))
        wire.clear()
        store.append(record(2), 1, events(1, 2, 3))
        assert [s.split()[0] for s in wire.statements] == ["BEGIN", "UPDATE", "INSERT", "INSERT", "INSERT", "COMMIT"]
        assert store.load_run("run_1").version == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_lost_race_still_costs_no_round_trip_more_until_it_is_lost(kind: str, pg_schema: Any, tracedir: Path) -> None:
    """The stale write finds out in its one statement; only then does it ask whether the run exists."""
    with opened_store(kind, pg_schema.url) as store:
        store.create_run(record(1), events(0))
        store.append(record(2), 1, events(1))
        wire = watch(sync_side(store), tracedir)
        with pytest.raises(StaleRun):
            store.append(record(2), 1, events(1))
        assert len(wire.statements) == 2  # the step, then the run's existence (StaleRun, not RunNotFound)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_idle_connection_is_pinged_and_a_dead_one_replaced_unseen(
    kind: str, pg_schema: Any, tracedir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    with opened_store(kind, pg_schema.url) as store:
        store.create_run(record(1), events(0))
        wire = watch(sync_side(store), tracedir)
        store.append(record(2), 1, events(1))
        assert wire.round_trips == 1  # fresh from use: not pinged

        monkeypatch.setattr(sql_store, "IDLE_PING_AFTER", 0.0)  # every pooled connection now counts as idle
        with psycopg.connect(libpq_dsn(pg_schema.url), autocommit=True) as admin:  # the server drops the one used
            for pid in wire.backends:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        store.append(record(3), 2, events(2))  # no error: the ping found it dead, the pool opened another
        assert store.load_run("run_1").version == 3
        assert len(wire.backends) == 2
