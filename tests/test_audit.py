"""The audit log: one entry per tool call, read back from the event log alone.

A run whose one model turn asks for a call that is retried, one a person denies, one a
person approves with edited input, one that raises, one a policy refuses and one that
just runs; then the filters, ``--since`` parsing, and the ``tether audit`` command.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import CliResult, run_tether, tool_use, tool_use_turn
from tether import Agent, ApprovalVerdict, Approve, Deny, Policy, RetryPolicy, Rule, Runner, RunResult, tool
from tether.core.approvals import Decision
from tether.errors import ConfigError, RunNotFound
from tether.facts.events import Event, ToolFinished, Warned
from tether.models.scripted import ScriptedModel
from tether.stores import Store
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore
from tether.testing import RecordingApprover
from tether.tools import Tool
from tether.views.audit import AuditEntry, entries, parse_since, query, select

ENTRY_KEYS = {
    "run_id", "call_id", "tool", "input", "requested_at", "status", "decision", "approvals", "attempts",
    "retries", "result", "error", "error_type", "error_class", "duration", "started_at", "finished_at",
    "cached", "truncated_from", "warnings", "last_at", "agent",
}  # fmt: skip


ANSWER = {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "usage": {"input_tokens": 1}}
SCRIPT = [
    tool_use_turn(
        tool_use("toolu_flaky", "flaky", {"x": 1}),
        tool_use("toolu_risky", "risky", {"target": "prod"}),
        tool_use("toolu_transfer", "transfer", {"amount": 500}),
        tool_use("toolu_broken", "broken", {}),
        tool_use("toolu_nuke", "nuke", {"target": "prod"}),
        tool_use("toolu_add", "add", {"a": 2, "b": 3}),
    ),
    ANSWER,
]
APPROVER_DECISIONS: dict[str, Decision] = {
    "risky": Deny("too risky on a Friday", actor="alice"),
    "transfer": Approve(input={"amount": 5}, actor="bob"),
}


class Clock:
    """Advances one second per reading, so every event has its own time."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def make_tools() -> list[Tool]:
    calls = {"flaky": 0}

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0.0, retry_on=(RuntimeError,)))
    def flaky(x: int) -> str:
        """Fails once, then works."""
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise RuntimeError("transient glitch")
        return f"flaky ok {x}"

    @tool(approval=True)
    def risky(target: str) -> str:
        """Needs a person."""
        return f"did {target}"

    @tool(approval=True)
    def transfer(amount: int) -> str:
        """Moves money; needs a person."""
        return f"sent {amount}"

    @tool
    def broken() -> str:
        """Always raises."""
        raise ValueError("bad data")

    @tool(approval=lambda args, context: ApprovalVerdict("deny", "never in prod"))
    def nuke(target: str) -> str:
        """Refused by policy."""
        return "boom"

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    return [flaky, risky, transfer, broken, nuke, add]


def drive(store: Store, *, start: float | None = None, script: list[dict[str, Any]] | None = None) -> RunResult:
    clock: Callable[[], float] = Clock(start) if start is not None else time.time
    agent = Agent(model=ScriptedModel(script or SCRIPT), tools=make_tools())
    runner = Runner(agent, store, approver=RecordingApprover(APPROVER_DECISIONS), clock=clock)
    result = runner.run("Do all the things.")
    assert result.status == "done", result
    return result


@pytest.fixture
def run() -> tuple[MemoryStore, RunResult, dict[str, AuditEntry]]:
    store = MemoryStore()
    result = drive(store, start=1_000.0)
    found = entries(result.run_id, store.load_events(result.run_id))
    return store, result, {e.call_id: e for e in found}


Run = tuple[MemoryStore, RunResult, dict[str, AuditEntry]]


# One entry per call -----------------------------------------------------------------------
def test_one_entry_per_call_in_call_order(run: Run) -> None:
    _, result, by_call = run
    assert list(by_call) == ["toolu_flaky", "toolu_risky", "toolu_transfer", "toolu_broken", "toolu_nuke", "toolu_add"]
    for entry in by_call.values():
        assert entry.run_id == result.run_id
        assert set(entry.to_dict()) == ENTRY_KEYS
        json.dumps(entry.to_dict())  # JSON-able as is
    assert by_call["toolu_add"].input == {"a": 2, "b": 3}
    requested = {e.requested_at for e in by_call.values()}
    assert len(requested) == 1  # one model turn asked for all of them


