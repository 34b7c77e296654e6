"""`tether gc` deletes old finished runs and never a parked, running or still resumable one."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from support import CliResult, PgSchema, finish_terminal, flat, libpq_dsn, run_tether, spawn_tether
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
    gated = {
        "content": [{"type": "tool_use", "id": "p1", "name": "publish", "input": {"text": "x"}}],
        "stop_reason": "tool_use",
    }
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
    gated = {
        "content": [{"type": "tool_use", "id": "p1", "name": "publish", "input": {"text": "x"}}],
        "stop_reason": "tool_use",
    }
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
    SQLStore(f"sqlite:///{tmp_path / 'runs.db'}").list_runs()
    result = cli(tmp_path, "gc", "--older-than", "soon")
    assert result.returncode == 2
    assert "--older-than" in result.stderr


def test_gc_refuses_a_cutoff_in_the_future_and_deletes_nothing(tmp_path: Path) -> None:
    ids = finished_runs(tmp_path, days_ago=1)
    result = cli(tmp_path, "gc", "--older-than", "2999-01-01", "--yes")
    assert result.returncode == 2
    assert "is in the future" in result.stderr
    assert "--older-than 0s" in result.stderr
    assert len(ids) == 2
    assert sorted(r.id for r in SQLStore(f"sqlite:///{tmp_path / 'runs.db'}").list_runs()) == sorted(ids)


def finished_runs(tmp_path: Path, *, days_ago: float) -> list[str]:
    """One done and one cancelled run in tmp_path/runs.db, last updated ``days_ago``."""
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    then = time.time() - days_ago * 86400
    done = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    ran = Runner(Agent(model=ScriptedModel([done])), store, clock=lambda: then).run("a").run_id
    gated = {
        "content": [{"type": "tool_use", "id": "p1", "name": "publish", "input": {"text": "x"}}],
        "stop_reason": "tool_use",
    }
    runner = Runner(Agent(model=ScriptedModel([gated]), tools=[publish]), store, clock=lambda: then)
    cancelled = runner.cancel(runner.run("b").run_id).run_id
    store.close()
    return [ran, cancelled]


def remaining(tmp_path: Path) -> set[str]:
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        return {r.id for r in store.list_runs()}
    finally:
        store.close()


def test_gc_dry_run_lists_what_would_go_and_deletes_nothing(tmp_path: Path) -> None:
    old = finished_runs(tmp_path, days_ago=40)
    fresh = finished_runs(tmp_path, days_ago=1)
    text = cli(tmp_path, "gc", "--older-than", "30d", "--dry-run")
    listing = cli(tmp_path, "gc", "--older-than", "30d", "--dry-run", "--json")
    assert text.returncode == 0, text
    assert listing.returncode == 0, listing
    assert "would delete 2 finished run(s) (cancelled, done, failed; transient failures kept)" in flat(text.stdout)
    for run_id in old:
        assert run_id in text.stdout
    assert not any(run_id in text.stdout for run_id in fresh)
    assert sorted(r["run_id"] for r in listing.data["runs"]) == sorted(old)
    assert {r["status"] for r in listing.data["runs"]} == {"done", "cancelled"}
    assert listing.data["dry_run"] is True
    assert listing.data["deleted"] == 0
    assert remaining(tmp_path) == {*old, *fresh}


def test_gc_units_are_unambiguous_and_the_output_states_the_cutoff(tmp_path: Path) -> None:
    finished_runs(tmp_path, days_ago=0.5)
    ambiguous = cli(tmp_path, "gc", "--older-than", "1m")
    assert ambiguous.returncode == 2, ambiguous
    assert "--older-than '1m' is ambiguous: write 1min for minutes or 1mo for months" in ambiguous.err
    assert len(remaining(tmp_path)) == 2

    kept = cli(tmp_path, "gc", "--older-than", "1mo")
    assert kept.returncode == 0, kept
    assert len(remaining(tmp_path)) == 2
    cutoff = time.strftime("%Y-%m-%d", time.localtime(time.time() - 30 * 86400))
    assert f"last updated before {cutoff} " in kept.stdout  # the date and time it means, then its zone
    assert "(1mo ago)" in kept.stdout

    gone = cli(tmp_path, "gc", "--older-than", "12h", "--json")
    assert gone.returncode == 0, gone
    assert gone.data["deleted"] == 2


def test_gc_on_a_terminal_asks_before_deleting_unless_yes(tmp_path: Path) -> None:
    old = finished_runs(tmp_path, days_ago=40)
    db = ["--db", f"sqlite:///{tmp_path / 'runs.db'}"]
    declined = spawn_tether(tmp_path, "gc", "--older-than", "30d", *db)
    declined.expect(r"delete 2 finished run\(s\) .* last updated before .*\? \[y/N\] ")
    declined.sendline("n")
    status, shown = finish_terminal(declined)
    assert status == 1, shown
    assert "nothing deleted" in shown
    assert remaining(tmp_path) == set(old)

    accepted = spawn_tether(tmp_path, "gc", "--older-than", "30d", *db)
    accepted.expect(r"\[y/N\] ")
    accepted.sendline("y")
    status, shown = finish_terminal(accepted)
    assert status == 0, shown
    assert "deleted 2 finished run(s)" in flat(shown)
    assert remaining(tmp_path) == set()

    again = finished_runs(tmp_path, days_ago=40)
    status, shown = finish_terminal(spawn_tether(tmp_path, "gc", "--older-than", "30d", "--yes", *db))
    assert status == 0, shown
    assert "[y/N]" not in shown
    assert "deleted 2 finished run(s)" in flat(shown)
    assert not remaining(tmp_path) & set(again)


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
            "INSERT INTO tether_event (run_id, seq, type, data, at) VALUES (%s, %s, 'warning', %s, 0)",
            (failed.run_id, logged, '{"message": "resumed"}'),
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
