"""The fake model APIs as the engine scenarios script and read them: one wire per provider.

A scenario scripts the model's turns in tether's own terms (Messages API blocks and stop
reasons, the usage as tether counts it) and reads back what each request sent as a
conversation in the same terms. :class:`MessagesWire` passes both through to FakeMessagesAPI;
:class:`ChatWire` turns a scripted turn into a chat completion (tool_use blocks as tool_calls,
stop reasons as finish reasons) and a sent Chat Completions conversation back into blocks, so
the same scenario checks the same facts through either adapter, each fake rejecting what its
real API rejects.

Imported as ``from wires import ...`` (tests/ is on sys.path).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from support import settled
from tether import AsyncRunner, Limits, Runner, RunResult, tool
from tether.agent import Agent
from tether.core.state import RunState
from tether.facts.history import check_pairing
from tether.models import ModelAdapter, ModelSettings, Usage
from tether.policy.compaction import HistoryProcessor
from tether.stores import AsyncStore, Store
from tether.testing import FakeChatCompletionsAPI, FakeMessagesAPI, validate_chat_request, validate_messages_request
from tether.tools import Tool

FINISH_REASONS = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "stop_sequence": "stop"}
"""Stop reasons as the finish reasons a Chat Completions API says them with."""
MODEL = "claude-test"
"""The model name every scenario's requests carry (both fakes take any name)."""
Message = dict[str, Any]


class Wire:
    """What the scenarios need of a fake API: script turns, fail, read back requests."""

    provider: str
    error_prefix: str
    """How an API error's message starts (``"Anthropic API error"``)."""
    unreachable: str
    """How a connection error's message starts."""
    api: FakeMessagesAPI | FakeChatCompletionsAPI
    base_url: str
    _call_ids: Iterator[int]

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The raw request bodies, in order."""
        return self.api.requests

    @property
    def pending(self) -> int:
        """Scripted turns not asked for yet."""
        return self.api.pending

    def model(self, **options: Any) -> ModelAdapter:
        """The provider's adapter pointed at the fake (a test key, no retries unless ``options`` say)."""
        raise NotImplementedError

    def reply(self, response: Mapping[str, Any]) -> None:
        """Script one turn: ``content`` blocks, ``stop_reason`` (derived when absent), ``usage`` as tether counts it."""
        raise NotImplementedError

    def reply_text(self, text: str, **fields: Any) -> None:
        """Script an answer in prose."""
        self.reply({"content": [{"type": "text", "text": text}], **fields})

    def reply_tool_use(
        self,
        name: str,
        tool_input: Mapping[str, Any],
        *,
        tool_use_id: str | None = None,
        text: str | None = None,
        **fields: Any,
    ) -> str:
        """Script a turn calling one tool (after ``text``, if given); returns the call's id."""
        call_id = tool_use_id or f"toolu_scripted_{next(self._call_ids)}"
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text is not None else []
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": dict(tool_input)})
        self.reply({"content": content, **fields})
        return call_id

    def fail(self, status: int, message: str, **fields: Any) -> None:
        """Script an HTTP error."""
        self.api.fail(status, message, **fields)

    def sent(self, index: int) -> list[Message]:
        """Request ``index``'s conversation as tether's Messages API history (no cache marks)."""
        raise NotImplementedError

    def sent_system(self, index: int) -> str | None:
        """Request ``index``'s system prompt."""
        raise NotImplementedError

    def sent_tools(self, index: int) -> list[str]:
        """The names of request ``index``'s tools."""
        raise NotImplementedError

    def sent_max_tokens(self, index: int) -> int:
        """Request ``index``'s limit on the answer's length."""
        raise NotImplementedError

    def sent_tool_choice(self, index: int) -> str | None:
        """Request ``index``'s tool choice as a setting says it: auto, any, none, a tool's name (None: unset)."""
        raise NotImplementedError

    def problem(self, body: dict[str, Any]) -> str | None:
        """Why the API would refuse ``body`` (None: it would take it)."""
        raise NotImplementedError

    def assert_valid(self, *, expected: int | None = None) -> None:
        """Every request reached the fake valid, for the scenario's model, with intact pairing."""
        assert self.requests, "no request reached the fake"
        if expected is not None:
            assert len(self.requests) == expected, [r.get("messages") for r in self.requests]
        for index, body in enumerate(self.requests):
            problem = self.problem(body)
            assert problem is None, f"request #{index + 1} would be rejected: {problem}"
            assert body["model"] == MODEL
            check_pairing(self.sent(index), run_id=f"request-{index + 1}")


