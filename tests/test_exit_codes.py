"""One exit code per situation, as docs/reference/exit-codes.md lists them: each situation brought
about by the real ``tether`` command (in process, or in a shell where a pipe matters).

Alike situations share a code: a reader leaving early is 0 whatever the command; something named
that is not there is 2 whether a run, a call, a SQLite file or a PostgreSQL database.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from support import clean_env, run_tether, tool_use, tool_use_turn
from tether import Agent, Runner, tool
from tether.core.approvals import DecideLater
from tether.stores.sql import SQLStore
from tether.surfaces.exit_codes import SIGNAL_BASE, ExitCode
from tether.testing import ScriptedModel

pytestmark = pytest.mark.slow  # whole `tether` commands

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "exit-codes.md"
BIG = "x" * 200_000
"""More than a pipe holds, so a reader leaving early cuts the output while it is written."""


@tool
def echo(text: str) -> str:
    """Say the text back."""
    return text


@tool(approval=True)
def publish(text: str) -> str:
    """Publish the text (a person approves it)."""
    return "published"


def test_every_code_is_listed_in_the_docs_once() -> None:
    rows = re.findall(r"^\| (\d+(?: \+ N)?) \|", DOCS.read_text(encoding="utf-8"), re.MULTILINE)
    assert rows == [str(code.value) for code in ExitCode] + [f"{SIGNAL_BASE} + N"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, str]:
    """A database with a done run and a parked one, each saying more than a pipe holds.

    (directory, its URL, the done run, the parked run waiting on ``toolu_pub``)
    """
    where = tmp_path_factory.mktemp("codes")
    db = f"sqlite:///{where / 'runs.db'}"
    store = SQLStore(db)
    try:
        said = {"content": [{"type": "text", "text": BIG}], "stop_reason": "end_turn"}
        script = [tool_use_turn(tool_use("toolu_echo", "echo", {"text": BIG})), said]
        done = Runner(Agent(model=ScriptedModel(script), tools=[echo]), store).run("Echo.").run_id
        gated = ScriptedModel([tool_use_turn(tool_use("toolu_pub", "publish", {"text": BIG}))])
        parked = Runner(Agent(model=gated, tools=[publish]), store, approver=DecideLater()).run("Publish.").run_id
    finally:
        store.close()
    return where, db, done, parked


@pytest.mark.parametrize(
    "command",
    [["show", "DONE"], ["show", "DONE", "--events"], ["show", "DONE", "--json"], ["audit"], ["pending"], ["runs"]],
)
def test_a_reader_leaving_early_is_0_whatever_the_command(runs: tuple[Path, str, str, str], command: list[str]) -> None:
    where, db, done, _ = runs
    words = [done if word == "DONE" else word for word in command]
    tether = f"{shlex.quote(sys.executable)} -m tether {shlex.join(words)} --db {shlex.quote(db)}"
    shell = f"set -o pipefail; {tether} | head -c 100 > /dev/null"  # the status is tether's
    finished = subprocess.run(
        ["bash", "-c", shell], cwd=where, env=clean_env(), capture_output=True, text=True, check=False
    )
    assert finished.returncode == ExitCode.DONE, finished
    assert "Traceback" not in finished.stderr, finished.stderr
    assert "Exception ignored" not in finished.stderr, finished.stderr


def test_a_run_a_call_or_a_sqlite_file_not_there_are_all_2(runs: tuple[Path, str, str, str]) -> None:
    where, db, _, parked = runs
    for command in (
        ["show", "run_nope", "--db", db],
        ["approve", "run_nope", "toolu_pub", "--db", db],
        ["approve", parked, "toolu_nope", "--db", db],
        ["deny", parked, "toolu_nope", "--db", db],
        ["runs", "--db", "sqlite:///typo.db"],
    ):
        result = run_tether(where, *command)
        assert result.returncode == ExitCode.USAGE, result
        assert result.stderr.startswith("error: "), result  # one line saying what is not there
    assert not (where / "typo.db").exists()


@pytest.mark.postgres
def test_a_postgresql_database_not_there_is_2_as_a_sqlite_file_is(pg_url: str, tmp_path: Path) -> None:
    parts = urlsplit(pg_url)
    missing = urlunsplit(parts._replace(path=f"/tether_missing_{uuid.uuid4().hex[:12]}"))
    result = run_tether(tmp_path, "runs", "--db", missing)
    assert result.returncode == ExitCode.USAGE, result
    assert "there is no database" in result.err
    assert "createdb" in result.err


TOOLS = """
from tether import tool


@tool(approval=True)
def publish(text: str) -> str:
    \"\"\"Publish the text (a person approves it).\"\"\"
    return "published"


TOOLS = [publish]
"""


def test_done_awaiting_and_refused_each_have_their_code(tmp_path: Path) -> None:
    (tmp_path / "codetools.py").write_text(TOOLS, encoding="utf-8")
    said = {"content": [{"type": "text", "text": "Not published."}], "stop_reason": "end_turn"}
    script = [tool_use_turn(tool_use("toolu_pub", "publish", {"text": "hi"})), said]
    (tmp_path / "script.json").write_text(json.dumps(script), encoding="utf-8")
    db = ("--db", f"sqlite:///{tmp_path / 'runs.db'}")
    started = run_tether(
        tmp_path, "run", "Publish.", "--tools", "codetools:TOOLS", "--model", "scripted:script.json", *db
    )
    assert started.returncode == ExitCode.AWAITING, started  # nobody to ask: parked
    run_id = run_tether(tmp_path, "runs", "--json", *db).data["runs"][0]["run_id"]
    assert run_tether(tmp_path, "resume", run_id, *db).returncode == ExitCode.AWAITING
    assert run_tether(tmp_path, "deny", run_id, "toolu_pub", *db).returncode == ExitCode.DONE
    twice = run_tether(tmp_path, "deny", run_id, "toolu_pub", *db)
    assert twice.returncode == ExitCode.FAILED, twice  # refused: decided already
    assert twice.stderr.startswith("refused: "), twice
    assert run_tether(tmp_path, "resume", run_id, *db).returncode == ExitCode.DONE
    assert run_tether(tmp_path, "cancel", run_id, *db).returncode == ExitCode.USAGE  # it has ended
