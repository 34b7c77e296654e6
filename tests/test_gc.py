"""`tether gc` deletes old finished runs and never a parked or running one."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support import CliResult, run_tether
from tether import Agent, Runner, tool
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel


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
    store.close()