class MessagesWire(Wire):
    """FakeMessagesAPI as it is: the scenarios already speak its terms."""

    provider = "anthropic"
    error_prefix = "Anthropic API error"
    unreachable = "cannot reach the Anthropic API"
    api: FakeMessagesAPI

    def __init__(self, api: FakeMessagesAPI) -> None:
        self.api = api
        self.base_url = api.url
        self._call_ids = itertools.count(1)

    def model(self, **options: Any) -> ModelAdapter:
        from tether.models.anthropic import AnthropicModel

        options.setdefault("api_key", "test-key")
        options.setdefault("base_url", self.base_url)
        options.setdefault("max_retries", 0)
        return AnthropicModel(model=MODEL, **options)

    def reply(self, response: Mapping[str, Any]) -> None:
        fields = dict(response)
        if isinstance(fields.get("usage"), Usage):
            fields["usage"] = fields["usage"].to_dict()
        self.api.reply(fields)

    def sent(self, index: int) -> list[Message]:
        return strip_cache(self.requests[index]["messages"])

    def sent_system(self, index: int) -> str | None:
        system = self.requests[index].get("system")
        return str(system[0]["text"]) if isinstance(system, list) else system

    def sent_tools(self, index: int) -> list[str]:
        return [tool["name"] for tool in self.requests[index].get("tools") or []]

    def sent_max_tokens(self, index: int) -> int:
        return int(self.requests[index]["max_tokens"])

    def sent_tool_choice(self, index: int) -> str | None:
        choice = self.requests[index].get("tool_choice")
        if choice is None:
            return None
        return str(choice["name"] if choice["type"] == "tool" else choice["type"])

    def problem(self, body: dict[str, Any]) -> str | None:
        return validate_messages_request(body)


class ChatWire(Wire):
    """FakeChatCompletionsAPI, scripted and read in the Messages API's terms."""

    provider = "openai"
    error_prefix = "OpenAI API error"
    unreachable = "cannot reach the OpenAI-compatible API"
    api: FakeChatCompletionsAPI

    def __init__(self, api: FakeChatCompletionsAPI) -> None:
        self.api = api
        self.base_url = api.url
        self._call_ids = itertools.count(1)

    def model(self, **options: Any) -> ModelAdapter:
        from tether.models.openai import OpenAIModel  # only the runs that use it pay for importing openai

        options.pop("prompt_caching", None)  # OpenAI caches prompts by itself
        options.setdefault("api_key", "test-key")
        options.setdefault("base_url", self.base_url)
        options.setdefault("max_retries", 0)
        return OpenAIModel(MODEL, **options)

    def reply(self, response: Mapping[str, Any]) -> None:
        content = list(response.get("content") or [])
        calls = [block for block in content if block["type"] == "tool_use"]
        text = "".join(block["text"] for block in content if block["type"] == "text") or None
        stop = response.get("stop_reason") or ("tool_use" if calls else "end_turn")
        message: dict[str, Any] = {"content": text}
        if stop == "refusal":
            message = {"content": None, "refusal": text or "I can't help with that."}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["input"])},
                }
                for c in calls
            ]
            if stop == "max_tokens":  # cut off: the last call's arguments end mid-way, as they would
                cut = message["tool_calls"][-1]["function"]
                cut["arguments"] = cut["arguments"][:-2]
        finish = FINISH_REASONS.get(stop, stop) if stop != "refusal" else "stop"
        usage = chat_usage(response.get("usage"))
        self.api.reply_message(message, finish_reason=finish, **({"usage": usage} if usage else {}))

    def sent(self, index: int) -> list[Message]:
        return messages_of(self.requests[index]["messages"])

    def sent_system(self, index: int) -> str | None:
        first = self.requests[index]["messages"][0]
        return str(first["content"]) if first["role"] == "system" else None

    def sent_tools(self, index: int) -> list[str]:
        return [tool["function"]["name"] for tool in self.requests[index].get("tools") or []]

    def sent_max_tokens(self, index: int) -> int:
        return int(self.requests[index]["max_completion_tokens"])

    def sent_tool_choice(self, index: int) -> str | None:
        choice = self.requests[index].get("tool_choice")
        if isinstance(choice, dict):
            return str(choice["function"]["name"])
        return {"required": "any"}.get(choice, choice) if choice is not None else None

    def problem(self, body: dict[str, Any]) -> str | None:
        return validate_chat_request(body)


