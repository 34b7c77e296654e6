"""Model calls under API trouble: capped Retry-After waits, and transient failures that resume."""

from __future__ import annotations

import time
from pathlib import Path

from fake_messages_api import FakeMessagesAPI
from support import fake_api_env, fake_api_model, run_tether
from tether import Agent, AsyncRunner, Runner


def test_a_long_retry_after_is_capped_and_reported(api: FakeMessagesAPI) -> None:
    waits: list[float] = []
    api.fail(429, "slow down", headers={"retry-after": "120", "retry-after-ms": "120000"})
    api.reply_text("hello")
    adapter = fake_api_model(api, max_retries=2, max_retry_wait=0.05, on_retry_wait=waits.append)
    started = time.monotonic()
    result = Runner(Agent(model=adapter, model_name="claude-test")).run("hi")
    adapter.close()
    assert result.status == "done"
    assert time.monotonic() - started < 5  # not the 120 s the API asked for
    assert waits == [0.05]
    assert len(api.requests) == 2
    assert result.steps == 1  # SDK retries are inside one model invocation


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
    kinds = [e.type for e in runner.store.load_events(failed.run_id)]
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


def test_the_cli_shows_retry_waits(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.fail(429, "slow down", headers={"retry-after": "0.2", "retry-after-ms": "200"})
    api.reply_text("hello")
    done = run_tether(
        tmp_path, "run", "hi", "--model", "claude-test", "--db", f"sqlite:///{tmp_path / 'r.db'}", env=fake_api_env(api)
    )
    assert done.returncode == 0, done.stderr
    assert "retrying in 0.2s" in done.stderr
