"""Scale-out on procrastinate: a submitted run is queued by the very transaction that frees it.

In-process checks of what lands in procrastinate's table (the queue's truth) for each kind of
write; the proof with worker processes, a SIGKILL and approvals from outside is
``test_scaleout_proof.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from support import LaggyProxy, PgSchema, clean_env, libpq_dsn, model_reply, tool_use, tool_use_turn
from tether import Agent, AsyncRunner, Runner, tool
from tether.core.approvals import Approve, DecideLater, Deny
from tether.drivers import queue
from tether.drivers import worker as workers
from tether.errors import ConfigError
from tether.policy.policies import RetryPolicy
from tether.stores.sql import AsyncSQLStore, SQLStore
from tether.surfaces.cli import main
from tether.testing import ScriptedModel

pytestmark = pytest.mark.postgres

DONE = model_reply([{"type": "text", "text": "done"}], "end_turn")


@tool(approval=True)
def wipe(path: str) -> str:
    """Delete a path (pretend)."""
    return f"wiped {path}"


class Flaky(Exception):
    """A tool failure worth a retry."""


@tool(retry=RetryPolicy(max_attempts=3, initial_delay=60, retry_on=(Flaky,)))
def fetch(url: str) -> str:
    """Fetch a URL (fails: its retry is due in a minute)."""
    raise Flaky(url)


def agent(*replies: dict[str, Any]) -> Agent:
    return Agent(model=ScriptedModel([*replies, DONE]), tools=[wipe, fetch])


def jobs(url: str) -> list[dict[str, Any]]:
    """procrastinate's rows, oldest first (what a worker would fetch)."""
    with psycopg.connect(libpq_dsn(url), row_factory=dict_row) as connection:
        return connection.execute(
            "SELECT queueing_lock, lock, status::text AS status, queue_name, scheduled_at, task_name "
            "FROM procrastinate_jobs ORDER BY id"
        ).fetchall()


@pytest.fixture
def store(pg_schema: PgSchema) -> Iterator[SQLStore]:
    store = SQLStore(pg_schema.url)
    yield store
    store.close()


def test_submit_creates_the_run_and_its_job_together(store: SQLStore) -> None:
    runner = Runner(agent(), store)
    run_id = runner.submit("go", queue="fast")
    assert store.load_run(run_id).spec["dispatch"] == {"queue": "fast"}
    [job] = jobs(store.url)
    assert job["queueing_lock"] == job["lock"] == run_id
    assert (job["status"], job["queue_name"], job["task_name"], job["scheduled_at"]) == (
        "todo",
        "fast",
        queue.DRIVE_TASK,
        None,
    )


def test_a_run_that_cannot_be_created_queues_nothing(store: SQLStore) -> None:
    runner = Runner(agent(), store)
    runner.submit("go", run_id="run_taken")
    with pytest.raises(Exception, match="already exists"):
        runner.submit("again", run_id="run_taken")
    assert [job["queueing_lock"] for job in jobs(store.url)] == ["run_taken"]


def test_a_run_driven_here_is_never_queued(store: SQLStore) -> None:
    queue.ensure_schema(store.url)
    result = Runner(agent(), store).run("go")
    assert result.status == "done"
    assert jobs(store.url) == []


def test_a_decision_that_frees_a_submitted_run_queues_it_in_its_transaction(store: SQLStore) -> None:
    gated = tool_use_turn(tool_use("call_1", "wipe", {"path": "/tmp/x"}))
    runner = Runner(agent(gated), store, approver=DecideLater())
    run_id = runner.submit("go")
    _finish_first_job(store.url)
    assert runner.drive(run_id, max_wait=0).status == "awaiting_approval"
    assert _waiting(store.url) == []  # parked for a person: nothing to do until they decide
    runner.decide(run_id, "call_1", Approve(actor="ops"))
    assert _waiting(store.url) == [run_id]


