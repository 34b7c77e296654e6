"""The Chat Completions format both ways, without the SDK: history out, one assistant turn in."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tether.errors import ModelError
from tether.models import Usage
from tether.models.chat_format import (
    ChunkFolder,
    UnsendableBlock,
    chat_messages,
    chat_response,
    chat_tool_choice,
    chat_tools,
    chat_usage,
)
from tether.testing import validate_chat_request
from tether.testing.fake_chat_completions import stream_chunks

SOURCE = "the test server"


def completion(message: dict[str, Any], finish_reason: str | None = "stop", **fields: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "gpt-test",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
        **fields,
    }


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two lookups.", "signature": "sig"},
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "call_p", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_r", "name": "weather", "input": {"city": "Rome", "unit": None}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_p", "content": "21 degrees"},
            {"type": "tool_result", "tool_use_id": "call_r", "content": "Error: timed out", "is_error": True},
            {"type": "text", "text": "And tomorrow?"},
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]},
]


# Requests ------------------------------------------------------------------------------------
def test_the_history_maps_to_chat_messages_exactly() -> None:
    messages = chat_messages("Be brief.", HISTORY)

    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                call("call_p", "weather", '{"city": "Paris"}'),
                call("call_r", "weather", '{"city": "Rome", "unit": null}'),
            ],
        },
        {"role": "tool", "tool_call_id": "call_p", "content": "21 degrees"},
        {"role": "tool", "tool_call_id": "call_r", "content": "Error: timed out"},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert validate_chat_request({"model": "m", "messages": messages}) is None


def test_a_turn_of_only_calls_has_null_content_and_an_empty_turn_an_empty_string() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "t", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
        },
        {"role": "assistant", "content": []},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
    ]

    messages = chat_messages(None, history)

    assert messages == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("c", "t", "{}")]},
        {"role": "tool", "tool_call_id": "c", "content": "ab"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
    ]
    assert validate_chat_request({"model": "m", "messages": messages}) is None


def test_an_error_result_says_so_in_its_text_since_a_tool_message_has_no_flag() -> None:
    results = [
        {"type": "tool_result", "tool_use_id": "a", "content": "disk full", "is_error": True},
        {"type": "tool_result", "tool_use_id": "b", "content": "Error (retryable): timed out", "is_error": True},
    ]
    asked = [{"type": "tool_use", "id": i, "name": "t", "input": {}} for i in "ab"]

    messages = chat_messages(
        None,
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": asked},
            {"role": "user", "content": results},
        ],
    )

    assert [m["content"] for m in messages[2:]] == ["Error: disk full", "Error (retryable): timed out"]


def test_images_become_image_urls() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    linked = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}

    (message,) = chat_messages(None, [{"role": "user", "content": [{"type": "text", "text": "see"}, image, linked]}])

    assert message["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]},
        {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": [{"type": "image"}]}]},
    ],
)
def test_a_block_with_no_place_in_chat_completions_is_refused_clearly(message: dict[str, Any]) -> None:
    with pytest.raises(UnsendableBlock, match="cannot be sent to a Chat Completions API") as raised:
        chat_messages(None, [message])

    assert raised.value.retryable is False


def test_tools_become_functions() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

    tools = chat_tools(
        [{"name": "weather", "description": "Get it.", "input_schema": schema}, {"name": "ping", "description": ""}]
    )

    assert tools == [
        {"type": "function", "function": {"name": "weather", "description": "Get it.", "parameters": schema}},
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    ]


@pytest.mark.parametrize(
    ("choice", "fields"),
    [
        (None, {}),
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "tool", "name": "weather"}, {"tool_choice": {"type": "function", "function": {"name": "weather"}}}),
        ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required", "parallel_tool_calls": False}),
    ],
)
def test_tool_choice_maps(choice: dict[str, Any] | None, fields: dict[str, Any]) -> None:
    assert chat_tool_choice(choice) == fields


# Responses -----------------------------------------------------------------------------------
def test_a_prose_answer_is_one_text_block_ending_the_turn() -> None:
    response = chat_response(
        completion({"content": "Sunny."}, usage={"prompt_tokens": 9, "completion_tokens": 2}), source=SOURCE
    )

    assert response.content == [{"type": "text", "text": "Sunny."}]
    assert response.stop_reason == "end_turn"
    assert response.usage == Usage(9, 2)
    assert (response.id, response.model) == ("chatcmpl-1", "gpt-test")


def test_parallel_calls_become_tool_use_blocks_in_order() -> None:
    calls = [call("call_b", "weather", '{"city": "Rome"}'), call("call_a", "weather", "")]

    response = chat_response(completion({"content": "Both.", "tool_calls": calls}, "tool_calls"), source=SOURCE)

    assert response.stop_reason == "tool_use"
    assert response.content == [
        {"type": "text", "text": "Both."},
        {"type": "tool_use", "id": "call_b", "name": "weather", "input": {"city": "Rome"}},
        {"type": "tool_use", "id": "call_a", "name": "weather", "input": {}},
    ]


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("tool_calls", "tool_use"),
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        ("weird", "weird"),
        (None, None),
    ],
)
def test_finish_reasons_map_to_stop_reasons(finish: str | None, stop: str | None) -> None:
    assert chat_response(completion({"content": "x"}, finish), source=SOURCE).stop_reason == stop


def test_content_filter_is_a_refusal_with_its_reason() -> None:
    response = chat_response(completion({"content": None}, "content_filter"), source=SOURCE)

    assert response.stop_reason == "refusal"
    assert response.content == []
    assert response.stop_details == {
        "type": "content_filter",
        "explanation": "the provider's content filter stopped the answer",
    }


def test_a_refusal_is_a_refusal_with_its_text() -> None:
    response = chat_response(completion({"content": None, "refusal": "I can't help with that."}), source=SOURCE)

    assert response.stop_reason == "refusal"
    assert response.content == [{"type": "text", "text": "I can't help with that."}]


def test_a_call_cut_off_at_length_stays_last_so_the_engine_asks_again() -> None:
    calls = [call("c1", "write", '{"path": "a"}'), call("c2", "write", '{"path": "b", "cont')]

    response = chat_response(completion({"content": None, "tool_calls": calls}, "length"), source=SOURCE)

    assert response.stop_reason == "max_tokens"
    assert response.content[-1] == {"type": "tool_use", "id": "c2", "name": "write", "input": {}}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (completion({"content": None, "tool_calls": [call("c", "t", "{not json")]}, "tool_calls"), "not a JSON object"),
        (completion({"content": None, "tool_calls": [call("c", "t", "[1]")]}, "tool_calls"), "not a JSON object"),
        (completion({"content": None, "tool_calls": [call("", "t", "{}")]}, "tool_calls"), "at least 1 character"),
        (completion({"content": None, "tool_calls": [call("c", "t", "{}"), call("c", "t", "{}")]}), "used by another"),
        (
            completion({"content": None, "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}),
            "a tool call needs a function",
        ),
        ({"id": "chatcmpl-9", "choices": []}, "a completion needs a choice with a message"),
        ({"choices": [{"message": "hi"}]}, "a completion needs a choice with a message"),
    ],
)
def test_a_malformed_completion_is_a_transient_error_naming_the_problem(data: dict[str, Any], problem: str) -> None:
    with pytest.raises(ModelError, match=problem) as raised:
        chat_response(data, source=SOURCE)

    assert raised.value.retryable
    assert str(raised.value).startswith(f"{SOURCE} sent a malformed response")


def test_cached_prompt_tokens_are_cache_reads_not_input() -> None:
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 50,
        "prompt_tokens_details": {"cached_tokens": 700, "cache_write_tokens": 200},
    }

    assert chat_usage(usage) == Usage(
        input_tokens=100, output_tokens=50, cache_creation_input_tokens=200, cache_read_input_tokens=700
    )
    assert chat_usage(None) == Usage()
    assert chat_usage({"prompt_tokens": 5, "prompt_tokens_details": None}) == Usage(5)


# Streams -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [
        completion({"content": "It is sunny in Paris today."}, usage={"prompt_tokens": 7, "completion_tokens": 3}),
        completion(
            {
                "content": "Two.",
                "tool_calls": [call("a", "weather", '{"city": "Paris, France"}'), call("b", "ping", "{}")],
            },
            "tool_calls",
            usage={"prompt_tokens": 7, "completion_tokens": 3},
        ),
        completion({"content": None, "refusal": "No."}, usage={"prompt_tokens": 7, "completion_tokens": 3}),
    ],
)
def test_folded_chunks_give_what_the_unstreamed_call_gives(data: dict[str, Any]) -> None:
    folder = ChunkFolder()
    told = [folder.fold(chunk) for chunk in stream_chunks(data, include_usage=True)]

    assert folder.finished
    assert "".join(told) == (data["choices"][0]["message"]["content"] or "")
    assert chat_response(folder.result(), source=SOURCE) == chat_response(data, source=SOURCE)
    assert json.loads(json.dumps(folder.result()))["usage"] == data["usage"]


def test_a_stream_without_a_finish_reason_is_not_finished() -> None:
    folder = ChunkFolder()
    for chunk in stream_chunks(completion({"content": "half"}))[:-1]:
        folder.fold(chunk)

    assert folder.started
    assert not folder.finished
