"""`tether pending --run/--tenant` and decisions bound to the fingerprint of what was shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import CliResult, run_tether

pytestmark = pytest.mark.slow  # whole `tether` commands (in-process: support.run_tether)


def tether(cwd: Path, *args: str) -> CliResult:
    """``tether ARGS`` on the demo database in cwd/ws."""
    return run_tether(cwd, *args, "--db", f"sqlite:///{cwd / 'ws' / 'tether.db'}")


def test_pending_filters_and_fingerprint_bound_decisions(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    parked = tether(tmp_path, "demo", "--workspace", str(tmp_path / "ws"), "--json")
    assert parked.returncode == 3, parked.stderr
    run_id = json.loads(parked.stdout)["run_id"]

    [pending] = json.loads(tether(tmp_path, "pending", "--run", run_id, "--json").stdout)["pending"]
    assert json.loads(tether(tmp_path, "pending", "--tenant", "someone-else", "--json").stdout) == {"pending": []}
    missing = tether(tmp_path, "pending", "--run", "run_nope")
    assert missing.returncode == 2
    assert "not found" in missing.stderr

    wrong = tether(tmp_path, "approve", run_id, pending["call_id"], "--fingerprint", "0123456789abcdef")
    assert wrong.returncode == 1
    assert "differ from those shown" in " ".join(wrong.stderr.split())
    right = tether(tmp_path, "approve", run_id, pending["call_id"], "--fingerprint", pending["fingerprint"])
    assert right.returncode == 0, right.stderr
    assert json.loads(tether(tmp_path, "pending", "--json").stdout) == {"pending": []}