def test_a_decision_leaving_calls_undecided_queues_nothing(store: SQLStore) -> None:
    two = tool_use_turn(tool_use("call_1", "wipe", {"path": "a"}), tool_use("call_2", "wipe", {"path": "b"}))
    runner = Runner(agent(two), store, approver=DecideLater())
    run_id = runner.submit("go")
    _finish_first_job(store.url)
    runner.drive(run_id, max_wait=0)
    runner.decide(run_id, "call_1", Deny("no", actor="ops"))
    assert _waiting(store.url) == []
    runner.decide(run_id, "call_2", Approve(actor="ops"))
    assert _waiting(store.url) == [run_id]


def test_a_retry_due_later_is_a_job_scheduled_at_its_due_time(store: SQLStore) -> None:
    runner = Runner(agent(tool_use_turn(tool_use("call_1", "fetch", {"url": "u"}))), store)
    run_id = runner.submit("go")
    _finish_first_job(store.url)
    result = runner.drive(run_id, max_wait=0)
    assert result.status == "waiting_retry"
    [job] = [job for job in jobs(store.url) if job["status"] == "todo"]
    assert job["queueing_lock"] == run_id
    assert job["scheduled_at"].timestamp() == pytest.approx(result.next_due_at, abs=0.01)


def test_cancel_removes_the_runs_queued_work(store: SQLStore) -> None:
    runner = Runner(agent(), store)
    run_id, other = runner.submit("go"), runner.submit("go too")
    runner.cancel(run_id, "changed my mind")
    assert _waiting(store.url) == [other]


def test_a_run_is_never_queued_twice(store: SQLStore) -> None:
    gated = tool_use_turn(tool_use("call_1", "wipe", {"path": "/tmp/x"}))
    runner = Runner(agent(gated), store, approver=DecideLater())
    run_id = runner.submit("go")
    _finish_first_job(store.url)
    runner.drive(run_id, max_wait=0)
    _defer_by_hand(store.url, run_id)  # say a resume was queued already
    runner.decide(run_id, "call_1", Approve(actor="ops"))  # its own job is then not added: the decision holds
    assert _waiting(store.url) == [run_id]


async def test_the_async_store_queues_in_its_transaction_too(pg_schema: PgSchema) -> None:
    store = AsyncSQLStore(pg_schema.url)
    try:
        gated = tool_use_turn(tool_use("call_1", "wipe", {"path": "/tmp/x"}))
        runner = AsyncRunner(agent(gated), store, approver=DecideLater())
        run_id = await runner.submit("go")
        assert await asyncio.to_thread(_waiting, pg_schema.url) == [run_id]
        await asyncio.to_thread(_finish_first_job, pg_schema.url)
        assert (await runner.drive(run_id, max_wait=0)).status == "awaiting_approval"
        assert await asyncio.to_thread(_waiting, pg_schema.url) == []  # the drive's own steps queue nothing
        await runner.decide(run_id, "call_1", Approve(actor="ops"))
        assert await asyncio.to_thread(_waiting, pg_schema.url) == [run_id]
        await runner.cancel(run_id)
        assert await asyncio.to_thread(_waiting, pg_schema.url) == []
    finally:
        await store.close()


async def test_a_drive_on_the_async_store_parks_for_a_retry_with_a_job_at_its_due_time(pg_schema: PgSchema) -> None:
    store = AsyncSQLStore(pg_schema.url)
    try:
        runner = AsyncRunner(agent(tool_use_turn(tool_use("call_1", "fetch", {"url": "u"}))), store)
        run_id = await runner.submit("go")
        await asyncio.to_thread(_finish_first_job, pg_schema.url)
        result = await runner.drive(run_id, max_wait=0)
        [job] = [job for job in await asyncio.to_thread(jobs, pg_schema.url) if job["status"] == "todo"]
        assert job["scheduled_at"].timestamp() == pytest.approx(result.next_due_at, abs=0.01)
    finally:
        await store.close()


