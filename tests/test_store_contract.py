"""One contract, every store: memory, SQLite and PostgreSQL behave the same, sync and async.

The async stores (AsyncSQLStore on SQLite and PostgreSQL, and a sync store made awaitable) run
the same tests, each call awaited to its end (support.Blocking). PostgreSQL comes from
TETHER_TEST_PG_URL (default: the local test server), in a schema of the module's own
(module_pg_schema, conftest.py), emptied before each test and dropped at the end, so concurrent
test runs never see each other's rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import PG_URL, Blocking, PgSchema, libpq_dsn, opened_store
from tether.errors import ConfigError, RunNotFound, StaleRun, StoreError
from tether.facts.events import Event, RunStarted, ToolStarted, Warned
from tether.stores import WAITING_KEY, Holder, RunLease, RunLog, RunQuery, RunRecord, Snapshot, Store
from tether.stores.awaitable import as_async_store
from tether.stores.memory import MemoryStore


@pytest.fixture(
    params=[
        "memory",
        "memory-awaitable",
        "sqlite",
        "sqlite-async",
        "sqlite-threaded",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("postgres-async", marks=pytest.mark.postgres),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store implementation, empty."""
    backend, _, kind = request.param.partition("-")
    if backend == "memory":
        memory: Any = MemoryStore() if not kind else Blocking(as_async_store(MemoryStore()))
        yield memory
        memory.close()
        return
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'tether.db'}"
    else:
        schema: PgSchema = request.getfixturevalue("module_pg_schema")  # made once: ~100 tests use it
        empty_tables(schema)
        url = schema.url
    with opened_store(kind or "sync", url) as opened:
        yield opened


def empty_tables(schema: PgSchema) -> None:
    """Every row of the schema's tables gone, but the store's own (the schema version it checks)."""
    import psycopg

    with psycopg.connect(libpq_dsn(PG_URL), autocommit=True, connect_timeout=3) as connection:
        tables = connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> 'tether_meta'", (schema.name,)
        ).fetchall()
        if tables:
            connection.execute(f"TRUNCATE {', '.join(f'{schema.name}.{name}' for (name,) in tables)}")


# Helpers ------------------------------------------------------------------------------
def record(run_id: str = "run_1", version: int = 1, **changes: Any) -> RunRecord:
    values: dict[str, Any] = {
        "id": run_id,
        "status": "thinking",
        "version": version,
        "tenant": None,
        "spec": {"model": "claude-test", "max_steps": 10, "tools": ["a", "b"]},
        "summary": {"steps": version - 1, "tool_calls": 0, "output": None},
        "created_at": 1_700_000_000.125,
        "updated_at": 1_700_000_000.125 + version,
    }
    values.update(changes)
    return RunRecord(**values)


def events(*seqs: int) -> list[Event]:
    return [Event(s, 1_700_000_000.5 + s, Warned(f"n{s}")) for s in seqs]


def canonical(value: Any) -> str:
    """Type-exact comparison: 2.0 vs 2 and True vs 1 differ here, unlike with ==."""
    return json.dumps(value, sort_keys=True)


# Creating and loading -----------------------------------------------------------------
def test_create_then_load_returns_the_row_and_events(store: Store) -> None:
    row = record(tenant="acme")
    first = [Event(0, 1.5, RunStarted({"x": 1}, [])), *events(1)]
    store.create_run(row, first)

    assert store.load_run("run_1") == row
    assert store.load_events("run_1") == first


def test_create_with_no_events(store: Store) -> None:
    store.create_run(record(), [])
    assert store.load_events("run_1") == []
    assert store.load_run("run_1").version == 1
    assert store.load_log("run_1") == RunLog(version=1, tenant=None, events=[])


def test_load_log_gives_the_version_with_its_events(store: Store) -> None:
    store.create_run(record(tenant="acme"), events(0))
    store.append(record(version=2, tenant="acme"), 1, events(1, 2))
    assert store.load_log("run_1") == RunLog(version=2, tenant="acme", events=events(0, 1, 2))
    assert store.load_log("run_1", tenant="acme") == store.load_log("run_1")
    for missing, tenant in (("run_1", "other"), ("run_missing", None)):
        with pytest.raises(RunNotFound):
            store.load_log(missing, tenant=tenant)


def test_duplicate_create_raises_store_error_and_keeps_the_original(store: Store) -> None:
    store.create_run(record(status="thinking"), events(0))
    with pytest.raises(StoreError, match="already exists"):
        store.create_run(record(status="done", summary={"other": True}), events(0, 1))
    assert store.load_run("run_1") == record(status="thinking")
    assert store.load_events("run_1") == events(0)


def test_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(RunNotFound) as caught:
        store.load_run("run_missing")
    assert caught.value.run_id == "run_missing"
    with pytest.raises(RunNotFound):
        store.load_events("run_missing")
    with pytest.raises(RunNotFound):
        store.append(record("run_missing", 2), 1, events(0))


