"""Bad input on the command line is a clear error with exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

from support import Cli

DEEP = "[" * 30_000 + "]" * 30_000
"""JSON nested past the parser's recursion limit."""


def test_bad_input_to_any_command_is_a_usage_error_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "a-file").write_text("not a directory")
    db = ["--db", f"sqlite:///{tmp_path / 'runs.db'}"]
    cases = {
        ("run", "hi", "--model", "scripted:deep.json", *db): "cannot read scripted model file",
        ("run", "hi", "--model", "scripted:deep.json", "--max-steps", "0", *db): "--max-steps: '0' must be positive",
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