def test_submit_needs_postgresql(tmp_path: Any) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    with pytest.raises(ConfigError, match="need PostgreSQL and a `tether worker`"):
        Runner(agent(), store).submit("go")
    assert store.list_runs() == []


def _waiting(url: str) -> list[str]:
    """The runs with a drive job waiting (a worker's periodic recovery job is not one)."""
    todo = [job for job in jobs(url) if job["status"] == "todo" and job["task_name"] == queue.DRIVE_TASK]
    return [job["queueing_lock"] for job in todo]


def _finish_first_job(url: str) -> None:
    """What a worker does with the submit's job before it drives (here the test drives in-process)."""
    with psycopg.connect(libpq_dsn(url)) as connection:
        connection.execute("UPDATE procrastinate_jobs SET status = 'succeeded' WHERE status = 'todo'")


def _defer_by_hand(url: str, run_id: str) -> None:
    with psycopg.connect(libpq_dsn(url)) as connection:
        connection.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, queueing_lock, args) "
            "VALUES ('tether', %s, %s, %s, %s)",
            (queue.DRIVE_TASK, run_id, run_id, psycopg.types.json.Jsonb({"run_id": run_id})),
        )


async def test_a_stopped_worker_finishes_the_step_and_leaves_the_run_queued(pg_schema: PgSchema) -> None:
    worker: workers.Worker | None = None

    @tool
    async def pause(reason: str) -> str:
        """Ask the worker to stop (as SIGTERM does) while this step runs."""
        assert worker is not None
        worker.stop()
        return "paused"

    turn = tool_use_turn(tool_use("call_1", "pause", {"reason": "deploy"}))
    the_agent = Agent(model=ScriptedModel([turn, DONE]), tools=[pause])
    notes: list[workers.WorkerNote] = []
    worker = workers.Worker(pg_schema.url, agent=the_agent, stalled_after=3, on_note=notes.append)
    store = AsyncSQLStore(pg_schema.url)
    try:
        run_id = await AsyncRunner(the_agent, store).submit("go")
        await asyncio.wait_for(worker.run(), timeout=30)
        assert [(n.run_id, n.what) for n in notes] == [(run_id, "picked_up"), (run_id, "requeued")]
        log = await store.load_events(run_id)
        assert [e.type for e in log if e.type in {"tool_started", "tool_finished"}] == ["tool_started", "tool_finished"]
        assert sum(e.type == "model_responded" for e in log) == 1  # the step stood; no further one ran
        assert (await store.load_run(run_id)).status == "thinking"
        assert await asyncio.to_thread(_waiting, pg_schema.url) == [run_id]  # queued for the next worker
    finally:
        await store.close()


async def test_a_worker_notes_each_run_it_picks_up_and_where_its_drive_left_it(pg_schema: PgSchema) -> None:
    import io

    from rich.console import Console  # noqa: TID251 - the worker's lines are read off a console writing to a buffer

    from tether.surfaces.terminal import render_worker_note

    def reply(request: Any) -> dict[str, Any]:
        prompt = json.dumps(request.messages[0]["content"])
        if request.invocation == 0 and "wipe" in prompt:
            return tool_use_turn(tool_use("call_1", "wipe", {"path": "/tmp/x"}))
        if request.invocation == 0 and "fetch" in prompt:
            return tool_use_turn(tool_use("call_2", "fetch", {"url": "https://x"}))
        return DONE

    the_agent = Agent(model=ScriptedModel(reply), tools=[wipe, fetch])
    notes: list[workers.WorkerNote] = []

    def seen(note: workers.WorkerNote) -> None:
        notes.append(note)
        if sum(n.what != "picked_up" for n in notes) == 3:
            worker.stop()

    worker = workers.Worker(pg_schema.url, agent=the_agent, stalled_after=3, on_note=seen)
    store = AsyncSQLStore(pg_schema.url)
    try:
        runs = {await AsyncRunner(the_agent, store).submit(prompt): prompt for prompt in ("go", "wipe", "fetch")}
        await asyncio.wait_for(worker.run(), timeout=30)
    finally:
        await store.close()

    assert sorted(n.run_id for n in notes if n.what == "picked_up") == sorted(runs)
    ended = {runs[n.run_id]: n for n in notes if n.what != "picked_up"}
    assert ended["go"].what == "done"
    assert (ended["wipe"].what, ended["wipe"].detail) == ("awaiting_approval", "wipe call_1")
    assert ended["fetch"].what == "waiting_retry"
    assert ended["fetch"].at is not None
    out = io.StringIO()
    for note in notes:
        render_worker_note(Console(file=out, width=300, color_system=None), note)
    lines = out.getvalue().splitlines()
    assert any(line.endswith("parked awaiting approval: wipe call_1") for line in lines)
    assert sum("picked up" in line for line in lines) == 3