# Snapshots (see tether.core.snapshots) -------------------------------------------------
def test_load_log_starts_from_the_snapshot_in_the_format_asked_for(store: Store) -> None:
    store.create_run(record(tenant="acme"), events(0, 1))
    store.append(record(version=2, tenant="acme"), 1, events(2, 3))
    kept = Snapshot(2, "format-a", {"steps": 2, "text": "caf\u00e9 \x00 \ud800"})
    store.save_snapshot("run_1", kept)
    assert store.load_log("run_1", snapshot_format="format-a") == RunLog(2, "acme", events(3), kept)
    store.append(record(version=3, tenant="acme"), 2, events(4))
    assert store.load_log("run_1", snapshot_format="format-a") == RunLog(3, "acme", events(3, 4), kept)
    # another code's snapshot is never used, and a caller asking for none gets the whole log
    whole = RunLog(3, "acme", events(0, 1, 2, 3, 4))
    assert store.load_log("run_1", snapshot_format="format-b") == whole
    assert store.load_log("run_1") == whole
    with pytest.raises(RunNotFound):
        store.load_log("run_1", tenant="other", snapshot_format="format-a")


def test_a_snapshot_at_the_last_event_leaves_no_tail(store: Store) -> None:
    store.create_run(record(), events(0, 1))
    store.save_snapshot("run_1", Snapshot(1, "f", {}))
    assert store.load_log("run_1", snapshot_format="f") == RunLog(1, None, [], Snapshot(1, "f", {}))


def test_a_newer_snapshot_replaces_an_older_one_never_the_reverse(store: Store) -> None:
    store.create_run(record(), events(0, 1, 2, 3))
    store.save_snapshot("run_1", Snapshot(2, "f", {"at": 2}))
    store.save_snapshot("run_1", Snapshot(1, "f", {"at": 1}))  # a late writer's older one
    assert store.load_log("run_1", snapshot_format="f").snapshot == Snapshot(2, "f", {"at": 2})
    store.save_snapshot("run_1", Snapshot(3, "f", {"at": 3}))
    assert store.load_log("run_1", snapshot_format="f").snapshot == Snapshot(3, "f", {"at": 3})
    store.save_snapshot("run_1", Snapshot(0, "g", {"at": 0}))  # new code's, even if earlier
    assert store.load_log("run_1", snapshot_format="g") == RunLog(1, None, events(1, 2, 3), Snapshot(0, "g", {"at": 0}))
    assert store.load_log("run_1", snapshot_format="f").snapshot is None


def test_snapshots_of_missing_runs_are_not_kept_and_go_with_their_run(store: Store) -> None:
    store.save_snapshot("run_missing", Snapshot(0, "f", {}))
    with pytest.raises(RunNotFound):
        store.load_log("run_missing", snapshot_format="f")
    store.create_run(record(status="done", updated_at=10.0), events(0, 1))
    store.save_snapshot("run_1", Snapshot(1, "f", {}))
    assert store.delete_runs(finished_before=20.0, statuses={"done"}) == 1
    store.create_run(record(status="done", updated_at=10.0), events(0, 1))  # the same id again
    assert store.load_log("run_1", snapshot_format="f") == RunLog(1, None, events(0, 1))


# Appending ----------------------------------------------------------------------------
def test_append_bumps_the_version_and_extends_the_log(store: Store) -> None:
    store.create_run(record(version=1), events(0))
    store.append(record(version=2, status="tool_running"), 1, events(1, 2))
    store.append(record(version=3, status="done", summary={"steps": 2, "output": "hi"}), 2, [])
    store.append(record(version=4, status="done"), 3, events(3))

    loaded = store.load_run("run_1")
    assert loaded == record(version=4, status="done")
    assert [e.seq for e in store.load_events("run_1")] == [0, 1, 2, 3]
    assert store.load_events("run_1") == events(0, 1, 2, 3)


def test_append_keeps_what_a_step_cannot_change(store: Store) -> None:
    original = record(tenant="acme", spec={"model": "m1"})
    store.create_run(original, events(0))
    store.append(record(version=2, tenant="other", spec={"model": "m2"}, created_at=5.0), 1, events(1))
    loaded = store.load_run("run_1")
    assert (loaded.tenant, loaded.spec, loaded.created_at) == ("acme", {"model": "m1"}, original.created_at)
    assert loaded.version == 2
    assert loaded.updated_at == record(version=2).updated_at


@pytest.mark.parametrize("expected", [1, 3, 0])
def test_stale_append_raises_and_writes_nothing(store: Store, expected: int) -> None:
    store.create_run(record(version=1), events(0))
    store.append(record(version=2), 1, events(1))
    before_row, before_log = store.load_run("run_1"), store.load_events("run_1")

    with pytest.raises(StaleRun) as caught:
        store.append(record(version=expected + 1, status="done"), expected, events(2, 3))

    assert caught.value.run_id == "run_1"
    assert caught.value.expected_version == expected
    assert store.load_run("run_1") == before_row
    assert store.load_events("run_1") == before_log


def test_append_reusing_a_seq_is_stale_and_writes_nothing(store: Store) -> None:
    """Two writers that both loaded version 1 produce the same seqs: the second loses."""
    store.create_run(record(version=1), events(0, 1))
    with pytest.raises(StaleRun):
        store.append(record(version=2, status="done"), 1, events(2, 1))
    assert store.load_run("run_1") == record(version=1)
    assert store.load_events("run_1") == events(0, 1)


def test_events_come_back_ordered_by_seq(store: Store) -> None:
    store.create_run(record(version=1), events(0, 2, 1))
    store.append(record(version=2), 1, events(5, 3, 4))
    store.append(record(version=3), 2, events(6))
    assert [e.seq for e in store.load_events("run_1")] == [0, 1, 2, 3, 4, 5, 6]


