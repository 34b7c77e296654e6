"""Bad input on the command line is a clear error with exit code 2, never a traceback."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from support import Cli, clean_env
from tether import Agent, Runner
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

DEEP = "[" * 30_000 + "]" * 30_000
"""JSON nested past the parser's recursion limit."""


def test_bad_input_to_any_command_is_a_usage_error_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "a-file").write_text("not a directory")
    db = ["--db", f"sqlite:///{tmp_path / 'runs.db'}"]
    cases = {
        ("run", "hi", "--model", "scripted:deep.json", *db): "cannot read scripted model file",
        ("run", "hi", "--model", "scripted:deep.json", "--max-steps", "0", *db): "--max-steps: '0' must be positive",
        ("run", "hi", "--model", "scripted:deep.json", "--max-cost", "inf", *db): "--max-cost: 'inf' must be positive",
        ("run", "hi", "--model", "scripted:deep.json", "--max-seconds", "nan", *db): "--max-seconds: 'nan' must be",
        ("demo", "--workspace", str(tmp_path / "a-file"), "--deny-all"): "cannot use the demo workspace",
        ("runs", "--db", "postgresql+psycopg://u:pw@host:port/db"): "invalid database URL",
        ("gc", "--older-than", "soon", *db): "--older-than 'soon': expected an age like 90s, 30min",
        ("audit", "--since", "1m", *db): "--since '1m' is ambiguous",
        ("runs", "--status", "running", *db): "invalid choice: 'running'",
        ("show", "run_\udcff", *db): "run_id: 'run_\\udcff' is not valid UTF-8 text",  # argv byte 0xff
    }
    results = Cli(tmp_path).parallel(*cases)
    for result, message in zip(results, cases.values(), strict=True):
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr, result
        assert message in result.err, result


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """``tether show --json RUN | head -c 10``: the pipe closes mid-output; no BrokenPipeError traceback."""
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    long_answer = {"content": [{"type": "text", "text": "x" * 200_000}], "stop_reason": "end_turn"}
    store = SQLStore(db)
    run_id = Runner(Agent(model=ScriptedModel([long_answer])), store).run("Say a lot.").run_id
    store.close()
    tether = f"{shlex.quote(sys.executable)} -m tether"
    shell = f"{tether} show {run_id} --json --db {shlex.quote(db)} | head -c 10"
    done = subprocess.run(["bash", "-c", shell], check=False, capture_output=True, text=True, env=clean_env())
    assert len(done.stdout) == 10
    assert "Traceback" not in done.stderr, done.stderr
