"""A malformed model response fails the run cleanly: resumable, recorded, named, no traceback.

The responses are served as raw JSON by FakeMessagesAPI to the real ``anthropic`` client (which
parses leniently), so what reaches the adapter is what a broken API or proxy would send.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import fake_api_env, fake_api_model, run_tether
from tether import Agent, AsyncRunner, Runner
from tether.errors import ModelError
from tether.models import ModelRequest
from tether.testing import FakeMessagesAPI, ScriptedModel

TEXT = {"type": "text", "text": "hello"}
MALFORMED: dict[str, tuple[dict[str, Any], str]] = {
    "tool_use without id": (
        {"content": [{"type": "tool_use", "name": "add", "input": {}}], "stop_reason": "tool_use"},
        "content.0 (tool_use).id: field required",
    ),
    "tool_use without name": (
        {"content": [{"type": "tool_use", "id": "t1", "input": {}}], "stop_reason": "tool_use"},
        "content.0 (tool_use).name: field required",
    ),
    "tool_use input not an object": (
        {"content": [{"type": "tool_use", "id": "t1", "name": "add", "input": [1]}], "stop_reason": "tool_use"},
        "content.0 (tool_use).input: input should be a valid dictionary",
    ),
    "usage as a list": ({"content": [TEXT], "usage": [1, 2]}, "usage: input should be a valid dictionary"),
    "a token count that is not a number": (
        {"content": [TEXT], "usage": {"input_tokens": "many"}},
        "usage.input_tokens: input should be a valid integer",
    ),
    "a content block that is not an object": (
        {"content": [TEXT, "hello"]},
        "content.1: a content block should be an object, not str",
    ),
    "an unknown block type": ({"content": [{"type": "mystery", "x": 1}]}, "content.0: unknown block type 'mystery'"),
    "a block without a type": ({"content": [{"text": "x"}]}, "content.0: a content block needs a 'type'"),
    "a text block whose text is a number": (
        {"content": [{"type": "text", "text": 5}]},
        "content.0 (text).text: input should be a valid string",
    ),
    "content that is not a list": ({"content": TEXT}, "content: input should be a valid list"),
    "a stop_reason that is not a string": ({"content": [TEXT], "stop_reason": 3}, "stop_reason: input should be"),
    "two tool_use blocks with one id": (
        {
            "content": [
                {"type": "tool_use", "id": "t1", "name": "add", "input": {}},
                {"type": "tool_use", "id": "t1", "name": "add", "input": {}},
            ],
            "stop_reason": "tool_use",
        },
        "content.1 (tool_use).id: 't1' is used by another tool_use block",
    ),
}
CASES = pytest.mark.parametrize(("body", "named"), MALFORMED.values(), ids=MALFORMED.keys())


@CASES
def test_the_run_fails_resumably_naming_what_was_malformed(
    api: FakeMessagesAPI, body: dict[str, Any], named: str
) -> None:
    api.reply(body)
    adapter = fake_api_model(api)
    runner = Runner(Agent(model=adapter, model_name="claude-test"))
    failed = runner.run("hi")
    assert failed.status == "failed"
    assert failed.error is not None
    assert "malformed response msg_fake_1" in failed.error
    assert named in failed.error
    assert "resume the run to try again" in failed.error
    assert len(runner.load(failed.run_id).messages) == 1  # nothing of the response entered the history

    api.reply_text("fine now")  # a resume asks again, as after any transient model failure
    resumed = runner.drive(failed.run_id)
    adapter.close()
    assert resumed.status == "done"
    assert resumed.output == "fine now"
    finished = [e.data for e in runner.store.load_events(failed.run_id) if e.type == "run_finished"]
    assert named in finished[0]["error"]  # the failed attempt stays in the log


STREAMED = ["tool_use without id", "an unknown block type", "a content block that is not an object"]


@pytest.mark.parametrize("case", STREAMED)
def test_a_streamed_malformed_response_fails_the_same_way(api: FakeMessagesAPI, case: str) -> None:
    api.reply(MALFORMED[case][0])
    adapter = fake_api_model(api, stream_fallback=False)
    runner = Runner(Agent(model=adapter, model_name="claude-test"), on_text=lambda _: None)
    failed = runner.run("hi")
    adapter.close()
    assert api.requests[0]["stream"] is True
    assert failed.status == "failed"
    assert failed.error is not None
    assert "malformed response" in failed.error
    assert "resume the run to try again" in failed.error


async def test_a_streamed_malformed_response_fails_the_same_way_async(api: FakeMessagesAPI) -> None:
    api.reply(MALFORMED["a content block that is not an object"][0])
    adapter = fake_api_model(api, stream_fallback=False)
    failed = await AsyncRunner(Agent(model=adapter, model_name="claude-test"), on_text=lambda _: None).run("hi")
    await adapter.aclose()
    assert failed.status == "failed"
    assert failed.error is not None
    assert "malformed response stream" in failed.error


async def test_the_async_adapter_validates_too(api: FakeMessagesAPI) -> None:
    api.reply(MALFORMED["usage as a list"][0])
    adapter = fake_api_model(api)
    failed = await AsyncRunner(Agent(model=adapter, model_name="claude-test")).run("hi")
    await adapter.aclose()
    assert failed.status == "failed"
    assert failed.error is not None
    assert "usage: input should be a valid dictionary" in failed.error


@CASES
def test_the_scripted_model_validates_its_replies(body: dict[str, Any], named: str) -> None:
    request = ModelRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10)
    with pytest.raises(ModelError) as caught:
        ScriptedModel([{"id": "msg_fake_1", **body}]).complete(request)
    assert caught.value.retryable
    assert named in str(caught.value)


def test_the_cli_says_what_was_malformed_without_a_traceback(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.reply(MALFORMED["tool_use without id"][0])
    db = f"sqlite:///{tmp_path / 'r.db'}"
    done = run_tether(tmp_path, "run", "hi", "--model", "claude-test", "--db", db, "--json", env=fake_api_env(api))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    output = json.loads(done.stdout)
    assert output["status"] == "failed"
    assert "content.0 (tool_use).id: field required" in output["error"]