def test_load_events_after_a_cursor_reads_only_the_newer_ones_at_most_limit(store: Store) -> None:
    """What a stream's follower reads: the events past its cursor, a batch at a time."""
    store.create_run(record(version=1, tenant="acme"), events(0, 1, 2))
    store.append(record(version=2, tenant="acme"), 1, events(3, 4))
    assert store.load_events("run_1", after=1) == events(2, 3, 4)
    assert store.load_events("run_1", after=1, limit=2) == events(2, 3)
    assert store.load_events("run_1", after=-1, limit=1) == events(0)
    assert store.load_events("run_1", after=4) == []  # nothing new: an empty answer, not an error
    assert store.load_events("run_1", after=99, tenant="acme") == []
    with pytest.raises(RunNotFound):
        store.load_events("run_1", after=1, tenant="globex")
    with pytest.raises(RunNotFound):
        store.load_events("run_nope", after=1)
    with pytest.raises(ConfigError, match="limit must be >= 1, not 0"):
        store.load_events("run_1", after=1, limit=0)


def test_not_json_data_raises_store_error_and_writes_nothing(store: Store) -> None:
    store.create_run(record(version=1), events(0))
    bad = [Event(1, 0.0, RunStarted({"value": object()}, []))]
    with pytest.raises(StoreError):
        store.append(record(version=2), 1, bad)
    with pytest.raises(StoreError):
        store.create_run(record("run_2"), bad)
    assert store.load_run("run_1") == record(version=1)
    assert store.load_events("run_1") == events(0)
    with pytest.raises(RunNotFound):
        store.load_run("run_2")


# Content round trip -------------------------------------------------------------------
ROUND_TRIP: dict[str, Any] = {
    "nested": {"a": {"b": {"c": [1, {"d": None}, [], {}]}}},
    "unicode": 'héllo wörld — 中文 😀 \u200b\t\n"quoted" \\back\\slash',
    "ключ": "значение",
    # Not here, as PostgreSQL's JSONB cannot keep them: -0.0 (becomes 0.0) and floats whose
    # JSON has an exponent but no fraction, like 1e20 (become ints); strings with NUL.
    "floats": [0.1, 0.30000000000000004, 2.0, -1.5e-10, 3.141592653589793, 123456.789, 1e-300],
    "ints": [0, -1, 2**53, -(2**40)],
    "bools": [True, False],
    "none": None,
    "empty": {"list": [], "dict": {}, "string": ""},
    "content": [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": [1.5, None]}},
    ],
}
TEXT = ROUND_TRIP["unicode"]


def test_json_content_round_trips_exactly(store: Store) -> None:
    row = record(spec={"tools": ROUND_TRIP}, summary={"usage": ROUND_TRIP, "output": "ü"})
    log = [Event(0, 1_700_000_000.123456, RunStarted(ROUND_TRIP, [ROUND_TRIP]))]
    store.create_run(row, log)
    store.append(record(version=2, summary=ROUND_TRIP), 1, [Event(1, 2.5, ToolStarted("c", "t", 1, owner=TEXT))])

    loaded_log = store.load_events("run_1")
    assert loaded_log == [*log, Event(1, 2.5, ToolStarted("c", "t", 1, owner=TEXT))]
    started = loaded_log[0].fact
    assert isinstance(started, RunStarted)
    assert canonical(started.spec) == canonical(ROUND_TRIP)
    assert canonical(started.messages) == canonical([ROUND_TRIP])
    assert [e.at for e in loaded_log] == [1_700_000_000.123456, 2.5]
    loaded = store.load_run("run_1")
    assert canonical(loaded.spec) == canonical({"tools": ROUND_TRIP})
    assert canonical(loaded.summary) == canonical(ROUND_TRIP)
    assert loaded.created_at == row.created_at


def test_changing_written_or_loaded_objects_does_not_change_the_store(store: Store) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": ["hi"]}]
    summary: dict[str, Any] = {"usage": {"input_tokens": 1}}
    store.create_run(record(summary=summary), [Event(0, 0.0, RunStarted({}, messages))])
    messages[0]["content"].append("later")
    summary["usage"]["input_tokens"] = 99

    loaded = store.load_events("run_1")
    loaded[0].data["messages"].clear()
    store.load_run("run_1").summary["usage"].clear()

    assert store.load_events("run_1")[0].fact == RunStarted({}, [{"role": "user", "content": ["hi"]}])
    assert store.load_run("run_1").summary == {"usage": {"input_tokens": 1}}


# Tenants and listing ------------------------------------------------------------------
def test_tenant_scoping(store: Store) -> None:
    store.create_run(record("run_a", tenant="a"), events(0))

    for tenant in (None, "a"):
        assert store.load_run("run_a", tenant=tenant).tenant == "a"
        assert store.load_events("run_a", tenant=tenant) == events(0)
    with pytest.raises(RunNotFound):
        store.load_run("run_a", tenant="b")
    with pytest.raises(RunNotFound):
        store.load_events("run_a", tenant="b")


