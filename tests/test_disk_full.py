"""A write that finds the disk full: a clear StoreError, the run left at its last committed step."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa  # noqa: TID251 - the test limits the database file like a full disk would

from tether import Agent, Approve, Runner, tool
from tether.core.approvals import DecideLater
from tether.errors import StoreError
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel


@tool
def dump() -> str:
    """Return a large result."""
    return "x" * 400_000


SCRIPT = [
    {"content": [{"type": "tool_use", "id": "t1", "name": "dump", "input": {}}], "stop_reason": "tool_use"},
    {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
]


def test_a_full_disk_fails_the_write_cleanly_and_the_run_resumes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    full = SQLStore(url)
    runner = Runner(Agent(model=ScriptedModel(SCRIPT), tools=[dump], limits=_no_truncation()), full)
    state = runner.create("dump it")
    with runner.hold(state.id):
        runner.step(state)  # the model asks for the tool: committed

    def cap(connection: Any, _record: Any) -> None:
        connection.execute("PRAGMA max_page_count = 40")  # about 160 KB: like a full disk

    full.engine.dispose()
    sa.event.listen(full.engine, "connect", cap)
    with pytest.raises(StoreError, match="full"):
        runner.drive(state.id)
    full.close()

    roomy = SQLStore(url)
    try:
        agent = Agent(model=ScriptedModel(SCRIPT), tools=[dump], limits=_no_truncation())
        again = Runner(agent, roomy, approver=DecideLater())  # a person decides later
        committed = roomy.load_events(state.id)
        assert committed[-1].type == "tool_started"  # the failed write left nothing half-written
        result = again.drive(state.id)
    finally:
        roomy.close()
    # the tool ran but its result could not be stored: it is in doubt, so a person decides
    assert result.status == "awaiting_approval"
    assert "interrupted" in result.pending_approvals[0]["reason"]


@tool(approval=True)
def deploy() -> str:
    """Deploy (a person approves it first)."""
    return "deployed"


GATED = [
    {"content": [{"type": "tool_use", "id": "t1", "name": "deploy", "input": {}}], "stop_reason": "tool_use"},
    {"content": [{"type": "text", "text": "deployed"}], "stop_reason": "end_turn"},
]

FULL_ON_RELEASE = """
CREATE TRIGGER disk_full BEFORE DELETE ON tether_run_lease
BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END
"""
"""Deleting a lease fails as on a full disk (SQLite cannot write the page that drops the row)."""


def test_a_lease_a_full_disk_kept_holds_up_no_later_drive(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The drive ends as usual; the next one (here, in this process) takes the lease over at once.

    In another process on this host the same holds once this one has ended (see test_leases).
    """
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SQLStore(url)
    try:
        runner = Runner(Agent(model=ScriptedModel(GATED), tools=[deploy]), store, approver=DecideLater())
        state = runner.create("deploy it")
        with store.engine.begin() as connection:
            connection.exec_driver_sql(FULL_ON_RELEASE)
        parked = runner.drive(state.id)  # its lease cannot be deleted: no crash, the lease stays
        assert parked.status == "awaiting_approval"
        with store.engine.begin() as connection:
            connection.exec_driver_sql("DROP TRIGGER disk_full")  # room again
        runner.decide(state.id, "t1", Approve(actor="ops"))
        with caplog.at_level(logging.WARNING, logger="tether.stores.leases"):
            done = runner.drive(state.id)  # not RunBusy for the next 30 s
    finally:
        store.close()
    assert done.status == "done"
    [said] = [r.getMessage() for r in caplog.records if r.name == "tether.stores.leases"]
    assert f"pid {os.getpid()} on this host) has ended; taken over now" in said


def _no_truncation() -> Any:
    from tether import Limits

    return Limits(max_result_chars=None)
