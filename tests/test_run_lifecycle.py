"""Nothing strands a run: ``tether cancel`` from any process, and signals that leave it resumable.

Commands run as ``python -m tether`` would (support.run_tether); those a signal or a cancel
must reach while they work are real processes. The tools module beside the runs
(:data:`support.EFFECT_TOOLS`) logs what its tools did in ``effects.log``, and ``wait_for``
holds a tool call open until a flag file appears, so a signal or a cancel can arrive while a
tool runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support import EFFECT_TOOLS, TETHER, Cli, CliResult, clean_env, finish_tether, model_reply, tool_use, tool_use_turn
from tether import Agent, ModelError, Runner
from tether.stores import open_store
from tether.testing import ScriptedModel

ANSWER = model_reply([{"type": "text", "text": "All done."}], "end_turn")
SCRIPTS = {
    "gated.json": [tool_use_turn(tool_use("toolu_delete", "delete", {"path": "a.txt"})), ANSWER],
    "waits.json": [tool_use_turn(tool_use("toolu_wait", "wait_for", {"flag": "go"})), ANSWER],
    "answer.json": [ANSWER],
}


@dataclass
class Project:
    """A directory with the tools module and model scripts; its database is ``runs.db`` in it."""

    root: Path

    @property
    def db(self) -> str:
        return f"sqlite:///{self.root / 'runs.db'}"

    def tether(self, *args: str, cwd: Path | None = None) -> CliResult:
        """``tether ARGS --db`` this project's database (run in ``cwd``, default the project)."""
        return Cli(self.root)(*args, "--db", self.db, cwd=cwd)

    def run(self, script: str, *options: str) -> CliResult:
        return self.tether("run", "go", "--tools", "mytools:TOOLS", "--model", f"scripted:{script}", *options)

    def start_run(self, script: str, *options: str) -> Any:
        """Start ``tether run`` in the background (see :func:`support.finish_tether`)."""
        args = ["run", "go", "--tools", "mytools:TOOLS", "--model", f"scripted:{script}", *options, "--db", self.db]
        return Cli(self.root).start(*args)

    def effects(self) -> list[str]:
        log = self.root / "effects.log"
        return log.read_text(encoding="utf-8").splitlines() if log.exists() else []

    def wait_for_effect(self, line: str) -> None:
        deadline = time.monotonic() + 30
        while line not in self.effects():
            assert time.monotonic() < deadline, f"never logged {line!r}: {self.effects()}"
            time.sleep(0.02)

    def show(self, run_id: str) -> dict[str, Any]:
        return self.tether("show", run_id, "--json").data

    def only_run(self) -> str:
        [row] = self.tether("runs", "--json").data["runs"]
        return str(row["run_id"])


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = tmp_path / "project"
    root.mkdir()
    (root / "mytools.py").write_text(EFFECT_TOOLS, encoding="utf-8")
    for name, script in SCRIPTS.items():
        (root / name).write_text(json.dumps(script), encoding="utf-8")
    return Project(root)


def run_finished(shown: dict[str, Any]) -> dict[str, Any]:
    [finished] = [e for e in shown["events"] if e["type"] == "run_finished"]
    return dict(finished)


