"""A malformed model response fails the run cleanly: resumable, recorded, named, no traceback.

Malformed: a shape the Messages API never sends, a value nested too deeply to read, a stop
reason the engine cannot act on. A tool_use id reused from an earlier turn is repaired instead
(renamed, with a warning), so the run goes on.

The responses are served as raw JSON by FakeMessagesAPI to the real ``anthropic`` client (which
parses leniently), so what reaches the adapter is what a broken API or proxy would send.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import fake_api_env, fake_api_model, run_tether
from tether import Agent, AsyncRunner, Runner, RunResult, tool
from tether.errors import ModelError
from tether.models import ModelRequest
from tether.models.anthropic import AnthropicModel
from tether.policy.compaction import KeepLastTurns
from tether.testing import FakeMessagesAPI, ScriptedModel
from tether.testing.fake_messages_api import sse_events

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


def failed_run(api: FakeMessagesAPI) -> tuple[Runner, RunResult, AnthropicModel]:
    """A run of an agent on the real client, asked once against the fake's script: it must fail."""
    adapter = fake_api_model(api)
    runner = Runner(Agent(model=adapter, model_name="claude-test"))
    failed = runner.run("hi")
    assert failed.status == "failed"
    assert failed.error is not None
    return runner, failed, adapter


def resumes(api: FakeMessagesAPI, runner: Runner, run_id: str, adapter: AnthropicModel) -> None:
    """Resuming asks the model again, which answers this time: the run is done."""
    api.reply_text("fine now")
    resumed = runner.drive(run_id)
    adapter.close()
    assert (resumed.status, resumed.output) == ("done", "fine now")


def failed_streamed_run(api: FakeMessagesAPI) -> RunResult:
    """A run whose one call is streamed (someone listens to the text), not asked again unstreamed: it must fail."""
    adapter = fake_api_model(api, stream_fallback=False)
    failed = Runner(Agent(model=adapter, model_name="claude-test"), on_text=lambda _: None).run("hi")
    adapter.close()
    assert api.requests[0]["stream"] is True
    assert failed.status == "failed"
    return failed


