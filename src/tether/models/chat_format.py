"""The Chat Completions format, converted at the edge both ways: tether's history in, its turn out.

tether keeps the conversation as Messages API blocks whatever the model (see
:mod:`tether.facts.history`). For an OpenAI-compatible API this module turns a request into
Chat Completions messages (``tool_use`` blocks into an assistant's ``tool_calls``, each
``tool_result`` into a ``tool`` message right after it, in order) and a chat completion back
into one assistant turn of blocks, with its finish reason as a stop reason the engine knows:

================== ==================== =====================================================
finish_reason      stop_reason          what the engine does
================== ==================== =====================================================
``stop``           ``end_turn``         done, or the calls run if the turn has any
``tool_calls``     ``tool_use``         the calls run
``length``         ``max_tokens``       a cut-off call is discarded and asked again with more
``content_filter`` ``refusal``          the run fails, saying the provider's filter stopped it
(``refusal`` text) ``refusal``          the run fails with the model's refusal
================== ==================== =====================================================

Pure data work, no SDK: :mod:`tether.models.openai` sends what this builds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tether.errors import ModelError
from tether.facts.history import Block, Message, text_block
from tether.models import ModelResponse, Usage

FINISH_REASONS: Mapping[str, str] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
"""Chat Completions finish reasons as Messages API stop reasons; others pass through unchanged
(the engine fails the run on one it does not know rather than guess)."""
TOOL_CHOICES: Mapping[str, str] = {"auto": "auto", "any": "required", "none": "none"}
"""Messages API ``tool_choice`` types as Chat Completions ``tool_choice`` values."""
DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
"""Another provider's reasoning, kept in the history for it but meaningless (and unsendable) here."""
ERROR_PREFIX = "Error"
"""How a failed call's result starts (tether's own error results all do), the model's only sign of it here."""
CONTENT_FILTER = {"type": "content_filter", "explanation": "the provider's content filter stopped the answer"}


class UnsendableBlock(ModelError):
    """The history holds a block Chat Completions has no place for (a document, a server tool's result)."""

    def __init__(self, kind: str, where: str) -> None:
        super().__init__(f"a {kind!r} block ({where}) cannot be sent to a Chat Completions API")


# Requests ------------------------------------------------------------------------------------
def chat_messages(system: str | None, messages: list[Message]) -> list[dict[str, Any]]:
    """The history as Chat Completions messages, the system prompt first."""
    converted: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for index, message in enumerate(messages):
        content = message["content"]
        blocks = [text_block(content)] if isinstance(content, str) else list(content)
        where = f"messages.{index}"
        if message["role"] == "assistant":
            converted.append(_assistant(blocks, where))
        elif message["role"] == "system":
            converted.append({"role": "system", "content": _joined_text(blocks, where)})
        else:
            converted += _user(blocks, where)
    return converted


