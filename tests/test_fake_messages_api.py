"""Prove FakeMessagesAPI behaves like the real Messages API, using the real anthropic client."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic  # noqa: TID251 - the fake must be proven against the real client
import httpx2
import pytest
from anthropic.types import Message, MessageParam, TextBlock, ToolUseBlock  # noqa: TID251 - see above

from tether.testing.fake_messages_api import FakeMessagesAPI, error_event, sse_events, validate_messages_request

MODEL = "claude-test-model"
USER_HI: dict[str, Any] = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def client(fake_api_server: FakeMessagesAPI) -> Iterator[anthropic.Anthropic]:
    # One client per module: constructing a client costs ~30 ms, more than a whole test.
    with anthropic.Anthropic(base_url=fake_api_server.url, api_key="k", max_retries=0) as c:
        yield c


def _create(client: anthropic.Anthropic, **params: Any) -> Message:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "messages": [USER_HI], **params}
    message: Message = client.messages.create(**body)
    return message


def _text(message: Message, index: int = 0) -> str:
    block = message.content[index]
    assert isinstance(block, TextBlock)
    return block.text


def _tool_use(tool_id: str, name: str = "read_file") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"path": "a"}}


def _tool_result(tool_id: str, content: Any = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content}


def _tool(name: str = "read_file", **extra: Any) -> dict[str, Any]:
    return {"name": name, "input_schema": {"type": "object", "properties": {}}, **extra}


def _raw_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url + "/v1/messages", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


# --------------------------------------------------------------------------- happy path


def test_text_reply_parses_into_message_with_defaults(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    api.reply({"content": [{"type": "text", "text": "Hello!"}]})

    message = _create(client)

    assert isinstance(message, Message)
    assert message.id == "msg_fake_1"
    assert message.model == MODEL
    assert message.role == "assistant"
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert message.content[0].type == "text"
    assert _text(message) == "Hello!"
    assert message.usage.input_tokens == 10
    assert message.usage.output_tokens == 5
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens == 0
    assert message._request_id is not None
    assert message._request_id.startswith("req_fake_")


def test_requests_and_headers_are_recorded(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    api.reply_text("one")
    api.reply_text("two", usage={"input_tokens": 7})

    _create(client, system="be brief")
    second = _create(client, messages=[{"role": "user", "content": "again"}])

    assert second.usage.input_tokens == 7
    assert second.usage.output_tokens == 5  # missing usage keys still get defaults
    assert [r["messages"][0]["content"] for r in api.requests] == ["hi", "again"]
    assert api.requests[0]["system"] == "be brief"
    assert api.paths == ["/v1/messages", "/v1/messages"]
    assert all(h["anthropic-version"] for h in api.headers)
    assert api.headers[0]["authorization"] == "Bearer k"
    assert api.pending == 0


def test_tool_use_round_trip_is_accepted(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    tool_id = api.reply_tool_use("read_file", {"path": "a.txt"}, text="Let me look.")
    api.reply_text("done")

    first = _create(client, tools=[_tool()])
    assert first.stop_reason == "tool_use"
    call = first.content[1]
    assert isinstance(call, ToolUseBlock)
    assert call.id == tool_id
    assert call.input == {"path": "a.txt"}

    history = [
        USER_HI,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                _tool_result(tool_id, [{"type": "text", "text": "x"}]),
                {"type": "text", "text": "go"},
            ],
        },
    ]
    assert _text(_create(client, tools=[_tool()], messages=history)) == "done"


def test_reply_with_computes_reply_from_request(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    def echo(request: dict[str, Any]) -> dict[str, Any]:
        last = request["messages"][-1]["content"]
        return {"content": [{"type": "text", "text": f"echo: {last}"}], "model": "other"}

    api.reply_with(echo)
    message = _create(client, messages=[{"role": "user", "content": "ping"}])
    assert _text(message) == "echo: ping"
    assert message.model == "other"


def test_reply_with_that_raises_fails_loudly(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    def broken(request: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")

    api.reply_with(broken)
    with pytest.raises(anthropic.InternalServerError, match="RuntimeError: boom"):
        _create(client)


def test_reply_raw_serves_its_bytes_as_they_are(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    body = '{"id": "msg_raw", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": null}'
    params: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "messages": [USER_HI]}
    api.reply_raw(body)
    raw = client.messages.with_raw_response.create(**params)
    assert raw.http_response.content == body.encode()  # no defaults filled in
    api.reply_raw(body)
    refused = pytest.raises(anthropic.InternalServerError, match="a raw body was scripted for a streaming call")
    with refused, client.messages.stream(**params) as stream:
        stream.get_final_message()


def test_empty_queue_answers_500(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.InternalServerError, match="no scripted reply left") as info:
        _create(client)
    assert info.value.status_code == 500
    assert info.value.type == "api_error"


@pytest.mark.parametrize(
    "history",
    [
        pytest.param(
            [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("t1", "gone_tool")]},
                {"role": "user", "content": [_tool_result("t1")]},
            ],
            id="tool_use-of-tool-not-in-tools",
        ),
        pytest.param([USER_HI, {"role": "user", "content": "more"}], id="consecutive-user"),
        pytest.param([USER_HI, {"role": "assistant", "content": "The answer is ("}], id="prefill"),
        pytest.param([USER_HI, {"role": "assistant", "content": ""}], id="empty-final-assistant"),
        pytest.param(
            [{"role": "system", "content": [{"type": "text", "text": "rules"}]}, USER_HI],
            id="system-role-message",  # this API version accepts text-only system messages
        ),
        pytest.param(
            [
                USER_HI,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "xx"},
                        _tool_use("t1"),
                        _tool_use("t2"),
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        _tool_result("t2"),
                        {"type": "tool_result", "tool_use_id": "t1", "is_error": True},
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
            id="thinking-and-parallel-tools-answered-out-of-order",
        ),
    ],
)
def test_valid_histories_are_accepted(
    api: FakeMessagesAPI, client: anthropic.Anthropic, history: list[dict[str, Any]]
) -> None:
    api.reply_text("ok")
    assert _text(_create(client, messages=history)) == "ok"


def test_max_tokens_zero_is_accepted(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    # This API version documents max_tokens=0 as "only warm the prompt cache".
    api.reply({"content": [], "usage": {"output_tokens": 0}})
    assert _create(client, max_tokens=0).content == []


def test_four_cache_breakpoints_are_allowed(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    cc = {"type": "ephemeral"}
    api.reply_text("ok")
    _create(
        client,
        tools=[_tool(cache_control=cc)],
        system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": cc}]}],
        extra_body={"cache_control": cc},
    )
    assert api.pending == 0


# --------------------------------------------------------------------------- rejections

_CC = {"type": "ephemeral"}

INVALID: list[Any] = [
    pytest.param({"messages": []}, "messages: at least one message is required", id="no-messages"),
    pytest.param(
        {"max_tokens": -1},
        "max_tokens: Input should be greater than or equal to 0",
        id="negative-max-tokens",
    ),
    pytest.param(
        {"messages": [{"role": "tool", "content": "x"}]},
        "messages.0.role: Input should be 'user', 'assistant' or 'system'",
        id="bad-role",
    ),
    pytest.param(
        {"messages": [{"role": "system", "content": [_tool_result("t1")]}, USER_HI]},
        "messages.0.content.0.type: Input should be 'text'",
        id="system-message-non-text",
    ),
    pytest.param(
        {"messages": [{"role": "system", "content": "rules"}, {"role": "assistant", "content": "x"}]},
        'first message must use the "user" role',
        id="system-then-assistant",
    ),
    pytest.param(
        {"messages": [{"role": "assistant", "content": "x"}, USER_HI]},
        'first message must use the "user" role',
        id="first-not-user",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": ""}]},
        "messages.0: all messages must have non-empty content",
        id="empty-string-content",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": []}]},
        "messages.0: all messages must have non-empty content",
        id="empty-list-content",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
        "messages.0.content.0: text content blocks must be non-empty",
        id="empty-text-block",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": " \n"}]}]},
        "text content blocks must contain non-whitespace text",
        id="whitespace-text-block",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
        "messages.0.content.0: Input tag 'bogus' found using 'type'",
        id="unknown-block-type",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [_tool_use("t1")]}]},
        "messages.0.content.0: `tool_use` blocks can only be in `assistant` messages",
        id="tool-use-in-user",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f"}]},
                {"role": "user", "content": [_tool_result("t1")]},
            ]
        },
        "messages.1.content.0.input: Field required",
        id="tool-use-without-input",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": []}],
                },
                {"role": "user", "content": [_tool_result("t1")]},
            ]
        },
        "messages.1.content.0.input: Input should be a valid dictionary",
        id="tool-use-input-not-dict",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("t1")]},
                {"role": "user", "content": [_tool_result("t1")]},
                {"role": "assistant", "content": [_tool_use("t1")]},
                {"role": "user", "content": [_tool_result("t1")]},
            ]
        },
        "messages.3.content.0: `tool_use` ids must be unique",
        id="duplicate-tool-use-ids",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("toolu_a"), _tool_use("toolu_b")]},
                {"role": "user", "content": [_tool_result("toolu_a")]},
            ]
        },
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_b. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        id="missing-tool-result",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("toolu_a")]},
                {"role": "user", "content": "no results here"},
            ]
        },
        "without `tool_result` blocks immediately after: toolu_a",
        id="string-reply-to-tool-use",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("toolu_a")]},
                {"role": "assistant", "content": "more"},
            ]
        },
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_a",
        id="tool-use-followed-by-assistant",
    ),
    pytest.param(
        {"messages": [USER_HI, {"role": "assistant", "content": [_tool_use("toolu_a")]}]},
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_a",
        id="trailing-tool-use",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("toolu_a")]},
                {"role": "user", "content": [_tool_result("toolu_a"), _tool_result("toolu_x")]},
            ]
        },
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x. "
        "Each `tool_result` block must have a corresponding `tool_use` block in the previous "
        "message.",
        id="extra-tool-result",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [_tool_result("toolu_x")]}]},
        "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x",
        id="tool-result-without-tool-use",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("toolu_a")]},
                {"role": "user", "content": [_tool_result("toolu_a")]},
                {"role": "user", "content": [_tool_result("toolu_a")]},
            ]
        },
        "messages.3.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_a",
        id="tool-result-two-messages-later",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("toolu_a")]},
                {"role": "user", "content": [_tool_result("toolu_a"), _tool_result("toolu_a")]},
            ]
        },
        "messages.2.content.1: each `tool_use` must have a single result",
        id="duplicate-tool-result",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("toolu_a")]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "first"}, _tool_result("toolu_a")],
                },
            ]
        },
        "messages.2.content.1: `tool_result` blocks must come first in the user message",
        id="text-before-tool-result",
    ),
    pytest.param(
        {"messages": [USER_HI, {"role": "assistant", "content": [_tool_result("t1")]}]},
        "messages.1.content.0: `tool_result` blocks can only be in `user` messages",
        id="tool-result-in-assistant",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("t1")]},
                {"role": "user", "content": [{"type": "tool_result", "content": "x"}]},
            ]
        },
        "messages.2.content.0.tool_use_id: Field required",
        id="tool-result-without-id",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("t1")]},
                {"role": "user", "content": [{**_tool_result("t1"), "is_error": "yes"}]},
            ]
        },
        "messages.2.content.0.is_error: Input should be a valid boolean",
        id="tool-result-is-error-not-bool",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("t1")]},
                {"role": "user", "content": [_tool_result("t1", [_tool_use("t9")])]},
            ]
        },
        "messages.2.content.0.content.0: Input tag 'tool_use' found using 'type'",
        id="tool-result-content-bad-block",
    ),
    pytest.param(
        {
            "messages": [
                USER_HI,
                {"role": "assistant", "content": [_tool_use("t1")]},
                {"role": "user", "content": [_tool_result("t1", [{"type": "text", "text": ""}])]},
            ]
        },
        "messages.2.content.0.content.0: text content blocks must be non-empty",
        id="tool-result-empty-text",
    ),
    pytest.param(
        {"tools": [_tool("read file")]},
        "tools.0.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'",
        id="tool-name-space",
    ),
    pytest.param(
        {"tools": [_tool("x" * 65)]},
        "tools.0.name: String should match pattern",
        id="tool-name-too-long",
    ),
    pytest.param({"tools": [{"name": "f"}]}, "tools.0.input_schema: Field required", id="no-input-schema"),
    pytest.param(
        {"tools": [{"name": "f", "input_schema": {"type": "array"}}]},
        "tools.0.input_schema.type: Input should be 'object'",
        id="input-schema-not-object",
    ),
    pytest.param({"tools": [_tool("f"), _tool("f")]}, "tools: Tool names must be unique", id="dup-tool-names"),
    pytest.param(
        {
            "tools": [_tool("a", cache_control=_CC), _tool("b", cache_control=_CC)],
            "system": [{"type": "text", "text": "s", "cache_control": _CC}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": _CC}]}],
            "extra_body": {"cache_control": _CC},
        },
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        id="five-cache-breakpoints",
    ),
    pytest.param(
        {"system": [{"type": "text", "text": "s", "cache_control": {"type": "persistent"}}]},
        "system.0.cache_control.type: Input should be 'ephemeral'",
        id="cache-control-type",
    ),
    pytest.param(
        {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]},
        "system.0.cache_control.ttl: Input should be '5m' or '1h'",
        id="cache-control-ttl",
    ),
    pytest.param(
        {"system": [{"type": "image", "source": {"type": "url", "url": "u"}}]},
        "system.0.type: Input should be 'text'",
        id="system-non-text-block",
    ),
    pytest.param(
        {"tool_choice": {"type": "required"}},
        "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'",
        id="tool-choice-type",
    ),
    pytest.param(
        {"tools": [_tool("a")], "tool_choice": {"type": "tool", "name": "b"}},
        "tool_choice.name: Tool 'b' not found in provided tools",
        id="tool-choice-unknown-tool",
    ),
    pytest.param(
        {"extra_body": {"temprature": 0.5}},
        "temprature: Extra inputs are not permitted",
        id="unknown-top-level-field",
    ),
]


@pytest.mark.parametrize(("params", "reason"), INVALID)
def test_invalid_request_is_rejected_before_consuming_a_reply(
    api: FakeMessagesAPI, client: anthropic.Anthropic, params: dict[str, Any], reason: str
) -> None:
    api.reply_text("kept for the next valid request")

    with pytest.raises(anthropic.BadRequestError) as info:
        _create(client, **params)

    assert reason in str(info.value)
    assert info.value.type == "invalid_request_error"
    assert info.value.api_message is not None
    assert reason in info.value.api_message
    assert info.value.request_id is not None
    assert len(api.requests) == 1  # rejected requests are recorded
    assert api.pending == 1  # ...and do not consume the script
    assert _text(_create(client)) == "kept for the next valid request"


# --------------------------------------------------------------------------- errors and retries


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (400, anthropic.BadRequestError, "invalid_request_error"),
        (401, anthropic.AuthenticationError, "authentication_error"),
        (403, anthropic.PermissionDeniedError, "permission_error"),
        (404, anthropic.NotFoundError, "not_found_error"),
        (413, anthropic.ContentTooLargeError, "request_too_large"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
def test_fail_maps_to_client_error_classes(
    api: FakeMessagesAPI,
    client: anthropic.Anthropic,
    status: int,
    error_class: type[anthropic.APIStatusError],
    error_type: str,
) -> None:
    api.fail(status, f"scripted {status}")

    with pytest.raises(error_class) as info:
        _create(client)

    assert info.value.status_code == status
    assert info.value.type == error_type
    assert info.value.api_message == f"scripted {status}"
    assert info.value.request_id == "req_fake_1"
    assert len(api.requests) == 1  # max_retries=0: no retry


def test_overloaded_raises_api_status_error_529(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    api.fail(529, "Overloaded")
    with pytest.raises(anthropic.APIStatusError) as info:
        _create(client)
    assert info.value.status_code == 529
    assert "overloaded_error" in str(info.value)


def test_rate_limit_then_success_is_retried_quickly(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    api.fail(429, "Number of request tokens has exceeded your per-minute rate limit")
    api.reply_text("after retry")

    start = time.monotonic()
    message = _create(client.with_options(max_retries=2))

    assert _text(message) == "after retry"
    assert time.monotonic() - start < 1.0
    assert len(api.requests) == 2
    assert [h["x-stainless-retry-count"] for h in api.headers] == ["0", "1"]


def test_fail_headers_and_error_type_can_be_overridden(api: FakeMessagesAPI) -> None:
    api.fail(429, "slow down", error_type="custom_error", headers={"retry-after": "7", "x-extra": "1"})
    status, body = _raw_post(
        api.url,
        json.dumps({"model": MODEL, "max_tokens": 5, "messages": [USER_HI]}).encode(),
        {"x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json"},
    )
    assert status == 429
    assert body == {"type": "error", "error": {"type": "custom_error", "message": "slow down"}}


def test_missing_api_key_is_401_and_missing_version_is_400(api: FakeMessagesAPI) -> None:
    payload = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [USER_HI]}).encode()
    api.reply_text("unused")

    status, body = _raw_post(api.url, payload, {"anthropic-version": "2023-06-01"})
    assert status == 401
    assert body["error"]["type"] == "authentication_error"

    status, body = _raw_post(api.url, payload, {"x-api-key": "k"})
    assert status == 400
    assert "anthropic-version" in body["error"]["message"]

    status, body = _raw_post(api.url, b"{not json", {"x-api-key": "k", "anthropic-version": "v"})
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"

    assert len(api.requests) == 3
    assert api.pending == 1


def test_async_client_works(api: FakeMessagesAPI) -> None:
    api.reply_text("async hello")
    api.fail(400, "nope")

    async def run() -> tuple[Message, anthropic.BadRequestError | None]:
        async with anthropic.AsyncAnthropic(base_url=api.url, api_key="k", max_retries=0) as client:
            hi: list[MessageParam] = [{"role": "user", "content": "hi"}]
            message = await client.messages.create(model=MODEL, max_tokens=10, messages=hi)
            try:
                await client.messages.create(model=MODEL, max_tokens=10, messages=hi)
            except anthropic.BadRequestError as err:
                return message, err
            return message, None

    message, error = asyncio.run(run())
    assert _text(message) == "async hello"
    assert error is not None
    assert error.api_message == "nope"
    assert api.headers[0]["x-stainless-async"].startswith("async")


# --------------------------------------------------------------------------- streaming

RICH_REPLY: dict[str, Any] = {
    "id": "msg_rich",
    "content": [
        {"type": "thinking", "thinking": "The user wants a file read. I will read it.", "signature": "c2lnbmF0dXJl"},
        {"type": "text", "text": "Reading the file now, then I will summarise it."},
        {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a/b.txt", "lines": [1, 2.5]}},
        {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {}},
    ],
    "stop_reason": "tool_use",
    "usage": {"input_tokens": 12, "output_tokens": 34, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 6},
}


def _stream(client: anthropic.Anthropic) -> tuple[list[Any], Message]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2000, "messages": [USER_HI]}
    with client.messages.stream(**body) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def test_a_stream_rebuilds_the_message_the_same_reply_gives_without_streaming(
    api: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    api.reply(RICH_REPLY)
    api.reply(RICH_REPLY)

    whole = _create(client, max_tokens=2000)
    events, streamed = _stream(client)

    assert streamed.model_dump() == {**whole.model_dump(), "content": streamed.model_dump()["content"]}
    assert [b.model_dump(exclude_none=True) for b in streamed.content] == [
        b.model_dump(exclude_none=True) for b in whole.content
    ]
    assert api.requests[1]["stream"] is True
    assert "stream" not in api.requests[0]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} <= set(deltas)
    assert deltas.count("text_delta") > 1  # text arrives in pieces


def test_stream_events_follow_the_documented_flow_on_the_wire(api: FakeMessagesAPI) -> None:
    api.reply(RICH_REPLY)
    body = json.dumps({"model": MODEL, "max_tokens": 2000, "messages": [USER_HI], "stream": True}).encode()
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    request = urllib.request.Request(api.url + "/v1/messages", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:  # urllib undoes the chunked framing
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["transfer-encoding"] == "chunked"
        raw = response.read().decode()

    records = [record.split("\n") for record in raw.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in records]
    data = [json.loads(lines[1].removeprefix("data: ")) for lines in records]
    assert [d["type"] for d in data] == names  # each event's name is its data's type
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = data[0]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]["input_tokens"]) == ([], None, 12)
    assert data[-2]["delta"]["stop_reason"] == "tool_use"
    assert data[-2]["usage"]["output_tokens"] == 34
    tool_json = "".join(
        d["delta"]["partial_json"] for d in data if d["type"] == "content_block_delta" and d["index"] == 2
    )
    assert json.loads(tool_json) == {"path": "a/b.txt", "lines": [1, 2.5]}
    assert [d["index"] for d in data if d["type"] == "content_block_start"] == [0, 1, 2, 3]


def test_sse_events_needs_no_server() -> None:
    message = {**RICH_REPLY, "content": [{"type": "redacted_thinking", "data": "opaque"}], "stop_reason": "end_turn"}
    events = sse_events(message)
    assert [e["type"] for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2]["content_block"] == {"type": "redacted_thinking", "data": "opaque"}  # whole in its start


def test_an_error_event_mid_stream_is_raised_by_the_client_after_a_200(
    api: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    events = sse_events({**RICH_REPLY, "model": MODEL, "type": "message", "role": "assistant"})
    api.reply_events([*events[:8], error_event("overloaded_error", "Overloaded")])

    with pytest.raises(anthropic.APIStatusError) as info:
        _stream(client.with_options(max_retries=2))

    assert info.value.status_code == 200  # the stream had started: the HTTP status says nothing
    assert info.value.type == "overloaded_error"
    assert info.value.api_message == "Overloaded"
    assert len(api.requests) == 1  # the SDK does not retry a stream that failed midway


def test_a_dropped_stream_breaks_in_the_http_client(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    events = sse_events({**RICH_REPLY, "model": MODEL, "type": "message", "role": "assistant"})
    api.reply_events(events[:5], drop_connection=True)

    with pytest.raises(httpx2.RemoteProtocolError):  # not wrapped by the SDK once the stream has started
        _stream(client)


def test_an_error_before_the_stream_is_a_plain_http_error(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    api.fail(529, "Overloaded")
    api.reply_text("after retry")

    events, message = _stream(client.with_options(max_retries=1))

    assert _text(message) == "after retry"
    assert len(api.requests) == 2  # retried by the SDK, as without streaming
    assert events[0].type == "message_start"


def test_a_scripted_stream_fails_a_non_streaming_call_loudly(api: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    api.reply_events(sse_events({**RICH_REPLY, "model": MODEL, "type": "message", "role": "assistant"}))
    with pytest.raises(anthropic.InternalServerError, match="non-streaming call"):
        _create(client)


# --------------------------------------------------------------------------- offline validation


def test_validate_offline() -> None:
    assert validate_messages_request({"model": MODEL, "max_tokens": 5, "messages": [USER_HI]}) is None
    assert validate_messages_request({"max_tokens": 5, "messages": [USER_HI]}) == "model: Field required"
    assert validate_messages_request({"model": MODEL, "messages": [USER_HI]}) == "max_tokens: Field required"
    assert validate_messages_request({"model": MODEL, "max_tokens": 5}) == "messages: Field required"
    assert validate_messages_request({"model": 3, "max_tokens": 5, "messages": [USER_HI]}) == (
        "model: Input should be a valid string"
    )
    assert validate_messages_request({"model": MODEL, "max_tokens": True, "messages": [USER_HI]}) == (
        "max_tokens: Input should be a valid integer"
    )
    assert validate_messages_request({"model": MODEL, "max_tokens": 5, "messages": "hi"}) == (
        "messages: Input should be a valid list"
    )
    streaming = {"model": MODEL, "max_tokens": 5, "messages": [USER_HI], "stream": True}
    assert validate_messages_request(streaming) is None
    assert validate_messages_request({**streaming, "stream": "yes"}) == "stream: Input should be a valid boolean"
    assert validate_messages_request([]) is not None
