"""OpenAIModel on its own, through the real openai client: one request in, tether types out, errors translated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai  # noqa: TID251 - checks the adapter chains the SDK's errors
import pytest

from support import closed_port
from tether.errors import ModelError
from tether.models import ModelRequest, ModelResponse, Usage
from tether.models.openai import OpenAIModel
from tether.models.openai_client import translate_error
from tether.testing import FakeChatCompletionsAPI, validate_chat_request
from tether.testing.fake_chat_completions import stream_chunks

PROMPT: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
TOOLS = [{"name": "lookup", "description": "Look up.", "input_schema": {"type": "object", "properties": {}}}]


@pytest.fixture
def api(chat_api: FakeChatCompletionsAPI) -> FakeChatCompletionsAPI:
    return chat_api


@pytest.fixture
def model(api: FakeChatCompletionsAPI) -> Iterator[OpenAIModel]:
    adapter = OpenAIModel("gpt-test", api_key="sk-test-secret", base_url=api.url, max_retries=0)
    yield adapter
    adapter.close()


def request(**overrides: Any) -> ModelRequest:
    fields: dict[str, Any] = {"model": "ignored-name", "messages": [PROMPT], "max_tokens": 321, **overrides}
    return ModelRequest(**fields)


def test_complete_returns_tether_types(api: FakeChatCompletionsAPI, model: OpenAIModel) -> None:
    api.reply_tool_calls(
        ("lookup", {"key": "k"}, "call_1"),
        text="Checking.",
        usage={"prompt_tokens": 30, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 20}},
    )

    response = model.complete(request())

    assert isinstance(response, ModelResponse)
    assert response.stop_reason == "tool_use"
    assert response.usage == Usage(10, 4, 0, 20)
    assert response.model == "gpt-test"
    assert response.id == "chatcmpl-fake-1"
    assert all(type(block) is dict for block in response.content)
    assert response.content == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"key": "k"}},
    ]


def test_request_shape(api: FakeChatCompletionsAPI, model: OpenAIModel) -> None:
    api.reply_text("a")
    api.reply_text("b")

    model.complete(request())
    model.complete(request(system="Be brief.", tools=TOOLS, tool_choice={"type": "none"}))

    bare, full = api.requests
    assert validate_chat_request(bare) is None
    assert validate_chat_request(full) is None
    assert bare == {"model": "gpt-test", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 321}
    assert full["messages"][0] == {"role": "system", "content": "Be brief."}
    assert full["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look up.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    assert full["tool_choice"] == "none"
    assert api.headers[0]["authorization"] == "Bearer sk-test-secret"


def test_max_tokens_field_can_be_the_older_name(api: FakeChatCompletionsAPI) -> None:
    api.reply_text("a")
    adapter = OpenAIModel("local", api_key="k", base_url=api.url, max_retries=0, max_tokens_field="max_tokens")

    adapter.complete(request())

    assert api.requests[0]["max_tokens"] == 321
    assert "max_completion_tokens" not in api.requests[0]


def test_key_and_base_url_come_from_the_environment(
    api: FakeChatCompletionsAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", api.url)
    api.reply_text("from env")

    response = OpenAIModel("gpt-test", max_retries=0).complete(request())

    assert response.content == [{"type": "text", "text": "from env"}]
    assert api.headers[0]["authorization"] == "Bearer sk-from-env"


def test_missing_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)

    with pytest.raises(ModelError, match="no OpenAI credentials: pass api_key= or set OPENAI_API_KEY") as caught:
        OpenAIModel("gpt-test", base_url=f"http://127.0.0.1:{closed_port()}/v1").complete(request())

    assert caught.value.retryable  # the run stays resumable: set the key, resume, nothing is lost


# Streaming -----------------------------------------------------------------------------------
def test_stream_tells_the_text_and_returns_what_complete_returns(
    api: FakeChatCompletionsAPI, model: OpenAIModel
) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 6}
    api.reply_tool_calls(("lookup", {"key": "a long key"}, "call_9"), text="Let me look that up.", usage=usage)
    api.reply_tool_calls(("lookup", {"key": "a long key"}, "call_9"), text="Let me look that up.", usage=usage)
    told: list[str] = []

    streamed = model.stream(request(tools=TOOLS), told.append)
    plain = model.complete(request(tools=TOOLS))

    assert "".join(told) == "Let me look that up."
    assert len(told) > 1
    assert (streamed.content, streamed.stop_reason, streamed.usage) == (plain.content, plain.stop_reason, plain.usage)
    assert api.requests[0]["stream"] is True
    assert api.requests[0]["stream_options"] == {"include_usage": True}
    assert validate_chat_request(api.requests[0]) is None


def test_a_stream_cut_before_its_finish_is_asked_again_unstreamed(
    api: FakeChatCompletionsAPI, model: OpenAIModel
) -> None:
    chunks = stream_chunks(
        {"id": "c", "model": "m", "choices": [{"message": {"content": "half an"}, "finish_reason": "stop"}]}
    )
    api.reply_chunks(chunks[:2], drop_connection=True)
    api.reply_text("whole answer")

    response = model.stream(request(), lambda _: None)

    assert response.content == [{"type": "text", "text": "whole answer"}]
    assert [body.get("stream") for body in api.requests] == [True, None]


def test_an_error_chunk_mid_stream_is_asked_again_unstreamed_when_transient(
    api: FakeChatCompletionsAPI, model: OpenAIModel
) -> None:
    first = stream_chunks(
        {"id": "c", "model": "m", "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}
    )[0]
    api.reply_chunks([first, {"error": {"message": "The server had an error", "type": "server_error"}}])
    api.reply_text("recovered")

    assert model.stream(request(), lambda _: None).content == [{"type": "text", "text": "recovered"}]


def test_without_fallback_a_broken_stream_fails_transiently(api: FakeChatCompletionsAPI) -> None:
    adapter = OpenAIModel("gpt-test", api_key="k", base_url=api.url, max_retries=0, stream_fallback=False)
    first = stream_chunks(
        {"id": "c", "model": "m", "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}
    )[0]
    api.reply_chunks([first, {"error": {"message": "The server had an error", "type": "server_error"}}])

    with pytest.raises(ModelError, match=r"mid-stream \(server_error\): The server had an error") as caught:
        adapter.stream(request(), lambda _: None)

    assert caught.value.retryable


async def test_acomplete_and_astream_use_the_async_client(api: FakeChatCompletionsAPI) -> None:
    adapter = OpenAIModel("gpt-test", api_key="k", base_url=api.url, max_retries=0)
    api.reply_text("async hello")
    api.reply_text("async stream")
    told: list[str] = []

    first = await adapter.acomplete(request())
    second = await adapter.astream(request(), told.append)

    assert first.content == [{"type": "text", "text": "async hello"}]
    assert second.content == [{"type": "text", "text": "async stream"}]
    assert "".join(told) == "async stream"
    assert api.headers[0].get("x-stainless-async", "").startswith("async")
    await adapter.aclose()


# Errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (403, False), (404, False), (429, True), (500, True), (503, True)],
)
def test_api_errors_become_model_errors(
    api: FakeChatCompletionsAPI, model: OpenAIModel, status: int, retryable: bool
) -> None:
    api.fail(status, f"the API said no ({status})")

    with pytest.raises(ModelError) as caught:
        model.complete(request())

    assert str(caught.value) == f"OpenAI API error {status}: the API said no ({status})"
    assert caught.value.status == status
    assert caught.value.retryable is retryable
    assert isinstance(caught.value.__cause__, openai.APIStatusError)


def test_context_length_exceeded_is_a_context_window_error(api: FakeChatCompletionsAPI, model: OpenAIModel) -> None:
    api.fail(400, "This model's maximum context length is 128000 tokens.", code="context_length_exceeded")

    with pytest.raises(ModelError) as caught:
        model.complete(request())

    assert str(caught.value) == "context window exceeded: This model's maximum context length is 128000 tokens."
    assert caught.value.retryable is False


def test_the_key_an_error_echoes_is_scrubbed(api: FakeChatCompletionsAPI, model: OpenAIModel) -> None:
    api.fail(401, "Incorrect API key provided: sk-test-secret.")

    with pytest.raises(ModelError) as caught:
        model.complete(request())

    assert "sk-test-secret" not in str(caught.value)


def test_retry_after_is_honoured_capped_and_reported(api: FakeChatCompletionsAPI) -> None:
    waits: list[tuple[float, int]] = []
    adapter = OpenAIModel(
        "gpt-test",
        api_key="k",
        base_url=api.url,
        max_retries=2,
        max_retry_wait=0.01,
        on_retry_wait=lambda wait, retry: waits.append((wait, retry)),
    )
    api.fail(429, "Rate limit reached", headers={"retry-after": "30", "retry-after-ms": "30000"})
    api.reply_text("made it")

    response = adapter.complete(request())

    assert response.content == [{"type": "text", "text": "made it"}]
    assert waits == [(0.01, 1)]
    assert response.retry_waits == (0.01,)
    adapter.close()


def test_exhausted_retries_say_how_long_they_waited(api: FakeChatCompletionsAPI) -> None:
    adapter = OpenAIModel("gpt-test", api_key="k", base_url=api.url, max_retries=1, max_retry_wait=0.01)
    api.fail(500, "boom")
    api.fail(500, "boom again")

    with pytest.raises(ModelError) as caught:
        adapter.complete(request())

    assert str(caught.value) == "OpenAI API error 500: boom again"
    assert caught.value.retryable
    assert caught.value.retry_waits == (0.001,)
    adapter.close()


def test_a_malformed_completion_is_a_transient_error(api: FakeChatCompletionsAPI, model: OpenAIModel) -> None:
    api.reply_tool_calls(("lookup", "{not json", "call_1"))

    with pytest.raises(ModelError, match="the OpenAI-compatible API sent a malformed response") as caught:
        model.complete(request())

    assert caught.value.retryable


@pytest.mark.parametrize(
    ("depth", "named"),
    [(150, "nested more than 100 levels deep"), (3500, "arguments: nested too deeply to read")],
)
def test_arguments_nested_too_deeply_are_a_malformed_completion(
    api: FakeChatCompletionsAPI, model: OpenAIModel, depth: int, named: str
) -> None:
    arguments = '{"value": ' + '{"a":' * depth + "1" + "}" * depth + "}"  # text: the completion itself is flat
    api.reply_tool_calls(("lookup", arguments, "call_1"))

    with pytest.raises(ModelError, match="the OpenAI-compatible API sent a malformed response") as caught:
        model.complete(request())

    assert named in str(caught.value)
    assert caught.value.retryable


def test_connection_error_is_retryable_and_names_the_url_it_tried() -> None:
    port = closed_port()
    adapter = OpenAIModel("gpt-test", api_key="k", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)

    with pytest.raises(ModelError) as caught:
        adapter.complete(request())

    named = f"cannot reach the OpenAI-compatible API at http://127.0.0.1:{port}/v1/chat/completions: "
    assert str(caught.value).startswith(named)
    assert caught.value.retryable is True
    assert isinstance(caught.value.__cause__, openai.APIConnectionError)


def test_other_sdk_errors_are_wrapped() -> None:
    error = translate_error(openai.OpenAIError("something odd"))

    assert str(error) == "OpenAI client error: something odd"
    assert error.retryable is False