def test_list_runs_filters_orders_and_limits(store: Store) -> None:
    specs = [
        ("run_1", "a", "done", 100.0),
        ("run_2", "b", "done", 300.0),
        ("run_3", "a", "thinking", 200.0),
        ("run_4", None, "done", 400.0),
        ("run_5", "a", "done", 500.0),
    ]
    for run_id, tenant, status, created in specs:
        store.create_run(record(run_id, tenant=tenant, status=status, created_at=created), [])

    def ids(**filters: Any) -> list[str]:
        return [r.id for r in store.list_runs(**filters)]

    assert ids() == ["run_5", "run_4", "run_2", "run_3", "run_1"]
    assert ids(tenant="a") == ["run_5", "run_3", "run_1"]
    assert ids(status="done") == ["run_5", "run_4", "run_2", "run_1"]
    assert ids(status="done", tenant="a") == ["run_5", "run_1"]
    assert ids(status="waiting") == []
    assert ids(tenant="nobody") == []
    assert ids(limit=2) == ["run_5", "run_4"]
    assert ids(tenant="a", limit=1) == ["run_5"]
    assert ids(limit=0) == []
    assert store.list_runs(tenant="b") == [record("run_2", tenant="b", status="done", created_at=300.0)]
    with pytest.raises(ConfigError, match="limit"):
        store.list_runs(limit=-1)


def test_list_runs_sees_appended_status(store: Store) -> None:
    store.create_run(record(status="thinking"), events(0))
    store.append(record(version=2, status="done"), 1, events(1))
    assert [r.id for r in store.list_runs(status="done")] == ["run_1"]
    assert store.list_runs(status="thinking") == []
    assert store.list_runs()[0].version == 2


def test_list_runs_tells_runs_waiting_for_a_retry_before_the_limit(store: Store) -> None:
    """``executing_tool`` and ``waiting_retry`` share a stored status; the store splits them before its limit."""
    for n, due in enumerate([None, 50.0, None, 70.0, None]):
        summary = {"steps": 1, "next_due_at": due} if n != 4 else {"steps": 1}  # run_4: no key at all
        store.create_run(record(f"run_{n}", status="executing_tool", summary=summary, created_at=float(n)), [])
    store.create_run(record("parked", status="awaiting_approval", summary={"next_due_at": None}, created_at=9.0), [])

    def ids(**filters: Any) -> list[str]:
        return [r.id for r in store.list_runs(status="executing_tool", **filters)]

    assert ids(waiting_retry=True) == ["run_3", "run_1"]
    assert ids(waiting_retry=True, limit=1) == ["run_3"]
    assert ids(waiting_retry=False) == ["run_4", "run_2", "run_0"]
    assert ids(waiting_retry=False, limit=2) == ["run_4", "run_2"]
    assert ids() == ["run_4", "run_3", "run_2", "run_1", "run_0"]
    assert [r.id for r in store.list_runs(waiting_retry=False, limit=1)] == ["parked"]


def test_list_runs_ties_are_stable(store: Store) -> None:
    for run_id in ("run_b", "run_c", "run_a"):
        store.create_run(record(run_id, created_at=1.0), [])
    assert [r.id for r in store.list_runs()] == ["run_c", "run_b", "run_a"]