# tether cancel -------------------------------------------------------------------------------
def test_cancel_a_parked_run_from_elsewhere_without_its_tools_or_model(project: Project, tmp_path: Path) -> None:
    parked = project.run("gated.json", "--json")
    assert parked.returncode == 3, parked
    run_id = parked.data["run_id"]
    (project.root / "mytools.py").unlink()
    (project.root / "gated.json").unlink()

    cancelled = project.tether("cancel", run_id, "--reason", "not needed after all", "--json", cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled
    assert cancelled.data["status"] == "cancelled"
    assert cancelled.data["error"] == "cancelled: not needed after all"
    assert cancelled.data["pending_approvals"] == []
    shown = project.show(run_id)
    assert shown["status"] == "cancelled"
    assert run_finished(shown)["status"] == "cancelled"
    assert project.tether("pending", "--json").data == {"pending": [], "total": 0}

    again = project.tether("cancel", run_id)
    assert again.returncode == 2, again
    assert f"run {run_id} has already ended (cancelled): nothing to cancel" in again.err
    assert project.effects() == []


def test_cancel_says_plainly_when_there_is_nothing_to_cancel(project: Project) -> None:
    done = project.run("answer.json", "--json")
    assert done.returncode == 0, done
    human, unknown = Cli(project.root).parallel(
        ["cancel", done.data["run_id"], "--db", project.db], ["cancel", "run_nope", "--db", project.db]
    )
    assert human.returncode == 2, human
    assert f"run {done.data['run_id']} has already ended (done): nothing to cancel" in human.err
    assert human.stdout == ""
    assert unknown.returncode == 2, unknown
    assert "not found" in unknown.err
    assert project.show(done.data["run_id"])["status"] == "done"


def test_cancel_human_output_names_the_run_and_how_it_stood(project: Project) -> None:
    parked = project.run("gated.json", "--json")
    cancelled = project.tether("cancel", parked.data["run_id"])
    assert cancelled.returncode == 0, cancelled
    assert f"cancelled run {parked.data['run_id']} (it was awaiting_approval)" in cancelled.stdout


def test_a_run_that_failed_transiently_can_be_cancelled(db_url: str, tmp_path: Path) -> None:
    """It has not ended (resuming it would try the model again), so cancel ends it for good."""
    overloaded = ModelError("overloaded", status=529, retryable=True)
    model = ScriptedModel([overloaded, ANSWER])
    store = open_store(db_url)
    try:
        failed = Runner(Agent(model=model), store).run("hi")
        assert (failed.status, store.load_run(failed.run_id).summary["retryable"]) == ("failed", True)

        cancelled = Cli(tmp_path)("cancel", failed.run_id, "--reason", "gave up", "--json", "--db", db_url)
        assert cancelled.returncode == 0, cancelled
        assert cancelled.data["status"] == "cancelled"
        assert cancelled.data["error"] == "cancelled: gave up"

        again = Runner(Agent(model=model), store).drive(failed.run_id)
        assert again.status == "cancelled"
        assert len(model.requests) == 1  # the model was not tried again
        record = store.load_run(failed.run_id)
        assert (record.status, record.summary["retryable"]) == ("cancelled", False)
    finally:
        store.close()


@pytest.mark.slow  # a process signalled or cancelled while it works
def test_cancel_while_another_process_runs_a_tool(project: Project) -> None:
    """The cancel wins at once; the driver finds the run cancelled when its tool returns and stops."""
    driver = project.start_run("waits.json", "--json")
    project.wait_for_effect("waiting for go")
    run_id = project.only_run()

    cancelled = project.tether("cancel", run_id, "--reason", "stop it")
    assert cancelled.returncode == 0, cancelled
    (project.root / "go").touch()
    stopped = finish_tether(driver)
    assert stopped.returncode == 1, stopped
    assert "another process" in stopped.err
    shown = project.show(run_id)
    assert shown["status"] == "cancelled"
    assert [e["type"] for e in shown["events"]].count("tool_finished") == 0  # nothing written after the cancel
    assert project.effects() == ["waiting for go", "wait_for go"]


# Signals -----------------------------------------------------------------------------------
@pytest.mark.slow  # a process signalled or cancelled while it works
@pytest.mark.parametrize(
    ("signum", "json_output"),
    [(signal.SIGINT, True), (signal.SIGTERM, True), (signal.SIGHUP, False)],
    ids=["SIGINT-json", "SIGTERM-json", "SIGHUP"],
)
def test_a_signal_while_a_tool_runs_leaves_the_run_resumable(
    project: Project, signum: signal.Signals, json_output: bool
) -> None:
    """Ctrl-C, SIGTERM and SIGHUP alike: exit 128 + the signal, the hint, and with ``--json`` the
    run's object as it stands; resuming then finishes the run."""
    driver = project.start_run("waits.json", *(["--json"] if json_output else []))
    project.wait_for_effect("waiting for go")
    run_id = project.only_run()
    driver.send_signal(signum)
    stopped = finish_tether(driver)

    assert stopped.returncode == 128 + signum, stopped
    assert f"interrupted; resume with:\n  {TETHER} resume {run_id} --db {project.db}\n" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    if json_output:
        assert stopped.data["run_id"] == run_id
        assert stopped.data["status"] == "executing_tool"
        assert stopped.data["tool_calls"] == 0
    assert project.effects() == ["waiting for go"]

    (project.root / "go").touch()
    resumed = project.tether("resume", run_id, "--approve-all", "--json")  # not idempotent: asked again
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert resumed.data["output"] == "All done."
    assert project.effects() == ["waiting for go", "waiting for go", "wait_for go"]


@pytest.mark.slow  # a process signalled or cancelled while it works
def test_a_run_started_under_nohup_keeps_ignoring_sighup(project: Project) -> None:
    """An ignored SIGHUP (``nohup tether run ...``) stays ignored: the run goes on to the end."""
    args = ["run", "go", "--tools", "mytools:TOOLS", "--model", "scripted:waits.json", "--json", "--db", project.db]
    driver = subprocess.Popen(
        ["nohup", sys.executable, "-m", "tether", *args],
        cwd=project.root,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    project.wait_for_effect("waiting for go")
    driver.send_signal(signal.SIGHUP)
    (project.root / "go").touch()
    done = finish_tether(driver)
    assert done.returncode == 0, done
    assert done.data["status"] == "done"
