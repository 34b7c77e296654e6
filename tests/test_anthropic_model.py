"""AnthropicModel on its own: one request in, tether types out, SDK errors translated."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Iterator
from typing import Any

import anthropic  # noqa: TID251 - checks the adapter chains the SDK's errors
import pytest

from support import closed_port, fake_api_model
from tether.errors import ModelError
from tether.models import ModelRequest, ModelResponse, Usage
from tether.models.anthropic import DEFAULT_MODEL, AnthropicModel, default_model_name
from tether.models.anthropic_client import translate_error
from tether.testing import FakeMessagesAPI, validate_messages_request

PROMPT: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}


@pytest.fixture
def model(api: FakeMessagesAPI) -> Iterator[AnthropicModel]:
    adapter = fake_api_model(api)
    yield adapter
    adapter.close()


def request(**overrides: Any) -> ModelRequest:
    fields: dict[str, Any] = {"model": "ignored-name", "messages": [PROMPT], "max_tokens": 321, **overrides}
    return ModelRequest(**fields)


def test_complete_returns_tether_types(api: FakeMessagesAPI, model: AnthropicModel) -> None:
    api.reply(
        {
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "k"}},
            ],
            "usage": {
                "input_tokens": 3,
                "output_tokens": 4,
                "cache_creation_input_tokens": 5,
                "cache_read_input_tokens": 6,
            },
        }
    )

    response = model.complete(request())

    assert isinstance(response, ModelResponse)
    assert response.stop_reason == "tool_use"
    assert response.usage == Usage(3, 4, 5, 6)
    assert response.model == "claude-test"
    assert response.id == "msg_fake_1"
    assert all(type(block) is dict for block in response.content)
    assert response.content[0]["text"] == "Checking."
    assert {k: response.content[1][k] for k in ("type", "id", "name", "input")} == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "lookup",
        "input": {"key": "k"},
    }


def test_request_shape(api: FakeMessagesAPI, model: AnthropicModel) -> None:
    api.reply_text("a")
    api.reply_text("b")
    tools = [{"name": "lookup", "description": "Look up.", "input_schema": {"type": "object", "properties": {}}}]

    model.complete(request())
    model.complete(request(system="Be brief.", tools=tools))

    bare, full = api.requests
    assert validate_messages_request(bare) is None
    assert validate_messages_request(full) is None
    assert bare["model"] == "claude-test"  # the adapter's name, not the request's
    assert bare["max_tokens"] == 321
    assert "system" not in bare
    assert "tools" not in bare
    assert full["system"] == "Be brief."
    assert full["tools"] == tools


def test_cache_breakpoint_does_not_touch_the_callers_messages(api: FakeMessagesAPI, model: AnthropicModel) -> None:
    api.reply_text("ok")
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    before = repr(messages)

    model.complete(request(messages=messages))

    assert repr(messages) == before
    assert api.requests[0]["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}


def test_refusal_stop_details_are_kept(api: FakeMessagesAPI, model: AnthropicModel) -> None:
    details = {"type": "refusal", "category": "bio", "explanation": "Not this."}
    api.reply({"content": [], "stop_reason": "refusal", "stop_details": details})

    response = model.complete(request())

    assert response.stop_reason == "refusal"
    assert response.stop_details == details


def test_model_name_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_MODEL", raising=False)
    assert default_model_name() == DEFAULT_MODEL
    assert AnthropicModel().name == DEFAULT_MODEL
    monkeypatch.setenv("TETHER_MODEL", "claude-from-env")
    assert AnthropicModel().name == "claude-from-env"
    assert AnthropicModel("claude-explicit").name == "claude-explicit"


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (403, False), (404, False), (413, False), (429, True), (500, True), (529, True)],
)
def test_api_errors_become_model_errors(
    api: FakeMessagesAPI, model: AnthropicModel, status: int, retryable: bool
) -> None:
    api.fail(status, f"the API said no ({status})")

    with pytest.raises(ModelError) as caught:
        model.complete(request())

    assert str(caught.value) == f"Anthropic API error {status}: the API said no ({status})"
    assert caught.value.status == status
    assert caught.value.retryable is retryable
    assert isinstance(caught.value.__cause__, anthropic.APIStatusError)


def test_prompt_too_long_is_a_context_window_error(api: FakeMessagesAPI, model: AnthropicModel) -> None:
    api.fail(400, "prompt is too long: 250000 tokens > 200000 maximum")

    with pytest.raises(ModelError) as caught:
        model.complete(request())

    assert str(caught.value) == "context window exceeded: prompt is too long: 250000 tokens > 200000 maximum"
    assert caught.value.status == 400
    assert caught.value.retryable is False


def test_connection_error_is_retryable_and_names_the_url_it_tried() -> None:
    port = closed_port()
    adapter = AnthropicModel("claude-test", api_key="k", base_url=f"http://who:pw@127.0.0.1:{port}", max_retries=0)

    with pytest.raises(ModelError) as caught:
        adapter.complete(request())

    assert str(caught.value).startswith(f"cannot reach the Anthropic API at http://127.0.0.1:{port}/v1/messages: ")
    assert "pw" not in str(caught.value)
    assert caught.value.status is None
    assert caught.value.retryable is True
    assert isinstance(caught.value.__cause__, anthropic.APIConnectionError)


def test_other_sdk_errors_are_wrapped() -> None:
    error = translate_error(anthropic.AnthropicError("something odd"))

    assert str(error) == "Anthropic client error: something odd"
    assert error.status is None
    assert error.retryable is False


async def test_acomplete_uses_the_async_client(api: FakeMessagesAPI) -> None:
    api.reply_text("async hello")
    adapter = AnthropicModel("claude-test", api_key="k", base_url=api.url, max_retries=0)

    response = await adapter.acomplete(request())

    assert response.content[0]["text"] == "async hello"
    assert api.headers[0].get("x-stainless-async", "").startswith("async")
    assert adapter._async_client is not None
    await adapter._async_client.close()


def test_acomplete_works_from_one_event_loop_after_another(api: FakeMessagesAPI) -> None:
    adapter = AnthropicModel("claude-test", api_key="k", base_url=api.url, max_retries=0)
    api.reply_text("first loop")
    api.reply_text("second loop")
    answers: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the stale transport of the dead loop
        for _ in range(2):
            try:
                answers.append(asyncio.run(adapter.acomplete(request())).content[0]["text"])
            except ModelError as error:  # kept as text: a live traceback would keep the transport alive
                answers.append(f"ModelError: {error}")
        adapter._async_client = None
        gc.collect()

    assert answers == ["first loop", "second loop"]
