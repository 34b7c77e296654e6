"""Bad input on the command line is a clear error with exit code 2, never a traceback."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from support import Cli, clean_env, runs_made
from tether import Agent, Runner
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

DEEP = "[" * 30_000 + "]" * 30_000
"""JSON nested past the parser's recursion limit."""


def test_bad_input_to_any_command_is_a_usage_error_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "a-file").write_text("not a directory")
    db = ["--db", f"sqlite:///{tmp_path / 'runs.db'}"]
    SQLStore(db[1]).list_runs()  # commands but `run` use an existing database only (tested below)
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


def test_a_command_on_a_database_that_is_not_there_says_so_and_creates_nothing(tmp_path: Path) -> None:
    """A mistyped --db used to create an empty database, then say the run was not found."""
    cli = Cli(tmp_path)
    for command in (["show", "run_x"], ["runs"], ["approve", "run_x", "toolu_1"], ["pending"], ["ui"]):
        result = cli(*command, "--db", "sqlite:///typo.db")
        assert result.returncode == 2, result
        assert f"there is no database at '{tmp_path / 'typo.db'}'" in result.err
    assert cli("diagram").returncode == 0  # the graph alone reads no run
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_printed_commands_name_a_relative_database_by_its_absolute_path(tmp_path: Path) -> None:
    """So `tether pending`'s hint can be pasted anywhere: without --db it would open (and create) ./tether.db."""
    from tether import tool
    from tether.core.approvals import DecideLater

    @tool(approval=True)
    def delete(name: str) -> str:
        """Delete a file."""
        return name

    store = SQLStore(f"sqlite:///{tmp_path / 'rel.db'}")
    turn = {"content": [{"type": "tool_use", "id": "t1", "name": "delete", "input": {"name": "a"}}]}
    Runner(
        Agent(model=ScriptedModel([{**turn, "stop_reason": "tool_use"}]), tools=[delete]), store, approver=DecideLater()
    ).run("go")
    store.close()
    shown = " ".join(Cli(tmp_path)("pending", "--db", "sqlite:///rel.db").stdout.split())
    assert f"approve RUN CALL --db sqlite:///{tmp_path / 'rel.db'}" in shown
    assert f"resume RUN --db sqlite:///{tmp_path / 'rel.db'}" in shown


def test_a_model_without_its_key_is_refused_before_any_run_is_created(tmp_path: Path) -> None:
    """A missing key used to create a run and fail it at its first step; now one line, and nothing made."""
    (tmp_path / "script.json").write_text('[{"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}]')
    cli = Cli(tmp_path)
    cases = {
        ("run", "hi", "--model", "openai:gpt-test"): "openai:gpt-test: no OpenAI credentials: set OPENAI_API_KEY",
        ("run", "hi"): "no Anthropic credentials: set ANTHROPIC_API_KEY, or choose another model with --model",
        ("run", "hi", "--model", "anthropic:claude-test"): "model anthropic:claude-test: no Anthropic credentials",
    }
    for command, message in cases.items():
        result = cli(*command)
        assert result.returncode == 2, result
        assert message in result.err, result
        assert "no run was created" in result.err
        assert len(result.stderr.strip().splitlines()) == 1, result
    assert runs_made(cli) == []

    offline = cli("run", "hi", "--model", "scripted:script.json", "--json")  # a scripted model needs no key
    assert offline.returncode == 0, offline
    keyed = cli("run", "hi", "--model", "openai:gpt-test", "--detach")  # its worker calls the model, with its keys
    assert "no OpenAI credentials" not in keyed.err
