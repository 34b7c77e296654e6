"""Whole runs through the real ``anthropic`` client, against FakeMessagesAPI.

Every scenario is driven by both :class:`tether.Runner` and :class:`tether.AsyncRunner`
with :class:`tether.models.anthropic.AnthropicModel`, and checks that each request the
fake received would be accepted by the API (the fake rejects what the API rejects: broken
pairing, roles, order, too many cache breakpoints...).
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic  # noqa: TID251 - the scenarios check requests against the SDK's own param types
import pydantic
import pytest

from support import closed_port, fake_api_model, settled, token_usage
from tether import AsyncRunner, Limits, Runner, RunResult, tool
from tether.agent import Agent
from tether.core import events as ev
from tether.core.history import check_pairing
from tether.core.state import RunState
from tether.models import Usage
from tether.models.anthropic import AnthropicModel
from tether.testing import FakeMessagesAPI, validate_messages_request
from tether.tools import Tool

MODEL = "claude-test"
EPHEMERAL = {"type": "ephemeral"}

Message = dict[str, Any]
AnyRunner = Runner | AsyncRunner


# Harness (the api fixture is in conftest.py) -------------------------------------------------
@dataclass
class Harness:
    """Builds models and runners of one kind (sync or async) and drives them alike."""

    api: FakeMessagesAPI
    kind: str
    models: list[AnthropicModel] = field(default_factory=list)

    def model(self, **options: Any) -> AnthropicModel:
        model = fake_api_model(self.api, MODEL, **options)
        self.models.append(model)
        return model

    def runner(
        self,
        tools: Sequence[Tool] = (),
        *,
        model: AnthropicModel | None = None,
        limits: Limits | None = None,
        system: str | None = None,
    ) -> AnyRunner:
        agent = Agent(
            model=model or self.model(),
            tools=tools,
            system=system,
            limits=limits or Limits(),
            model_name=MODEL,
        )
        return Runner(agent) if self.kind == "sync" else AsyncRunner(agent)

    async def run(self, runner: AnyRunner, prompt: str, *, continue_from: str | None = None) -> RunResult:
        if isinstance(runner, AsyncRunner):
            return await runner.run(prompt, continue_from=continue_from)
        return runner.run(prompt, continue_from=continue_from)

    async def drive(self, runner: AnyRunner, run: str | RunState) -> RunResult:
        if isinstance(runner, AsyncRunner):
            return await runner.drive(run)
        return runner.drive(run)

    async def close(self) -> None:
        for model in self.models:
            model.close()
            await model.aclose()


@pytest.fixture(params=["sync", "async"])
async def h(request: pytest.FixtureRequest, api: FakeMessagesAPI) -> AsyncIterator[Harness]:
    harness = Harness(api, request.param)
    yield harness
    await harness.close()


# Helpers -----------------------------------------------------------------------------------
def strip_cache(messages: list[Message]) -> list[Message]:
    """The messages without cache_control marks (what tether stores)."""
    stripped = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{k: v for k, v in block.items() if k != "cache_control"} for block in content]
        stripped.append({"role": message["role"], "content": content})
    return stripped


def assert_valid(api: FakeMessagesAPI, *, expected: int | None = None) -> None:
    """Every request reached the fake valid (no 400 caused by tether) with intact pairing."""
    assert api.requests, "no request reached the fake"
    if expected is not None:
        assert len(api.requests) == expected, [r.get("messages") for r in api.requests]
    for index, body in enumerate(api.requests):
        problem = validate_messages_request(body)
        assert problem is None, f"request #{index + 1} would be rejected: {problem}"
        assert body["model"] == MODEL
        check_pairing(strip_cache(body["messages"]), run_id=f"request-{index + 1}")
    for headers in api.headers:
        assert headers.get("anthropic-version")


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


def user_text(text: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


async def event_types(runner: AnyRunner, run_id: str) -> list[str]:
    return [event.type for event in await settled(runner.store.load_events(run_id))]


# Tools ---------------------------------------------------------------------------------------
class Calls(list[tuple[str, dict[str, Any]]]):
    """What the tools were actually called with."""


def make_tools(calls: Calls) -> dict[str, Tool]:
    @tool
    def get_weather(city: str, unit: str = "celsius") -> str:
        """Get the current weather for a city."""
        calls.append(("get_weather", {"city": city, "unit": unit}))
        return f"{city}: 21 degrees {unit}"

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        calls.append(("lookup", {"key": key}))
        return f"value of {key}"

    @tool
    def query(sql: str) -> str:
        """Run a query."""
        calls.append(("query", {"sql": sql}))
        raise RuntimeError("database is locked (code 5): 'main.db'")

    @tool
    def write_file(path: str, content: str) -> str:
        """Write a file."""
        calls.append(("write_file", {"path": path, "content": content}))
        return f"wrote {len(content)} bytes to {path}"

    @tool(final=True)
    def submit_answer(answer: str, confidence: float) -> None:
        """Submit the final answer."""
        calls.append(("submit_answer", {"answer": answer, "confidence": confidence}))

    @tool
    def search(query: str, limit: int | None = None) -> str:
        """Search the index."""
        calls.append(("search", {"query": query, "limit": limit}))
        return f"results for {query}"

    @tool(approval=True)
    def delete_file(path: str) -> str:
        """Delete a file (needs approval)."""
        calls.append(("delete_file", {"path": path}))
        return "deleted"

    return {t.name: t for t in (get_weather, lookup, query, write_file, submit_answer, search, delete_file)}


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def tools(calls: Calls) -> dict[str, Tool]:
    return make_tools(calls)


# Scenarios ------------------------------------------------------------------------------------
async def test_text_only_answer(h: Harness) -> None:
    h.api.reply_text("Hello there.", usage=token_usage(120, 7, created=100, read=20))
    runner = h.runner(system="Be brief.")

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert result.output == "Hello there."
    assert result.error is None
    assert (result.steps, result.tool_calls) == (1, 0)
    assert result.usage == Usage(120, 7, 100, 20)
    assert_valid(h.api, expected=1)
    body = h.api.requests[0]
    assert body["max_tokens"] == Limits().max_tokens
    assert body["system"] == "Be brief."
    assert "tools" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": EPHEMERAL}]}
    ]
    history = (await settled(runner.load(result.run_id))).messages
    assert history[-1]["role"] == "assistant"
    assert [b["text"] for b in history[-1]["content"]] == ["Hello there."]


async def test_one_tool_call_then_answer(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    call_id = h.api.reply_tool_use(
        "get_weather", {"city": "Paris"}, text="Let me check.", usage=token_usage(50, 10, created=40)
    )
    h.api.reply_text("It is 21 degrees in Paris.", usage=token_usage(70, 9, read=40))
    runner = h.runner([tools["get_weather"]])

    result = await h.run(runner, "Weather in Paris?")

    assert result.status == "done", result.error
    assert result.output == "It is 21 degrees in Paris."
    assert (result.steps, result.tool_calls) == (2, 1)
    assert result.usage == Usage(120, 19, 40, 40)
    assert calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert_valid(h.api, expected=2)

    definition = h.api.requests[0]["tools"]
    assert len(definition) == 1
    assert definition[0]["name"] == "get_weather"
    assert definition[0]["description"] == "Get the current weather for a city."
    schema = definition[0]["input_schema"]
    assert schema["type"] == "object"
    assert schema["required"] == ["city"]
    assert schema["properties"]["city"]["type"] == "string"
    assert schema["properties"]["unit"] == {"default": "celsius", "title": "Unit", "type": "string"}
    assert h.api.requests[1]["tools"] == definition

    messages = h.api.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["type"] for b in messages[1]["content"]] == ["text", "tool_use"]
    assert messages[1]["content"][1]["id"] == call_id
    assert messages[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": "Paris: 21 degrees celsius",
            "cache_control": EPHEMERAL,
        }
    ]


async def test_three_parallel_calls_answered_in_one_message_in_call_order(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    ids = ["toolu_c", "toolu_a", "toolu_b"]  # not sorted: order must follow the calls
    h.api.reply(
        {
            "content": [
                {"type": "text", "text": "Three lookups."},
                *({"type": "tool_use", "id": i, "name": "lookup", "input": {"key": i[-1]}} for i in ids),
            ]
        }
    )
    h.api.reply_text("c, a and b found.")
    runner = h.runner([tools["lookup"]])

    result = await h.run(runner, "Look up c, a, b")

    assert result.status == "done", result.error
    assert result.tool_calls == 3
    assert [c[1]["key"] for c in calls] == ["c", "a", "b"]
    assert_valid(h.api, expected=2)
    messages = strip_cache(h.api.requests[1]["messages"])
    assert len(messages) == 3
    results = messages[2]["content"]
    assert messages[2]["role"] == "user"
    assert [b["type"] for b in results] == ["tool_result"] * 3
    assert [b["tool_use_id"] for b in results] == ids
    assert [b["content"] for b in results] == ["value of c", "value of a", "value of b"]
    assert all("is_error" not in b for b in results)


async def test_raising_tool_gives_is_error_with_message_verbatim(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    call_id = h.api.reply_tool_use("query", {"sql": "select 1"})
    h.api.reply_text("The database is locked.")
    runner = h.runner([tools["query"]])

    result = await h.run(runner, "Query it")

    assert result.status == "done", result.error
    assert result.output == "The database is locked."
    assert calls == [("query", {"sql": "select 1"})]
    assert_valid(h.api, expected=2)
    (block,) = strip_cache(h.api.requests[1]["messages"])[2]["content"]
    assert block["tool_use_id"] == call_id
    assert block["is_error"] is True
    assert "database is locked (code 5): 'main.db'" in block["content"]
    assert block["content"] == (
        "Error (retryable): tool 'query' raised RuntimeError: database is locked (code 5): 'main.db'"
    )


async def test_unknown_tool_and_invalid_arguments_are_is_error_results(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply(
        {
            "content": [
                {"type": "tool_use", "id": "toolu_unknown", "name": "launch_rockets", "input": {"n": 3}},
                {"type": "tool_use", "id": "toolu_bad", "name": "get_weather", "input": {"town": "Paris"}},
            ]
        }
    )
    h.api.reply_text("Sorry.")
    weather = tools["get_weather"]
    runner = h.runner([weather, tools["lookup"]])
    with pytest.raises(pydantic.ValidationError) as invalid:
        weather.validate({"town": "Paris"})

    result = await h.run(runner, "Go")

    assert result.status == "done", result.error
    assert calls == []
    assert result.tool_calls == 0
    assert_valid(h.api, expected=2)
    unknown, bad = strip_cache(h.api.requests[1]["messages"])[2]["content"]
    assert unknown["tool_use_id"] == "toolu_unknown"
    assert unknown["is_error"] is True
    assert "unknown tool 'launch_rockets'" in unknown["content"]
    assert "get_weather" in unknown["content"]
    assert "lookup" in unknown["content"]
    assert bad["tool_use_id"] == "toolu_bad"
    assert bad["is_error"] is True
    assert bad["content"] == f"Error: invalid arguments for tool 'get_weather': {invalid.value}"


async def test_max_steps_stops_a_model_that_keeps_calling_tools(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    for n in range(3):
        h.api.reply_tool_use("lookup", {"key": str(n)})
    runner = h.runner([tools["lookup"]], limits=Limits(max_steps=2))

    result = await h.run(runner, "Loop")

    assert result.status == "failed"
    assert result.error is not None
    assert "max_steps" in result.error
    assert "2" in result.error
    assert result.steps == 2
    assert len(calls) == 2
    assert h.api.pending == 1
    assert_valid(h.api, expected=2)
    history = (await settled(runner.load(result.run_id))).messages
    assert history[-1]["role"] == "user"  # the last results are kept, ready to continue
    check_pairing(history, run_id=result.run_id)


async def test_final_tool_ends_the_run_with_the_validated_input(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply_tool_use("submit_answer", {"answer": "42", "confidence": "0.9"})
    h.api.reply_text("never requested")
    runner = h.runner([tools["submit_answer"], tools["lookup"]])

    result = await h.run(runner, "Answer")

    assert result.status == "done", result.error
    assert result.result == {"answer": "42", "confidence": 0.9}
    assert result.steps == 1
    assert calls == []  # a final tool's input is the result; its function is not run
    assert h.api.pending == 1
    assert_valid(h.api, expected=1)


async def test_429_is_retried_by_the_sdk_within_one_step(h: Harness) -> None:
    h.api.fail(429, "Number of request tokens has exceeded your rate limit.")
    h.api.reply_text("Made it.", usage=token_usage(11, 3))
    runner = h.runner(model=h.model(max_retries=2))

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert result.output == "Made it."
    assert len(h.api.requests) == 2
    assert result.steps == 1
    assert result.usage == Usage(11, 3)
    assert h.api.requests[0] == h.api.requests[1]
    assert_valid(h.api, expected=2)


async def test_400_fails_the_run_with_history_intact(h: Harness, tools: dict[str, Tool]) -> None:
    h.api.reply_tool_use("lookup", {"key": "k"})
    h.api.fail(400, "messages.2.content.0: something the API disliked")
    runner = h.runner([tools["lookup"]])
    state = await settled(runner.create("Look k up"))

    result = await h.drive(runner, state)

    assert result.status == "failed"
    assert result.error is not None
    assert "400" in result.error
    assert "messages.2.content.0: something the API disliked" in result.error
    assert result.error.startswith("model call failed:")
    assert result.steps == 1
    assert_valid(h.api, expected=2)
    loaded = await settled(runner.load(result.run_id))
    sent = strip_cache(h.api.requests[1]["messages"])
    assert loaded.messages == sent  # unchanged from before the failed call
    assert loaded.messages == state.messages
    assert [m["role"] for m in loaded.messages] == ["user", "assistant", "user"]
    types = await event_types(runner, result.run_id)
    assert types.count(ev.ModelResponded.kind) == 1
    assert types[-1] == ev.RunFinished.kind


async def test_400_on_the_first_call_leaves_only_the_prompt(h: Harness) -> None:
    h.api.fail(400, "max_tokens: too large for this model")
    runner = h.runner()

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error == "model call failed: Anthropic API error 400: max_tokens: too large for this model"
    assert (await settled(runner.load(result.run_id))).messages == [user_text("Hi")]
    assert result.steps == 0


async def test_529_without_retries_fails_clearly(h: Harness) -> None:
    h.api.fail(529, "Overloaded")
    runner = h.runner(model=h.model(max_retries=0))

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error == (
        "model call failed: Anthropic API error 529: Overloaded (transient: resume the run to try again)"
    )
    assert_valid(h.api, expected=1)
    assert (await settled(runner.load(result.run_id))).messages == [user_text("Hi")]


async def test_5xx_exhausting_retries_fails_after_all_attempts(h: Harness) -> None:
    for _ in range(3):
        h.api.fail(500, "Internal server error")
    h.api.reply_text("too late")
    runner = h.runner(model=h.model(max_retries=2))

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error == (
        "model call failed: Anthropic API error 500: Internal server error (transient: resume the run to try again)"
    )
    assert h.api.pending == 1
    assert_valid(h.api, expected=3)


async def test_tool_use_cut_off_at_max_tokens_is_not_run_and_asked_again_with_more(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply(
        {
            "content": [
                {"type": "text", "text": "Writing the file."},
                {"type": "tool_use", "id": "toolu_cut", "name": "write_file", "input": {"path": "a.txt"}},
            ],
            "stop_reason": "max_tokens",
            "usage": token_usage(30, 4096),
        }
    )
    call_id = h.api.reply_tool_use("write_file", {"path": "a.txt", "content": "x" * 10}, usage=token_usage(30, 5000))
    h.api.reply_text("Done writing.", usage=token_usage(40, 4))
    runner = h.runner([tools["write_file"]], limits=Limits(max_tokens=4096))

    result = await h.run(runner, "Write a.txt")

    assert result.status == "done", result.error
    assert calls == [("write_file", {"path": "a.txt", "content": "x" * 10})]
    assert result.steps == 3
    assert result.usage == Usage(100, 9100)
    assert_valid(h.api, expected=3)
    assert [r["max_tokens"] for r in h.api.requests] == [4096, 8192, 8192]
    assert strip_cache(h.api.requests[1]["messages"]) == [user_text("Write a.txt")]  # the cut turn is dropped
    history = (await settled(runner.load(result.run_id))).messages
    assert "toolu_cut" not in repr(history)
    assert history[1]["content"][0]["id"] == call_id
    assert ev.Warned.kind in await event_types(runner, result.run_id)


async def test_tool_use_cut_off_at_the_ceiling_fails(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    cut = {
        "content": [{"type": "tool_use", "id": "toolu_cut", "name": "write_file", "input": {"path": "a"}}],
        "stop_reason": "max_tokens",
    }
    h.api.reply(cut)
    h.api.reply(cut)
    runner = h.runner([tools["write_file"]], limits=Limits(max_tokens=1000, max_tokens_ceiling=2000))

    result = await h.run(runner, "Write")

    assert result.status == "failed"
    assert result.error is not None
    assert "max_tokens=2000" in result.error
    assert "not run" in result.error
    assert calls == []
    assert [r["max_tokens"] for r in h.api.requests] == [1000, 2000]
    assert_valid(h.api, expected=2)


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
    assert_valid(h.api, expected=2)


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
    assert_valid(h.api, expected=2)
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
    assert_valid(h.api, expected=3)
    third = strip_cache(h.api.requests[2]["messages"])
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
    assert_valid(h.api, expected=1)


async def test_refusal_with_text_uses_the_text(h: Harness) -> None:
    h.api.reply({"content": [{"type": "text", "text": "I can't help with that."}], "stop_reason": "refusal"})
    runner = h.runner()

    result = await h.run(runner, "Bad idea")

    assert result.status == "failed"
    assert result.error == "the model refused: I can't help with that."


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
    assert (await settled(runner.load(result.run_id))).messages == [
        user_text("Long")
    ]  # the partial answer is discarded
    assert_valid(h.api, expected=1)


async def test_prompt_too_long_400_is_a_context_window_error(h: Harness) -> None:
    h.api.fail(400, "prompt is too long: 250000 tokens > 200000 maximum")
    runner = h.runner()

    result = await h.run(runner, "Long")

    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("model call failed: context window exceeded")
    assert "250000 tokens > 200000 maximum" in result.error
    assert_valid(h.api, expected=1)


async def test_continue_sends_the_whole_history_and_the_new_prompt(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply_tool_use("get_weather", {"city": "Oslo"}, text="Checking.")
    h.api.reply_text("Oslo is at 21 degrees.")
    h.api.reply_text("Bring a light jacket.")
    runner = h.runner([tools["get_weather"]])
    first = await h.run(runner, "Weather in Oslo?")
    assert first.status == "done", first.error
    first_history = (await settled(runner.load(first.run_id))).messages

    second = await settled(runner.create("Should I bring a jacket?", continue_from=first.run_id))
    result = await h.drive(runner, second)

    assert result.status == "done", result.error
    assert result.output == "Bring a light jacket."
    assert result.run_id != first.run_id
    assert_valid(h.api, expected=3)
    sent = strip_cache(h.api.requests[2]["messages"])
    assert sent == [*first_history, user_text("Should I bring a jacket?")]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert h.api.requests[2]["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL
    assert (await settled(runner.load(first.run_id))).messages == first_history  # the parent is untouched


async def test_continue_after_results_merges_the_prompt_after_them(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply_tool_use("lookup", {"key": "a"})
    runner = h.runner([tools["lookup"]], limits=Limits(max_steps=1))
    first = await h.run(runner, "Start")
    assert first.status == "failed"
    h.api.reply_text("Continuing.")

    result = await h.run(runner, "Go on", continue_from=first.run_id)

    # max_steps counts the new run's own model calls: one is allowed again
    assert result.status == "done", result.error
    assert_valid(h.api, expected=2)
    sent = strip_cache(h.api.requests[1]["messages"])
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result", "text"]
    assert sent[2]["content"][1]["text"] == "Go on"


async def test_continue_after_a_cancelled_approval_is_valid(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    call_id = h.api.reply_tool_use("delete_file", {"path": "/etc/passwd"})
    runner = h.runner([tools["delete_file"]])
    first = await h.run(runner, "Clean up")
    assert first.status == "awaiting_approval"
    await settled(runner.cancel(first.run_id, "changed my mind"))
    h.api.reply_text("OK, nothing deleted.")

    state = await settled(runner.create("Never mind, just list the files", continue_from=first.run_id))
    result = await h.drive(runner, state)

    assert result.status == "done", result.error
    assert calls == []
    assert_valid(h.api, expected=2)
    sent = strip_cache(h.api.requests[1]["messages"])
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    answer, prompt = sent[2]["content"]
    assert answer["type"] == "tool_result"
    assert answer["tool_use_id"] == call_id
    assert answer["is_error"] is True
    assert prompt == {"type": "text", "text": "Never mind, just list the files"}


@pytest.mark.parametrize("stop_reason", ["refusal", "end_turn"])
async def test_continue_after_an_empty_assistant_turn_is_valid(h: Harness, stop_reason: str) -> None:
    h.api.reply({"content": [], "stop_reason": stop_reason})
    h.api.reply_text("Second try.")
    runner = h.runner()
    first = await h.run(runner, "First")
    assert first.status in ("done", "failed")

    result = await h.run(runner, "Again", continue_from=first.run_id)

    assert_valid(h.api, expected=2)
    assert result.status == "done", result.error


async def test_every_request_marks_its_newest_block_and_where_the_previous_request_ended(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    for n in range(6):  # more steps than the API's 4 breakpoints: marks must not pile up
        h.api.reply_tool_use("lookup", {"key": str(n)})
    h.api.reply_text("All done.")
    runner = h.runner([tools["lookup"]], system="System prompt.")

    result = await h.run(runner, "Look up six keys")

    assert result.status == "done", result.error
    assert_valid(h.api, expected=7)
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
    assert_valid(h.api, expected=2)
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
    assert api_key_sent(h.api.headers[0]) == "test-key"


async def test_api_key_and_base_url_come_from_the_environment(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", h.api.url)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    h.api.reply_text("from env")
    model = AnthropicModel(model=MODEL, max_retries=0)
    h.models.append(model)
    runner = h.runner(model=model)

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert result.output == "from env"
    assert_valid(h.api, expected=1)
    assert api_key_sent(h.api.headers[0]) == "env-key"


async def test_explicit_api_key_wins_over_the_environment(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    h.api.reply_text("explicit")
    runner = h.runner()  # api_key="test-key", base_url=the fake

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert api_key_sent(h.api.headers[0]) == "test-key"


async def test_missing_api_key_fails_the_run_clearly(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    model = AnthropicModel(model=MODEL, base_url=h.api.url, max_retries=0)
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
    assert h.api.requests == []


async def test_unreachable_api_fails_with_cannot_reach(h: Harness) -> None:
    runner = h.runner(model=h.model(base_url=f"http://127.0.0.1:{closed_port()}", max_retries=0))

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("model call failed: cannot reach the Anthropic API")
    assert h.api.requests == []
    assert (await settled(runner.load(result.run_id))).messages == [user_text("Hi")]


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
    assert_valid(h.api, expected=2)
    assert param_violations(h.api.requests[1]["messages"]) == []


async def test_null_tool_arguments_survive_the_round_trip(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    call_id = h.api.reply_tool_use("search", {"query": "q", "limit": None})
    h.api.reply_text("Done.")
    runner = h.runner([tools["search"]])

    result = await h.run(runner, "Search q")

    assert result.status == "done", result.error
    assert calls == [("search", {"query": "q", "limit": None})]
    assert_valid(h.api, expected=2)
    replayed = h.api.requests[1]["messages"][1]["content"][0]
    assert replayed["id"] == call_id
    assert replayed["input"] == {"query": "q", "limit": None}  # what the model sent, exactly
