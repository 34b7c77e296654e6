"""Kill a real process (SIGKILL) at every step boundary and inside tools, then resume.

The run must complete; no event may be lost or duplicated; every request the model saw
must be valid for the Messages API; every tool ran exactly as often as the crash point
explains: an idempotent call in doubt is re-run, a finished call (a parallel sibling
included) never is, and a side effect in doubt runs again only with a recorded approval.
The killed driver's lease keeps the run busy until it expires (half a second here); only
then does the next process take the run over.
Runs on SQLite and on PostgreSQL in a fresh schema (the db_url fixture, conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from support import run_python
from tether.core.events import Event
from tether.stores.sql import SQLStore
from tether.testing import validate_messages_request

pytestmark = pytest.mark.slow  # kills real processes at every step boundary

DRIVER = Path(__file__).with_name("crash_driver.py")
CLEAN_WRITES = 7  # store writes of an uninterrupted run; checked by test_clean_run_write_count


def drive(
    workdir: Path, db_url: str, run_id: str, crash: str, approver: str = "deny"
) -> subprocess.CompletedProcess[str]:
    return run_python(str(DRIVER), str(workdir), db_url, run_id, crash, approver)


def crash_points() -> list[str]:
    points = [f"{when}:{n}" for n in range(1, CLEAN_WRITES + 1) for when in ("before-append", "after-append")]
    return [*points, "in-tool:send_email", "in-tool:fetch_price"]


# Store writes of a clean run: 1 create, 2 model response, 3/4 fetch_price (toolu_a) started/
# finished, 5/6 send_email (toolu_b) started/finished, 7 the final model response.
FETCH_IN_DOUBT = {"after-append:3", "before-append:4", "in-tool:fetch_price"}
"""fetch_price's start was committed and its result never was: idempotent, so it is run again."""
EMAIL_IN_DOUBT = {"after-append:5", "before-append:6", "in-tool:send_email"}
"""The same for send_email, a side effect: someone must decide."""
RAN_BEFORE_CRASH = {"before-append:4", "in-tool:fetch_price", "before-append:6", "in-tool:send_email"}
"""Of those, the points where the tool had really run before the process died."""


def expected_effects(crash: str, approver: str) -> Counter[str]:
    """How many times each call really ran, across both processes."""
    fetch = 1 + (crash in FETCH_IN_DOUBT and crash in RAN_BEFORE_CRASH)
    email = int(crash in EMAIL_IN_DOUBT and crash in RAN_BEFORE_CRASH)
    if crash not in EMAIL_IN_DOUBT or approver == "approve":
        email += 1
    return Counter({"fetch_price toolu_a": fetch, "send_email toolu_b": email})


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
    effects = Counter(line for line in log.read_text().split("\n") if line) if log.exists() else Counter()
    return {"effects": effects, "events": events}


def attempts_started(events: list[Event], call_id: str) -> list[int]:
    return [e.data["attempt"] for e in events if e.type == "tool_started" and e.data["call_id"] == call_id]


def last_result(events: list[Event], call_id: str) -> dict[str, Any]:
    return [e.data for e in events if e.type == "tool_finished" and e.data["call_id"] == call_id][-1]


def test_clean_run_write_count(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'runs.db'}"
    done = drive(tmp_path, db_url, "run_clean", "none")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "done"
    # create, model call, 2 x (tool start, tool finish), model call: every write is a crash point
    assert result["store_writes"] == CLEAN_WRITES
    checked = check_run(tmp_path, db_url, "run_clean")
    assert checked["effects"] == expected_effects("none", "deny")


def crash_and_resume(tmp_path: Path, db_url: str, crash: str, approver: str) -> dict[str, Any]:
    run_id = f"run_crash_{abs(hash((crash, str(tmp_path)))) % 10**12}"
    first = drive(tmp_path, db_url, run_id, crash, approver)
    assert first.returncode == -9, f"the driver should have been killed at {crash}: {first.stderr}"
    second = drive(tmp_path, db_url, run_id, "none", approver)
    deadline = time.monotonic() + 30
    while second.returncode == 5:  # the dead driver's lease has not expired yet: the run is busy
        assert time.monotonic() < deadline, "the killed driver's lease never expired"
        second = drive(tmp_path, db_url, run_id, "none", approver)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout)
    assert result["status"] == "done", result
    checked = check_run(tmp_path, db_url, run_id)
    assert checked["effects"] == expected_effects(crash, approver), crash
    return checked


@pytest.mark.parametrize("crash", crash_points())
def test_killed_run_resumes_exactly_once(crash: str, db_url: str, tmp_path: Path) -> None:
    events = crash_and_resume(tmp_path, db_url, crash, "deny")["events"]
    asked = [item["call_id"] for e in events if e.type == "approval_requested" for item in e.data["calls"]]
    if crash in FETCH_IN_DOUBT:  # the interrupted idempotent call ran again, unasked
        assert attempts_started(events, "toolu_a") == [1, 2]
    else:
        assert attempts_started(events, "toolu_a") == [1]
    if crash in EMAIL_IN_DOUBT:
        # it started and may have run: never silently re-run; the model is told instead
        assert asked == ["toolu_b"]
        assert attempts_started(events, "toolu_b") == [1]
        result = last_result(events, "toolu_b")
        assert result["is_error"] is True
        assert result["interrupted"] is True
        assert "interrupted mid-run" in result["content"]
        assert "may already have taken effect" in result["content"]
        assert "it was not run again (harness declined to re-run it" in result["content"]
    else:
        assert asked == []


@pytest.mark.parametrize("crash", sorted(EMAIL_IN_DOUBT))
def test_an_approved_rerun_of_a_side_effect_is_recorded(crash: str, db_url: str, tmp_path: Path) -> None:
    events = crash_and_resume(tmp_path, db_url, crash, "approve")["events"]
    decided = [e.data for e in events if e.type == "approval_decided"]
    assert [(d["call_id"], d["approved"], d["actor"]) for d in decided] == [("toolu_b", True, "harness")]
    assert attempts_started(events, "toolu_b") == [1, 2]
    assert last_result(events, "toolu_b")["content"] == "sent to ops@example.com"
    assert attempts_started(events, "toolu_a") == [1]  # the finished sibling never ran again


@pytest.mark.parametrize("crash", sorted(EMAIL_IN_DOUBT))
def test_without_an_approver_the_model_is_told_the_call_was_not_rerun(crash: str, db_url: str, tmp_path: Path) -> None:
    events = crash_and_resume(tmp_path, db_url, crash, "none")["events"]
    assert [e for e in events if e.type.startswith("approval_")] == []  # nobody to ask: not parked
    result = last_result(events, "toolu_b")
    assert result["is_error"] is True
    assert result["interrupted"] is True
    assert "it was not run again (there is no approver to ask)" in result["content"]
    assert attempts_started(events, "toolu_b") == [1]