def test_a_retried_call_lists_its_attempts_and_the_failure(run: Run) -> None:
    entry = run[2]["toolu_flaky"]
    assert entry.status == "ok"
    assert entry.result == "flaky ok 1"
    assert entry.attempts == 2
    assert len(entry.retries) == 1
    retry = entry.retries[0]
    assert retry["attempt"] == 1
    assert "transient glitch" in retry["error"]
    assert retry["due_at"] is not None
    assert entry.decision == {"verdict": "allowed", "by": None, "at": entry.started_at, "reason": "no approval needed"}
    assert entry.duration is not None
    assert entry.duration >= 0
    assert entry.started_at is not None
    assert entry.finished_at is not None
    assert entry.started_at < entry.finished_at


def test_a_denial_says_who_when_and_why(run: Run) -> None:
    entry = run[2]["toolu_risky"]
    assert entry.status == "denied"
    assert entry.attempts == 0
    assert entry.duration is None
    decision = entry.decision
    assert decision is not None
    assert decision["verdict"] == "denied"
    assert decision["by"] == "alice"
    assert decision["reason"] == "too risky on a Friday"
    assert decision["asked_because"] == "the tool is marked approval=True"
    assert decision["at"] > entry.requested_at
    assert "denied by alice" in (entry.error or "")
    (asked,) = entry.approvals
    assert asked["by"] == "alice"
    assert asked["approved"] is False
    assert asked["decided_at"] == decision["at"]


def test_an_approval_with_edited_input_keeps_both_inputs(run: Run) -> None:
    entry = run[2]["toolu_transfer"]
    assert entry.status == "ok"
    assert entry.input == {"amount": 500}
    assert entry.result is not None
    assert entry.result.endswith("sent 5")
    decision = entry.decision
    assert decision is not None
    assert (decision["verdict"], decision["by"], decision["edited_input"]) == ("approved", "bob", {"amount": 5})
    assert entry.attempts == 1


def test_an_error_records_its_type(run: Run) -> None:
    entry = run[2]["toolu_broken"]
    assert entry.status == "error"
    assert entry.error_type == "ValueError"
    assert "bad data" in (entry.error or "")
    assert entry.result is None
    assert entry.attempts == 1
    assert entry.duration is not None


def test_a_policy_denial_is_by_policy(run: Run) -> None:
    entry = run[2]["toolu_nuke"]
    assert entry.status == "denied"
    assert entry.decision == {"verdict": "denied", "by": "policy", "at": entry.finished_at, "reason": "never in prod"}
    assert entry.attempts == 0
    assert entry.approvals == []


def test_an_ungated_call_needs_no_approval(run: Run) -> None:
    entry = run[2]["toolu_add"]
    assert entry.decision == {"verdict": "allowed", "by": None, "at": entry.started_at, "reason": "no approval needed"}


def test_a_call_let_through_by_a_rule_or_an_approval_gate_is_allowed_by_policy() -> None:
    @tool(approval=lambda args, context: ApprovalVerdict("allow", "small amounts are fine"))
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    script = [
        tool_use_turn(tool_use("toolu_risky", "risky", {"target": "x"}), tool_use("toolu_pay", "pay", {"amount": 1})),
        ANSWER,
    ]
    store = MemoryStore()
    policy = Policy([Rule(tool="risky", action="allow", name="risky-is-fine-here")])
    agent = Agent(model=ScriptedModel(script), tools=[*make_tools(), pay], policy=policy)
    result = Runner(agent, store).run("go")
    by_call = {e.call_id: e for e in entries(result.run_id, store.load_events(result.run_id))}
    assert by_call["toolu_risky"].decision == {
        "verdict": "allowed",
        "by": "policy",
        "at": by_call["toolu_risky"].started_at,
        "reason": "rule 1 (risky-is-fine-here): allowed",
    }
    pay_decision = by_call["toolu_pay"].decision
    assert pay_decision is not None
    assert (pay_decision["by"], pay_decision["reason"]) == ("policy", "small amounts are fine")


def test_a_call_allowed_by_an_approval_for_the_run_is_attributed_to_it() -> None:
    script = [
        tool_use_turn(tool_use("toolu_1", "risky", {"target": "a"})),
        tool_use_turn(tool_use("toolu_2", "risky", {"target": "b"})),
        ANSWER,
    ]
    store = MemoryStore()
    approver = RecordingApprover({"risky": Approve(actor="alice", remember_for_run=True)})
    result = Runner(Agent(model=ScriptedModel(script), tools=make_tools()), store, approver=approver).run("go")
    assert result.status == "done"
    first, second = entries(result.run_id, store.load_events(result.run_id))
    assert first.decision is not None
    assert first.decision["for_run"] is True  # what the person chose, beside who they were
    assert second.decision == {
        "verdict": "approved",
        "by": "alice",
        "at": first.decision["at"],
        "reason": "risky was approved for the rest of the run",
        "asked_because": "the tool is marked approval=True",
        "edited_input": None,
        "for_run_call": "toolu_1",
    }
    assert second.approvals == []  # nobody was asked about this one


