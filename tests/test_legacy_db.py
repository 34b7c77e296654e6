"""A database written by tether 0.1 (schema version 2, before the typed core) still loads,
folds into the same state, and its parked runs resume to their end with today's code.

tests/fixtures/legacy_v2.db was made by tests/fixtures/make_legacy_db.py at that version;
legacy_v2.expected.json holds what that code folded each run into.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, Approve, Runner
from tether.drivers.runner import result_of
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

import legacy_tools  # noqa: E402


def answer(text: str) -> dict[str, Any]:
    usage = {"input_tokens": 1, "output_tokens": 1}
    return {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": usage}


@pytest.fixture
def legacy_store(tmp_path: Path) -> Iterator[SQLStore]:
    """A copy of the legacy database (never the committed file itself), opened with today's code."""
    copy = tmp_path / "legacy.db"
    shutil.copy(FIXTURES / "legacy_v2.db", copy)
    store = SQLStore(f"sqlite:///{copy}")
    yield store
    store.close()


def runner(store: SQLStore, script: list[Any], *, clock: Any = time.time) -> Runner:
    agent = Agent(model=ScriptedModel(script), tools=legacy_tools.TOOLS, system="legacy fixture")
    return Runner(agent, store, clock=clock)


def test_every_legacy_run_folds_into_the_state_it_had(legacy_store: SQLStore) -> None:
    expected = json.loads((FIXTURES / "legacy_v2.expected.json").read_text())
    reader = runner(legacy_store, [])
    records = legacy_store.list_runs()
    assert {record.id for record in records} == set(expected)
    expected["legacy_cancelled"]["result"]["pending_approvals"] = []  # on purpose: a cancelled run waits for no one
    for record in records:
        state = reader.load(record.id, tenant=record.tenant)
        assert result_of(state).to_dict() == expected[record.id]["result"], record.id
        assert state.messages == expected[record.id]["messages"], record.id


def test_a_legacy_run_awaiting_approval_resumes_to_done(legacy_store: SQLStore) -> None:
    r = runner(legacy_store, [{}, answer("Deleted /b only.")])
    r.decide("legacy_awaiting", "toolu_a2", Approve(actor="carol"), tenant="acme")
    result = r.drive("legacy_awaiting", tenant="acme")
    assert result.status == "done"
    assert result.output == "Deleted /b only."
    results = {block["tool_use_id"]: block for block in r.load("legacy_awaiting", tenant="acme").messages[2]["content"]}
    assert results["toolu_a1"]["is_error"] is True
    assert "not that one" in results["toolu_a1"]["content"]
    assert results["toolu_a2"]["content"] == "deleted /b"


def test_a_legacy_run_waiting_for_a_retry_resumes_when_due(
    legacy_store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(legacy_tools, "FAILURES_LEFT", {})
    later = time.time() + 7200  # the retry was scheduled an hour after the legacy run
    r = runner(legacy_store, [{}, answer("flaky said ok k")], clock=lambda: later)
    result = r.drive("legacy_waiting", max_wait=0)
    assert result.status == "done"
    assert result.tool_calls == 2  # the failed legacy attempt and today's


def test_a_legacy_run_that_failed_transiently_is_retried(legacy_store: SQLStore) -> None:
    result = runner(legacy_store, [answer("recovered")]).drive("legacy_failed")
    assert result.status == "done"
    assert result.output == "recovered"


def test_legacy_finished_runs_stay_finished(legacy_store: SQLStore) -> None:
    r = runner(legacy_store, [])
    assert r.drive("legacy_done").status == "done"
    assert r.drive("legacy_cancelled").status == "cancelled"
