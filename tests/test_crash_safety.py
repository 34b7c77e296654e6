"""Kill a real process (SIGKILL) at every step boundary and inside tools, then resume.

The run must complete; no event may be lost or duplicated; every request the model saw
must be valid for the Messages API; every tool ran exactly as often as the crash point
explains: an idempotent call in doubt is re-run, a finished call (a parallel sibling
included) never is, and a side effect in doubt runs again only with a recorded approval.
The killed driver's lease names a process of this host that is gone, so the next driver
takes the run over at once (were it still busy, the test would wait out the lease's half second).
Each way of running the two calls is checked: one after the other, and concurrently on
Runner and AsyncRunner (where both are under way at once, so a crash can leave both in doubt).
Runs on SQLite and on PostgreSQL, in one database per backend for the whole module (the
db_url fixture below): each test's run has an id of its own, and every check reads only that
run and the test's own directory.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support import PgSchema, run_script
from tether.facts.events import Event
from tether.stores.sql import SQLStore
from tether.testing import validate_messages_request

pytestmark = pytest.mark.slow  # kills real processes at every step boundary

DRIVER = Path(__file__).with_name("crash_driver.py")
LEASE_WAIT = 0.2
"""Seconds between drives of a run whose killed driver's lease (0.5 s) has not expired: a new
driver starts in well under that, so trying again at once would only start more of them."""


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One database per backend for the module, its tables made here (not conftest's empty one per test).

    A new PostgreSQL schema, or SQLite file, and its tables cost a test more than its checks; no
    check needs an empty database, as each reads only its own run.
    """
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('crash_db') / 'runs.db'}"
        made_tables(url)
        yield url
        return
    schema: PgSchema = request.getfixturevalue("module_pg_schema")
    made_tables(schema.url)
    yield schema.url


def made_tables(url: str) -> None:
    store = SQLStore(url)
    try:
        store.list_runs()  # a store makes its tables on first use
    finally:
        store.close()


def drive(
    workdir: Path, db_url: str, run_id: str, crash: str, approver: str = "deny", mode: str = "serial"
) -> subprocess.CompletedProcess[str]:
    return run_script(DRIVER, str(workdir), db_url, run_id, crash, approver, mode)


@dataclass(frozen=True)
class Schedule:
    """Where each call stands at each crash point, for one way of running the two calls."""

    writes: int
    """Store writes of an uninterrupted run (checked by test_clean_run_write_count): each is a crash point."""
    fetch_in_doubt: frozenset[str]
    """fetch_price's start was committed and its result never was: idempotent, so it is run again."""
    email_in_doubt: frozenset[str]
    """The same for send_email, a side effect: someone must decide."""
    fetch_ran: frozenset[str]
    """Of ``fetch_in_doubt``, the points where the tool had really run before the process died."""
    email_ran: frozenset[str]
    """Of ``email_in_doubt``, the same."""


# Store writes of a clean serial run: 1 create, 2 the model response with fetch_price's
# (toolu_a) start, 3 its result with send_email's (toolu_b) start, 4 send_email's result, 5 the
# final model response. A start is committed with the write before it (one commit fewer each),
# so a crash right after that write leaves the call in doubt though it never ran.
SERIAL = Schedule(
    writes=5,
    fetch_in_doubt=frozenset({"after-append:2", "before-append:3", "in-tool:fetch_price"}),
    email_in_doubt=frozenset({"after-append:3", "before-append:4", "in-tool:send_email"}),
    fetch_ran=frozenset({"before-append:3", "in-tool:fetch_price"}),
    email_ran=frozenset({"before-append:4", "in-tool:send_email"}),
)
# Concurrently (crash_driver.Meeting fixes the order): 1 create, 2 model response, 3/4 the
# starts of toolu_a and toolu_b (toolu_a is launched between them), 5/6 their results, 7 the
# final model response. send_email's effect comes before fetch_price's, and both before
# either result is committed.
CONCURRENT = Schedule(
    writes=7,
    fetch_in_doubt=frozenset(
        [
            "after-append:3",
            "before-append:4",
            "after-append:4",
            "before-append:5",
            "in-tool:send_email",
            "in-tool:fetch_price",
        ]
    ),
    email_in_doubt=frozenset(
        [
            "after-append:4",
            "before-append:5",
            "after-append:5",
            "before-append:6",
            "in-tool:send_email",
            "in-tool:fetch_price",
        ]
    ),
    fetch_ran=frozenset(["before-append:5", "in-tool:fetch_price"]),
    email_ran=frozenset(
        ["before-append:5", "after-append:5", "before-append:6", "in-tool:send_email", "in-tool:fetch_price"]
    ),
)
SCHEDULES = {"serial": SERIAL, "concurrent": CONCURRENT, "concurrent-async": CONCURRENT}
MODES = sorted(SCHEDULES)