def cli_fails_then_resumes(api: FakeMessagesAPI, tmp_path: Path, named: str) -> None:
    """``tether run`` fails on the fake's reply, naming it; with the script fixed, ``tether resume`` ends the run."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    env = fake_api_env(api)
    failed = run_tether(tmp_path, "run", "hi", "--model", "claude-test", "--db", db, "--json", env=env)
    assert failed.returncode == 1, failed.stderr
    assert "Traceback" not in failed.stderr
    assert named in failed.data["error"]
    api.reply_text("fine now")  # the fake API's script, fixed
    resumed = run_tether(tmp_path, "resume", failed.data["run_id"], "--db", db, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert (resumed.data["status"], resumed.data["output"]) == ("done", "fine now")


@CASES
def test_the_run_fails_resumably_naming_what_was_malformed(
    api: FakeMessagesAPI, body: dict[str, Any], named: str
) -> None:
    api.reply(body)
    runner, failed, adapter = failed_run(api)
    assert failed.error is not None
    assert "malformed response msg_fake_1" in failed.error
    assert named in failed.error
    assert "resume the run to try again" in failed.error
    assert len(runner.load(failed.run_id).messages) == 1  # nothing of the response entered the history

    resumes(api, runner, failed.run_id, adapter)  # a resume asks again, as after any transient model failure
    finished = [e.data for e in runner.store.load_events(failed.run_id) if e.type == "run_finished"]
    assert named in finished[0]["error"]  # the failed attempt stays in the log


STREAMED = ["tool_use without id", "an unknown block type", "a content block that is not an object"]


@pytest.mark.parametrize("case", STREAMED)
def test_a_streamed_malformed_response_fails_the_same_way(api: FakeMessagesAPI, case: str) -> None:
    api.reply(MALFORMED[case][0])
    failed = failed_streamed_run(api)
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


@pytest.mark.parametrize(
    ("script", "named"),
    [
        (lambda api: api.reply(MALFORMED["usage as a list"][0]), "usage: input should be a valid dictionary"),
        (lambda api: api.reply_raw(deep_reply(3500)), "a value nested too deeply to read"),
    ],
    ids=["usage as a list", "nested 3,500 deep"],
)
async def test_the_async_adapter_validates_too(
    api: FakeMessagesAPI, script: Callable[[FakeMessagesAPI], None], named: str
) -> None:
    script(api)
    adapter = fake_api_model(api)
    failed = await AsyncRunner(Agent(model=adapter, model_name="claude-test")).run("hi")
    await adapter.aclose()
    assert failed.status == "failed"
    assert failed.error is not None
    assert named in failed.error


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


# Values nested too deeply to read -----------------------------------------------------------
def deep_json(depth: int) -> str:
    """A JSON object nested ``depth`` levels deep, as text (Python's own encoder stops near 1,000)."""
    return '{"a":' * depth + "1" + "}" * depth


def deep_reply(depth: int) -> str:
    """A whole Messages API response whose one tool_use input nests ``depth`` levels deep."""
    return (
        '{"id": "msg_deep", "type": "message", "role": "assistant", "model": "claude-test", "stop_reason": '
        '"tool_use", "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 5}, "content": '
        f'[{{"type": "tool_use", "id": "toolu_deep", "name": "add", "input": {{"value": {deep_json(depth)}}}}}]}}'
    )


DEPTHS = {
    150: "content.0 (tool_use): nested more than 100 levels deep",  # read, refused at the edge
    300: "a value nested too deeply to read",  # past what pydantic serialises
    3500: "a value nested too deeply to read",  # past what Python's JSON parser reads
}


@pytest.mark.parametrize(("depth", "named"), DEPTHS.items(), ids=[f"depth-{d}" for d in DEPTHS])
def test_a_tool_input_nested_thousands_deep_fails_the_run_resumably(
    api: FakeMessagesAPI, depth: int, named: str
) -> None:
    api.reply_raw(deep_reply(depth))
    runner, failed, adapter = failed_run(api)
    assert failed.error is not None
    assert "the Anthropic API sent a malformed response" in failed.error
    assert named in failed.error
    assert "resume the run to try again" in failed.error
    assert runner.store.load_run(failed.run_id).summary["retryable"] is True
    resumes(api, runner, failed.run_id, adapter)


def test_a_streamed_tool_input_nested_thousands_deep_fails_the_same_way(api: FakeMessagesAPI) -> None:
    message = {
        "id": "msg_deep",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "tool_use", "id": "toolu_deep", "name": "add", "input": {}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    events = sse_events(message)
    for event in events:  # the input's JSON ({}), sent as one piece: a value nested 3,500 deep instead
        if event["type"] == "content_block_delta" and event["delta"]["partial_json"]:
            event["delta"]["partial_json"] = f'{{"value": {deep_json(3500)}}}'
    api.reply_events(events)
    failed = failed_streamed_run(api)
    assert failed.error is not None
    assert "the response stream could not be read" in failed.error
    assert "recursion limit exceeded" in failed.error
    assert failed.error.endswith("characters) (transient: resume the run to try again)")  # not the whole input
    assert len(failed.error) < 1000
    assert "resume the run to try again" in failed.error


def test_the_scripted_model_refuses_a_deep_reply_too() -> None:
    deep: object = 1
    for _ in range(150):
        deep = {"a": deep}
    reply = {"content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {"value": deep}}]}
    request = ModelRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10)
    with pytest.raises(ModelError, match="nested more than 100 levels deep") as caught:
        ScriptedModel([reply]).complete(request)
    assert caught.value.retryable


def test_the_cli_fails_a_deep_reply_resumably_and_resume_carries_on(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.reply_raw(deep_reply(3500))
    cli_fails_then_resumes(api, tmp_path, "a value nested too deeply to read")


# Stop reasons the engine cannot act on -----------------------------------------------------
STOPS: dict[str, tuple[dict[str, Any], str]] = {
    "no stop_reason": ({"content": [TEXT], "stop_reason": None}, "it has no stop_reason"),
    "an unknown stop_reason": (
        {"content": [TEXT], "stop_reason": "mystery"},
        "its stop_reason 'mystery' is none the Messages API defines",
    ),
    "tool_use without a tool_use block": (
        {"content": [TEXT], "stop_reason": "tool_use"},
        "its stop_reason is tool_use but it holds no tool_use block",
    ),
}
STOP_CASES = pytest.mark.parametrize(("body", "named"), STOPS.values(), ids=STOPS.keys())


@STOP_CASES
def test_a_stop_reason_the_engine_cannot_act_on_fails_the_run_resumably(
    api: FakeMessagesAPI, body: dict[str, Any], named: str
) -> None:
    api.reply(body)
    runner, failed, adapter = failed_run(api)
    assert failed.error == (
        f"the model's reply msg_fake_1 was malformed: {named}; it was not used (resume the run to ask the model again)"
    )
    assert len(runner.load(failed.run_id).messages) == 1  # the reply is in the log, not the history
    resumes(api, runner, failed.run_id, adapter)


@STOP_CASES
def test_a_run_failed_on_a_stop_reason_can_be_cancelled(api: FakeMessagesAPI, body: dict[str, Any], named: str) -> None:
    api.reply(body)
    runner, failed, adapter = failed_run(api)
    adapter.close()
    assert runner.cancel(failed.run_id, "giving up").status == "cancelled"


@STOP_CASES
def test_the_cli_fails_on_a_stop_reason_and_resume_asks_again(
    api: FakeMessagesAPI, tmp_path: Path, body: dict[str, Any], named: str
) -> None:
    api.reply(body)
    cli_fails_then_resumes(api, tmp_path, named)


def test_a_scripted_run_fixed_after_a_bad_stop_reason_resumes_from_the_cli(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": [TEXT], "stop_reason": "mystery"}]), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    failed = run_tether(tmp_path, "run", "hi", "--model", f"scripted:{script}", "--db", db, "--json")
    assert failed.returncode == 1, failed.stderr
    assert "its stop_reason 'mystery' is none the Messages API defines" in failed.data["error"]
    # The script, fixed: the model is asked again for its second reply (the first was spent).
    script.write_text(json.dumps([{"content": [TEXT]}, {"content": [TEXT], "stop_reason": "end_turn"}]))
    resumed = run_tether(tmp_path, "resume", failed.data["run_id"], "--db", db, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert (resumed.data["status"], resumed.data["output"]) == ("done", "hello")


# A tool_use id the model reuses in a later turn -----------------------------------------------
@tool
def add(a: int, b: int, tool_use_id: str) -> str:
    """Add two numbers (and say which call asked)."""
    return f"{a + b} for {tool_use_id}"


def test_a_tool_use_id_reused_in_a_later_turn_is_renamed_and_the_run_goes_on(api: FakeMessagesAPI) -> None:
    api.reply_tool_use("add", {"a": 1, "b": 2}, tool_use_id="toolu_same")
    api.reply_tool_use("add", {"a": 3, "b": 4}, tool_use_id="toolu_same")
    api.reply_text("3 and 7")
    adapter = fake_api_model(api)
    runner = Runner(Agent(model=adapter, tools=[add], model_name="claude-test"))
    done = runner.run("add twice")
    adapter.close()
    assert (done.status, done.output) == ("done", "3 and 7")  # the API accepted every request: ids unique
    results = [e.data for e in runner.store.load_events(done.run_id) if e.type == "tool_finished"]
    assert [r["content"] for r in results] == ["3 for toolu_same", "7 for toolu_same_2"]  # a key of its own each
    sent = api.requests[2]["messages"]
    assert [b["id"] for m in sent if m["role"] == "assistant" for b in m["content"]] == ["toolu_same", "toolu_same_2"]
    warnings = [e.data for e in runner.store.load_events(done.run_id) if e.type == "warning"]
    assert warnings == [
        {
            "message": "the model reused the tool_use id 'toolu_same' of an earlier call in this run: this call is "
            "recorded as 'toolu_same_2', so that each call keeps an id (and idempotency key) of its own",
            "call_id": "toolu_same_2",
            "tool": "add",
        }
    ]


def test_an_id_reused_after_the_history_forgot_it_is_renamed_too() -> None:
    def turn(call_id: str, a: int) -> dict[str, Any]:
        call = {"type": "tool_use", "id": call_id, "name": "add", "input": {"a": a, "b": 0}}
        return {"content": [call], "stop_reason": "tool_use"}

    script = [
        turn("t1", 1),
        turn("t2", 2),
        turn("t1", 3),
        turn("t1", 4),
        {"content": [TEXT], "stop_reason": "end_turn"},
    ]
    agent = Agent(model=ScriptedModel(script), tools=[add], history_processors=[KeepLastTurns(1)])
    runner = Runner(agent)
    done = runner.run("add")
    assert done.status == "done"
    results = [e.data["content"] for e in runner.store.load_events(done.run_id) if e.type == "tool_finished"]
    assert results == ["1 for t1", "2 for t2", "3 for t1_2", "4 for t1_3"]  # compacted away, never reused
