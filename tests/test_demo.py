"""End-to-end tests of ``tether demo``: offline scripted model, real tools, a real gate.

The JSON tests run with stdin not a terminal; the pseudo-terminal tests (pexpect) answer
the approval prompt the way a person would: approve, deny with a reason, edit, or Ctrl-D.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from support import (
    DEMO_PROMPT,
    FIBONACCI,
    Cli,
    Scenario,
    clean_env,
    demo_db_url,
    finish_terminal,
    flat,
    run_tether,
    spawn_tether,
)

pytestmark = pytest.mark.slow  # `tether demo` processes

TIMEOUT = 20


# The first command of each JSON scenario, each in its own directory --------------------
FIRST = {
    "approve_all": ["demo", "--approve-all", "--json"],
    "deny_all": ["demo", "--deny-all", "--json"],
    "parked": ["demo", "--json"],
    "custom_workspace": ["demo", "--workspace", "ws", "--json"],
}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Scenario]:
    root = tmp_path_factory.mktemp("demo")
    started = {}
    for name, command in FIRST.items():
        (root / name).mkdir()
        started[name] = Scenario(Cli(root / name), command)
    return started


def test_demo_approve_all(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["approve_all"]
    done = scenario.first
    assert done.returncode == 0, done
    data = done.data
    assert data["status"] == "done"
    assert FIBONACCI in data["output"]
    assert data["steps"] == 3
    assert data["tool_calls"] == 2
    assert data["pending_approvals"] == []
    workspace = scenario.cwd / "tether-demo"
    assert (workspace / "fib.py").is_file()
    assert (workspace / "tether.db").is_file()
    assert not (scenario.cwd / "tether.db").exists()


def test_demo_deny_all_never_runs_the_program(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["deny_all"]
    done = scenario.first
    assert done.returncode == 0, done
    data = done.data
    assert data["status"] == "done"
    assert "did not" in data["output"]
    assert "denied" in data["output"]
    assert FIBONACCI not in data["output"]
    assert (scenario.cwd / "tether-demo" / "fib.py").is_file()  # written...
    assert data["tool_calls"] == 1  # ...but run_python never executed


def test_demo_parks_then_approve_and_resume_from_elsewhere(scenarios: dict[str, Scenario], tmp_path: Path) -> None:
    scenario = scenarios["parked"]
    parked = scenario.first
    assert parked.returncode == 3, parked
    data = parked.data
    assert data["status"] == "awaiting_approval"
    [pending] = data["pending_approvals"]
    assert pending["tool"] == "run_python"
    assert pending["input"] == {"path": "fib.py"}
    workspace = scenario.cwd / "tether-demo"
    assert (workspace / "fib.py").is_file()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"TETHER_DEMO_WORKSPACE": str(workspace)}
    approved = run_tether(
        elsewhere, "approve", data["run_id"], pending["call_id"], "--db", demo_db_url(workspace), env=env
    )
    assert approved.returncode == 0, approved
    resumed = run_tether(elsewhere, "resume", data["run_id"], "--db", demo_db_url(workspace), "--json", env=env)
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert FIBONACCI in resumed.data["output"]
    assert resumed.data["tool_calls"] == 2


def test_demo_resume_uses_the_runs_own_workspace(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["custom_workspace"]
    parked = scenario.first
    assert parked.returncode == 3, parked
    workspace = scenario.cwd / "ws"
    assert (workspace / "fib.py").is_file()
    resumed = run_tether(
        scenario.cwd, "resume", parked.data["run_id"], "--approve-all", "--json", "--db", demo_db_url(workspace)
    )
    assert resumed.returncode == 0, resumed
    assert FIBONACCI in resumed.data["output"], resumed


def test_the_demo_workspace_is_ignored_by_git() -> None:
    """``scripts/demo`` run from a checkout leaves ./tether-demo/ there: git must not offer to commit it."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("tether-demo/tether.db", "tether-demo/fib.py", "examples/tether-demo/tether.db"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=root, check=False)
        assert ignored.returncode == 0, f"{path} is not ignored by git"


# The hints, as a newcomer copies them -------------------------------------------------
VENV_BIN = Path(sys.executable).parent
PATH_WITHOUT_VENV = os.pathsep.join(
    folder for folder in os.environ.get("PATH", "").split(os.pathsep) if Path(folder).resolve() != VENV_BIN.resolve()
)
"""A newcomer's PATH after ``scripts/demo``: the venv is not activated."""