AnyRunner = Runner | AsyncRunner


@dataclass
class Harness:
    """Builds models and runners of one provider and one kind (sync or async) and drives them alike."""

    api: Wire
    kind: str
    models: list[Any] = field(default_factory=list)

    def model(self, **options: Any) -> Any:
        model = self.api.model(**options)
        self.models.append(model)
        return model

    def runner(
        self,
        tools: Sequence[Tool] = (),
        *,
        model: Any = None,
        limits: Limits | None = None,
        system: str | None = None,
        store: Store | AsyncStore | None = None,
        settings: ModelSettings | None = None,
        approver: Any = None,
        output_type: type[pydantic.BaseModel] | None = None,
        history_processors: Sequence[HistoryProcessor] = (),
    ) -> AnyRunner:
        agent = Agent(
            model=model or self.model(),
            tools=tools,
            system=system,
            limits=limits or Limits(),
            model_name=MODEL,
            settings=settings or ModelSettings(),
            output_type=output_type,
            history_processors=history_processors,
        )
        kind = Runner if self.kind == "sync" else AsyncRunner
        return kind(agent, store, approver=approver)

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


def user_text(text: str) -> Message:
    """A user turn of one text block."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


async def event_types(runner: AnyRunner, run_id: str) -> list[str]:
    """The kinds of a run's stored events, in order."""
    return [event.type for event in await settled(runner.store.load_events(run_id))]


# Tools the scenarios call --------------------------------------------------------------------
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


def strip_cache(messages: list[Message]) -> list[Message]:
    """The messages without cache_control marks (what tether stores)."""
    stripped = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{k: v for k, v in block.items() if k != "cache_control"} for block in content]
        stripped.append({"role": message["role"], "content": content})
    return stripped


def chat_usage(usage: object) -> dict[str, Any] | None:
    """Tether's usage (a Usage or its dict) as Chat Completions counts it: cache reads and writes inside the prompt."""
    if usage is None:
        return None
    counted = usage if isinstance(usage, Usage) else Usage.from_dict(dict(usage))  # type: ignore[call-overload]
    prompt = counted.input_tokens + counted.cache_creation_input_tokens + counted.cache_read_input_tokens
    details = {
        "cached_tokens": counted.cache_read_input_tokens,
        "cache_write_tokens": counted.cache_creation_input_tokens,
    }
    return {"prompt_tokens": prompt, "completion_tokens": counted.output_tokens, "prompt_tokens_details": details}


def messages_of(chat: list[dict[str, Any]]) -> list[Message]:
    """A sent Chat Completions conversation as the Messages API history it stands for.

    The inverse of :func:`tether.models.chat_format.chat_messages` (written apart from it, so a
    round trip checks it): ``tool`` messages and the user message right after them are one
    user turn; a result is an error when its text says so, as the model reads it.
    """
    history: list[Message] = []
    for message in chat:
        role, content = message["role"], message.get("content")
        if role == "system":
            continue
        if role == "assistant":
            blocks = _text_blocks(content)
            for call in message.get("tool_calls") or []:
                arguments = json.loads(call["function"]["arguments"])
                blocks.append(
                    {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}
                )
            history.append({"role": "assistant", "content": blocks})
            continue
        if role == "tool":
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": content}
            if str(content).startswith("Error"):
                result["is_error"] = True
            blocks = [result]
        else:
            blocks = _text_blocks(content)
        previous = history[-1] if history else None
        if previous is not None and previous["role"] == "user" and previous["content"][-1]["type"] == "tool_result":
            previous["content"].extend(blocks)
        else:
            history.append({"role": "user", "content": blocks})
    return history


def _text_blocks(content: object) -> list[dict[str, Any]]:
    if not content:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": part["text"]} for part in content]  # type: ignore[attr-defined]
