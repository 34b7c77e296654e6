"""Kill a real process (SIGKILL) at every step boundary and inside tools, then resume.

The run must complete; no event may be lost or duplicated; every request the model saw
must be valid for the Messages API; a non-idempotent tool runs at most once unless a
person approves a re-run (the harness always denies), while an idempotent one may re-run.
Runs on SQLite and on PostgreSQL in a fresh schema (the db_url fixture, conftest.py).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from fake_messages_api import validate_messages_request
from support import run_python
from tether.stores.sql import SQLStore

DRIVER = Path(__file__).with_name("crash_driver.py")
CLEAN_WRITES = 7  # store writes of an uninterrupted run; checked by test_clean_run_write_count


def drive(workdir: Path, db_url: str, run_id: str, crash: str) -> subprocess.CompletedProcess[str]:
    return run_python(str(DRIVER), str(workdir), db_url, run_id, crash)


def crash_points() -> list[str]:
    points = [f"{when}:{n}" for n in range(1, CLEAN_WRITES + 1) for when in ("before-append", "after-append")]
    return [*points, "in-tool:send_email", "in-tool:fetch_price"]


def check_run(workdir: Path, db_url: str, run_id: str) -> dict[str, object]:
    store = SQLStore(db_url)
    try:
        events = store.load_events(run_id)
    finally:
        store.close()
    assert [e.seq for e in events] == list(range(len(events))), "events lost or duplicated"
    assert events[0].type == "run_started"
    assert events[-1].type == "run_finished"
    assert Counter(e.type for e in events)["run_finished"] == 1
    for line in (workdir / "requests.jsonl").read_text().splitlines():
        request = json.loads(line)
        assert validate_messages_request(request) is None, request
    log = workdir / "effects.log"
    effects = Counter(log.read_text().split("\n")) if log.exists() else Counter()
    assert effects["send_email toolu_b"] <= 1, "a side effect ran twice without approval"
    return {"effects": effects, "events": events}


def test_clean_run_write_count(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'runs.db'}"
    done = drive(tmp_path, db_url, "run_clean", "none")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "done"
    # create, model call, 2 x (tool start, tool finish), model call: every write is a crash point
    assert result["store_writes"] == CLEAN_WRITES
    checked = check_run(tmp_path, db_url, "run_clean")
    assert checked["effects"]["send_email toolu_b"] == 1


@pytest.mark.parametrize("crash", crash_points())
def test_killed_run_resumes_exactly_once(crash: str, db_url: str, tmp_path: Path) -> None:
    run_id = f"run_crash_{abs(hash((crash, str(tmp_path)))) % 10**12}"
    first = drive(tmp_path, db_url, run_id, crash)
    assert first.returncode == -9, f"the driver should have been killed at {crash}: {first.stderr}"
    second = drive(tmp_path, db_url, run_id, "none")
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout)
    assert result["status"] == "done", result
    checked = check_run(tmp_path, db_url, run_id)
    interrupted_email = crash == "in-tool:send_email"
    if interrupted_email:
        # it started and may have run: never silently re-run; the model is told instead
        assert checked["effects"]["send_email toolu_b"] == 1
        finished = [e for e in checked["events"] if e.type == "tool_finished" and e.data["call_id"] == "toolu_b"]
        assert finished[-1].data["is_error"] is True
        assert "interrupted" in finished[-1].data["content"] or "denied" in finished[-1].data["content"]
