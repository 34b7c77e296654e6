"""A read on a PostgreSQL connection that dropped meanwhile is made again on a new one.

A pooled connection the server or the network cut while it sat idle fails its next use. A read
changes nothing, so the store runs it again on a fresh connection: what ``tether run`` prints
after the run's last commit is the run as stored, never "database error" for a finished run. A
write is not made again (it may have committed before the connection dropped): it fails with a
transient StoreError, which a drive retries itself.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import sqlalchemy as sa  # noqa: TID251 - the test cuts the store's own connections, as a network would

from support import PgSchema, libpq_dsn, run_tether
from tether import Agent, AsyncRunner, Runner
from tether.errors import StoreError
from tether.stores import RunQuery
from tether.stores.sql import AsyncSQLStore, SQLStore
from tether.testing import ScriptedModel

pytestmark = pytest.mark.postgres

ANSWER = {"content": [{"type": "text", "text": "Hello."}], "stop_reason": "end_turn"}


def named(url: str, name: str) -> str:
    """``url`` whose connections say ``name`` as their application_name (so they can be found and cut)."""
    return f"{url}&{urlencode({'application_name': name})}"


def cut(server_url: str, *, name: str | None = None, pid: int | None = None) -> int:
    """Terminate the backends of ``name`` (or the one ``pid``), waiting until each is gone; how many."""
    import psycopg

    which = "application_name = %s" if name is not None else "pid = %s"
    with psycopg.connect(libpq_dsn(server_url), autocommit=True) as admin:
        rows = admin.execute(
            f"SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE {which}",
            (name if name is not None else pid,),
        ).fetchall()
    return sum(1 for (gone,) in rows if gone)


@pytest.fixture
def app_name() -> str:
    return f"tether-test-{uuid.uuid4().hex[:8]}"


def test_reads_after_the_connection_dropped_are_made_again_and_a_write_is_not(
    pg_schema: PgSchema, pg_url: str, app_name: str
) -> None:
    store = SQLStore(named(pg_schema.url, app_name))
    try:
        result = Runner(Agent(model=ScriptedModel([ANSWER])), store).run("Say hello.")
        assert cut(pg_url, name=app_name) == 1  # the pooled connection, idle: dropped unseen
        assert store.load_run(result.run_id).status == "done"
        assert cut(pg_url, name=app_name) == 1
        assert [e.type for e in store.load_events(result.run_id)][-1] == "run_finished"
        assert cut(pg_url, name=app_name) == 1
        assert store.query_runs(RunQuery(status="done")).total == 1
        assert cut(pg_url, name=app_name) == 1
        with pytest.raises(StoreError) as failed:
            store.cache_put("key", "tool", "value", expires_at=2e9)
        assert failed.value.transient  # a drive would try its write again; the caller decides
        assert store.cache_get("key", now=1e9) is None
    finally:
        store.close()


def test_the_async_store_reads_again_too(pg_schema: PgSchema, pg_url: str, app_name: str) -> None:
    async def scenario() -> str:
        store = AsyncSQLStore(named(pg_schema.url, app_name))
        try:
            result = await AsyncRunner(Agent(model=ScriptedModel([ANSWER])), store).run("Say hello.")
            assert cut(pg_url, name=app_name) >= 1
            return (await store.load_run(result.run_id)).status
        finally:
            await store.close()

    assert asyncio.run(scenario()) == "done"


@pytest.fixture
def cut_after_the_lease_is_released(pg_url: str) -> Iterator[list[int]]:
    """Drop the connection that released a run's lease (after the run's last commit), once; the pids cut."""
    done: list[int] = []

    def after_execute(connection: sa.Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if done or not statement.startswith("DELETE FROM tether_run_lease"):
            return
        pid = connection.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
        done.append(pid)
        cut(pg_url, pid=pid)

    sa.event.listen(sa.Engine, "after_cursor_execute", after_execute)
    try:
        yield done
    finally:
        sa.event.remove(sa.Engine, "after_cursor_execute", after_execute)


def test_tether_run_prints_the_stored_result_when_the_connection_drops_after_the_run(
    pg_schema: PgSchema, tmp_path: Path, cut_after_the_lease_is_released: list[int]
) -> None:
    (tmp_path / "script.json").write_text(json.dumps([ANSWER]))
    ran = run_tether(tmp_path, "run", "Say hello.", "--model", "scripted:script.json", "--db", pg_schema.url, "--json")
    assert len(cut_after_the_lease_is_released) == 1  # the connection the result is read on next was cut
    assert ran.returncode == 0, ran
    assert (ran.data["status"], ran.data["output"]) == ("done", "Hello.")
    assert "database error" not in ran.err
