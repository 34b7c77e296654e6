"""Model calls under API trouble: capped Retry-After waits, and transient failures that resume."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pexpect
import pytest

from support import clean_env, done, fake_api_env, fake_api_model, run_tether, screen_text
from tether import Agent, AsyncRunner, Runner, RunResult
from tether.testing import FakeMessagesAPI


def test_a_long_retry_after_is_capped_and_reported(api: FakeMessagesAPI) -> None:
    waits: list[tuple[float, int]] = []
    api.fail(429, "slow down", headers={"retry-after": "120", "retry-after-ms": "120000"})
    api.reply_text("hello")
    adapter = fake_api_model(
        api, max_retries=2, max_retry_wait=0.05, on_retry_wait=lambda wait, retry: waits.append((wait, retry))
    )
    runner = Runner(Agent(model=adapter, model_name="claude-test"))
    result = runner.run("hi")
    adapter.close()
    assert result.status == "done"
    assert waits == [(0.05, 1)]  # capped: not the 120 s the API asked for
    assert len(api.requests) == 2
    assert result.steps == 1  # SDK retries are inside one model invocation
    (responded,) = [e.data for e in done(runner.store.load_events(result.run_id)) if e.type == "model_responded"]
    assert responded["retry_waits"] == [0.05]  # the event log keeps the wait


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_retry_waits_are_recorded_on_the_model_response(api: FakeMessagesAPI, kind: str) -> None:
    api.fail(429, "slow down", headers={"retry-after": "0.2", "retry-after-ms": "200"})
    api.fail(529, "Overloaded", headers={"retry-after": "0.1", "retry-after-ms": "100"})
    api.reply_text("hello")
    adapter = fake_api_model(api, max_retries=2)
    runner: Runner | AsyncRunner
    if kind == "sync":
        runner = sync_runner = Runner(Agent(model=adapter, model_name="claude-test"))
        result = sync_runner.run("hi")
        adapter.close()
    else:
        async_runner = runner = AsyncRunner(Agent(model=adapter, model_name="claude-test"))

        async def run_and_close() -> RunResult:
            try:
                return await async_runner.run("hi")
            finally:
                await adapter.aclose()  # in its loop: the connection belongs to it

        result = asyncio.run(run_and_close())
    assert result.status == "done"
    (responded,) = [e.data for e in done(runner.store.load_events(result.run_id)) if e.type == "model_responded"]
    assert responded["retry_waits"] == [0.2, 0.1]


def test_retry_waits_before_a_failure_are_recorded_too(api: FakeMessagesAPI) -> None:
    for _ in range(2):
        api.fail(429, "slow down", headers={"retry-after": "0.1", "retry-after-ms": "100"})
    adapter = fake_api_model(api, max_retries=1)
    runner = Runner(Agent(model=adapter, model_name="claude-test"))
    failed = runner.run("hi")
    adapter.close()
    assert failed.status == "failed"
    (warning,) = [e.data for e in done(runner.store.load_events(failed.run_id)) if e.type == "warning"]
    assert warning["retry_waits"] == [0.1]
    assert "retried 1 time(s), waiting 0.1s" in warning["message"]


def test_a_transient_failure_parks_the_run_failed_and_resume_tries_again(api: FakeMessagesAPI) -> None:
    api.fail(529, "Overloaded")
    adapter = fake_api_model(api, max_retries=0)
    runner = Runner(Agent(model=adapter, model_name="claude-test"))
    failed = runner.run("hi")
    assert failed.status == "failed"
    assert failed.error is not None
    assert "529" in failed.error
    assert "resume the run to try again" in failed.error
    assert len(runner.load(failed.run_id).messages) == 1  # history intact: no partial turn

    api.reply_text("back again")
    resumed = runner.drive(failed.run_id)
    assert resumed.status == "done"
    assert resumed.output == "back again"
    assert resumed.error is None
    kinds = [e.type for e in done(runner.store.load_events(failed.run_id))]
    assert kinds.count("run_finished") == 2
    adapter.close()


async def test_a_transient_failure_resumes_with_the_async_driver(api: FakeMessagesAPI) -> None:
    api.fail(503, "unavailable")
    adapter = fake_api_model(api, max_retries=0)
    runner = AsyncRunner(Agent(model=adapter, model_name="claude-test"))
    failed = await runner.run("hi")
    assert failed.status == "failed"
    api.reply_text("ok now")
    resumed = await runner.drive(failed.run_id)
    assert resumed.status == "done"
    await adapter.aclose()


def test_a_permanent_failure_is_not_retried_on_resume(api: FakeMessagesAPI) -> None:
    api.fail(400, "messages: bad request")
    adapter = fake_api_model(api, max_retries=0)
    runner = Runner(Agent(model=adapter, model_name="claude-test"))
    failed = runner.run("hi")
    assert failed.status == "failed"
    assert failed.error is not None
    assert "400" in failed.error
    again = runner.drive(failed.run_id)
    assert again.status == "failed"
    assert len(api.requests) == 1
    adapter.close()


@pytest.mark.slow
def test_the_cli_shows_retry_waits(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.fail(429, "slow down", headers={"retry-after": "0.2", "retry-after-ms": "200"})
    api.reply_text("hello")
    done = run_tether(
        tmp_path, "run", "hi", "--model", "claude-test", "--db", f"sqlite:///{tmp_path / 'r.db'}", env=fake_api_env(api)
    )
    assert done.returncode == 0, done.stderr
    assert "retrying in 0.2s (retry 1)" in done.stderr


@pytest.mark.slow
def test_the_live_view_shows_retry_waits_in_its_spinner(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.fail(429, "slow down", headers={"retry-after": "1", "retry-after-ms": "1000"})
    api.reply_text("hello")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "tether", "run", "hi", "--model", "claude-test", "--db", f"sqlite:///{tmp_path / 'r.db'}"],
        cwd=str(tmp_path),
        env=clean_env(TERM="xterm", **fake_api_env(api)),
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 200),
    )
    try:
        child.expect("thinking · step 1 · API busy or unreachable: retrying in 1s \\(retry 1\\)")
        child.expect(pexpect.EOF)
        rest = screen_text(child.before or "")
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert "status: done" in rest
    assert "the model API is busy" not in rest  # the spinner said it; no extra line
