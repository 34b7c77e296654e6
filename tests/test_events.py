"""The event vocabulary: every kind of fact is stored as exactly the JSON tether always wrote,
and read back as the same fact, on every store.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tether.facts import events as ev
from tether.facts.events import Event
from tether.facts.status import from_stored
from tether.models import Usage
from tether.stores import RunRecord, Store
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore

FIXTURES = Path(__file__).parent / "fixtures"
USAGE = {"input_tokens": 3, "output_tokens": 2, "cache_creation_input_tokens": 1, "cache_read_input_tokens": 0}
ALLOWED = {"by": "policy", "reason": "rule 0 allows it"}
TOOL_USE = {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}}

STORED: list[tuple[ev.Fact, dict[str, Any]]] = [
    (
        ev.RunStarted({"model": "m"}, [{"role": "user", "content": "hi"}], 1.5),
        {"spec": {"model": "m"}, "messages": [{"role": "user", "content": "hi"}], "created_at": 1.5},
    ),
    (
        ev.ModelResponded([TOOL_USE], "tool_use", Usage(3, 2, 1, 0), None, None, None, 0.25),
        {
            "content": [TOOL_USE],
            "stop_reason": "tool_use",
            "usage": USAGE,
            "cost_usd": None,
            "model": None,
            "id": None,
            "latency": 0.25,
        },
    ),
    (
        ev.ModelResponded(
            [TOOL_USE],
            "max_tokens",
            Usage(3, 2, 1, 0),
            0.01,
            "m",
            "msg_1",
            0.5,
            [1.0, 2.0],
            discarded=True,
            next_max_tokens=2048,
        ),
        {
            "content": [TOOL_USE],
            "stop_reason": "max_tokens",
            "usage": USAGE,
            "cost_usd": 0.01,
            "model": "m",
            "id": "msg_1",
            "latency": 0.5,
            "retry_waits": [1.0, 2.0],
            "discarded": True,
            "next_max_tokens": 2048,
        },
    ),
    (
        ev.ToolStarted("c1", "f", 2, "host:1:ab", ev.Allowed("policy", "rule 0 allows it")),
        {"call_id": "c1", "tool": "f", "attempt": 2, "owner": "host:1:ab", "allowed": ALLOWED},
    ),
    (
        ev.ToolStarted("c1", "f", 1, "host:1:ab", lease_until=99.5),  # as tether 0.1 wrote it
        {"call_id": "c1", "tool": "f", "attempt": 1, "owner": "host:1:ab", "lease_until": 99.5},
    ),
    (ev.ToolFinished("c1", "f", "ok", False), {"call_id": "c1", "tool": "f", "content": "ok", "is_error": False}),
    (
        ev.ToolFinished(
            "c1",
            "f",
            "Error: x",
            True,
            attempt=3,
            duration=0.5,
            error_type="OSError",
            error_class="retryable",
            in_doubt=True,
            interrupted=True,
            denied_by="policy",
            reason="no",
            budget_limit="max_cost_usd",
            cached=True,
            final_result={"a": 1},
            allowed=ev.Allowed(None, "no approval needed"),
            full_content="Error: xyz",
            truncated_from=10,
        ),
        {
            "call_id": "c1",
            "tool": "f",
            "content": "Error: x",
            "is_error": True,
            "attempt": 3,
            "duration": 0.5,
            "error_type": "OSError",
            "error_class": "retryable",
            "in_doubt": True,
            "interrupted": True,
            "denied_by": "policy",
            "reason": "no",
            "budget_limit": "max_cost_usd",
            "cached": True,
            "final_result": {"a": 1},
            "allowed": {"by": None, "reason": "no approval needed"},
            "full_content": "Error: xyz",
            "truncated_from": 10,
        },
    ),
    (
        ev.RetryScheduled("c1", "f", 1, 0.125, "TimeoutError", 12.5, "Error (retryable): boom", "retryable"),
        {
            "call_id": "c1",
            "tool": "f",
            "attempt": 1,
            "duration": 0.125,
            "error_type": "TimeoutError",
            "due_at": 12.5,
            "error": "Error (retryable): boom",
            "error_class": "retryable",
        },
    ),
    (
        ev.ApprovalRequested([ev.RequestedCall("c1", "f", {"x": 1}, "asked", "abc")]),
        {"calls": [{"call_id": "c1", "tool": "f", "input": {"x": 1}, "reason": "asked", "fingerprint": "abc"}]},
    ),
    (
        ev.ApprovalRequested([ev.RequestedCall("c1", "f", {"x": 1}, "again?", "abc", "boom")], True, 0.5),
        {
            "calls": [
                {
                    "call_id": "c1",
                    "tool": "f",
                    "input": {"x": 1},
                    "reason": "again?",
                    "fingerprint": "abc",
                    "last_error": "boom",
                }
            ],
            "escalation": True,
            "duration": 0.5,
        },
    ),
    (
        ev.ApprovalDecided("c1", "f", True, "ann", "", {"x": 2}, "abc", True),
        {
            "call_id": "c1",
            "tool": "f",
            "approved": True,
            "actor": "ann",
            "reason": "",
            "input": {"x": 2},
            "fingerprint": "abc",
            "remember_for_run": True,
        },
    ),
    (ev.ResultsReturned(), {}),
    (ev.Transition("start", None, "thinking"), {"event": "start", "source": None, "target": "thinking"}),
    (ev.Warned("careful"), {"message": "careful"}),
    (
        ev.Warned("rule says", call_id="c1", tool="f", rule=0, rule_name=None),
        {"message": "rule says", "call_id": "c1", "tool": "f", "rule": 0, "rule_name": None},
    ),
    (
        ev.Warned("stuck", call_id="c1", tool="f", abandoned_thread=True),
        {"message": "stuck", "call_id": "c1", "tool": "f", "abandoned_thread": True},
    ),
    (ev.Warned("near", limit="max_steps"), {"message": "near", "limit": "max_steps"}),
    (ev.Warned("spent", budget="max_cost_usd"), {"message": "spent", "budget": "max_cost_usd"}),
    (ev.Warned("retried", retry_waits=[1.5]), {"message": "retried", "retry_waits": [1.5]}),
    (
        ev.BudgetExhausted("max_cost_usd", 0.5, 0.4, "answer now"),
        {"limit": "max_cost_usd", "used": 0.5, "allowed": 0.4, "prompt": "answer now"},
    ),
    (
        ev.ResultDemanded("call final_result", 1, True),
        {"prompt": "call final_result", "attempt": 1, "forced": True},
    ),
    (
        ev.HistoryCompacted("keep_last_turns", [{"role": "user", "content": "go"}], 4),
        {"processor": "keep_last_turns", "messages": [{"role": "user", "content": "go"}], "removed": 4},
    ),
    (
        ev.HistoryCompacted(
            "summarise", [{"role": "user", "content": "go"}], 6, True, "sum", Usage(10, 2), 0.001, "m", 0.5
        ),
        {
            "processor": "summarise",
            "messages": [{"role": "user", "content": "go"}],
            "removed": 6,
            "forced": True,
            "summary": "sum",
            "usage": {
                "input_tokens": 10,
                "output_tokens": 2,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
            "cost_usd": 0.001,
            "model": "m",
            "latency": 0.5,
        },
    ),
    (ev.ContextExceeded("prompt is too long"), {"error": "prompt is too long"}),
    (
        ev.RunFinished("done", None, "hello", {"a": 1}, False),
        {"status": "done", "error": None, "output": "hello", "result": {"a": 1}, "retryable": False},
    ),
    (
        ev.CacheHit("c1", "f", "f:abc", ev.Allowed("approved_for_run", "ok")),
        {"call_id": "c1", "tool": "f", "key": "f:abc", "allowed": {"by": "approved_for_run", "reason": "ok"}},
    ),
    (ev.CacheMiss("c1", "f", "f:abc"), {"call_id": "c1", "tool": "f", "key": "f:abc"}),
    (
        ev.CallAbandoned("c1", "host:1:ab", "op", "forced"),
        {"call_id": "c1", "owner": "host:1:ab", "by": "op", "reason": "forced"},
    ),
    (
        ev.ChildStarted("c1", "review", "run_child", 1, 1),
        {"call_id": "c1", "tool": "review", "run_id": "run_child", "attempt": 1, "depth": 1},
    ),
    (
        ev.ChildParked("c1", "run_child", [{"call_id": "c2", "run_id": "run_child", "chain": ["run_1", "run_child"]}]),
        {
            "call_id": "c1",
            "run_id": "run_child",
            "pending": [{"call_id": "c2", "run_id": "run_child", "chain": ["run_1", "run_child"]}],
        },
    ),
    (ev.ChildResumed("c1", "run_child"), {"call_id": "c1", "run_id": "run_child"}),
    (ev.ChildWaiting("c1", "run_child", 1060.0), {"call_id": "c1", "run_id": "run_child", "due_at": 1060.0}),
    (
        ev.ChildEnded("c1", "run_child", "done", Usage(3, 2, 0, 0), 0.5, 2),
        {
            "call_id": "c1",
            "run_id": "run_child",
            "status": "done",
            "usage": Usage(3, 2, 0, 0).to_dict(),
            "cost_usd": 0.5,
            "tool_calls": 2,
        },
    ),
    (
        ev.HandedOff("triage", "billing", "c1", "transfer_to_billing"),
        {"from_agent": "triage", "to_agent": "billing", "call_id": "c1", "tool": "transfer_to_billing"},
    ),
    (
        ev.HandedOff(None, "triage", "c2", "transfer_to_triage", filtered=True),
        {"from_agent": None, "to_agent": "triage", "call_id": "c2", "tool": "transfer_to_triage", "filtered": True},
    ),
]


def test_every_kind_is_covered() -> None:
    assert {fact.kind for fact, _ in STORED} == ev.EVENT_TYPES


@pytest.mark.parametrize(("fact", "stored"), STORED, ids=[f"{i}-{f.kind}" for i, (f, _) in enumerate(STORED)])
def test_a_fact_is_stored_as_its_json_and_read_back(fact: ev.Fact, stored: dict[str, Any]) -> None:
    assert list(fact.to_json().items()) == list(stored.items())  # keys in the order tether writes them
    event = ev.decode("run_1", 7, fact.kind, json.loads(json.dumps(stored)), 2.5)
    assert event == Event(7, 2.5, fact)
    assert event.to_dict() == {"seq": 7, "type": fact.kind, "at": 2.5, **stored}


def round_trip(store: Store) -> None:
    log = [Event(seq, 1.0 + seq, fact) for seq, (fact, _) in enumerate(STORED)]
    store.create_run(RunRecord(id="run_1", status="done", version=1), log[:1])
    store.append(RunRecord(id="run_1", status="done", version=2), 1, log[1:])
    assert store.load_events("run_1") == log
    assert store.load_log("run_1").events == log


def test_every_kind_round_trips_through_the_sql_store(db_url: str) -> None:
    store = SQLStore(db_url)
    try:
        round_trip(store)
    finally:
        store.close()


def test_every_kind_round_trips_through_the_memory_store() -> None:
    round_trip(MemoryStore())


def test_a_legacy_database_shows_exactly_what_it_stored(tmp_path: Path) -> None:
    """Each event of the tether 0.1 fixture reads back as its stored JSON, key for key, in order.

    Only a transition's statuses read back spelt as everything else spells them (``executing_tool``).
    """
    copy = tmp_path / "legacy.db"
    shutil.copy(FIXTURES / "legacy_v2.db", copy)
    with sqlite3.connect(copy) as connection:
        rows = connection.execute("SELECT run_id, seq, type, data FROM tether_event ORDER BY run_id, seq").fetchall()
    store = SQLStore(f"sqlite:///{copy}")
    try:
        loaded = {run_id: store.load_events(run_id) for run_id in {row[0] for row in rows}}
    finally:
        store.close()
    assert {kind for _, _, kind, _ in rows} >= {"run_started", "model_responded", "tool_started", "run_finished"}
    for run_id, seq, kind, data in rows:
        event = loaded[run_id][seq]
        assert event.type == kind
        stored = json.loads(data)
        if kind == "transition":
            stored = {**stored, "source": stored["source"] and from_stored(stored["source"])}
            stored["target"] = from_stored(stored["target"])
        assert json.dumps(event.data) == json.dumps(stored), (run_id, seq)
