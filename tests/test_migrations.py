"""An older database is migrated forward on first use, losing nothing; a newer one is refused.

The version 1 layout is written here by raw SQL, as tether 1 left it (no tool-cache table,
no ``retryable`` in failed runs' rows), filled with real runs, then opened by SQLStore.
Runs on SQLite and on PostgreSQL in a fresh schema (the db_url fixture, conftest.py).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from support import clean_env, libpq_dsn
from tether import Agent, ModelError, Runner
from tether.errors import StoreError
from tether.facts.events import Event, RunStarted
from tether.stores import SCHEMA_VERSION, Holder, RunLease, RunRecord
from tether.stores.memory import MemoryStore
from tether.stores.sql import MIGRATIONS, SQLStore
from tether.testing import ScriptedModel

V1_TABLES = """
CREATE TABLE tether_run (
    id VARCHAR(64) NOT NULL, tenant VARCHAR(200), status VARCHAR(32) NOT NULL, version INTEGER NOT NULL,
    spec {json} NOT NULL, summary {json} NOT NULL, created_at FLOAT NOT NULL, updated_at FLOAT NOT NULL,
    PRIMARY KEY (id)
);
CREATE INDEX ix_tether_run_tenant ON tether_run (tenant);
CREATE INDEX ix_tether_run_status ON tether_run (status);
CREATE INDEX ix_tether_run_created_at ON tether_run (created_at);
CREATE TABLE tether_event (
    run_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, type VARCHAR(40) NOT NULL, data {json} NOT NULL,
    at FLOAT NOT NULL, PRIMARY KEY (run_id, seq), FOREIGN KEY(run_id) REFERENCES tether_run (id)
);
CREATE TABLE tether_meta ("key" VARCHAR(64) NOT NULL, value VARCHAR NOT NULL, PRIMARY KEY ("key"));
INSERT INTO tether_meta ("key", value) VALUES ('schema_version', '{version}');
"""

ANSWER = {"content": [{"type": "text", "text": "Hello."}], "stop_reason": "end_turn"}


@contextmanager
def raw(db_url: str) -> Iterator[Any]:
    """A plain DB-API connection (autocommit) to the database behind ``db_url``."""
    if db_url.startswith("sqlite:///"):
        connection: Any = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    else:
        import psycopg

        connection = psycopg.connect(libpq_dsn(db_url), autocommit=True)
    try:
        yield connection
    finally:
        connection.close()


def write_v1_database(db_url: str, runs: Sequence[tuple[RunRecord, list[Event]]], version: int = 1) -> None:
    postgres = not db_url.startswith("sqlite")
    mark = "%s" if postgres else "?"
    with raw(db_url) as connection:
        for statement in V1_TABLES.format(json="JSONB" if postgres else "JSON", version=version).split(";"):
            if statement.strip():
                connection.execute(statement)
        for record, events in runs:
            connection.execute(
                f"INSERT INTO tether_run VALUES ({', '.join([mark] * 8)})",
                (
                    record.id,
                    record.tenant,
                    record.status,
                    record.version,
                    json.dumps(record.spec),
                    json.dumps(record.summary),
                    record.created_at,
                    record.updated_at,
                ),
            )
            for event in events:
                connection.execute(
                    f"INSERT INTO tether_event VALUES ({', '.join([mark] * 5)})",
                    (record.id, event.seq, event.type, json.dumps(event.data), event.at),
                )


def version_one_runs() -> list[tuple[RunRecord, list[Event]]]:
    """Three real runs (done, failed for good, failed transiently) as a version 1 store held them."""
    memory = MemoryStore()
    replies: list[Any] = [
        ANSWER,
        ModelError("bad request", status=400),
        ModelError("overloaded", status=529, retryable=True),
    ]
    runs = []
    for reply in replies:
        run_id = Runner(Agent(model=ScriptedModel([reply])), memory).run("Say hello.").run_id
        record = memory.load_run(run_id)
        spec = {k: v for k, v in record.spec.items() if k != "schema_version"}
        summary = {k: v for k, v in record.summary.items() if k != "retryable"}
        events = memory.load_events(run_id)
        started = events[0].fact
        assert isinstance(started, RunStarted)
        events[0] = Event(0, events[0].at, replace(started, spec=spec))
        runs.append((RunRecord(**{**record.__dict__, "spec": spec, "summary": summary}), events))
    return runs


def test_a_version_one_database_is_migrated_with_its_runs_intact(db_url: str) -> None:
    runs = version_one_runs()
    write_v1_database(db_url, runs)
    store = SQLStore(db_url)
    try:
        for record, events in runs:
            assert store.load_events(record.id) == events
            migrated = store.load_run(record.id)
            if record.status == "failed":  # read from the log: only the overload was transient
                assert migrated.summary == {**record.summary, "retryable": "transient" in record.summary["error"]}
            else:
                assert migrated.summary == record.summary
            assert (migrated.spec, migrated.version, migrated.status) == (record.spec, record.version, record.status)
        store.cache_put("key", "tool", "value", expires_at=2e9)  # the table version 2 added
        assert store.cache_get("key", now=1e9) == "value"

        transient_failure = runs[2][0].id
        assert store.delete_runs(finished_before=2e9, statuses={"done", "failed"}) == 2
        assert [r.id for r in store.list_runs()] == [transient_failure]  # gc keeps what may resume
        resumed = Runner(Agent(model=ScriptedModel([ANSWER])), store).drive(transient_failure)
        assert resumed.status == "done"  # a run written by version 1 resumes
    finally:
        store.close()
    with raw(db_url) as connection:
        found = connection.execute("SELECT value FROM tether_meta WHERE \"key\" = 'schema_version'").fetchall()
    assert found == [(str(SCHEMA_VERSION),)]
    reopened = SQLStore(db_url)  # already current: opens without migrating again
    try:
        assert [r.id for r in reopened.list_runs()] == [transient_failure]
    finally:
        reopened.close()


def test_a_database_from_a_newer_tether_is_refused_untouched(db_url: str) -> None:
    runs = version_one_runs()[:1]
    write_v1_database(db_url, runs, version=SCHEMA_VERSION + 1)
    store = SQLStore(db_url)
    try:
        with pytest.raises(StoreError, match=f"tether schema {SCHEMA_VERSION + 1}, newer than this tether"):
            store.list_runs()
    finally:
        store.close()
    with raw(db_url) as connection:
        assert connection.execute("SELECT count(*) FROM tether_event").fetchall() == [(len(runs[0][1]),)]


def test_a_version_four_lease_is_read_as_one_of_unknown_holder_and_new_ones_name_theirs(db_url: str) -> None:
    """Schema 5 adds the holder's columns; a lease held while tether upgraded keeps its owner and expiry."""
    current = SQLStore(db_url)
    current.list_runs()  # the current layout, then taken back to version 4's lease table
    current.close()
    holder_columns = ("holder_host", "holder_pid_namespace", "holder_pid", "holder_started")
    with raw(db_url) as connection:
        for column in holder_columns:
            connection.execute(f"ALTER TABLE tether_run_lease DROP COLUMN {column}")
        connection.execute("UPDATE tether_meta SET value = '4' WHERE \"key\" = 'schema_version'")
        connection.execute("INSERT INTO tether_run_lease VALUES ('run_1', 'old:1:a', 2000000000.0, 100.0)")
    store = SQLStore(db_url)
    try:
        assert store.claim_run("run_1", "new:2:b", now=1e9, ttl=30.0) == RunLease("run_1", "old:1:a", 2e9, 100.0)
        holder = Holder("boot:x", 1, 2, 3)
        assert store.claim_run("run_2", "new:2:b", now=1e9, ttl=30.0, holder=holder).holder == holder
    finally:
        store.close()
    with raw(db_url) as connection:
        found = connection.execute("SELECT value FROM tether_meta WHERE \"key\" = 'schema_version'").fetchall()
    assert found == [(str(SCHEMA_VERSION),)]


def test_migration_steps_cover_every_version_in_order() -> None:
    assert [version for version, _ in MIGRATIONS] == list(range(1, SCHEMA_VERSION))


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from tether.stores.sql import SQLStore
url, go = sys.argv[1], Path(sys.argv[2])
store = SQLStore(url)
while not go.exists():
    time.sleep(0.002)
store.list_runs()
print("ok")
"""


@pytest.mark.slow
def test_processes_opening_a_new_database_at_once_all_succeed(db_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT_ONCE, db_url, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        for _ in range(4)
    ]
    go.touch()
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert (process.returncode, out.strip()) == (0, "ok"), err