# A paged query over every run --------------------------------------------------------------------
def test_query_runs_pages_newest_first_and_counts_them_all(store: Store) -> None:
    for n in range(7):
        store.create_run(record(f"run_{n}", created_at=float(n), updated_at=float(10 - n)), [])

    def page(offset: int, limit: int = 3, **query: Any) -> tuple[list[str], int]:
        found = store.query_runs(RunQuery(**query), limit=limit, offset=offset)
        return [r.id for r in found.records], found.total

    assert page(0) == (["run_6", "run_5", "run_4"], 7)
    assert page(3) == (["run_3", "run_2", "run_1"], 7)
    assert page(6) == (["run_0"], 7)
    assert page(7) == ([], 7)
    assert page(0, limit=0) == ([], 7)
    assert page(0, longest_waiting_first=True) == (["run_6", "run_5", "run_4"], 7)  # updated 4, 5, 6
    assert store.query_runs(RunQuery(), limit=1).records == [record("run_6", created_at=6.0, updated_at=4.0)]
    for bad in ({"limit": -1}, {"offset": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            store.query_runs(RunQuery(), **bad)


def test_longest_waiting_first_orders_parked_runs_by_when_their_calls_were_asked(store: Store) -> None:
    parked = {  # run: (asked at, last changed at); run_b's partner call was just decided
        "run_a": (10.0, 30.0),
        "run_b": (5.0, 50.0),
        "run_c": (20.0, 20.0),
    }
    for run_id, (asked, changed) in parked.items():
        summary = {"steps": 1, "pending_approvals": [], WAITING_KEY: asked}
        store.create_run(record(run_id, status="awaiting_approval", summary=summary, updated_at=changed), events(0))
    store.create_run(record("run_old", status="awaiting_approval", updated_at=7.0), events(0))  # kept no asked time
    query = RunQuery(status="awaiting_approval", longest_waiting_first=True)
    assert [r.id for r in store.query_runs(query, limit=2).records] == ["run_b", "run_old"]  # asked 5, changed 7
    assert [r.id for r in store.query_runs(query, limit=4).records] == ["run_b", "run_old", "run_a", "run_c"]
    assert [r.id for r in store.query_runs(query, limit=2, offset=2).records] == ["run_a", "run_c"]


def test_query_runs_filters_by_status_tenant_agent_model_and_creation_time(store: Store) -> None:
    made = [
        ("run_1", "a", "done", 100.0, {"agent": "Researcher", "model": "claude-sonnet-4-5"}),
        ("run_2", "b", "done", 200.0, {"agent": "writer", "model": "openai:gpt-5"}),
        ("run_3", "a", "failed", 300.0, {"model": "claude-haiku-4-5"}),
        (
            "run_4",
            None,
            "done",
            400.0,
            {"agent": "researcher", "model": "claude-sonnet-4-5", "parent": {"run_id": "run_1"}},
        ),
    ]
    for run_id, tenant, status, created, spec in made:
        store.create_run(record(run_id, tenant=tenant, status=status, created_at=created, spec=spec), [])

    def ids(**query: Any) -> list[str]:
        found = store.query_runs(RunQuery(**query), limit=10)
        assert found.total == len(found.records)
        return [r.id for r in found.records]

    assert ids(status="done") == ["run_4", "run_2", "run_1"]
    assert ids(tenant="a") == ["run_3", "run_1"]
    assert ids(agent="research") == ["run_4", "run_1"]  # part of the name, any case
    assert ids(model="SONNET") == ["run_4", "run_1"]
    assert ids(model="gpt", tenant="b") == ["run_2"]
    assert ids(created_from=200.0, created_before=400.0) == ["run_3", "run_2"]
    assert ids(roots_only=True) == ["run_3", "run_2", "run_1"]
    assert ids(agent="100%_") == []  # LIKE's wildcards are only characters here


def test_query_runs_finds_the_runs_whose_id_starts_so_exactly(store: Store) -> None:
    for n, run_id in enumerate(["run_ab1", "run_ab2", "run_AB3", "run_a%4", "run_b5"]):
        store.create_run(record(run_id, created_at=float(n)), [])

    def ids(prefix: str) -> tuple[list[str], int]:
        found = store.query_runs(RunQuery(id_prefix=prefix), limit=10)
        return [r.id for r in found.records], found.total

    assert ids("run_ab") == (["run_ab2", "run_ab1"], 2)  # case kept: not run_AB3
    assert ids("run_AB") == (["run_AB3"], 1)
    assert ids("run_a%") == (["run_a%4"], 1)  # LIKE's wildcards are only characters here
    assert ids("run_ab1") == (["run_ab1"], 1)
    assert ids("run_c") == ([], 0)
    assert ids("") == (["run_b5", "run_a%4", "run_AB3", "run_ab2", "run_ab1"], 5)


def test_query_runs_tells_runs_waiting_for_a_retry(store: Store) -> None:
    store.create_run(record("retrying", status="executing_tool", summary={"next_due_at": 5.0}, created_at=2.0), [])
    store.create_run(record("running", status="executing_tool", summary={}, created_at=1.0), [])
    query = RunQuery(status="executing_tool", waiting_retry=True)
    assert [r.id for r in store.query_runs(query).records] == ["retrying"]
    query = RunQuery(status="executing_tool", waiting_retry=False)
    assert [r.id for r in store.query_runs(query).records] == ["running"]


def test_query_runs_searches_ids_prompts_tools_pending_calls_errors_and_answers(store: Store) -> None:
    def made(run_id: str, created: float, *, spec: Any = None, summary: Any = None, log: Any = ()) -> None:
        row = record(run_id, created_at=created, spec=spec or {}, summary=summary or {})
        store.create_run(row, list(log))

    opening = Event(0, 1.0, RunStarted({}, [{"role": "user", "content": 'Refund "INV-7" for Ana'}]))
    made("run_prompt", 1.0, spec={"prompt": "Summarise the Q3 report"})
    made("run_before_prompts_were_kept", 2.0, log=[opening])  # its prompt is in its first event only
    made("run_tool", 3.0, log=[Event(0, 1.0, ToolStarted("toolu_1", "search_web", 1))])
    made("run_pending", 4.0, summary={"pending_approvals": [{"tool": "wire_money", "input": {"to": "Bob"}}]})
    made("run_error", 5.0, summary={"error": "TimeoutError: the 100%_ done"})
    made("run_answer", 6.0, summary={"output": "The answer is forty-two."})

    def ids(text: str) -> list[str]:
        return [r.id for r in store.query_runs(RunQuery(text=text), limit=10).records]

    assert ids("q3 REPORT") == ["run_prompt"]
    assert ids('"inv-7" for') == ["run_before_prompts_were_kept"]  # a quote, as JSON spells it
    assert ids("search_web") == ["run_tool"]
    assert ids("wire_money") == ["run_pending"]
    assert ids("bob") == ["run_pending"]  # the pending call's input too
    assert ids("100%_") == ["run_error"]
    assert ids("forty-two") == ["run_answer"]
    assert ids("run_t") == ["run_tool"]
    assert ids("role") == ["run_before_prompts_were_kept"]  # an older run's messages are searched as JSON, keys too
    assert ids("nothing like it") == []


def test_list_due_finds_runs_whose_retry_is_due_earliest_first(store: Store) -> None:
    def waiting(run_id: str, due: float | None, *, status: str = "executing_tool", tenant: str | None = None) -> None:
        summary = {"steps": 1, "next_due_at": due}
        store.create_run(record(run_id, status=status, tenant=tenant, summary=summary), events(0))

    waiting("later", 500.0)
    waiting("due_b", 200.0, tenant="b")
    waiting("due_a", 100.5, tenant="a")
    waiting("exactly_now", 300.0)
    waiting("running", None)  # executing a tool, no retry pending
    waiting("parked", 100.0, status="awaiting_approval")  # not waiting for a retry
    store.create_run(record("no_key", status="executing_tool"), events(0))

    def ids(now: float, **filters: Any) -> list[str]:
        return [r.id for r in store.list_due(now, **filters)]

    assert ids(300.0) == ["due_a", "due_b", "exactly_now"]
    assert ids(300.0, tenant="b") == ["due_b"]
    assert ids(300.0, limit=1) == ["due_a"]
    assert ids(50.0) == []
    assert store.list_due(100.5)[0] == record(
        "due_a", status="executing_tool", tenant="a", summary={"steps": 1, "next_due_at": 100.5}
    )
    with pytest.raises(ConfigError, match="limit"):
        store.list_due(0.0, limit=-1)


def test_list_due_sees_a_retry_scheduled_then_started(store: Store) -> None:
    store.create_run(record(status="executing_tool"), events(0))
    store.append(record(version=2, status="executing_tool", summary={"next_due_at": 10.0}), 1, events(1))
    assert [r.id for r in store.list_due(10.0)] == ["run_1"]
    store.append(record(version=3, status="executing_tool", summary={"next_due_at": None}), 2, events(2))
    assert store.list_due(10.0) == []


def test_list_due_leaves_out_child_runs_their_root_is_listed_instead(store: Store) -> None:
    due = {"steps": 1, "next_due_at": 10.0}
    store.create_run(record("root", status="executing_tool", summary=due), events(0))
    link = {"run_id": "root", "call_id": "toolu_1", "tool": "review", "depth": 1, "chain": ["root"]}
    child_spec = {**record().spec, "parent": link}
    store.create_run(record("child", status="executing_tool", spec=child_spec, summary=due), events(0))
    assert [r.id for r in store.list_due(10.0)] == ["root"]


# Retention ----------------------------------------------------------------------------
def test_delete_runs_removes_only_old_finished_runs_and_their_events(store: Store) -> None:
    old = 1_700_000_000.0
    for run_id, status, updated in [
        ("old_done", "done", old),
        ("old_failed", "failed", old),
        ("old_parked", "awaiting_approval", old),
        ("old_running", "executing_tool", old),
        ("new_done", "done", old + 10_000),
    ]:
        store.create_run(record(run_id, status=status, updated_at=updated, created_at=updated), events(0, 1))

    deleted = store.delete_runs(finished_before=old + 1, statuses={"done", "failed", "cancelled"})

    assert deleted == 2
    remaining = {r.id for r in store.list_runs()}
    assert remaining == {"old_parked", "old_running", "new_done"}
    for gone in ("old_done", "old_failed"):
        with pytest.raises(RunNotFound):
            store.load_events(gone)
    assert len(store.load_events("old_parked")) == 2


def test_delete_runs_filters_by_status_and_tenant(store: Store) -> None:
    store.create_run(record("a_done", status="done", tenant="a", updated_at=1.0), events(0))
    store.create_run(record("b_done", status="done", tenant="b", updated_at=1.0), events(0))
    store.create_run(record("a_failed", status="failed", tenant="a", updated_at=1.0), events(0))

    assert store.delete_runs(finished_before=2.0, statuses={"done"}, tenant="a") == 1
    assert {r.id for r in store.list_runs()} == {"b_done", "a_failed"}


def test_delete_runs_keeps_transient_failures_unless_asked(store: Store) -> None:
    for run_id, status, summary in [
        ("failed_for_good", "failed", {"retryable": False}),
        ("failed_transiently", "failed", {"retryable": True}),
        ("failed_long_ago", "failed", {}),  # a row written before runs said: not retryable
        ("done", "done", {"retryable": False}),
    ]:
        store.create_run(record(run_id, status=status, summary=summary, updated_at=1.0), events(0, 1))
    finished = {"done", "failed", "cancelled"}

    assert store.delete_runs(finished_before=2.0, statuses=finished) == 3
    assert [r.id for r in store.list_runs()] == ["failed_transiently"]
    assert len(store.load_events("failed_transiently")) == 2
    assert store.delete_runs(finished_before=2.0, statuses=finished, include_retryable=True) == 1
    assert store.list_runs() == []


def test_delete_runs_removes_old_parked_runs_only_when_asked(store: Store) -> None:
    """Parked: awaiting a decision, waiting for a retry, or left mid-step by a driver that stopped."""
    for run_id, status, updated, summary in [
        ("old_awaiting", "awaiting_approval", 1.0, {}),
        ("old_waiting_retry", "executing_tool", 1.0, {"next_due_at": 5.0}),
        ("old_interrupted_tool", "executing_tool", 1.0, {}),
        ("old_interrupted_thinking", "thinking", 1.0, {}),
        ("old_failed_transiently", "failed", 1.0, {"retryable": True}),
        ("new_awaiting", "awaiting_approval", 3.0, {}),
        ("old_done", "done", 1.0, {}),
    ]:
        store.create_run(record(run_id, status=status, summary=summary, updated_at=updated), events(0, 1))

    store.create_run(record("old_driven", status="executing_tool", updated_at=1.0), events(0, 1))
    store.claim_run("old_driven", "host:1:live", now=1.5, ttl=0.5)  # renewed until the cutoff: driven since
    store.claim_run("old_interrupted_tool", "host:2:gone", now=0.5, ttl=1.0)  # expired before it

    assert store.delete_runs(finished_before=2.0, statuses={"cancelled"}) == 0  # by default never
    deleted = store.delete_runs(finished_before=2.0, statuses={"cancelled"}, include_parked=True)

    assert deleted == 4
    assert {r.id for r in store.list_runs()} == {"old_failed_transiently", "new_awaiting", "old_done", "old_driven"}
    with pytest.raises(RunNotFound):
        store.load_events("old_awaiting")


@pytest.mark.parametrize("statuses", [{"awaiting_approval"}, {"done", "thinking"}, set()])
def test_delete_runs_refuses_unfinished_statuses(store: Store, statuses: set[str]) -> None:
    store.create_run(record("parked", status="awaiting_approval", updated_at=1.0), events(0))
    with pytest.raises(ConfigError, match="only finished runs"):
        store.delete_runs(finished_before=2.0, statuses=statuses)
    assert store.load_run("parked").status == "awaiting_approval"


# Tool-result cache --------------------------------------------------------------------
def test_cache_get_returns_what_was_put_until_it_expires(store: Store) -> None:
    assert store.cache_get("add:abc", 100.0) is None
    store.cache_put("add:abc", "add", "5", 200.0)

    assert store.cache_get("add:abc", 100.0) == "5"
    assert store.cache_get("add:abc", 199.5) == "5"
    assert store.cache_get("add:abc", 200.0) is None  # expired at expires_at exactly
    assert store.cache_get("add:abc", 300.0) is None
    assert store.cache_get("add:other", 100.0) is None


def test_cache_put_replaces_the_entry_for_a_key(store: Store) -> None:
    store.cache_put("k", "tool", "stale", 50.0)
    assert store.cache_get("k", 100.0) is None
    store.cache_put("k", "tool", "fresh", 500.0)
    assert store.cache_get("k", 100.0) == "fresh"
    store.cache_put("k", "tool", "newer", 400.0)  # a replacement takes its own expiry
    assert store.cache_get("k", 100.0) == "newer"
    assert store.cache_get("k", 450.0) is None


def test_cache_values_round_trip_exactly(store: Store) -> None:
    values = {
        "empty": "",
        "unicode": ROUND_TRIP["unicode"] + " ключ",
        "json": json.dumps(ROUND_TRIP),
        "large": "0123456789" * 30_000,
    }
    for key, value in values.items():
        store.cache_put(key, "tool", value, 1e12)
    for key, value in values.items():
        assert store.cache_get(key, 0.0) == value


def test_cache_purge_deletes_only_expired_entries(store: Store) -> None:
    store.cache_put("old", "tool", "a", 100.0)
    store.cache_put("at_now", "tool", "b", 200.0)
    store.cache_put("live", "tool", "c", 300.0)
    assert store.cache_purge(200.0) == 2  # expired at expires_at exactly, as cache_get says
    assert store.cache_get("live", 200.0) == "c"
    store.cache_put("old", "tool", "again", 500.0)  # a purged key can be cached again
    assert store.cache_get("old", 200.0) == "again"
    assert store.cache_purge(200.0) == 0


def test_cache_is_independent_of_runs(store: Store) -> None:
    store.cache_put("k", "tool", "v", 1e12)
    store.create_run(record(status="done", updated_at=1.0), events(0))
    store.delete_runs(finished_before=2.0, statuses={"done"})
    assert store.cache_get("k", 0.0) == "v"


# Run leases (who drives a run) ----------------------------------------------------------
def test_a_free_run_is_claimed_and_its_owner_renews_it(store: Store) -> None:
    taken = store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0)
    assert taken == RunLease("run_1", "host:1:a", expires_at=130.0, claimed_at=100.0)
    renewed = store.renew_run("run_1", "host:1:a", now=120.0, ttl=30.0)
    assert renewed == RunLease("run_1", "host:1:a", expires_at=150.0, claimed_at=100.0)
    again = store.claim_run("run_1", "host:1:a", now=125.0, ttl=30.0)  # claiming what one holds renews it too
    assert again == RunLease("run_1", "host:1:a", expires_at=155.0, claimed_at=100.0)
    late = store.renew_run("run_1", "host:1:a", now=200.0, ttl=30.0)  # expired, but nobody took it: still ours
    assert late == RunLease("run_1", "host:1:a", expires_at=230.0, claimed_at=100.0)


def test_a_renewal_never_takes_back_a_lease_once_taken(store: Store) -> None:
    store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0)
    store.claim_run("run_1", "host:2:b", now=101.0, ttl=30.0, force=True)
    held = store.renew_run("run_1", "host:1:a", now=102.0, ttl=30.0)
    assert held == RunLease("run_1", "host:2:b", expires_at=131.0, claimed_at=101.0)  # b's, unchanged
    store.release_run("run_1", "host:2:b")
    assert store.renew_run("run_1", "host:1:a", now=103.0, ttl=30.0) is None  # free now, yet a lost it
    assert store.renew_run("run_2", "host:1:a", now=103.0, ttl=30.0) is None  # never held
    assert store.claim_run("run_1", "host:3:c", now=104.0, ttl=30.0).owner == "host:3:c"


