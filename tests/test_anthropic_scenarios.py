"""Whole runs through the real ``anthropic`` client, against FakeMessagesAPI: what only Claude's API has.

The scenarios every provider shares (tool calls, errors, approvals, resume, ``--continue``)
are in test_provider_scenarios.py; these are Claude's own: pause_turn, refusal details,
context-window stop reasons, prompt caching, 529, its credentials, the SDK's param types.
Each is driven by both :class:`tether.Runner` and :class:`tether.AsyncRunner`, and the fake
rejects what the API rejects (broken pairing, roles, order, too many cache breakpoints...).
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from typing import Any

import anthropic  # noqa: TID251 - the scenarios check requests against the SDK's own param types
import pytest

from support import closed_port, settled, token_usage
from tether import Limits
from tether.models import Usage
from tether.models.anthropic import AnthropicModel
from tether.testing import FakeMessagesAPI
from tether.tools import Tool
from wires import MODEL, Calls, Harness, Message, MessagesWire, user_text

EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture(params=["sync", "async"])
async def h(request: pytest.FixtureRequest, api: FakeMessagesAPI) -> AsyncIterator[Harness]:
    harness = Harness(MessagesWire(api), request.param)
    yield harness
    await harness.close()


def cache_marks(body: dict[str, Any]) -> list[str]:
    """Where a request carries cache_control, as paths."""
    marks: list[str] = []
    system = body.get("system")
    if isinstance(system, list):
        marks += [f"system.{i}" for i, b in enumerate(system) if b.get("cache_control")]
    marks += [f"tools.{i}" for i, t in enumerate(body.get("tools") or []) if t.get("cache_control")]
    if body.get("cache_control"):
        marks.append("cache_control")
    for i, message in enumerate(body["messages"]):
        content = message["content"]
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if block.get("cache_control"):
                marks.append(f"messages.{i}.content.{j}")
            inner = block.get("content")
            if isinstance(inner, list):
                marks += [
                    f"messages.{i}.content.{j}.content.{k}" for k, b in enumerate(inner) if b.get("cache_control")
                ]
    return marks


# Scenarios ------------------------------------------------------------------------------------
async def test_529_without_retries_fails_clearly(h: Harness) -> None:
    h.api.fail(529, "Overloaded")
    runner = h.runner(model=h.model(max_retries=0))

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error == (
        "model call failed: Anthropic API error 529: Overloaded (transient: resume the run to try again)"
    )
    h.api.assert_valid(expected=1)
    assert (await settled(runner.load(result.run_id))).messages == [user_text("Hi")]


async def test_max_tokens_ceiling_is_sent_without_the_sdks_streaming_guard(h: Harness, tools: dict[str, Tool]) -> None:
    # The SDK refuses non-streaming calls it expects to run over 10 minutes (~21k tokens)
    # unless a timeout is set; the default ceiling (32000) must still be callable.
    h.api.reply(
        {
            "content": [{"type": "tool_use", "id": "toolu_cut", "name": "write_file", "input": {}}],
            "stop_reason": "max_tokens",
        }
    )
    h.api.reply_text("ok")
    runner = h.runner([tools["write_file"]], limits=Limits(max_tokens=16000))

    result = await h.run(runner, "Write")

    assert result.status == "done", result.error
    assert [r["max_tokens"] for r in h.api.requests] == [16000, 32000]
    h.api.assert_valid(expected=2)


async def test_pause_turn_reinvokes_with_the_partial_turn_and_merges_it(h: Harness) -> None:
    h.api.reply(
        {
            "content": [{"type": "text", "text": "Searching the web."}],
            "stop_reason": "pause_turn",
            "usage": token_usage(10, 2),
        }
    )
    h.api.reply_text("Found it: 42.", usage=token_usage(20, 3))
    runner = h.runner()

    result = await h.run(runner, "Search")

    assert result.status == "done", result.error
    assert result.steps == 2
    assert result.usage == Usage(30, 5)
    h.api.assert_valid(expected=2)
    second = h.api.requests[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant"]
    assert [b["text"] for b in second[-1]["content"]] == ["Searching the web."]  # the partial turn, last
    assert second[-1]["content"][-1]["cache_control"] == EPHEMERAL
    history = (await settled(runner.load(result.run_id))).messages
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert [b["text"] for b in history[1]["content"]] == ["Searching the web.", "Found it: 42."]
    assert result.output is not None
    assert "Found it: 42." in result.output


async def test_pause_turn_then_tool_use_runs_the_call_of_the_merged_turn(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply({"content": [{"type": "text", "text": "Thinking it over."}], "stop_reason": "pause_turn"})
    h.api.reply_tool_use("lookup", {"key": "k"})
    h.api.reply_text("Value found.")
    runner = h.runner([tools["lookup"]])

    result = await h.run(runner, "Find k")

    assert result.status == "done", result.error
    assert calls == [("lookup", {"key": "k"})]
    h.api.assert_valid(expected=3)
    third = h.api.sent(2)
    assert [m["role"] for m in third] == ["user", "assistant", "user"]
    assert [b["type"] for b in third[1]["content"]] == ["text", "tool_use"]


async def test_refusal_fails_with_the_reason(h: Harness) -> None:
    h.api.reply(
        {
            "content": [],
            "stop_reason": "refusal",
            "stop_details": {"type": "refusal", "category": "cyber", "explanation": "This could enable malware."},
        }
    )
    runner = h.runner()

    result = await h.run(runner, "Write malware")

    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("the model refused")
    assert "This could enable malware." in result.error
    h.api.assert_valid(expected=1)


async def test_refusal_without_any_detail_says_no_reason_given(h: Harness) -> None:
    h.api.reply({"content": [], "stop_reason": "refusal"})
    runner = h.runner()

    result = await h.run(runner, "Hmm")

    assert result.status == "failed"
    assert result.error == "the model refused: no reason given"


async def test_model_context_window_exceeded_stop_reason_fails(h: Harness) -> None:
    h.api.reply({"content": [{"type": "text", "text": "partial"}], "stop_reason": "model_context_window_exceeded"})
    runner = h.runner()

    result = await h.run(runner, "Long")

    assert result.status == "failed"
    assert result.error is not None
    assert "context window" in result.error
    assert (await settled(runner.load(result.run_id))).messages == [user_text("Long")]  # partial answer discarded
    h.api.assert_valid(expected=1)


async def test_prompt_too_long_400_is_a_context_window_error(h: Harness) -> None:
    h.api.fail(400, "prompt is too long: 250000 tokens > 200000 maximum")
    runner = h.runner()

    result = await h.run(runner, "Long")

    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("model call failed: context window exceeded")
    assert "250000 tokens > 200000 maximum" in result.error
    h.api.assert_valid(expected=1)


async def test_every_request_marks_its_newest_block_and_where_the_previous_request_ended(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    for n in range(6):  # more steps than the API's 4 breakpoints: marks must not pile up
        h.api.reply_tool_use("lookup", {"key": str(n)})
    h.api.reply_text("All done.")
    runner = h.runner([tools["lookup"]], system="System prompt.")

    result = await h.run(runner, "Look up six keys")

    assert result.status == "done", result.error
    h.api.assert_valid(expected=7)
    for index, body in enumerate(h.api.requests):
        last = len(body["messages"]) - 1
        newest = len(body["messages"][last]["content"]) - 1
        previous = [f"messages.{last - 2}.content.{len(body['messages'][last - 2]['content']) - 1}"] if index else []
        assert cache_marks(body) == [*previous, f"messages.{last}.content.{newest}"]
        assert body["messages"][last]["content"][newest]["cache_control"] == EPHEMERAL
    assert "cache_control" not in repr((await settled(runner.load(result.run_id))).messages)  # never persisted


async def test_prompt_caching_off_sends_no_breakpoint(h: Harness, tools: dict[str, Tool]) -> None:
    h.api.reply_tool_use("lookup", {"key": "a"})
    h.api.reply_text("Done.")
    runner = h.runner([tools["lookup"]], model=h.model(prompt_caching=False))

    result = await h.run(runner, "Look up a")

    assert result.status == "done", result.error
    h.api.assert_valid(expected=2)
    assert [cache_marks(body) for body in h.api.requests] == [[], []]
    assert "cache_control" not in repr(h.api.requests)


def api_key_sent(headers: dict[str, str]) -> str | None:
    if headers.get("x-api-key"):
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


async def test_api_key_is_sent(h: Harness) -> None:
    h.api.reply_text("hi")
    runner = h.runner()

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert api_key_sent(h.api.api.headers[0]) == "test-key"


async def test_api_key_and_base_url_come_from_the_environment(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", h.api.base_url)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    h.api.reply_text("from env")
    model = AnthropicModel(model=MODEL, max_retries=0)
    h.models.append(model)
    runner = h.runner(model=model)

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert result.output == "from env"
    h.api.assert_valid(expected=1)
    assert api_key_sent(h.api.api.headers[0]) == "env-key"


async def test_explicit_api_key_wins_over_the_environment(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    h.api.reply_text("explicit")
    runner = h.runner()  # api_key="test-key", base_url=the fake

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert api_key_sent(h.api.api.headers[0]) == "test-key"


async def test_missing_api_key_fails_the_run_clearly_and_resumably(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    model = AnthropicModel(model=MODEL, base_url=h.api.base_url, max_retries=0)
    h.models.append(model)
    runner = h.runner(model=model)
    state = await settled(runner.create("Hi"))

    try:
        result = await h.drive(runner, state)
    finally:
        stored = (await settled(runner.load(state.id))).status

    assert result.status == "failed"
    assert stored == "failed"
    assert result.error is not None
    assert "API key" in result.error or "authentication" in result.error
    assert "resume the run" in result.error
    assert h.api.requests == []

    # The key set (a new process reads it), resuming the same run finishes it: nothing was lost.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    h.api.reply_text("hello")
    keyed = AnthropicModel(model=MODEL, base_url=h.api.base_url, max_retries=0)
    h.models.append(keyed)
    resumed = await h.drive(h.runner(model=keyed, store=runner.store), state.id)

    assert resumed.status == "done", resumed.error
    assert resumed.output == "hello"
    assert api_key_sent(h.api.api.headers[0]) == "env-key"


# Replayed blocks against the SDK's own request types ---------------------------------------------
_PARAM_TYPES: dict[str, Any] = {
    "text": anthropic.types.TextBlockParam,
    "tool_use": anthropic.types.ToolUseBlockParam,
    "tool_result": anthropic.types.ToolResultBlockParam,
}


def _nullable(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Required, typing.NotRequired):
        return _nullable(args[0])
    return type(None) in args


def param_violations(messages: list[Message]) -> list[str]:
    """Blocks whose keys or nulls the SDK's ``*BlockParam`` TypedDicts do not allow."""
    found = []
    for i, message in enumerate(messages):
        for j, block in enumerate(message["content"] if isinstance(message["content"], list) else []):
            param = _PARAM_TYPES.get(block.get("type"))
            if param is None:
                continue
            hints = typing.get_type_hints(param, include_extras=True)
            for key, value in block.items():
                if key not in hints:
                    found.append(f"messages.{i}.content.{j}.{key}: not a {param.__name__} field")
                elif value is None and not _nullable(hints[key]):
                    found.append(f"messages.{i}.content.{j}.{key}: null, but {param.__name__} does not allow null")
    return found


async def test_replayed_assistant_blocks_match_the_sdk_param_types(h: Harness, tools: dict[str, Tool]) -> None:
    h.api.reply_tool_use("lookup", {"key": "a"}, text="Looking.")
    h.api.reply_text("Done.")
    runner = h.runner([tools["lookup"]])

    result = await h.run(runner, "Look up a")

    assert result.status == "done", result.error
    h.api.assert_valid(expected=2)
    assert param_violations(h.api.requests[1]["messages"]) == []
