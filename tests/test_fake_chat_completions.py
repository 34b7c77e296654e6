"""Prove FakeChatCompletionsAPI behaves like a strict Chat Completions server, using the real openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import openai  # noqa: TID251 - the fake must be proven against the real client
import pytest
from openai.types.chat import (  # noqa: TID251 - the client's own request types
    ChatCompletionAssistantMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)

from tether.testing import FakeChatCompletionsAPI, validate_chat_request
from tether.testing.fake_chat_completions import stream_chunks

MODEL = "gpt-test"
USER: ChatCompletionUserMessageParam = {"role": "user", "content": "hi"}
TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture
def api(chat_api: FakeChatCompletionsAPI) -> FakeChatCompletionsAPI:
    return chat_api


@pytest.fixture(scope="module")
def client(fake_chat_server: FakeChatCompletionsAPI) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake_chat_server.url, api_key="k", max_retries=0) as c:
        yield c


def call(
    call_id: str, name: str = "lookup", arguments: str = '{"key": "a"}'
) -> ChatCompletionMessageFunctionToolCallParam:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def asked(*ids: str) -> ChatCompletionAssistantMessageParam:
    return {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}


def answer(call_id: str, content: str = "ok") -> ChatCompletionToolMessageParam:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# Answers ------------------------------------------------------------------------------------
def test_a_text_reply_reaches_the_client_with_defaults(api: FakeChatCompletionsAPI, client: openai.OpenAI) -> None:
    api.reply_text("Hello.", usage={"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 4}})

    completion = client.chat.completions.create(model=MODEL, messages=[USER])

    assert completion.id == "chatcmpl-fake-1"
    assert completion.model == MODEL
    assert completion.choices[0].message.content == "Hello."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        12,
        5,
        17,
    )
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 4
    assert api.requests == [{"model": MODEL, "messages": [USER]}]
    assert api.paths == ["/v1/chat/completions"]


def test_tool_calls_reach_the_client_and_their_answers_are_accepted(
    api: FakeChatCompletionsAPI, client: openai.OpenAI
) -> None:
    ids = api.reply_tool_calls(("lookup", {"key": "a"}), ("lookup", {"key": "b"}, "call_b"))
    api.reply_text("Both found.")

    first = client.chat.completions.create(model=MODEL, messages=[USER], tools=[TOOL])
    calls = first.choices[0].message.tool_calls or []
    reply = cast("ChatCompletionAssistantMessageParam", first.choices[0].message.model_dump(exclude_none=True))
    history: list[ChatCompletionMessageParam] = [USER, reply, *(answer(c.id) for c in calls)]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[TOOL])

    assert ids == ["call_fake_1", "call_b"]
    assert [c.id for c in calls] == ids
    assert [json.loads(c.function.arguments) for c in calls] == [{"key": "a"}, {"key": "b"}]  # type: ignore[union-attr]
    assert first.choices[0].finish_reason == "tool_calls"
    assert second.choices[0].message.content == "Both found."


def test_a_stream_rebuilds_the_same_completion(api: FakeChatCompletionsAPI, client: openai.OpenAI) -> None:
    api.reply_tool_calls(("lookup", {"key": "a long value"}), text="Let me look.", usage={"prompt_tokens": 30})

    stream = client.chat.completions.create(
        model=MODEL,
        messages=[USER],
        tools=[TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(
        (d.function.arguments or "")
        for c in chunks
        if c.choices
        for d in c.choices[0].delta.tool_calls or []
        if d.function
    )
    assert text == "Let me look."
    assert json.loads(arguments) == {"key": "a long value"}
    assert len([c for c in chunks if c.choices and c.choices[0].delta.tool_calls]) > 2  # arguments come in pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 30


def test_stream_chunks_without_usage_has_no_usage_chunk() -> None:
    completion = {"id": "c", "model": "m", "choices": [{"message": {"content": "a b"}, "finish_reason": "stop"}]}

    chunks = stream_chunks(completion)

    assert all("usage" not in chunk for chunk in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "a b"


def test_an_error_chunk_mid_stream_is_an_api_error(api: FakeChatCompletionsAPI, client: openai.OpenAI) -> None:
    api.reply_chunks([{"error": {"message": "The server had an error", "type": "server_error"}}])

    with pytest.raises(openai.APIError, match="The server had an error"):
        list(client.chat.completions.create(model=MODEL, messages=[USER], stream=True))


# Errors -------------------------------------------------------------------------------------
def test_fail_answers_with_the_apis_error_shape(api: FakeChatCompletionsAPI, client: openai.OpenAI) -> None:
    api.fail(
        400, "This model's maximum context length is 8192 tokens.", code="context_length_exceeded", param="messages"
    )

    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=[USER])

    assert raised.value.code == "context_length_exceeded"
    assert raised.value.param == "messages"
    assert raised.value.body == {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }


def test_429_is_retried_by_the_client(api: FakeChatCompletionsAPI, fake_chat_server: FakeChatCompletionsAPI) -> None:
    api.fail(429, "Rate limit reached")
    api.reply_text("made it")

    with openai.OpenAI(base_url=fake_chat_server.url, api_key="k", max_retries=1) as retrying:
        completion = retrying.chat.completions.create(model=MODEL, messages=[USER])

    assert completion.choices[0].message.content == "made it"
    assert len(api.requests) == 2


def test_no_key_is_a_401(api: FakeChatCompletionsAPI, fake_chat_server: FakeChatCompletionsAPI) -> None:
    with (
        openai.OpenAI(
            base_url=fake_chat_server.url, api_key="k", max_retries=0, default_headers={"Authorization": ""}
        ) as c,
        pytest.raises(openai.AuthenticationError),
    ):
        c.chat.completions.create(model=MODEL, messages=[USER])


def test_a_used_up_script_is_a_500(api: FakeChatCompletionsAPI, client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError, match="no scripted reply left"):
        client.chat.completions.create(model=MODEL, messages=[USER])


def test_an_invalid_request_is_a_400_and_consumes_nothing(api: FakeChatCompletionsAPI, client: openai.OpenAI) -> None:
    api.reply_text("kept")

    with pytest.raises(openai.BadRequestError, match="did not have response messages: call_1"):
        client.chat.completions.create(model=MODEL, messages=[USER, asked("call_1")])

    assert api.pending == 1


# What a strict server refuses ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([USER, asked("c1")], "did not have response messages: c1"),
        ([USER, asked("c1", "c2"), answer("c1")], "did not have response messages: c2"),
        ([USER, asked("c1"), USER, answer("c1")], "did not have response messages: c1"),
        ([USER, answer("c1")], "must be a response to a preceding message with 'tool_calls'"),
        ([USER, asked("c1"), answer("c2")], "Unknown tool_call_id 'c2'"),
        ([USER, asked("c1"), answer("c1"), answer("c1")], "Unknown tool_call_id 'c1' (it was answered already)"),
        ([USER, asked("c1"), answer("c1"), asked("c1"), answer("c1")], "duplicate tool call id 'c1'"),
        ([USER, {"role": "assistant", "content": None}], "expected a string, got null"),
        ([{"role": "robot", "content": "x"}], "Invalid value: 'robot'"),
        (
            [{"role": "user", "content": "x", "tool_call_id": "c"}],
            "Unrecognized request argument supplied: messages[0].tool_call_id",
        ),
        ([{"role": "user"}], "Missing required parameter: 'messages[0].content'"),
        ([{"role": "user", "content": [{"type": "tool_result", "text": "x"}]}], "'messages[0].content[0].type'"),
        (
            [USER, {"role": "assistant", "content": None, "tool_calls": [call("c", arguments="{bad")]}],
            "expected a JSON object",
        ),
        ([], "empty array"),
    ],
)
def test_the_conversation_must_be_in_order_paired_and_well_roled(messages: list[Any], problem: str) -> None:
    error = validate_chat_request({"model": MODEL, "messages": messages})

    assert error is not None
    assert problem in error


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"max_tokens": 10, "max_completion_tokens": 10}, "cannot both be set"),
        ({"temperature": 3}, "'temperature': number must be between 0 and 2"),
        ({"top_p": -1}, "'top_p'"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "maximum length 4"),
        ({"stream_options": {"include_usage": True}}, "only allowed when 'stream' is enabled"),
        ({"tool_choice": "auto"}, "only allowed when 'tools' are specified"),
        ({"tools": [TOOL], "tool_choice": "any"}, "Supported values are: 'none', 'auto', and 'required'"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}}, "no function named 'x'"),
        ({"parallel_tool_calls": False}, "only allowed when 'tools' are specified"),
        ({"tools": [TOOL, TOOL]}, "duplicate function name 'lookup'"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "does not match pattern"),
        ({"tools": [{"name": "lookup", "input_schema": {"type": "object"}}]}, "'tools[0].type'"),
        ({"system": "Be brief."}, "Unrecognized request argument supplied: system"),
    ],
)
def test_request_fields_are_checked(fields: dict[str, Any], problem: str) -> None:
    error = validate_chat_request({"model": MODEL, "messages": [USER], **fields})

    assert error is not None
    assert problem in error


def test_a_valid_conversation_passes() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        USER,
        {"role": "assistant", "content": "Looking.", "tool_calls": [call("c1"), call("c2")]},
        answer("c2", "two"),
        answer("c1", "one"),
        {"role": "user", "content": [{"type": "text", "text": "and?"}]},
        {"role": "assistant", "content": "Done."},
    ]
    body = {
        "model": MODEL,
        "messages": messages,
        "tools": [TOOL],
        "tool_choice": "required",
        "max_completion_tokens": 9,
    }

    assert validate_chat_request(body) is None