def test_a_held_lease_is_refused_to_others_until_it_expires(store: Store) -> None:
    store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0)
    refused = store.claim_run("run_1", "host:2:b", now=129.5, ttl=30.0)
    assert refused == RunLease("run_1", "host:1:a", expires_at=130.0, claimed_at=100.0)  # the holder, unchanged
    taken = store.claim_run("run_1", "host:2:b", now=130.0, ttl=30.0)  # expired at expires_at exactly
    assert taken == RunLease("run_1", "host:2:b", expires_at=160.0, claimed_at=130.0)
    assert store.claim_run("run_1", "host:1:a", now=131.0, ttl=30.0).owner == "host:2:b"  # a's renewal: lost


def test_force_takes_a_lease_another_owner_holds(store: Store) -> None:
    store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0)
    forced = store.claim_run("run_1", "host:2:b", now=101.0, ttl=30.0, force=True)
    assert forced == RunLease("run_1", "host:2:b", expires_at=131.0, claimed_at=101.0)
    assert store.claim_run("run_1", "host:1:a", now=102.0, ttl=30.0).owner == "host:2:b"


def test_a_lease_keeps_its_holder_process_through_renewals(store: Store) -> None:
    holder = Holder("boot:5e7a", 4026531836, 4242, 2**40)  # start times past 32 bits fit
    taken = store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0, holder=holder)
    assert taken == RunLease("run_1", "host:1:a", expires_at=130.0, claimed_at=100.0, holder=holder)
    assert store.renew_run("run_1", "host:1:a", now=110.0, ttl=30.0) == RunLease(
        "run_1", "host:1:a", expires_at=140.0, claimed_at=100.0, holder=holder
    )
    assert store.claim_run("run_1", "host:2:b", now=111.0, ttl=30.0).holder == holder  # refused: the holder's
    elsewhere = Holder("name:other", None, 7, None)  # a system without /proc says less
    assert store.claim_run("run_1", "host:2:b", now=111.0, ttl=30.0, force=True, holder=elsewhere).holder == elsewhere
    assert store.claim_run("run_2", "host:3:c", now=111.0, ttl=30.0).holder is None  # unknown: none recorded


