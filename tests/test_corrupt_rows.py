"""A stored JSON value changed outside tether (or damaged): a clear error naming the row, never a traceback.

``tether resume`` and ``tether show`` of that run exit 2 with a message that names the run
(and the event); ``tether runs`` still lists every run, marks the bad one and says so on stderr.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa  # noqa: TID251 - the tests damage rows as an outside writer would

from support import Cli, tool_use
from tether.errors import CorruptData
from tether.facts.events import Event, Warned
from tether.stores import RunRecord
from tether.stores.sql import SQLStore


def damage(store: SQLStore, statement: str) -> None:
    with store.engine.begin() as connection:
        connection.execute(sa.text(statement))


@pytest.fixture
def store(db_url: str) -> Iterator[SQLStore]:
    """Two runs, ``run_bad`` (to damage) and ``run_good``, of two events each."""
    store = SQLStore(db_url)
    try:
        for run_id in ("run_bad", "run_good"):
            store.create_run(
                RunRecord(id=run_id, status="done", version=1, summary={"steps": 1}, created_at=1.0),
                [Event(n, 1.0, Warned(f"n{n}")) for n in (0, 1)],
            )
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("value", ["'{not json'", "'[1, 2]'", "'\"text\"'"], ids=["invalid", "list", "string"])
def test_a_damaged_run_row_is_named_and_the_others_still_list(store: SQLStore, db_url: str, value: str) -> None:
    if db_url.startswith("postgresql") and value == "'{not json'":
        pytest.skip("PostgreSQL's JSONB refuses invalid JSON: only the other damages can happen there")
    damage(store, f"UPDATE tether_run SET summary = {value} WHERE id = 'run_bad'")
    with pytest.raises(CorruptData, match=r"run 'run_bad'.*summary") as caught:
        store.load_run("run_bad")
    assert caught.value.run_id == "run_bad"
    listed = {record.id: record for record in store.list_runs()}
    assert set(listed) == {"run_bad", "run_good"}
    assert listed["run_good"].summary == {"steps": 1}
    assert listed["run_good"].unreadable is None
    assert listed["run_bad"].summary == {}
    assert "summary" in str(listed["run_bad"].unreadable)


@pytest.mark.parametrize("value", ["'{oops'", "'null'", "'[]'"], ids=["invalid", "null", "list"])
def test_a_damaged_event_is_named(store: SQLStore, db_url: str, value: str) -> None:
    if db_url.startswith("postgresql") and value == "'{oops'":
        pytest.skip("PostgreSQL's JSONB refuses invalid JSON")
    damage(store, f"UPDATE tether_event SET data = {value} WHERE run_id = 'run_bad' AND seq = 1")
    for load in (store.load_events, store.load_log):
        with pytest.raises(CorruptData, match=r"run 'run_bad'.*event 1"):
            load("run_bad")
    assert [e.fact for e in store.load_events("run_good")] == [Warned("n0"), Warned("n1")]


@pytest.mark.parametrize(
    ("kind", "data", "problem"),
    [
        ("tool_exploded", '{"call_id": "c1"}', "unknown type 'tool_exploded'"),
        ("tool_started", '{"call_id": "c1", "tool": "t"}', "not a valid tool_started event (attempt: Field required)"),
        ("transition", '{"event": "start", "source": null, "target": [1]}', "target: Input should be a valid string"),
        ("approval_requested", '{"calls": [{"tool": "t", "input": {}}]}', "calls.0.call_id: Field required"),
    ],
    ids=["unknown-type", "missing-field", "wrong-type", "nested"],
)
def test_an_event_that_is_no_fact_is_named(store: SQLStore, kind: str, data: str, problem: str) -> None:
    damage(store, f"UPDATE tether_event SET type = '{kind}', data = '{data}' WHERE run_id = 'run_bad' AND seq = 1")
    for load in (store.load_events, store.load_log):
        with pytest.raises(CorruptData, match=r"run 'run_bad'.*event 1") as caught:
            load("run_bad")
        assert problem in str(caught.value)
        assert caught.value.run_id == "run_bad"
    assert [e.fact for e in store.load_events("run_good")] == [Warned("n0"), Warned("n1")]


SCRIPT = [
    {"content": [tool_use("t1", "echo", {"text": "hi"})], "stop_reason": "tool_use"},
    {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
]
TOOLS = '''
from tether import tool


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text
'''


def test_the_cli_names_the_damaged_row_and_exits_2(tmp_path: Path) -> None:
    (tmp_path / "echoes.py").write_text(TOOLS, encoding="utf-8")
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")
    cli = Cli(tmp_path)
    runs = cli.parallel(
        *[("run", "hi", "--tools", "echoes:echo", "--model", "scripted:script.json", "--json", "--max-steps", "1")] * 2
    )
    summary_bad, events_bad = (run.data["run_id"] for run in runs)
    store = SQLStore(f"sqlite:///{tmp_path / 'tether.db'}")
    damage(store, f"UPDATE tether_run SET summary = '{{not json' WHERE id = '{summary_bad}'")
    damage(store, f"UPDATE tether_event SET data = '{{oops' WHERE run_id = '{events_bad}' AND seq = 2")
    store.close()

    listed, listed_json, *refused = cli.parallel(
        ("runs",),
        ("runs", "--json"),
        ("resume", summary_bad),
        ("resume", events_bad),
        ("show", events_bad, "--json"),
    )
    for result in (listed, listed_json):
        assert result.returncode == 0, result
        assert f"run {summary_bad}" in result.err, result
        assert "summary is not valid JSON" in result.err, result
    assert events_bad in listed.stdout  # its row is fine
    rows = {row["run_id"]: row for row in listed_json.data["runs"]}
    assert set(rows) == {summary_bad, events_bad}
    assert "summary is not valid JSON" in rows[summary_bad]["error"]
    for result, run_id, where in zip(
        refused, (summary_bad, events_bad, events_bad), ("summary", "event 2", "event 2"), strict=True
    ):
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr, result
        assert f"run '{run_id}'" in result.err, result
        assert where in result.err, result
