"""Real processes racing on the same run and on different runs, on SQLite and PostgreSQL.

One process drives a run at a time: it holds the run's lease, claimed before any model call
or tool start, so the others make no model call and give up (RunBusy; ``tether resume``
exits 5). Optimistic concurrency on the run's version backs it: exactly one writer wins each
step, a decision applies once, and the losers get StaleRun / ApprovalError instead of
corrupting the log. Each test gets an empty database per backend (the db_url fixture,
conftest.py: PostgreSQL in a fresh schema).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from concurrency_driver import agent
from support import PROCESS_WAIT, fake_api_env, finish_tether_forked, start_script, start_tether_forked
from tether import Runner
from tether.drivers.loader import agent_from_spec
from tether.stores.sql import SQLStore
from tether.testing import FakeMessagesAPI, ScriptedModel

pytestmark = pytest.mark.slow  # real processes racing

DRIVER = Path(__file__).with_name("concurrency_driver.py")
PROCESSES = 4


def race(mode: str, workdir: Path, db_url: str, run_ids: list[str]) -> list[str]:
    processes = [start_script(DRIVER, mode, str(workdir), db_url, run_id) for run_id in run_ids]
    while len(list(workdir.glob("ready-*"))) < len(processes):  # every one has loaded the run
        if not all(p.process.is_alive() for p in processes):
            (workdir / "go").touch()  # the others go on to their end, so their output can be shown
            raise AssertionError([p.finish() for p in processes])
        time.sleep(0.005)
    (workdir / "go").touch()
    outputs = []
    for process in processes:
        done = process.finish()
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    return outputs


def new_run(db_url: str, prompt: str) -> str:
    store = SQLStore(db_url)
    try:
        return Runner(agent(), store).create(prompt, run_id=f"run_{uuid.uuid4().hex[:16]}").id
    finally:
        store.close()


def events_of(db_url: str, run_id: str) -> list[str]:
    store = SQLStore(db_url)
    try:
        events = store.load_events(run_id)
    finally:
        store.close()
    assert [e.seq for e in events] == list(range(len(events)))
    return [e.type for e in events]


def test_many_processes_one_run_each_tool_runs_once(db_url: str, tmp_path: Path) -> None:
    run_id = new_run(db_url, "record three notes")
    outputs = race("drive", tmp_path, db_url, [run_id] * PROCESSES)
    # one takes the lease and drives the run to its end; the others find it busy, or, once it
    # is released, find the run changed since they loaded it (StaleRun): none calls the model
    assert outputs.count("done") == 1, outputs
    assert set(outputs) <= {"done", "busy", "stale"}, outputs
    calls = (tmp_path / "model_calls.log").read_text().split("\n")[:-1]
    assert sorted(int(call.split()[1]) for call in calls) == [0, 1, 2, 3], "a model call was made twice"
    assert len({call.split()[0] for call in calls}) == 1, "two processes called the model"
    effects = Counter((tmp_path / "effects.log").read_text().split())
    assert effects == Counter({"toolu_0": 1, "toolu_1": 1, "toolu_2": 1}), "a tool ran twice"
    # whoever lost a race left the run for the winner; one more drive finishes it if needed
    store = SQLStore(db_url)
    try:
        result = Runner(agent(), store).drive(run_id)
    finally:
        store.close()
    assert result.status == "done"
    assert events_of(db_url, run_id).count("run_finished") == 1


def test_processes_resuming_one_run_at_once_make_one_model_call(
    db_url: str, tmp_path: Path, api: FakeMessagesAPI
) -> None:
    """`tether resume` in N processes at once: one calls the model, the others exit 5 having made no call."""
    store = SQLStore(db_url)
    try:
        spec = {"model": "claude-test", "cwd": str(tmp_path)}
        run_id = Runner(agent_from_spec(spec, model=ScriptedModel([])), store).create("Say hello.").id
    finally:
        store.close()
    release = threading.Event()

    def held_answer(request: dict[str, Any]) -> dict[str, Any]:
        release.wait(PROCESS_WAIT)  # the first caller keeps the run until the others have given up
        return {"content": [{"type": "text", "text": "Hello."}]}

    for _ in range(PROCESSES):
        api.reply_with(held_answer)
    resumers = [
        start_tether_forked(tmp_path, "resume", run_id, "--json", "--db", db_url, env=fake_api_env(api))
        for _ in range(PROCESSES)
    ]
    deadline = time.monotonic() + PROCESS_WAIT  # on a busy machine each process may take seconds to start
    while sum(not r.process.is_alive() for r in resumers) < PROCESSES - 1 and len(api.requests) < 2:
        exits = [r.process.exitcode for r in resumers]
        assert time.monotonic() < deadline, f"{len(api.requests)} model calls, exits {exits}"
        time.sleep(0.01)
    release.set()
    results = [finish_tether_forked(resumer) for resumer in resumers]
    assert len(api.requests) == 1, f"{len(api.requests)} model calls"
    assert sorted(result.returncode for result in results) == [0] + [5] * (PROCESSES - 1), results
    for result in results:
        if result.returncode == 5:
            assert result.data["status"] == "thinking"  # --json: one object even so, saying who holds the run
            assert result.data["busy"]["lost"] is False
            assert f"another process is driving run {run_id!r}" in result.err
            assert f"tether resume {run_id} --force" in result.err
        else:
            assert result.data["output"] == "Hello."


CLAIM_ONCE = """
import os, sys, time
from pathlib import Path
from tether.stores.sql import SQLStore
url, go = sys.argv[1], Path(sys.argv[2])
store = SQLStore(url)
store.list_runs()  # the schema is ready: only the claim races
owner = f"racer:{os.getpid()}"
Path(f"{go}-ready-{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.002)
print("won" if store.claim_run("run_1", owner, now=time.time(), ttl=60).owner == owner else "lost")
store.close()
"""


def test_processes_claiming_one_lease_at_once_exactly_one_wins(db_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = tmp_path / "claim_once.py"
    script.write_text(CLAIM_ONCE)
    processes = [start_script(script, db_url, str(go)) for _ in range(PROCESSES)]
    while len(list(tmp_path.glob("go-ready-*"))) < PROCESSES:
        if not all(p.process.is_alive() for p in processes):
            go.touch()  # the others go on to their end, so their output can be shown
            raise AssertionError([p.finish() for p in processes])
        time.sleep(0.005)
    go.touch()
    outputs = []
    for process in processes:
        done = process.finish()
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    assert sorted(outputs) == ["lost"] * (PROCESSES - 1) + ["won"], outputs


def test_many_processes_many_runs_all_finish(db_url: str, tmp_path: Path) -> None:
    run_ids = [new_run(db_url, f"record notes #{n}") for n in range(PROCESSES)]
    outputs = race("drive", tmp_path, db_url, run_ids)
    assert outputs == ["done"] * PROCESSES
    assert len((tmp_path / "effects.log").read_text().split()) == 3 * PROCESSES


def test_concurrent_decisions_exactly_one_applies(db_url: str, tmp_path: Path) -> None:
    from tether.testing import ScriptedModel

    gated = {
        "content": [{"type": "tool_use", "id": "toolu_pub", "name": "publish", "input": {"text": "hi"}}],
        "stop_reason": "tool_use",
    }
    store = SQLStore(db_url)
    try:
        base = agent()
        runner = Runner(type(base)(model=ScriptedModel([gated]), tools=base.tools, model_name="claude-test"), store)
        parked = runner.run("publish hi")
    finally:
        store.close()
    assert parked.status == "awaiting_approval"
    outputs = race("approve", tmp_path, db_url, [parked.run_id] * PROCESSES)
    assert sorted(outputs).count("ok") == 1, outputs
    assert set(outputs) <= {"ok", "refused", "stale"}
    assert events_of(db_url, parked.run_id).count("approval_decided") == 1


APPEND_STEPS = """
import sys
from tether.facts.events import Event, Warned
from tether.stores import RunRecord
from tether.stores.sql import SQLStore
url, run_id, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = SQLStore(url)
for version in range(2, steps + 2):  # each step's one event says which version it made
    row = RunRecord(id=run_id, status="thinking", version=version, updated_at=float(version))
    store.append(row, version - 1, [Event(version - 1, 0.0, Warned(str(version)))])
store.close()
"""


def test_a_run_loaded_while_another_process_writes_it_is_consistent(db_url: str, tmp_path: Path) -> None:
    """Runner.load reads the version and the events at one instant: never a version behind them."""
    from tether.facts.events import Event, Warned
    from tether.stores import RunRecord

    store = SQLStore(db_url)
    try:
        store.create_run(RunRecord(id="run_busy", status="thinking", version=1), [Event(0, 0.0, Warned("1"))])
        script = tmp_path / "append_steps.py"
        script.write_text(APPEND_STEPS)
        writer = start_script(script, db_url, "run_busy", "300")
        loads = 0
        while writer.process.is_alive() or loads == 0:
            log = store.load_log("run_busy")
            assert log.events[-1].data["message"] == str(log.version)
            assert [e.seq for e in log.events] == list(range(log.version))
            loads += 1
        written = writer.finish()
        assert written.returncode == 0, written.stderr
        assert store.load_log("run_busy").version == 301
    finally:
        store.close()
