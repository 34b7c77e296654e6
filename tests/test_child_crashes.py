"""Kill a parent/child tree of runs (SIGKILL) at each boundary between them, then resume.

The writer's call is served by the reviewer's child run, whose gated ``publish`` a person
approves from another process. Whatever the kill point (the child linked, created, parked,
done, the parent resumed), the tree ends done with exactly one child and ``publish`` run once.
Runs on SQLite and on PostgreSQL in a fresh schema (the db_url fixture, conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from support import run_script
from tether.core.children import child_run_id
from tether.stores.sql import SQLStore

pytestmark = pytest.mark.slow  # kills real processes

DRIVER = Path(__file__).with_name("tree_crash_driver.py")
BEFORE_THE_DECISION = ["after:parent:child_started", "after:child:created", "after:child:approval_requested"]
AFTER_THE_DECISION = ["after:child:run_finished", "after:parent:child_resumed", "after:parent:child_ended"]


def driver(
    workdir: Path, db_url: str, run_id: str, action: str, crash: str = "none"
) -> subprocess.CompletedProcess[str]:
    return run_script(DRIVER, str(workdir), db_url, run_id, action, crash)


def drive_until_free(workdir: Path, db_url: str, run_id: str) -> dict[str, Any]:
    """Drive without a crash, waiting out the lease a killed driver left (exit 5: busy)."""
    deadline = time.monotonic() + 30
    while (done := driver(workdir, db_url, run_id, "drive")).returncode == 5:
        assert time.monotonic() < deadline, "the killed driver's lease never expired"
        time.sleep(0.2)  # the lease lasts 0.5 s and a driver starts in far less: no point starting more
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def killed(workdir: Path, db_url: str, run_id: str, crash: str) -> None:
    first = driver(workdir, db_url, run_id, "drive", crash)
    assert first.returncode == -9, f"the driver should have been killed at {crash}: {first.stdout} {first.stderr}"


def approve_elsewhere(workdir: Path, db_url: str, run_id: str) -> None:
    decided = driver(workdir, db_url, run_id, "approve")
    assert decided.returncode == 0, decided.stderr
    assert json.loads(decided.stdout)["chain"] == [run_id, child_run_id(run_id, "toolu_review", 1)]


@pytest.mark.parametrize("crash", [*BEFORE_THE_DECISION, *AFTER_THE_DECISION])
def test_a_killed_tree_resumes_with_one_child_and_one_publish(crash: str, db_url: str, tmp_path: Path) -> None:
    run_id = f"run_tree_{abs(hash((crash, str(tmp_path)))) % 10**12}"
    if crash in BEFORE_THE_DECISION:
        killed(tmp_path, db_url, run_id, crash)
    parked = drive_until_free(tmp_path, db_url, run_id)
    assert parked["status"] == "awaiting_approval", parked
    approve_elsewhere(tmp_path, db_url, run_id)
    if crash in AFTER_THE_DECISION:
        killed(tmp_path, db_url, run_id, crash)
    result = drive_until_free(tmp_path, db_url, run_id)

    assert result["status"] == "done", result
    assert result["output"] == "the reviewer published it"
    assert (tmp_path / "effects.log").read_text().splitlines() == ["publish a"]
    store = SQLStore(db_url)
    try:
        runs = {record.id: record.status for record in store.list_runs(limit=10)}
        child = child_run_id(run_id, "toolu_review", 1)
        assert runs == {run_id: "done", child: "done"}  # one child, never a second
        parent = [event.type for event in store.load_events(run_id)]
        assert parent.count("child_started") == 1
        assert parent.count("child_ended") == 1
        assert [event.type for event in store.load_events(child)].count("tool_started") == 1
    finally:
        store.close()
