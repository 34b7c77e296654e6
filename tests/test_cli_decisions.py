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
    elsewhere = tether(tmp_path, "pending", "--tenant", "someone-else", "--json")
    assert json.loads(elsewhere.stdout) == {"pending": [], "total": 0}
    missing = tether(tmp_path, "pending", "--run", "run_nope")
    assert missing.returncode == 2
    assert "not found" in missing.stderr

    wrong = tether(tmp_path, "approve", run_id, pending["call_id"], "--fingerprint", "0123456789abcdef")
    assert wrong.returncode == 1
    assert "differ from those shown" in " ".join(wrong.stderr.split())
    right = tether(tmp_path, "approve", run_id, pending["call_id"], "--fingerprint", pending["fingerprint"])
    assert right.returncode == 0, right.stderr
    assert json.loads(tether(tmp_path, "pending", "--json").stdout) == {"pending": [], "total": 0}


def test_every_command_taking_a_run_takes_a_start_of_its_id_that_names_one_run(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    demo = ("demo", "--workspace", str(tmp_path / "ws"), "--json")
    first, second = (json.loads(tether(tmp_path, *demo).stdout)["run_id"] for _ in range(2))
    shared = next(n for n, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    one, other = first[: shared + 1], second[: shared + 1]  # the shortest starts naming each

    naming = [
        ["show", "{}"],
        ["audit", "--run", "{}"],
        ["pending", "--run", "{}"],
        ["diagram", "--run", "{}"],
        ["approve", "{}", "toolu_demo_run"],
        ["deny", "{}", "toolu_demo_run"],
        ["resume", "{}"],
        ["cancel", "{}"],
        ["fork", "{}", "--at", "0"],
        ["run", "again", "--continue", "{}"],
    ]
    for command in naming:
        ambiguous = tether(tmp_path, *(part.format("run_") for part in command))
        assert ambiguous.returncode == 2, ambiguous
        said = " ".join(ambiguous.stderr.split())
        assert f"error: 'run_' is the start of 2 runs' ids: {second}, {first}; give more of the id" in said
        unknown = tether(tmp_path, *(part.format("run_zz") for part in command))
        assert unknown.returncode == 2, unknown
        assert "run 'run_zz' not found" in unknown.stderr

    assert json.loads(tether(tmp_path, "show", one, "--json").stdout)["run_id"] == first
    [waiting] = json.loads(tether(tmp_path, "pending", "--run", one, "--json").stdout)["pending"]
    assert waiting["run_id"] == first
    entries = json.loads(tether(tmp_path, "audit", "--run", other, "--json").stdout)["entries"]
    assert {entry["run_id"] for entry in entries} == {second}
    assert tether(tmp_path, "diagram", "--run", one).returncode == 0
    approved = tether(tmp_path, "approve", one, "toolu_demo_run")
    assert approved.returncode == 0, approved
    assert f"in run {first} " in approved.stdout
    resumed = tether(tmp_path, "resume", one, "--json")
    assert json.loads(resumed.stdout)["status"] == "done", resumed
    assert tether(tmp_path, "deny", other, "toolu_demo_run").returncode == 0
    cancelled = tether(tmp_path, "cancel", other, "--json")
    assert json.loads(cancelled.stdout)["run_id"] == second, cancelled
    forked = json.loads(tether(tmp_path, "fork", one, "--at", "0", "--json").stdout)
    assert forked["forked_from"]["run_id"] == first
    continued = tether(tmp_path, "run", "again", "--continue", one, "--json")
    assert continued.returncode in (0, 3), continued