def test_a_cached_call_is_marked_and_did_not_run() -> None:
    @tool(cache_ttl=60)
    def lookup(q: str) -> str:
        """Cached."""
        return q.upper()

    store = MemoryStore()
    script = [tool_use_turn(tool_use("toolu_1", "lookup", {"q": "hi"})), ANSWER]
    for _ in range(2):
        result = Runner(Agent(model=ScriptedModel(script), tools=[lookup]), store).run("go")
    (entry,) = entries(result.run_id, store.load_events(result.run_id))
    assert (entry.status, entry.cached, entry.attempts, entry.result) == ("ok", True, 0, "HI")
    assert entry.decision == {"verdict": "allowed", "by": None, "at": entry.last_at, "reason": "no approval needed"}


def test_a_parked_call_is_awaiting_approval() -> None:
    store = MemoryStore()
    script = [tool_use_turn(tool_use("toolu_risky", "risky", {"target": "x"})), ANSWER]
    result = Runner(Agent(model=ScriptedModel(script), tools=make_tools()), store).run("go")
    assert result.status == "awaiting_approval"
    (entry,) = entries(result.run_id, store.load_events(result.run_id))
    assert entry.status == "awaiting_approval"
    assert entry.decision is not None
    assert entry.decision["verdict"] == "pending"


def test_a_call_whose_run_ended_while_it_waited_was_never_decided() -> None:
    """Cancelled while parked: nobody will be asked any more, so it no longer reads as pending."""
    store = MemoryStore()
    script = [tool_use_turn(tool_use("toolu_risky", "risky", {"target": "x"})), ANSWER]
    runner = Runner(Agent(model=ScriptedModel(script), tools=make_tools()), store)
    result = runner.run("go")
    runner.cancel(result.run_id, "not today")
    (entry,) = entries(result.run_id, store.load_events(result.run_id))
    assert entry.status == "never_decided"
    assert entry.decision is not None
    assert (entry.decision["verdict"], entry.decision["reason"]) == ("never_decided", "the run ended cancelled")


def test_events_of_other_kinds_or_unknown_calls_are_ignored() -> None:
    log = [
        Event(0, 1.0, Warned("run-level")),
        Event(1, 2.0, ToolFinished("nobody", "t", "x", False)),
    ]
    assert entries("run_x", log) == []