def test_a_claim_replacing_a_dead_holder_takes_its_lease_and_no_one_elses(store: Store) -> None:
    store.claim_run("run_1", "host:1:dead", now=100.0, ttl=30.0)
    refused = store.claim_run("run_1", "host:2:b", now=101.0, ttl=30.0, replacing="host:9:other")
    assert refused.owner == "host:1:dead"  # it replaces only the holder it names
    taken = store.claim_run("run_1", "host:2:b", now=101.0, ttl=30.0, replacing="host:1:dead")
    assert taken == RunLease("run_1", "host:2:b", expires_at=131.0, claimed_at=101.0)
    # a second resumer that saw the same dead holder comes too late: the live one keeps the run
    assert store.claim_run("run_1", "host:3:c", now=102.0, ttl=30.0, replacing="host:1:dead").owner == "host:2:b"
    assert store.renew_run("run_1", "host:1:dead", now=103.0, ttl=30.0) == taken  # the dead one's renewal: lost


def test_only_the_holder_releases_a_lease(store: Store) -> None:
    store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0)
    store.release_run("run_1", "host:2:b")  # not b's to give up: nothing happens
    assert store.claim_run("run_1", "host:3:c", now=101.0, ttl=30.0).owner == "host:1:a"
    store.release_run("run_1", "host:1:a")
    assert store.claim_run("run_1", "host:3:c", now=101.0, ttl=30.0).owner == "host:3:c"
    store.release_run("run_2", "host:3:c")  # a run nobody holds: nothing to do