def crash_points(mode: str) -> list[str]:
    writes = SCHEDULES[mode].writes
    points = [f"{when}:{n}" for n in range(1, writes + 1) for when in ("before-append", "after-append")]
    return [*points, "in-tool:send_email", "in-tool:fetch_price"]


def expected_effects(crash: str, approver: str, schedule: Schedule = SERIAL) -> Counter[str]:
    """How many times each call really ran, across both processes."""
    fetch = 1 + (crash in schedule.fetch_ran)
    email = int(crash in schedule.email_ran)
    if crash not in schedule.email_in_doubt or approver == "approve":
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


@pytest.mark.parametrize("mode", MODES)
def test_clean_run_write_count(mode: str, tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'runs.db'}"
    done = drive(tmp_path, db_url, "run_clean", "none", mode=mode)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "done"
    # create, model call, 2 x (tool start, tool finish), model call: every write is a crash point
    assert result["store_writes"] == SCHEDULES[mode].writes
    checked = check_run(tmp_path, db_url, "run_clean")
    assert checked["effects"] == expected_effects("none", "deny")
    events = checked["events"]
    assert isinstance(events, list)
    assert not any(e.data.get("is_error") for e in events if e.type == "tool_finished")  # the calls met


def crash_and_resume(tmp_path: Path, db_url: str, crash: str, approver: str, mode: str = "serial") -> dict[str, Any]:
    run_id = f"run_crash_{uuid.uuid4().hex[:16]}"  # the module's tests share a database
    first = drive(tmp_path, db_url, run_id, crash, approver, mode)
    assert first.returncode == -9, f"the driver should have been killed at {crash}: {first.stderr}"
    second = drive(tmp_path, db_url, run_id, "none", approver, mode)
    deadline = time.monotonic() + 30
    while second.returncode == 5:  # the dead driver's lease has not expired yet: the run is busy
        assert time.monotonic() < deadline, "the killed driver's lease never expired"
        time.sleep(LEASE_WAIT)
        second = drive(tmp_path, db_url, run_id, "none", approver, mode)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout)
    assert result["status"] == "done", result
    checked = check_run(tmp_path, db_url, run_id)
    assert checked["effects"] == expected_effects(crash, approver, SCHEDULES[mode]), crash
    return checked


@pytest.mark.parametrize(("mode", "crash"), [(mode, crash) for mode in MODES for crash in crash_points(mode)])
def test_killed_run_resumes_exactly_once(crash: str, mode: str, db_url: str, tmp_path: Path) -> None:
    events = crash_and_resume(tmp_path, db_url, crash, "deny", mode)["events"]
    schedule = SCHEDULES[mode]
    asked = [item["call_id"] for e in events if e.type == "approval_requested" for item in e.data["calls"]]
    if crash in schedule.fetch_in_doubt:  # the interrupted idempotent call ran again, unasked
        assert attempts_started(events, "toolu_a") == [1, 2]
    else:
        assert attempts_started(events, "toolu_a") == [1]
    if crash in schedule.email_in_doubt:
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


def in_doubt_emails() -> list[tuple[str, str]]:
    """(mode, crash) for every crash point leaving send_email in doubt, serially and concurrently."""
    return [(mode, crash) for mode in ("serial", "concurrent") for crash in sorted(SCHEDULES[mode].email_in_doubt)]


@pytest.mark.parametrize(("mode", "crash"), in_doubt_emails())
def test_an_approved_rerun_of_a_side_effect_is_recorded(mode: str, crash: str, db_url: str, tmp_path: Path) -> None:
    events = crash_and_resume(tmp_path, db_url, crash, "approve", mode)["events"]
    decided = [e.data for e in events if e.type == "approval_decided"]
    assert [(d["call_id"], d["approved"], d["actor"]) for d in decided] == [("toolu_b", True, "harness")]
    assert attempts_started(events, "toolu_b") == [1, 2]
    assert last_result(events, "toolu_b")["content"] == "sent to ops@example.com"
    # a sibling that finished never ran again (concurrently, it may have been in doubt too)
    assert attempts_started(events, "toolu_a") == ([1, 2] if crash in SCHEDULES[mode].fetch_in_doubt else [1])


@pytest.mark.parametrize(("mode", "crash"), in_doubt_emails())
def test_without_an_approver_the_model_is_told_the_call_was_not_rerun(
    mode: str, crash: str, db_url: str, tmp_path: Path
) -> None:
    events = crash_and_resume(tmp_path, db_url, crash, "none", mode)["events"]
    assert [e for e in events if e.type.startswith("approval_")] == []  # nobody to ask: not parked
    result = last_result(events, "toolu_b")
    assert result["is_error"] is True
    assert result["interrupted"] is True
    assert "it was not run again (there is no approver to ask)" in result["content"]
    assert attempts_started(events, "toolu_b") == [1]