@pytest.mark.parametrize(
    ("started_as", "path"),
    [
        ([str(VENV_BIN / "tether")], PATH_WITHOUT_VENV),  # as scripts/demo starts it
        ([sys.executable, "-m", "tether"], PATH_WITHOUT_VENV),
        (["tether"], os.pathsep.join([str(VENV_BIN), PATH_WITHOUT_VENV])),  # an activated venv
    ],
    ids=["venv-script", "python-m", "on-path"],
)
def test_the_hints_the_demo_prints_work_when_copied_into_a_shell(
    tmp_path: Path, started_as: list[str], path: str
) -> None:
    env = clean_env(PATH=path)
    parked = subprocess.run(
        [*started_as, "demo"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert parked.returncode == 3, parked
    hint = re.search(r"^Decide with:\n  (.+)\n  (.+)\nthen go on with:\n  (.+)$", parked.stdout, re.MULTILINE)
    assert hint is not None, parked.stdout
    approve, _, resume = hint.groups()
    assert approve.startswith("/")  # absolute: it works pasted in any directory

    def shell(command: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "command not found" not in done.stderr
        return done

    approved = shell(approve)
    assert approved.returncode == 0, approved
    assert "continue with:" in approved.stdout
    resumed = shell(resume)
    assert resumed.returncode == 0, resumed
    assert "status: done" in flat(resumed.stdout)


# A real terminal -----------------------------------------------------------------------
@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[pexpect.spawn]:
    child = spawn_tether(tmp_path, "demo", timeout=TIMEOUT)
    try:
        yield child
    finally:
        child.close(force=True)


def ask(child: pexpect.spawn, answer: str, expect: str = DEMO_PROMPT) -> None:
    child.expect(expect)
    child.sendline(answer)


def test_terminal_approve(terminal: pexpect.spawn) -> None:
    ask(terminal, "a")
    status, output = finish_terminal(terminal)
    assert status == 0, output
    assert "status: done" in output
    assert f"printed: {FIBONACCI}" in output


def test_terminal_deny_with_a_reason(terminal: pexpect.spawn, tmp_path: Path) -> None:
    ask(terminal, "d")
    ask(terminal, "not today", expect=r"reason[^\n]*> ")
    status, output = finish_terminal(terminal)
    assert status == 0, output
    assert "status: done" in output
    assert "not today" in output
    assert FIBONACCI not in output
    assert (tmp_path / "tether-demo" / "fib.py").is_file()


def test_terminal_edit_reasks_until_the_json_is_valid(terminal: pexpect.spawn) -> None:
    ask(terminal, "e")
    ask(terminal, "{not json", expect=r"JSON[^\n]*> ")
    terminal.expect("Not valid")
    ask(terminal, '{"path": "fib.py"}', expect=r"JSON[^\n]*> ")
    status, output = finish_terminal(terminal)
    assert status == 0, output
    assert "status: done" in output
    assert FIBONACCI in output


def test_terminal_eof_parks_the_run(terminal: pexpect.spawn, tmp_path: Path) -> None:
    terminal.expect(DEMO_PROMPT)
    terminal.sendeof()
    status, output = finish_terminal(terminal)
    assert status == 3, output
    assert "awaiting_approval" in output

    url = demo_db_url(tmp_path / "tether-demo")
    runs = run_tether(tmp_path, "runs", "--json", "--db", url)
    assert runs.returncode == 0, runs
    [row] = runs.data["runs"]
    assert row["status"] == "awaiting_approval"
    shown = run_tether(tmp_path, "show", row["run_id"], "--json", "--db", url)
    assert shown.returncode == 0, shown
    assert shown.data["status"] == "awaiting_approval"
    assert [p["tool"] for p in shown.data["pending_approvals"]] == ["run_python"]
    assert not [e for e in shown.data["events"] if e["type"] == "approval_decided"]


def test_json_on_a_terminal_asks_on_stderr_and_prints_only_the_object_on_stdout(tmp_path: Path) -> None:
    """stdin a terminal: the person is asked (``--json`` does not silence the gate), on stderr."""
    master, slave = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "tether", "demo", "--json"],
        cwd=tmp_path,
        env=clean_env(TERM="xterm"),
        stdin=slave,
        stderr=slave,
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    shown = ""
    try:
        while "approve" not in shown or not shown.rstrip().endswith(">"):
            chunk = os.read(master, 4096).decode("utf-8", "replace")
            assert chunk, f"the terminal closed before the prompt: {shown!r}"
            shown += chunk
        os.write(master, b"a\n")
        stdout, _ = child.communicate(timeout=TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
        os.close(master)
    assert "run_python" in shown  # the approval panel went to the terminal, via stderr
    result = json.loads(stdout)  # stdout holds exactly one JSON object
    assert (child.returncode, result["status"]) == (0, "done")
    assert FIBONACCI in str(result["output"])