def test_a_lease_is_read_as_stored_without_being_claimed(store: Store) -> None:
    assert store.lease_of("run_1") is None
    held = store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0)
    assert store.lease_of("run_1") == held
    assert store.lease_of("run_2") is None
    assert store.claim_run("run_1", "host:2:b", now=200.0, ttl=30.0).owner == "host:2:b"  # a's had expired
    store.release_run("run_1", "host:2:b")
    assert store.lease_of("run_1") is None


def test_each_run_has_its_own_lease(store: Store) -> None:
    store.claim_run("run_1", "host:1:a", now=100.0, ttl=30.0)
    assert store.claim_run("run_2", "host:2:b", now=100.0, ttl=30.0).owner == "host:2:b"
    assert store.claim_run("run_1", "host:2:b", now=100.0, ttl=30.0).owner == "host:1:a"


def test_deleting_a_run_drops_its_lease_and_keeps_the_others(store: Store) -> None:
    store.create_run(record("run_old", status="done", updated_at=1.0), events(0))
    store.create_run(record("run_new", status="done", updated_at=5.0), events(0))
    store.claim_run("run_old", "host:1:a", now=100.0, ttl=30.0)  # left by a driver that died
    store.claim_run("run_new", "host:1:a", now=100.0, ttl=30.0)
    assert store.delete_runs(finished_before=2.0, statuses={"done"}) == 1
    assert store.claim_run("run_old", "host:2:b", now=101.0, ttl=30.0).owner == "host:2:b"
    assert store.claim_run("run_new", "host:2:b", now=101.0, ttl=30.0).owner == "host:1:a"
