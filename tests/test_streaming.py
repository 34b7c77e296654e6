"""Streaming: the answer's text shown while it is written, with one step per model call as before.

A streamed call returns exactly what the plain call returns (checked through the real
anthropic client against FakeMessagesAPI serving real server-sent events); a failure
mid-stream is asked again once unstreamed (the SDK retries that call), else a ModelError that
leaves the run resumable; the runner streams only when
someone listens and persists nothing per delta; the CLI shows the text in a real terminal.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from support import fake_api_env, fake_api_model, run_tether, screen_text, settled, spawn_tether, token_usage
from tether import Agent, AsyncRunner, Limits, Runner, RunResult, tool
from tether.errors import ModelError
from tether.facts import events as ev
from tether.models import (
    AsyncStreamingModelAdapter,
    ModelRequest,
    ModelResponse,
    StreamingModelAdapter,
    TextListener,
)
from tether.models.anthropic import AnthropicModel
from tether.models.scripted import ScriptedModel
from tether.testing.fake_messages_api import FakeMessagesAPI, error_event, sse_events

MODEL = "claude-test"
PROMPT: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}


def reply(content: list[dict[str, Any]], stop_reason: str, **fields: Any) -> dict[str, Any]:
    return {"id": "msg_same", "content": content, "stop_reason": stop_reason, **fields}


REPLIES = {
    "text": reply(
        [{"type": "text", "text": "Hello there, this answer arrives word by word."}],
        "end_turn",
        usage=token_usage(11, 22, created=33, read=44),
    ),
    "parallel_tool_use": reply(
        [
            {"type": "text", "text": "Reading both files."},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.txt", "lines": [1, 2]}},
            {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "b/ü.txt", "deep": {"x": None}}},
            {"type": "tool_use", "id": "toolu_3", "name": "list", "input": {}},
        ],
        "tool_use",
    ),
    "thinking": reply(
        [
            {"type": "thinking", "thinking": "The user greets me. A short answer will do.", "signature": "c2ln=="},
            {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
            {"type": "text", "text": "Hi! Let me check."},
            {"type": "tool_use", "id": "toolu_9", "name": "read", "input": {"path": "x"}},
        ],
        "tool_use",
    ),
    "max_tokens_cut_tool_use": reply(
        [
            {"type": "text", "text": "Writing it."},
            {"type": "tool_use", "id": "toolu_cut", "name": "write", "input": {"path": "a.txt"}},
        ],
        "max_tokens",
        usage=token_usage(30, 4096),
    ),
    "pause_turn": reply(
        [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "tether"}},
            {
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_1",
                "content": [
                    {"type": "web_search_result", "url": "https://ex.com/", "title": "Ex", "encrypted_content": "e"}
                ],
            },
            {"type": "text", "text": "Still searching."},
        ],
        "pause_turn",
    ),
    "refusal": reply([], "refusal", stop_details={"type": "refusal", "category": "cyber", "explanation": "Not this."}),
}


def request(**overrides: Any) -> ModelRequest:
    return ModelRequest(**{"model": "ignored", "messages": [PROMPT], "max_tokens": 321, **overrides})


def text_of(response: ModelResponse) -> str:
    return "".join(block["text"] for block in response.content if block["type"] == "text")


@pytest.fixture
async def model(api: FakeMessagesAPI) -> AsyncIterator[AnthropicModel]:
    adapter = fake_api_model(api, MODEL)
    yield adapter
    adapter.close()
    await adapter.aclose()


@pytest.fixture
async def strict(api: FakeMessagesAPI) -> AsyncIterator[AnthropicModel]:
    """A model that reports a broken stream instead of asking again unstreamed."""
    adapter = fake_api_model(api, MODEL, stream_fallback=False)
    yield adapter
    adapter.close()
    await adapter.aclose()


async def call(model: AnthropicModel, kind: str, listener: TextListener | None = None) -> ModelResponse:
    """One call, plain or streamed, with the sync or the async client."""
    if listener is None:
        return model.complete(request()) if kind == "sync" else await model.acomplete(request())
    return model.stream(request(), listener) if kind == "sync" else await model.astream(request(), listener)


# The adapter ---------------------------------------------------------------------------------
def test_the_adapters_can_stream() -> None:
    for adapter in (AnthropicModel(MODEL, api_key="k"), ScriptedModel([])):
        assert isinstance(adapter, StreamingModelAdapter)
        assert isinstance(adapter, AsyncStreamingModelAdapter)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("name", list(REPLIES))
async def test_a_streamed_call_returns_exactly_what_a_plain_call_returns(
    api: FakeMessagesAPI, model: AnthropicModel, kind: str, name: str
) -> None:
    api.reply(REPLIES[name])
    api.reply(REPLIES[name])
    pieces: list[str] = []

    plain = await call(model, kind)
    streamed = await call(model, kind, pieces.append)

    assert streamed == plain
    assert streamed.content == plain.content  # tool inputs parsed, thinking signed, server blocks whole
    assert "".join(pieces) == text_of(plain)
    assert len(pieces) == len(text_of(plain).split())  # a piece per word: the fake streams word by word
    first, second = api.requests
    assert second.pop("stream") is True
    assert second == first  # the same request otherwise


def test_the_streamed_response_keeps_usage_and_stop_details(api: FakeMessagesAPI, model: AnthropicModel) -> None:
    api.reply(REPLIES["text"])
    api.reply(REPLIES["refusal"])
    text = model.stream(request(), lambda _: None)
    refusal = model.stream(request(), lambda _: None)
    assert (text.usage.input_tokens, text.usage.output_tokens) == (11, 22)
    assert (text.usage.cache_creation_input_tokens, text.usage.cache_read_input_tokens) == (33, 44)
    assert refusal.stop_details == {"type": "refusal", "category": "cyber", "explanation": "Not this."}


def events_of(name: str) -> list[dict[str, Any]]:
    return sse_events({**REPLIES[name], "type": "message", "role": "assistant", "model": MODEL})


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    ("error_type", "status", "retryable"),
    [
        ("overloaded_error", 529, True),
        ("api_error", 500, True),
        ("rate_limit_error", 429, True),
        ("invalid_request_error", 400, False),
        ("some_new_error", None, False),
    ],
)
async def test_an_error_event_mid_stream_is_a_model_error_judged_like_its_http_twin(
    api: FakeMessagesAPI, kind: str, error_type: str, status: int | None, retryable: bool
) -> None:
    events = events_of("text")
    api.reply_events([*events[:5], error_event(error_type, "Overloaded")])  # two words, then the error
    adapter = fake_api_model(api, MODEL, max_retries=3, stream_fallback=False)
    pieces: list[str] = []

    with pytest.raises(ModelError) as caught:
        await call(adapter, kind, pieces.append)

    assert str(caught.value) == f"Anthropic API error mid-stream ({error_type}): Overloaded"
    assert caught.value.status == status
    assert caught.value.retryable is retryable
    assert pieces == ["Hello", " there,"]  # what arrived was shown; nothing else
    assert len(api.requests) == 1  # the SDK does not retry a stream that failed midway
    adapter.close()
    await adapter.aclose()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_stream_cut_short_is_a_retryable_model_error(
    api: FakeMessagesAPI, strict: AnthropicModel, kind: str
) -> None:
    events = events_of("parallel_tool_use")
    api.reply_events(events[:9], drop_connection=True)  # the connection breaks
    api.reply_events(events[:-1])  # the body ends properly, but without message_stop

    with pytest.raises(ModelError) as dropped:
        await call(strict, kind, lambda _: None)
    with pytest.raises(ModelError) as unfinished:
        await call(strict, kind, lambda _: None)

    assert str(dropped.value).startswith("the connection to the Anthropic API broke mid-stream")
    assert str(unfinished.value) == "the response stream ended before the message was complete"
    assert dropped.value.retryable
    assert unfinished.value.retryable


def test_a_tool_input_that_is_not_json_is_a_retryable_model_error(api: FakeMessagesAPI, strict: AnthropicModel) -> None:
    events = events_of("max_tokens_cut_tool_use")
    broken = [
        {**e, "delta": {"type": "input_json_delta", "partial_json": '{"path": }'}}
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
        else e
        for e in events
    ]
    api.reply_events(broken)
    with pytest.raises(ModelError) as caught:
        strict.stream(request(), lambda _: None)
    assert str(caught.value).startswith("the response stream could not be read: Unable to parse tool parameter JSON")
    assert caught.value.retryable


def test_an_error_before_the_stream_starts_is_retried_by_the_sdk(api: FakeMessagesAPI) -> None:
    api.fail(529, "Overloaded")
    api.reply(REPLIES["text"])
    adapter = fake_api_model(api, MODEL, max_retries=1)
    assert text_of(adapter.stream(request(), lambda _: None)) == "Hello there, this answer arrives word by word."
    assert len(api.requests) == 2
    adapter.close()


def test_the_scripted_model_streams_its_text_word_by_word() -> None:
    model = ScriptedModel([REPLIES["parallel_tool_use"], REPLIES["text"]])
    pieces: list[str] = []
    streamed = model.stream(request(), pieces.append)
    assert streamed == model.complete(request())
    assert pieces == ["Reading", " both", " files."]
    assert len(model.requests) == 2  # each call recorded once


# The runner ----------------------------------------------------------------------------------
@tool
def read(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@tool
def write(path: str, content: str) -> str:
    """Write a file."""
    return f"wrote {len(content)} characters to {path}"


async def drive(runner: Runner | AsyncRunner, run: str | None = None) -> RunResult:
    if isinstance(runner, AsyncRunner):
        return await (runner.drive(run) if run else runner.run("Read a and b"))
    return runner.drive(run) if run else runner.run("Read a and b")


def make_runner(kind: str, model: Any, *, on_text: TextListener | None = None, **limits: Any) -> Runner | AsyncRunner:
    agent = Agent(model=model, tools=[read, write], model_name=MODEL, limits=Limits(**limits))
    return Runner(agent, on_text=on_text) if kind == "sync" else AsyncRunner(agent, on_text=on_text)


TWO_READS = reply(
    [
        {"type": "text", "text": "Reading both."},
        {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "a"}},
        {"type": "tool_use", "id": "toolu_b", "name": "read", "input": {"path": "b"}},
    ],
    "tool_use",
)
ANSWER = reply([{"type": "text", "text": "Both files hold their contents."}], "end_turn")


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_runner_streams_only_when_someone_listens_and_commits_the_same_steps(
    api: FakeMessagesAPI, model: AnthropicModel, kind: str
) -> None:
    results = {}
    pieces: list[str] = []
    for listening in (False, True):
        api.reply(TWO_READS)
        api.reply(ANSWER)
        runner = make_runner(kind, model, on_text=pieces.append if listening else None)
        result = await drive(runner)
        assert result.status == "done", result.error
        results[listening] = [(e.type, e.data) for e in (await settled(runner.store.load_events(result.run_id)))]

    assert [r.get("stream") for r in api.requests] == [None, None, True, True]
    assert "".join(pieces) == "Reading both.Both files hold their contents."
    # Nothing is recorded per delta: the streamed run committed what the plain run committed.
    assert [kind for kind, _ in results[True]] == [kind for kind, _ in results[False]]
    responded = {k: [d["content"] for t, d in v if t == ev.ModelResponded.kind] for k, v in results.items()}
    assert responded[True] == responded[False]


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("breaks", ["overloaded", "dropped"])
async def test_a_stream_broken_midway_is_asked_again_unstreamed_in_the_same_step(
    api: FakeMessagesAPI, model: AnthropicModel, kind: str, breaks: str
) -> None:
    if breaks == "overloaded":
        api.reply_events([*events_of("text")[:6], error_event("overloaded_error", "Overloaded")])
    else:
        api.reply_events(events_of("text")[:6], drop_connection=True)
    api.reply(ANSWER)
    pieces: list[str] = []
    runner = make_runner(kind, model, on_text=pieces.append)

    result = await drive(runner)

    assert result.status == "done", result.error
    assert result.output == "Both files hold their contents."
    assert result.steps == 1  # the broken stream answered nothing: one model invocation
    assert [r.get("stream") for r in api.requests] == [True, None]  # the second call is a plain one
    assert pieces[:2] == ["Hello", " there,"]  # what arrived before the break was shown
    assert api.requests[1]["messages"] == api.requests[0]["messages"]  # the same request again


def test_a_stream_asked_again_unstreamed_fails_like_a_plain_call(api: FakeMessagesAPI, model: AnthropicModel) -> None:
    api.reply_events([*events_of("text")[:6], error_event("overloaded_error", "Overloaded")])
    api.fail(529, "Overloaded")  # the plain call fails too (no retries configured here)
    with pytest.raises(ModelError) as caught:
        model.stream(request(), lambda _: None)
    assert caught.value.status == 529
    assert caught.value.retryable
    assert len(api.requests) == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_failure_mid_stream_fails_the_run_resumably_like_a_529(
    api: FakeMessagesAPI, strict: AnthropicModel, kind: str
) -> None:
    api.reply_events([*events_of("text")[:6], error_event("overloaded_error", "Overloaded")])
    runner = make_runner(kind, strict, on_text=lambda _: None)

    failed = await drive(runner)

    assert failed.status == "failed"
    assert failed.error == (
        "model call failed: Anthropic API error mid-stream (overloaded_error): Overloaded "
        "(transient: resume the run to try again)"
    )
    state = await settled(runner.load(failed.run_id))
    assert len(state.messages) == 1  # history intact: nothing of the broken turn
    assert ev.ModelResponded.kind not in [e.type for e in (await settled(runner.store.load_events(failed.run_id)))]

    api.reply(ANSWER)
    resumed = await drive(runner, failed.run_id)
    assert resumed.status == "done"
    assert resumed.output == "Both files hold their contents."


def cut_tool_input(events: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The stream with the tool input of block ``index`` cut mid-string, as max_tokens cuts it."""
    json_text = "".join(
        e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["index"] == index
    )
    cut = json_text[: json_text.index("xxxx")]
    kept = [e for e in events if not (e["type"] == "content_block_delta" and e["index"] == index)]
    stop = kept.index({"type": "content_block_stop", "index": index})
    delta = {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": cut}}
    return [*kept[:stop], delta, *kept[stop:]]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_tool_use_cut_mid_json_by_max_tokens_is_discarded_and_asked_again(
    api: FakeMessagesAPI, model: AnthropicModel, kind: str
) -> None:
    full = {"path": "a.txt", "content": "x" * 40}
    cut_turn = {
        **reply([{"type": "tool_use", "id": "toolu_cut", "name": "write", "input": full}], "max_tokens"),
        "type": "message",
        "role": "assistant",
        "model": MODEL,
    }
    api.reply_events(cut_tool_input(sse_events(cut_turn), 0))
    api.reply(reply([{"type": "tool_use", "id": "toolu_ok", "name": "write", "input": full}], "tool_use"))
    api.reply(ANSWER)
    runner = make_runner(kind, model, on_text=lambda _: None, max_tokens=1000)

    result = await drive(runner)

    assert result.status == "done", result.error
    assert [r["max_tokens"] for r in api.requests] == [1000, 2000, 2000]
    finished = [
        e.data for e in (await settled(runner.store.load_events(result.run_id))) if e.type == ev.ToolFinished.kind
    ]
    assert [(f["call_id"], f["content"]) for f in finished] == [("toolu_ok", "wrote 40 characters to a.txt")]


class SyncOnlyStreaming:
    """A model that streams but cannot await: the async driver runs it in a thread."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.inner = ScriptedModel(script)

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self.inner.complete(request)

    def stream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        return self.inner.stream(request, on_text)


def test_the_async_driver_streams_a_sync_only_model_in_a_thread() -> None:
    pieces: list[str] = []
    runner = AsyncRunner(Agent(model=SyncOnlyStreaming([TWO_READS, ANSWER]), tools=[read]), on_text=pieces.append)
    result = asyncio.run(runner.run("Read a and b"))
    assert result.status == "done"
    assert "".join(pieces) == "Reading both.Both files hold their contents."


# The CLI -------------------------------------------------------------------------------------
def spawn(tmp_path: Path, api: FakeMessagesAPI, *args: str) -> pexpect.spawn:
    child = spawn_tether(
        tmp_path, "run", *args, "--model", MODEL, "--db", f"sqlite:///{tmp_path / 'r.db'}", env=fake_api_env(api)
    )
    child.logfile_read = io.StringIO()
    return child


def finish(child: pexpect.spawn) -> tuple[int | None, str, str]:
    """Exit status, the raw screen stream and its text."""
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    log = child.logfile_read
    assert isinstance(log, io.StringIO)
    return child.exitstatus, log.getvalue(), screen_text(log.getvalue())


@pytest.mark.slow
def test_the_cli_in_a_terminal_shows_the_answer_while_it_is_written(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.reply(REPLIES["text"])
    child = spawn(tmp_path, api, "Greet me")
    child.expect("thinking · step 1 · calling the model")
    child.expect("Hello there, this\r")  # a frame of the live view holding half the answer
    child.expect("model  Hello there, this answer arrives word by word.")  # then the committed summary
    status, shown, text = finish(child)
    assert status == 0
    assert api.requests[0]["stream"] is True
    assert "status: done" in text
    assert "1 model call(s), 0 tool call(s); tokens in 11, out 22, cache write 33, cache read 44" in text
    assert shown.rfind("\x1b[?25l") < shown.rfind("\x1b[?25h")  # the cursor is back


@pytest.mark.slow
def test_the_cli_asks_again_unstreamed_when_a_stream_breaks_midway(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.reply_events([*events_of("text")[:6], error_event("overloaded_error", "Overloaded")])
    api.reply(ANSWER)
    child = spawn(tmp_path, api, "Greet me")
    child.expect("Hello there,")
    status, _, text = finish(child)
    assert status == 0, text
    assert "Both files hold their contents." in text
    assert [r.get("stream") for r in api.requests] == [True, None]


@pytest.mark.slow
def test_the_cli_reports_a_failure_mid_stream_and_resume_finishes_the_run(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.reply_events([*events_of("text")[:6], error_event("overloaded_error", "Overloaded")])
    for _ in range(5):  # the unstreamed call asked again fails too, the SDK's 4 retries included
        api.fail(529, "Overloaded", headers={"retry-after-ms": "10"})
    child = spawn(tmp_path, api, "Greet me")
    child.expect("Hello there,")
    status, _, text = finish(child)
    assert status == 1
    assert "Anthropic API error 529: Overloaded" in text
    assert "resume the run to try again" in text

    api.reply(ANSWER)
    run_id = re.search(r"run (run_\w+)", text)
    assert run_id is not None, text
    resumed = run_tether(
        tmp_path, "resume", run_id[1], "--json", "--db", f"sqlite:///{tmp_path / 'r.db'}", env=fake_api_env(api)
    )
    assert resumed.returncode == 0, resumed
    assert resumed.data["output"] == "Both files hold their contents."


@pytest.mark.slow
@pytest.mark.parametrize("json_flag", [True, False])
def test_the_cli_off_a_terminal_does_not_stream(api: FakeMessagesAPI, tmp_path: Path, json_flag: bool) -> None:
    api.reply(REPLIES["text"])
    args = ["run", "Greet me", "--model", MODEL, "--db", f"sqlite:///{tmp_path / 'r.db'}"]
    done = run_tether(tmp_path, *args, *(["--json"] if json_flag else []), env=fake_api_env(api))
    assert done.returncode == 0, done
    assert "stream" not in api.requests[0]
    assert "\x1b" not in done.stdout
    if json_flag:
        assert done.data["output"] == "Hello there, this answer arrives word by word."  # one JSON object, only
    else:
        assert "model  Hello there, this answer arrives word by word." in done.stdout