# Filters ------------------------------------------------------------------------------------
class CountingStore(MemoryStore):
    """A memory store that remembers which logs were read."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []

    def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        self.read.append(run_id)
        return super().load_events(run_id, tenant=tenant, after=after, limit=limit)


@pytest.fixture
def two_runs() -> tuple[CountingStore, RunResult, RunResult]:
    store = CountingStore()
    old = drive(store, start=1_000.0)
    new = drive(store, start=10_000.0)
    store.read.clear()
    return store, old, new


def test_query_reads_every_run_newest_request_last(two_runs: tuple[CountingStore, RunResult, RunResult]) -> None:
    store, old, new = two_runs
    found = query(store)
    assert len(found) == 12
    assert [e.run_id for e in found] == [old.run_id] * 6 + [new.run_id] * 6


def test_filter_by_run_and_tool(two_runs: tuple[CountingStore, RunResult, RunResult]) -> None:
    store, old, new = two_runs
    assert {e.run_id for e in query(store, run_id=old.run_id)} == {old.run_id}
    assert store.read == [old.run_id]
    found = query(store, tool="transfer")
    assert [(e.run_id, e.tool) for e in found] == [(old.run_id, "transfer"), (new.run_id, "transfer")]
    assert query(store, tool="nothing") == []
    assert [e.call_id for e in query(store, run_id=new.run_id, tool="risky")] == ["toolu_risky"]


def test_since_skips_older_runs_without_reading_them(two_runs: tuple[CountingStore, RunResult, RunResult]) -> None:
    store, _, new = two_runs
    found = query(store, since=5_000.0)
    assert {e.run_id for e in found} == {new.run_id}
    assert store.read == [new.run_id]
    assert query(store, since=1e12) == []


def test_since_keeps_a_call_with_later_activity() -> None:
    early = AuditEntry("r", "c1", "t", {}, requested_at=10.0, last_at=10.0)
    decided_later = AuditEntry("r", "c2", "t", {}, requested_at=10.0, last_at=50.0)
    assert select([early, decided_later], since=20.0) == [decided_later]


def test_an_unknown_run_is_not_found() -> None:
    with pytest.raises(RunNotFound):
        query(MemoryStore(), run_id="run_missing")


# --since ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30min", 1800),
        ("2h", 7200),
        ("7d", 7 * 86400),
        ("1w", 604800),
        ("45s", 45),
        ("1.5h", 5400),
        (" 10 min ", 600),
        ("2mo", 60 * 86400),
        ("3 days", 3 * 86400),
    ],
)
def test_since_accepts_relative_durations(text: str, seconds: float) -> None:
    assert parse_since(text, now=1_000_000.0) == 1_000_000.0 - seconds


def test_since_accepts_iso_dates_and_times() -> None:
    assert parse_since("2025-01-31T12:00:00+00:00", now=0) == dt.datetime(2025, 1, 31, 12, tzinfo=dt.UTC).timestamp()
    assert parse_since("2025-01-31T12:00:00Z", now=0) == dt.datetime(2025, 1, 31, 12, tzinfo=dt.UTC).timestamp()
    assert parse_since("2025-01-31", now=0) == dt.datetime(2025, 1, 31).timestamp()  # local midnight


@pytest.mark.parametrize("text", ["yesterday", "5x", "", "-3h", "2025-13-01", "1e400d", "99999999999w"])
def test_since_refuses_anything_else(text: str) -> None:
    with pytest.raises(ConfigError, match="--since"):
        parse_since(text, now=1_000_000.0)


@pytest.mark.parametrize("text", ["1m", "30M", "2 m"])
def test_since_refuses_m_which_could_be_minutes_or_months(text: str) -> None:
    with pytest.raises(ConfigError, match=r"ambiguous: write \d+min for minutes or \d+mo for months"):
        parse_since(text, now=1_000_000.0)


# tether audit ------------------------------------------------------------------------------
def tether(cwd: Path, *args: str) -> CliResult:
    """``tether audit ARGS`` on cwd/audit.db, 250 columns wide (the table's rows fit)."""
    return run_tether(cwd, "audit", "--db", f"sqlite:///{cwd / 'audit.db'}", *args, env={"COLUMNS": "250"})


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunResult]:
    cwd = tmp_path_factory.mktemp("audit")
    store = SQLStore(f"sqlite:///{cwd / 'audit.db'}")
    try:
        result = drive(store)  # real clock: "--since 1h" covers it
    finally:
        store.close()
    return cwd, result


@pytest.mark.slow
def test_cli_json_is_one_object_with_entries(audited: tuple[Path, RunResult]) -> None:
    cwd, result = audited
    done = tether(cwd, "--json")
    assert done.returncode == 0, done
    payload = json.loads(done.stdout)
    assert set(payload) == {"entries"}
    assert len(payload["entries"]) == 6
    assert all(set(entry) == ENTRY_KEYS for entry in payload["entries"])
    risky = next(e for e in payload["entries"] if e["tool"] == "risky")
    assert (risky["status"], risky["decision"]["by"], risky["decision"]["reason"]) == (
        "denied",
        "alice",
        "too risky on a Friday",
    )
    assert risky["run_id"] == result.run_id


@pytest.mark.slow
def test_cli_filters(audited: tuple[Path, RunResult]) -> None:
    cwd, result = audited

    def tools(*args: str) -> list[str]:
        done = tether(cwd, "--json", *args)
        assert done.returncode == 0, done
        return [e["tool"] for e in json.loads(done.stdout)["entries"]]

    assert tools("--tool", "flaky") == ["flaky"]
    assert tools("--run", result.run_id, "--tool", "transfer") == ["transfer"]
    assert len(tools("--since", "1h")) == 6
    assert len(tools("--since", "2000-01-01")) == 6
    assert tools("--since", "2999-01-01") == []


@pytest.mark.slow
def test_cli_table(audited: tuple[Path, RunResult]) -> None:
    cwd, result = audited
    done = tether(cwd)
    assert done.returncode == 0, done
    text = " ".join(done.stdout.split())
    for expected in (
        "flaky",
        "denied by alice",
        "approved by bob (input edited)",
        "no approval needed",
        "error ValueError",
        result.run_id,
    ):
        assert expected in text
    empty = tether(cwd, "--tool", "nothing")
    assert "No tool calls match." in empty.stdout


@pytest.mark.slow
def test_cli_usage_errors(audited: tuple[Path, RunResult]) -> None:
    cwd, _ = audited
    bad = tether(cwd, "--since", "yesterday")
    assert bad.returncode == 2
    assert "--since" in bad.stderr
    missing = tether(cwd, "--run", "run_missing", "--json")
    assert missing.returncode == 2
    assert missing.stdout == ""