def _assistant(blocks: list[Block], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block["text"]))
        elif kind == "tool_use":
            arguments = json.dumps(block["input"], ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind not in DROPPED_BLOCKS:
            raise UnsendableBlock(str(kind), where)
    message: dict[str, Any] = {"role": "assistant", "content": _content(texts)}
    if calls:
        message["tool_calls"] = calls
        if not texts:
            message["content"] = None
    return message


def _content(texts: list[str]) -> str | list[dict[str, str]]:
    """One text as a plain string (what every compatible server reads); several as text parts."""
    if len(texts) == 1:
        return texts[0]
    return "" if not texts else [{"type": "text", "text": text} for text in texts]


def _user(blocks: list[Block], where: str) -> list[dict[str, Any]]:
    """Tool results as ``tool`` messages (they lead the user turn), then the rest as one user message."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_result":
            content = _joined_text(_as_blocks(block.get("content")), f"{where}.content.{index}")
            if block.get("is_error") and not content.startswith(ERROR_PREFIX):
                content = f"{ERROR_PREFIX}: {content}"  # a tool message has no is_error flag: its text says it
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content})
        elif kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, f"{where}.content.{index}")}})
        else:
            raise UnsendableBlock(str(kind), f"{where}.content.{index}")
    if not parts:
        return results
    if all(part["type"] == "text" for part in parts) and len(parts) == 1:
        return [*results, {"role": "user", "content": parts[0]["text"]}]
    return [*results, {"role": "user", "content": parts}]


def _as_blocks(content: object) -> list[Block]:
    if content is None:
        return []
    if isinstance(content, str):
        return [text_block(content)]
    return [dict(block) for block in content] if isinstance(content, list) else []


def _joined_text(blocks: list[Block], where: str) -> str:
    for block in blocks:
        if block.get("type") != "text":
            raise UnsendableBlock(str(block.get("type")), where)
    return "".join(str(block["text"]) for block in blocks)


def _image_url(block: Block, where: str) -> str:
    source = block.get("source") or {}
    if source.get("type") == "url":
        return str(source["url"])
    if source.get("type") == "base64":
        return f"data:{source['media_type']};base64,{source['data']}"
    raise UnsendableBlock(f"image with a {source.get('type')!r} source", where)


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages API tool definitions as Chat Completions ``function`` tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                **({"description": tool["description"]} if tool.get("description") else {}),
                "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


def chat_tool_choice(choice: Mapping[str, Any] | None) -> dict[str, Any]:
    """A Messages API ``tool_choice`` as the request fields that say the same (none when None)."""
    if choice is None:
        return {}
    kind = str(choice.get("type"))
    fields: dict[str, Any] = {}
    if kind == "tool":
        fields["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in TOOL_CHOICES:
        fields["tool_choice"] = TOOL_CHOICES[kind]
    else:
        raise ModelError(f"tool_choice {kind!r} has no Chat Completions equivalent")
    if choice.get("disable_parallel_tool_use") and kind != "none":
        fields["parallel_tool_calls"] = False
    return fields


# Responses -----------------------------------------------------------------------------------
def chat_usage(data: object) -> Usage:
    """Chat Completions usage as tether's: cached prompt tokens are cache reads, not input."""
    if not isinstance(data, Mapping):
        return Usage()
    details = data.get("prompt_tokens_details")
    details = details if isinstance(details, Mapping) else {}
    cached = _count(details.get("cached_tokens"))
    written = _count(details.get("cache_write_tokens"))
    prompt = _count(data.get("prompt_tokens"))
    return Usage(max(0, prompt - cached - written), _count(data.get("completion_tokens")), written, cached)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def chat_response(data: Mapping[str, Any], *, source: str) -> ModelResponse:
    """A chat completion (as JSON) as one assistant turn of Messages API blocks.

    Raises:
        ModelError: the completion is malformed (transient, naming what is wrong and ``source``).
    """
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(choice, Mapping) or not isinstance(message, Mapping):
        raise _malformed(data, source, "choices.0: a completion needs a choice with a message")
    finish = choice.get("finish_reason")
    content: list[Block] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append(text_block(text))
    refusal = message.get("refusal")
    cut_off = finish == "length"
    for index, call in enumerate(message.get("tool_calls") or []):
        content.append(_tool_use(call, index, cut_off=cut_off, data=data, source=source))
    stop_reason = FINISH_REASONS.get(finish, finish) if isinstance(finish, str) else None
    details = None
    if isinstance(refusal, str) and refusal:
        content, stop_reason = [text_block(refusal)], "refusal"
    elif finish == "content_filter":
        details = dict(CONTENT_FILTER)
    shaped = {
        "id": data.get("id"),
        "model": data.get("model"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_details": details,
        "usage": chat_usage(data.get("usage")).to_dict(),
    }
    return ModelResponse.from_dict(shaped, source=source)


def _tool_use(call: object, index: int, *, cut_off: bool, data: Mapping[str, Any], source: str) -> Block:
    """One ``tool_calls`` entry as a ``tool_use`` block; arguments that are not a JSON object are malformed.

    Unless the answer was cut off (``length``): the last call is then incomplete, and the engine
    discards the turn and asks again, so its arguments never matter.
    """
    where = f"choices.0.message.tool_calls.{index}"
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(call, Mapping) or not isinstance(function, Mapping):
        raise _malformed(data, source, f"{where}: a tool call needs a function")
    if call.get("type", "function") != "function":
        raise _malformed(data, source, f"{where}.type: only function tool calls are understood, not {call['type']!r}")
    raw = function.get("arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        if not cut_off:
            raise _malformed(data, source, f"{where}.function.arguments: not a JSON object: {str(raw)[:200]!r}")
        arguments = {}
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments}


def _malformed(data: Mapping[str, Any], source: str, problem: str) -> ModelError:
    which = f"a malformed response {data['id']}" if isinstance(data.get("id"), str) else "a malformed response"
    return ModelError(f"{source} sent {which}: {problem}", retryable=True)


class ChunkFolder:
    """Folds a stream's chunks (as JSON) into the chat completion the same call gives unstreamed."""

    def __init__(self) -> None:
        self.completion: dict[str, Any] = {}
        self.started = False
        """A chunk arrived: the client's own retries are behind us."""
        self.finished = False
        """A finish reason arrived: the answer is whole (a usage chunk may follow)."""
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None

    def fold(self, chunk: Mapping[str, Any]) -> str:
        """Take one chunk in; returns the answer's text it adds (for a live view)."""
        self.started = True
        for key in ("id", "model", "created"):
            if chunk.get(key) is not None:
                self.completion[key] = chunk[key]
        if chunk.get("usage") is not None:
            self.completion["usage"] = chunk["usage"]
        added = ""
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                added += str(delta["content"])
            if delta.get("refusal"):
                self._refusal.append(str(delta["refusal"]))
            for piece in delta.get("tool_calls") or []:
                self._fold_call(piece)
            if choice.get("finish_reason") is not None:
                self._finish = str(choice["finish_reason"])
                self.finished = True
        self._text.append(added)
        return added

    def _fold_call(self, piece: Mapping[str, Any]) -> None:
        call = self._calls.setdefault(int(piece.get("index", 0)), {"type": "function", "function": {"arguments": ""}})
        if piece.get("id"):
            call["id"] = piece["id"]
        function = piece.get("function") or {}
        if function.get("name"):
            call["function"]["name"] = function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] += function["arguments"]

    def result(self) -> dict[str, Any]:
        """The whole completion (call only once :attr:`finished`)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text) or None}
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._calls:
            message["tool_calls"] = [self._calls[index] for index in sorted(self._calls)]
        return {**self.completion, "choices": [{"index": 0, "message": message, "finish_reason": self._finish}]}
