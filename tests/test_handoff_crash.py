"""SIGKILL right after a handoff is committed: a new process resumes the run with the agent taken over."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from support import run_script
from tether.stores.sql import SQLStore
from tether.views import audit

pytestmark = pytest.mark.slow  # kills a real process

DRIVER = Path(__file__).with_name("handoff_crash_driver.py")


def test_a_driver_killed_right_after_the_handoff_resumes_with_billing(tmp_path: Path) -> None:
    db_url, run_id = f"sqlite:///{tmp_path / 'runs.db'}", "run_handoff_crash"
    first = run_script(DRIVER, str(tmp_path), db_url, run_id, "after:handed_off")
    assert first.returncode == -9, f"the driver should have been killed: {first.stdout} {first.stderr}"

    deadline = time.monotonic() + 30
    while (done := run_script(DRIVER, str(tmp_path), db_url, run_id)).returncode == 5:
        assert time.monotonic() < deadline, "the killed driver's lease never expired"
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)

    assert result["status"] == "done"
    assert result["output"] == "billing: refund on its way"
    assert result["model_calls"] == {"triage": 0, "billing": 1}  # the resumed process asked billing only
    assert (tmp_path / "effects.log").read_text().splitlines() == ["look up A-17"]
    store = SQLStore(db_url)
    try:
        assert [event.type for event in store.load_events(run_id)].count("handed_off") == 1
        found = audit.query(store, run_id=run_id)
    finally:
        store.close()
    assert [(entry.agent, entry.tool, entry.status) for entry in found] == [
        ("triage", "look_up_order", "ok"),
        ("triage", "transfer_to_billing", "ok"),
    ]
