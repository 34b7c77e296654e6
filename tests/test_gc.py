"""`tether gc` deletes old finished runs and never a parked, running or still resumable one."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from support import CliResult, PgSchema, libpq_dsn, run_tether
from tether import Agent, ModelError, Runner, tool
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

pytestmark = pytest.mark.slow  # real `tether` processes and a PostgreSQL race


@tool(approval=True)
def publish(text: str) -> str:
    """Publish (gated)."""
    return text


def cli(tmp_path: Path, *args: str) -> CliResult:
    """``tether ARGS`` on tmp_path/runs.db."""
    return run_tether(tmp_path, *args, "--db", f"sqlite:///{tmp_path / 'runs.db'}")


def test_gc_deletes_old_finished_runs_only(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    long_ago = [time.time() - 40 * 86400]
    gated = {"content": [{"type": "tool_use", "id": "p1", "name": "publish", "input": {"text": "x"}}],
             "stop_reason": "tool_use"}
    done = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    old = Runner(Agent(model=ScriptedModel([done]), tools=[publish]), store, clock=lambda: long_ago[0])
    old_done = old.run("a").run_id
    old_parked = Runner(Agent(model=ScriptedModel([gated]), tools=[publish]), store, clock=lambda: long_ago[0])
    parked_id = old_parked.run("b").run_id
    fresh_done = Runner(Agent(model=ScriptedModel([done]), tools=[publish]), store).run("c").run_id
    store.close()

    listing = cli(tmp_path, "gc", "--older-than", "30d", "--json")
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout)["deleted"] == 1
    assert json.loads(listing.stdout)["cache_deleted"] == 0

    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    remaining = {r.id for r in store.list_runs()}
    store.close()
    assert remaining == {parked_id, fresh_done}
    assert old_done not in remaining


def test_gc_deletes_old_parked_runs_only_when_asked(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    long_ago = time.time() - 40 * 86400
    gated = {"content": [{"type": "tool_use", "id": "p1", "name": "publish", "input": {"text": "x"}}],
             "stop_reason": "tool_use"}
    old_parked = Runner(Agent(model=ScriptedModel([gated]), tools=[publish]), store, clock=lambda: long_ago).run("a")
    new_parked = Runner(Agent(model=ScriptedModel([gated]), tools=[publish]), store).run("b")
    store.close()
    assert (old_parked.status, new_parked.status) == ("awaiting_approval", "awaiting_approval")

    kept = cli(tmp_path, "gc", "--older-than", "30d", "--json")
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["deleted"] == 0
    assert json.loads(kept.stdout)["include_parked"] is False

    gone = cli(tmp_path, "gc", "--older-than", "30d", "--include-parked")
    assert gone.returncode == 0, gone.stderr
    assert "deleted 1 run(s) (cancelled, done, failed; transient failures kept; parked runs too)" in gone.stdout
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    assert [r.id for r in store.list_runs()] == [new_parked.run_id]
    store.close()


def test_gc_rejects_a_bad_age(tmp_path: Path) -> None:
    result = cli(tmp_path, "gc", "--older-than", "soon")
    assert result.returncode == 2
    assert "--older-than" in result.stderr


def test_gc_purges_expired_tool_cache_entries(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    now = time.time()
    store.cache_put("lookup:expired", "lookup", "old value", now - 60)
    store.cache_put("lookup:live", "lookup", "fresh value", now + 3600)
    store.close()

    done = cli(tmp_path, "gc", "--older-than", "30d")
    assert done.returncode == 0, done.stderr
    assert "deleted 1 expired tool-cache entry" in done.stdout

    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    assert store.cache_purge(now) == 0  # gc took it already
    assert store.cache_get("lookup:live", now) == "fresh value"


def test_gc_keeps_transient_failures_unless_asked(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    long_ago = time.time() - 40 * 86400
    overloaded = ModelError("overloaded", status=529, retryable=True)
    refused = ModelError("bad request", status=400)
    transient = Runner(Agent(model=ScriptedModel([overloaded])), store, clock=lambda: long_ago).run("a")
    for_good = Runner(Agent(model=ScriptedModel([refused])), store, clock=lambda: long_ago).run("b")
    store.close()
    assert (transient.status, for_good.status) == ("failed", "failed")

    first = cli(tmp_path, "gc", "--older-than", "30d")
    assert first.returncode == 0, first.stderr
    assert "deleted 1 finished run(s) (cancelled, done, failed; transient failures kept)" in first.stdout
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    assert [r.id for r in store.list_runs()] == [transient.run_id]  # `tether resume` may still finish it
    store.close()

    second = cli(tmp_path, "gc", "--older-than", "30d", "--include-retryable", "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["deleted"] == 1


@pytest.mark.postgres
def test_gc_never_deletes_a_run_resumed_while_it_chooses(pg_schema: PgSchema) -> None:
    """gc is about to delete a failed run that another process is resuming: it leaves the run whole."""
    import psycopg

    store = SQLStore(pg_schema.url)
    long_ago = time.time() - 40 * 86400
    agent = Agent(model=ScriptedModel([ModelError("bad request", status=400)]))
    failed = Runner(agent, store, clock=lambda: long_ago).run("a")
    logged = len(store.load_events(failed.run_id))
    deleted: list[int] = []

    def gc() -> None:
        finished = {"done", "failed", "cancelled"}
        deleted.append(store.delete_runs(finished_before=time.time() - 86400, statuses=finished))

    with psycopg.connect(libpq_dsn(pg_schema.url)) as resuming:  # a resume's step, not committed yet
        resuming.execute(f'SET search_path TO "{pg_schema.name}"')
        resuming.execute(
            "UPDATE tether_run SET status = 'thinking', version = version + 1, updated_at = %s WHERE id = %s",
            (time.time(), failed.run_id),
        )
        resuming.execute(
            "INSERT INTO tether_event (run_id, seq, type, data, at) VALUES (%s, %s, 'warning', '{}', 0)",
            (failed.run_id, logged),
        )
        collector = threading.Thread(target=gc)
        collector.start()
        with psycopg.connect(libpq_dsn(pg_schema.url), autocommit=True) as watcher:
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
            while watcher.execute(waiting, (resuming.info.backend_pid,)).fetchone() != (1,):
                assert collector.is_alive(), "gc finished without waiting for the run's lock"
                time.sleep(0.01)
        resuming.commit()
        collector.join()
    assert deleted == [0]
    assert store.load_run(failed.run_id).status == "thinking"
    assert len(store.load_events(failed.run_id)) == logged + 1
    store.close()