def test_run_detach_prints_the_queued_run_id(pg_schema: PgSchema, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "go", "--detach", "--db", pg_schema.url, "--model", "scripted-demo", "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert (code, shown["status"], shown["queue"]) == (0, "queued", "tether")
    assert _waiting(pg_schema.url) == [shown["run_id"]]


@pytest.mark.slow  # a worker process
def test_worker_json_prints_a_line_per_note_on_stdout_and_its_banners_on_stderr(
    pg_schema: PgSchema, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "go", "--detach", "--db", pg_schema.url, "--model", "scripted-demo", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    command = [sys.executable, "-m", "tether", "worker", "--db", pg_schema.url, "--json"]
    worker = subprocess.Popen(command, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert worker.stdout is not None
    try:
        lines = [json.loads(worker.stdout.readline()) for _ in range(2)]  # picked up, then where it ended
    finally:
        worker.send_signal(signal.SIGTERM)
        rest, err = worker.communicate(timeout=30)
    assert [(line["run_id"], line["what"]) for line in lines] == [(run_id, "picked_up"), (run_id, "done")]
    assert all(isinstance(line["time"], float) for line in lines)
    assert rest == b""
    assert worker.returncode == 0
    assert b"tether worker: stopped" in err


@pytest.mark.parametrize("command", [["run", "go", "--detach", "--model", "scripted-demo"], ["worker"]])
def test_detach_and_worker_on_sqlite_exit_2_saying_they_need_postgresql(
    command: list[str], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--db", f"sqlite:///{tmp_path / 'runs.db'}"]) == 2
    assert "PostgreSQL" in capsys.readouterr().err
    assert SQLStore(f"sqlite:///{tmp_path / 'runs.db'}").list_runs() == []


class CuttableProxy(LaggyProxy):
    """A TCP proxy to PostgreSQL that can drop every connection and refuse new ones for a while: a restart."""

    def __init__(self, url: str) -> None:
        super().__init__(url, delay=0)
        self.down = threading.Event()

    def _admits(self) -> bool:
        return not self.down.is_set()

    def restart(self, down_for: float) -> None:
        self.down.set()
        dropped, self.sockets = self.sockets, []
        for sock in dropped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        time.sleep(down_for)
        self.down.clear()


@pytest.mark.slow
async def test_runs_finish_when_postgresql_restarts_under_a_worker(pg_schema: PgSchema) -> None:
    class SlowModel(ScriptedModel):
        async def acomplete(self, request: Any) -> Any:
            await asyncio.sleep(0.05)
            return self.complete(request)

    @tool
    def step(i: int) -> str:
        """One step of work."""
        return f"step {i}"

    turns = [tool_use_turn(tool_use(f"call_{i}", "step", {"i": i})) for i in range(4)]
    the_agent = Agent(model=SlowModel([*turns, DONE]), tools=[step])
    store = AsyncSQLStore(pg_schema.url)
    with CuttableProxy(pg_schema.url) as proxy:
        worker = workers.Worker(proxy.url, agent=the_agent, stalled_after=3, concurrency=4)
        serving = asyncio.create_task(worker.run())
        try:
            runner = AsyncRunner(the_agent, store)
            runs = [await runner.submit(f"task {i}") for i in range(12)]
            while not [r for r in await store.list_runs(status="done") if r.id in runs]:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(proxy.restart, 1.5)  # every connection of the worker dropped mid-work
            deadline = time.monotonic() + 60
            while len(await store.list_runs(status="done")) < len(runs) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert {r.status for r in await store.list_runs()} == {"done"}
        finally:
            worker.stop()
            await asyncio.wait_for(serving, timeout=30)
            await store.close()


def test_resume_detach_queues_a_submitted_run_again_once(store: SQLStore, capsys: pytest.CaptureFixture[str]) -> None:
    runner = Runner(agent(), store)
    run_id = runner.submit("go")
    _finish_first_job(store.url)  # say its job failed: the worker had no API key
    assert main(["resume", run_id, "--detach", "--db", store.url]) == 0
    assert main(["resume", run_id, "--detach", "--db", store.url]) == 0
    assert capsys.readouterr().out.splitlines() == [f"run {run_id} queued again", f"run {run_id} was queued already"]
    assert _waiting(store.url) == [run_id]


def test_resume_detach_refuses_a_run_driven_here_or_ended(store: SQLStore, capsys: pytest.CaptureFixture[str]) -> None:
    runner = Runner(agent(), store)
    here = runner.create("go").id
    submitted = runner.submit("go")
    runner.cancel(submitted)
    assert main(["resume", here, "--detach", "--db", store.url]) == 2
    assert main(["resume", submitted, "--detach", "--db", store.url]) == 2
    errors = capsys.readouterr().err
    assert "was not submitted to a queue" in errors
    assert "has already ended (cancelled)" in errors
    assert _waiting(store.url) == []


def test_approve_says_a_submitted_run_goes_on_by_itself(store: SQLStore, capsys: pytest.CaptureFixture[str]) -> None:
    gated = tool_use_turn(tool_use("call_1", "wipe", {"path": "/tmp/x"}))
    runner = Runner(agent(gated), store, approver=DecideLater())
    run_id = runner.submit("go")
    _finish_first_job(store.url)
    runner.drive(run_id, max_wait=0)
    assert main(["deny", run_id, "call_1", "--db", store.url]) == 0
    assert "queued for `tether worker` (queue tether): it goes on by itself" in capsys.readouterr().out
    assert _waiting(store.url) == [run_id]


def test_the_web_inbox_leaves_a_submitted_run_to_the_workers(store: SQLStore) -> None:
    from tether.surfaces.web.decisions import Decider, DecisionForm

    gated = tool_use_turn(tool_use("call_1", "wipe", {"path": "/tmp/x"}))
    runner = Runner(agent(gated), store, approver=DecideLater())
    run_id = runner.submit("go")
    _finish_first_job(store.url)
    [pending] = runner.drive(run_id, max_wait=0).pending_approvals
    resumed: list[str] = []
    decider = Decider(store, resume=lambda run, tenant: resumed.append(run))
    decider.decide(run_id, "call_1", DecisionForm("deny", pending["fingerprint"], reason="no"), tenant=None)
    assert resumed == []  # not driven in the web server: queued for a worker, in the decision's transaction
    assert _waiting(store.url) == [run_id]


def parent_of_a_gated_child() -> Agent:
    child = Agent(model=ScriptedModel([tool_use_turn(tool_use("call_c", "wipe", {"path": "x"})), DONE]), tools=[wipe])
    helper = child.as_tool("helper", "Helps.")
    delegate = tool_use_turn(tool_use("call_p", "helper", {"task": "tidy"}))
    return Agent(model=ScriptedModel([delegate, DONE]), tools=[helper])


def test_a_decision_in_a_child_run_queues_its_submitted_root(store: SQLStore) -> None:
    runner = Runner(parent_of_a_gated_child(), store, approver=DecideLater())
    root = runner.submit("go")
    _finish_first_job(store.url)
    assert runner.drive(root, max_wait=0).status == "awaiting_approval"  # parked on its child's gated call
    [child_run] = [r.id for r in store.list_runs() if r.id != root]
    assert _waiting(store.url) == []
    runner.decide(child_run, "call_c", Approve(actor="ops"))
    assert _waiting(store.url) == [root]  # the root's drive drives the child on
    _finish_first_job(store.url)
    assert runner.drive(root, max_wait=0).status == "done"


async def test_a_decision_in_a_child_run_queues_its_root_on_the_async_store_too(pg_schema: PgSchema) -> None:
    store = AsyncSQLStore(pg_schema.url)
    try:
        runner = AsyncRunner(parent_of_a_gated_child(), store, approver=DecideLater())
        root = await runner.submit("go")
        await asyncio.to_thread(_finish_first_job, pg_schema.url)
        assert (await runner.drive(root, max_wait=0)).status == "awaiting_approval"
        [child_run] = [r.id for r in await store.list_runs() if r.id != root]
        await runner.decide(child_run, "call_c", Approve(actor="ops"))
        assert await asyncio.to_thread(_waiting, pg_schema.url) == [root]
    finally:
        await store.close()


def test_a_child_parked_for_a_retry_queues_its_root_at_the_due_time(store: SQLStore) -> None:
    child = Agent(model=ScriptedModel([tool_use_turn(tool_use("call_c", "fetch", {"url": "u"})), DONE]), tools=[fetch])
    delegate = tool_use_turn(tool_use("call_p", "helper", {"task": "fetch it"}))
    parent = Agent(model=ScriptedModel([delegate, DONE]), tools=[child.as_tool("helper", "Fetches.")])
    runner = Runner(parent, store)
    root = runner.submit("go")
    _finish_first_job(store.url)
    runner.drive(root, max_wait=0)
    [child_run] = [r for r in store.list_runs() if r.id != root]
    [job] = [job for job in jobs(store.url) if job["status"] == "todo"]
    assert job["queueing_lock"] == root
    assert job["scheduled_at"].timestamp() == pytest.approx(child_run.summary["next_due_at"], abs=0.01)


def _stall_a_job(url: str, run_id: str) -> None:
    """A drive job taken by a worker whose heartbeat stopped a minute ago (as after a SIGKILL)."""
    with psycopg.connect(libpq_dsn(url)) as connection:
        worker_id = connection.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) VALUES (now() - interval '60 seconds') RETURNING id"
        ).fetchone()
        assert worker_id is not None
        connection.execute(
            "UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s WHERE queueing_lock = %s",
            (worker_id[0], run_id),
        )


async def test_recovery_queues_again_the_job_of_a_worker_whose_heartbeat_stopped(pg_schema: PgSchema) -> None:
    import procrastinate

    submitted = AsyncSQLStore(pg_schema.url)
    try:
        run_id = await AsyncRunner(agent(DONE), submitted).submit("go")
    finally:
        await submitted.close()
    await asyncio.to_thread(_stall_a_job, pg_schema.url, run_id)
    worker = workers.Worker(pg_schema.url, agent=agent(DONE), stalled_after=5)
    worker.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=libpq_dsn(pg_schema.url)))
    async with worker.app.open_async():
        assert await worker.recover_stalled() == 1
        assert await asyncio.to_thread(_waiting, pg_schema.url) == [run_id]  # todo again, for a live worker
        await asyncio.to_thread(_stall_a_job, pg_schema.url, run_id)
        await asyncio.to_thread(_defer_by_hand, pg_schema.url, run_id)
        assert await worker.recover_stalled() == 1  # a job of that run already waits: the stalled one goes
    assert await asyncio.to_thread(_waiting, pg_schema.url) == [run_id]
