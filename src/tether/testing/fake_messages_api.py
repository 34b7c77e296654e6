"""A local stand-in for the Anthropic Messages API, for testing agents that call Claude.

Why: a test should exercise the real ``anthropic`` client (request building, error
mapping, retries, streaming) without network access or cost, and must fail when the code
under test sends a request the real API would reject (most importantly a broken
``tool_use`` / ``tool_result`` pairing, or more than 4 cache breakpoints). A mock at the
Python level would hide both.

Usage, with tether's own adapter (any client taking a ``base_url`` works the same)::

    from tether import Agent, Runner
    from tether.models.anthropic import AnthropicModel
    from tether.testing import FakeMessagesAPI

    with FakeMessagesAPI() as api:
        api.reply_tool_use("add", {"a": 2, "b": 3})
        api.reply_text("5")
        model = AnthropicModel("claude-test", api_key="k", base_url=api.url, max_retries=0)
        result = Runner(Agent(model=model, tools=[add])).run("2 + 3?")
        assert api.requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"

Only ``POST /v1/messages`` is served. A request with ``"stream": true`` gets the same
scripted reply as server-sent events (see `sse_events`), written chunk by chunk as the
real API does, so streamed and non-streamed calls can be compared; `reply_events` scripts
a stream event by event (a mid-stream ``error`` event, a cut tool input, a dropped
connection); `fail` scripts an HTTP error. The server uses nothing but the standard
library, so it cannot drift with the client it is testing, and needs no test framework.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Mapping
from typing import Any, NoReturn, cast

from tether.testing.fake_server import Answer, Failure, FakeServer, Reply, Responder, Stream

__all__ = [
    "DEFAULT_ERROR_TYPES",
    "FakeMessagesAPI",
    "Responder",
    "error_event",
    "sse_events",
    "validate_messages_request",
]


DEFAULT_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""The ``error.type`` the real API uses for each HTTP status."""

_DEFAULT_USAGE: Mapping[str, int] = {
    "input_tokens": 10,
    "output_tokens": 5,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MAX_CACHE_BREAKPOINTS = 4
_MIN_THINKING_BUDGET = 1024

# Top-level request fields the client may send (the GA and beta `MessageCreateParams` of
# anthropic-version 2026-10-21, the one the SDK sends). Anything else is a typo that the
# real API rejects with "Extra inputs are not permitted".
_KNOWN_FIELDS = frozenset(
    {
        "betas",
        "billing_policy",
        "cache_control",
        "compaction",
        "container",
        "context_management",
        "diagnostics",
        "fallback_credit_token",
        "fallbacks",
        "inference_geo",
        "max_tokens",
        "mcp_servers",
        "messages",
        "metadata",
        "model",
        "output_config",
        "service_tier",
        "speed",
        "stop_sequences",
        "stream",
        "system",
        "thinking",
        "thread",
        "tool_choice",
        "tools",
        "user_profile_id",
        "workspace_id",
    }
)

_REMOVED_SAMPLING = ("temperature", "top_p", "top_k")
"""Taken by anthropic-version 2023-06-01, refused by 2026-10-21 (even at their defaults)."""

# Blocks that only the model produces, so they may appear only in assistant turns.
_ASSISTANT_ONLY = frozenset(
    {
        "tool_use",
        "server_tool_use",
        "thinking",
        "redacted_thinking",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
    }
)
_MESSAGE_BLOCK_TYPES = frozenset(
    {"text", "image", "document", "search_result", "tool_result", "container_upload"} | _ASSISTANT_ONLY
)
_TOOL_RESULT_CONTENT_TYPES = frozenset(
    {"text", "image", "document", "search_result", "tool_reference", "browser_state"}
)
_TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")
# This API version also accepts `system`-role messages (text only) inside `messages`.
_ROLES = ("user", "assistant", "system")

_PAIRING_HINT_MISSING = "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
_PAIRING_HINT_UNEXPECTED = (
    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
)


# --------------------------------------------------------------------------- validation


class _Invalid(Exception):
    """Carries the first validation error up to `validate_messages_request`."""


def _reject(message: str) -> NoReturn:
    raise _Invalid(message)


def _as_dict(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _reject(f"{path}: Input should be a valid dictionary")
    return cast(dict[str, Any], value)


def _as_list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        _reject(f"{path}: Input should be a valid list")
    return value


def _required_str(obj: Mapping[str, Any], key: str, path: str) -> str:
    if key not in obj:
        _reject(f"{path}.{key}: Field required")
    value = obj[key]
    if not isinstance(value, str):
        _reject(f"{path}.{key}: Input should be a valid string")
    return value


def _required_dict(obj: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    if key not in obj:
        _reject(f"{path}.{key}: Field required")
    return _as_dict(obj[key], f"{path}.{key}")


def _check_extra(obj: Mapping[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            _reject(f"{prefix}{key}: Extra inputs are not permitted")


class _Validator:
    """One pass over a request body; remembers what later rules need (ids, counts)."""

    def __init__(self) -> None:
        self.cache_breakpoints = 0
        self.tool_use_ids: set[str] = set()

    # -- shared pieces

    def cache_control(self, block: Mapping[str, Any], path: str) -> None:
        """Validate and count a ``cache_control`` marker; ``null`` means none."""
        value = block.get("cache_control")
        if value is None:
            return
        cc = _as_dict(value, f"{path}.cache_control")
        if cc.get("type") != "ephemeral":
            _reject(f"{path}.cache_control.type: Input should be 'ephemeral'")
        if "ttl" in cc and cc["ttl"] not in ("5m", "1h"):
            _reject(f"{path}.cache_control.ttl: Input should be '5m' or '1h'")
        _check_extra(cc, frozenset({"type", "ttl"}), f"{path}.cache_control.")
        self.cache_breakpoints += 1

    def text_block(self, block: Mapping[str, Any], path: str) -> None:
        text = _required_str(block, "text", path)
        if text == "":
            _reject(f"{path}: text content blocks must be non-empty")
        if not text.strip():
            _reject(f"{path}: text content blocks must contain non-whitespace text")

    # -- request sections

    def system(self, value: object) -> None:
        if isinstance(value, str):
            return
        for k, item in enumerate(_as_list(value, "system")):
            path = f"system.{k}"
            block = _as_dict(item, path)
            if block.get("type") != "text":
                _reject(f"{path}.type: Input should be 'text'")
            self.text_block(block, path)
            self.cache_control(block, path)

    def tools(self, value: object) -> set[str]:
        names: set[str] = set()
        for k, item in enumerate(_as_list(value, "tools")):
            path = f"tools.{k}"
            tool = _as_dict(item, path)
            name = _required_str(tool, "name", path)
            if not _TOOL_NAME.match(name):
                _reject(f"{path}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
            if tool.get("type") in (None, "custom"):
                schema = _required_dict(tool, "input_schema", path)
                if schema.get("type") != "object":
                    _reject(f"{path}.input_schema.type: Input should be 'object'")
            if name in names:
                _reject(f"tools: Tool names must be unique. Duplicate name: {name}")
            names.add(name)
            self.cache_control(tool, path)
        return names

    def tool_choice(self, value: object, tool_names: set[str]) -> str:
        choice = _as_dict(value, "tool_choice")
        kind = choice.get("type")
        if kind not in _TOOL_CHOICE_TYPES:
            _reject("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
        if kind == "tool":
            name = _required_str(choice, "name", "tool_choice")
            if name not in tool_names:
                _reject(f"tool_choice.name: Tool '{name}' not found in provided tools")
        if "disable_parallel_tool_use" in choice and not isinstance(choice["disable_parallel_tool_use"], bool):
            _reject("tool_choice.disable_parallel_tool_use: Input should be a valid boolean")
        return cast(str, kind)

    def thinking(self, value: object, max_tokens: int, tool_choice: str | None) -> bool:
        """Check the thinking config (and what it rules out); whether thinking is on."""
        config = _as_dict(value, "thinking")
        kind = config.get("type")
        if kind not in ("enabled", "disabled", "adaptive"):
            _reject("thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'")
        if kind == "disabled":
            return False
        if kind == "enabled":
            budget = config.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool):
                _reject("thinking.enabled.budget_tokens: Input should be a valid integer")
            if budget < _MIN_THINKING_BUDGET:
                _reject(
                    f"thinking.enabled.budget_tokens: Input should be greater than or equal to {_MIN_THINKING_BUDGET}"
                )
            if max_tokens <= budget:
                _reject("`max_tokens` must be greater than `thinking.budget_tokens`.")
        if tool_choice in ("any", "tool"):
            _reject("Thinking may not be enabled when tool_choice forces tool use.")
        return True

    def thinking_first(self, messages: list[Any]) -> None:
        """With thinking on, the assistant turn whose tool calls the last user turn answers starts with thinking.

        It is the turn the model is still in: the API needs its reasoning back, verbatim.
        """
        if len(messages) < 2 or messages[-1].get("role") != "user" or messages[-2].get("role") != "assistant":
            return
        content = messages[-2].get("content")
        blocks = content if isinstance(content, list) else []
        if not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks):
            return
        first = blocks[0].get("type") if blocks and isinstance(blocks[0], dict) else None
        if first not in ("thinking", "redacted_thinking"):
            _reject(
                f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                f"`{first}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block "
                "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
                "thinking blocks from previous turns. To avoid this requirement, disable `thinking`."
            )

    def block(self, value: object, path: str, role: str) -> dict[str, Any]:
        block = _as_dict(value, path)
        if "type" not in block:
            _reject(f"{path}.type: Field required")
        kind = block["type"]
        if kind not in _MESSAGE_BLOCK_TYPES:
            expected = ", ".join(f"'{t}'" for t in sorted(_MESSAGE_BLOCK_TYPES))
            _reject(
                f"{path}: Input tag '{kind}' found using 'type' does not match any of the expected tags: {expected}"
            )
        if role == "system" and kind != "text":
            _reject(f"{path}.type: Input should be 'text' (system messages hold only text)")
        if kind in _ASSISTANT_ONLY and role != "assistant":
            _reject(f"{path}: `{kind}` blocks can only be in `assistant` messages")
        if kind == "tool_result" and role != "user":
            _reject(f"{path}: `tool_result` blocks can only be in `user` messages")
        self.cache_control(block, path)

        if kind == "text":
            self.text_block(block, path)
        elif kind in ("image", "document"):
            source = _required_dict(block, "source", path)
            if "type" not in source:
                _reject(f"{path}.source.type: Field required")
        elif kind in ("tool_use", "server_tool_use"):
            tool_id = _required_str(block, "id", path)
            _required_str(block, "name", path)
            _required_dict(block, "input", path)
            if not tool_id:
                _reject(f"{path}.id: String should have at least 1 character")
            if tool_id in self.tool_use_ids:
                _reject(f"{path}: `tool_use` ids must be unique. Found duplicate id: {tool_id}")
            self.tool_use_ids.add(tool_id)
        elif kind == "tool_result":
            self.tool_result(block, path)
        elif kind == "thinking":
            _required_str(block, "thinking", path)
            _required_str(block, "signature", path)
        elif kind == "redacted_thinking":
            _required_str(block, "data", path)
        elif kind == "search_result":
            _required_str(block, "source", path)
            _required_str(block, "title", path)
            for k, item in enumerate(_as_list(block.get("content"), f"{path}.content")):
                inner = _as_dict(item, f"{path}.content.{k}")
                self.text_block(inner, f"{path}.content.{k}")
        elif kind == "container_upload":
            _required_str(block, "file_id", path)
        else:  # server tool results
            _required_str(block, "tool_use_id", path)
        return block

    def tool_result(self, block: Mapping[str, Any], path: str) -> None:
        _required_str(block, "tool_use_id", path)
        if "is_error" in block and not isinstance(block["is_error"], bool):
            _reject(f"{path}.is_error: Input should be a valid boolean")
        content = block.get("content")
        if content is None or isinstance(content, str):
            return
        for k, item in enumerate(_as_list(content, f"{path}.content")):
            inner_path = f"{path}.content.{k}"
            inner = _as_dict(item, inner_path)
            kind = inner.get("type")
            if kind not in _TOOL_RESULT_CONTENT_TYPES:
                allowed = ", ".join(f"'{t}'" for t in sorted(_TOOL_RESULT_CONTENT_TYPES))
                _reject(
                    f"{inner_path}: Input tag '{kind}' found using 'type' does not match any "
                    f"of the expected tags: {allowed}"
                )
            if kind == "text":
                self.text_block(inner, inner_path)
            self.cache_control(inner, inner_path)

    def messages(self, value: object) -> None:
        raw = _as_list(value, "messages")
        if not raw:
            _reject("messages: at least one message is required")
        parsed: list[tuple[str, list[dict[str, Any]]]] = []
        last = len(raw) - 1
        for i, item in enumerate(raw):
            parsed.append(self.message(item, i, is_last=i == last))
        conversation = [role for role, _ in parsed if role != "system"]
        if not conversation or conversation[0] != "user":
            _reject('messages: first message must use the "user" role')
        self.pairing(parsed)

    def message(self, value: object, i: int, *, is_last: bool) -> tuple[str, list[dict[str, Any]]]:
        path = f"messages.{i}"
        msg = _as_dict(value, path)
        role = msg.get("role")
        if "role" not in msg:
            _reject(f"{path}.role: Field required")
        if role not in _ROLES:
            _reject(f"{path}.role: Input should be 'user', 'assistant' or 'system'")
        if "content" not in msg:
            _reject(f"{path}.content: Field required")
        _check_extra(msg, frozenset({"role", "content"}), f"{path}.")
        content = msg["content"]
        final_assistant = is_last and role == "assistant"
        empty_msg = f"{path}: all messages must have non-empty content except for the optional final assistant message"
        if isinstance(content, str):
            if content == "" and not final_assistant:
                _reject(empty_msg)
            if final_assistant and content != content.rstrip():
                _reject("messages: final assistant content cannot end with trailing whitespace")
            return role, []
        items = _as_list(content, f"{path}.content")
        if not items and not final_assistant:
            _reject(empty_msg)
        blocks = [self.block(b, f"{path}.content.{j}", role) for j, b in enumerate(items)]
        if final_assistant and blocks and blocks[-1]["type"] == "text":
            text = cast(str, blocks[-1]["text"])
            if text != text.rstrip():
                _reject("messages: final assistant content cannot end with trailing whitespace")
        return role, blocks

    def pairing(self, parsed: list[tuple[str, list[dict[str, Any]]]]) -> None:
        """Enforce the tool_use -> tool_result handshake between adjacent turns."""
        for i, (role, blocks) in enumerate(parsed):
            if role == "user":
                self.user_results(parsed, i)
                continue
            use_ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
            if not use_ids:
                continue
            answered: set[str] = set()
            if i + 1 < len(parsed) and parsed[i + 1][0] == "user":
                answered = {b["tool_use_id"] for b in parsed[i + 1][1] if b["type"] == "tool_result"}
            missing = [tool_id for tool_id in use_ids if tool_id not in answered]
            if missing:
                _reject(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. {_PAIRING_HINT_MISSING}"
                )

    def user_results(self, parsed: list[tuple[str, list[dict[str, Any]]]], i: int) -> None:
        expected: set[str] = set()
        if i > 0 and parsed[i - 1][0] == "assistant":
            expected = {b["id"] for b in parsed[i - 1][1] if b["type"] == "tool_use"}
        seen: set[str] = set()
        other_before: int | None = None
        for j, block in enumerate(parsed[i][1]):
            if block["type"] != "tool_result":
                if other_before is None:
                    other_before = j
                continue
            path = f"messages.{i}.content.{j}"
            tool_id = cast(str, block["tool_use_id"])
            if tool_id not in expected:
                _reject(
                    f"{path}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{tool_id}. {_PAIRING_HINT_UNEXPECTED}"
                )
            if tool_id in seen:
                _reject(
                    f"{path}: each `tool_use` must have a single result. Found multiple "
                    f"`tool_result` blocks with id: {tool_id}"
                )
            seen.add(tool_id)
            if other_before is not None:
                _reject(
                    f"{path}: `tool_result` blocks must come first in the user message: "
                    f"found after a non-`tool_result` block at content.{other_before}"
                )


def validate_messages_request(body: object) -> str | None:
    """Check a Messages API request body the way the real API would.

    Why: lets tests assert offline that tether builds valid requests, and is the
    same check the fake server applies before answering.

    Returns:
        The error message the API would answer with (HTTP 400
        ``invalid_request_error``), or ``None`` if the request is acceptable.
    """
    try:
        _validate(body)
    except _Invalid as exc:
        return str(exc)
    return None


def _validate(value: object) -> None:
    if not isinstance(value, dict):
        _reject("Request body must be a JSON object")
    body = cast(dict[str, Any], value)
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            _reject(f"{key}: Field required")
    for name in _REMOVED_SAMPLING:
        if name in body:
            _reject(f"{name}: sampling parameters (temperature, top_p, top_k) are not accepted on this API version")
    _check_extra(body, _KNOWN_FIELDS, "")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        _reject("stream: Input should be a valid boolean")

    model = body["model"]
    if not isinstance(model, str):
        _reject("model: Input should be a valid string")
    if not model:
        _reject("model: String should have at least 1 character")
    max_tokens = body["max_tokens"]
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        _reject("max_tokens: Input should be a valid integer")
    if max_tokens < 0:  # 0 is valid: it only warms the prompt cache
        _reject("max_tokens: Input should be greater than or equal to 0")

    v = _Validator()
    if body.get("system") is not None:
        v.system(body["system"])
    tool_names = v.tools(body["tools"]) if body.get("tools") is not None else set()
    choice = v.tool_choice(body["tool_choice"], tool_names) if body.get("tool_choice") is not None else None
    if "stop_sequences" in body:
        for k, seq in enumerate(_as_list(body["stop_sequences"], "stop_sequences")):
            if not isinstance(seq, str):
                _reject(f"stop_sequences.{k}: Input should be a valid string")
    if body.get("metadata") is not None:
        _as_dict(body["metadata"], "metadata")
    thinking = body.get("thinking") is not None and v.thinking(body["thinking"], max_tokens, choice)
    v.messages(body["messages"])
    if thinking:
        v.thinking_first(body["messages"])
    v.cache_control(body, "")  # top-level automatic caching counts as a breakpoint too
    if v.cache_breakpoints > _MAX_CACHE_BREAKPOINTS:
        _reject(
            f"A maximum of {_MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
            f"provided. Found {v.cache_breakpoints}."
        )


# --------------------------------------------------------------------------- streaming

_TOOL_INPUT_BLOCKS = frozenset({"tool_use", "server_tool_use"})
_JSON_CHUNK = 12  # characters of a tool input per input_json_delta: several deltas even for small inputs


def _words(text: str) -> list[str]:
    """``text`` in pieces that join back to it exactly (a word and the spaces before it each)."""
    return re.findall(r"\s*\S+|\s+$", text)


def _block_events(index: int, block: object) -> list[dict[str, Any]]:
    """content_block_start, its deltas and content_block_stop for one finished block."""
    if not isinstance(block, Mapping):  # a malformed reply scripted on purpose: sent as it is
        return [
            {"type": "content_block_start", "index": index, "content_block": block},
            {"type": "content_block_stop", "index": index},
        ]
    kind = block.get("type")
    start = dict(block)
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        start["text"] = ""
        start.pop("citations", None)
        deltas += [{"type": "citations_delta", "citation": c} for c in block.get("citations") or []]
        deltas += [{"type": "text_delta", "text": piece} for piece in _words(str(block.get("text", "")))]
    elif kind in _TOOL_INPUT_BLOCKS:
        start["input"] = {}
        raw = json.dumps(block.get("input", {}))
        # The API opens with an empty partial_json, then sends the input's JSON in pieces.
        pieces = [""] + [raw[i : i + _JSON_CHUNK] for i in range(0, len(raw), _JSON_CHUNK)]
        deltas += [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
    elif kind == "thinking":
        start.update(thinking="", signature="")
        deltas += [{"type": "thinking_delta", "thinking": piece} for piece in _words(str(block.get("thinking", "")))]
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
    # Any other block (redacted_thinking, server tool results...) arrives whole in its start.
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def sse_events(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The events the API streams for ``message``, a complete Message object.

    Why: a ``stream: true`` call must rebuild, in the client, exactly the Message the same
    reply gives without streaming. The flow is the documented one: ``message_start`` (the
    Message with empty content, no stop reason, the input usage), a ``ping``, then per
    block ``content_block_start`` / ``content_block_delta``... / ``content_block_stop``
    (``text_delta``, ``input_json_delta`` in pieces, ``thinking_delta`` then
    ``signature_delta``), ``message_delta`` (stop reason, cumulative usage), ``message_stop``.
    """
    usage = message.get("usage") or {}
    if isinstance(usage, Mapping):
        started_usage: object = {**usage, "output_tokens": min(1, int(usage.get("output_tokens") or 0))}
    else:  # a malformed usage scripted on purpose: sent as it is
        started_usage = usage
    started = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "stop_details": None,
        "usage": started_usage,
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": started}, {"type": "ping"}]
    for index, block in enumerate(message.get("content") or []):
        events += _block_events(index, block)
    delta = {
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
        "stop_details": message.get("stop_details"),
    }
    events.append({"type": "message_delta", "delta": delta, "usage": usage})
    events.append({"type": "message_stop"})
    return events


def error_event(error_type: str = "overloaded_error", message: str = "Overloaded") -> dict[str, Any]:
    """An ``error`` event, as the API sends mid-stream (overloaded_error is a 529 outside a stream)."""
    return {"type": "error", "error": {"type": error_type, "message": message}}


# --------------------------------------------------------------------------- server


def _error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def _default_error_type(status: int) -> str:
    if status in DEFAULT_ERROR_TYPES:
        return DEFAULT_ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def _encoded(events: list[dict[str, Any]]) -> list[bytes]:
    """Each event as the API writes it: ``event: TYPE`` then its JSON ``data``."""
    return [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events]


class FakeMessagesAPI(FakeServer):
    """A scripted Anthropic Messages API on ``127.0.0.1`` for the real client to call.

    Why: scripted replies make agent runs deterministic, while validation of every
    request catches message histories that the real API would refuse.

    Each valid ``POST /v1/messages`` consumes the next scripted item (FIFO). Invalid
    requests get HTTP 400 ``invalid_request_error`` and consume nothing. With the
    queue empty, a valid request gets 500 ``api_error`` so the test fails loudly.

    Attributes:
        requests: Parsed JSON bodies received, in order, including rejected ones.
        headers: Request headers (lower-cased names), parallel to ``requests``.
        paths: Request paths, parallel to ``requests``.
    """

    def __init__(self, *, fast_retries: bool = True) -> None:
        """Start serving on a free port.

        Args:
            fast_retries: Add ``retry-after-ms: 1`` to retryable errors so the client's
                retry loop does not sleep its default 0.5-8 s back-off. The real API
                does not send this header; it changes only timing, never behaviour.
        """
        self._message_ids = itertools.count(1)
        self._tool_use_ids = itertools.count(1)
        self._signed: dict[str, str] = {}
        """The thinking each signature it served was given with: a thinking block sent back must be unchanged."""
        super().__init__(name="FakeMessagesAPI", fast_retries=fast_retries)

    @property
    def url(self) -> str:
        """Base URL to pass as ``base_url`` to ``anthropic.Anthropic``."""
        return self.origin

    # -- scripting

    def reply(self, response: Mapping[str, Any]) -> None:
        """Queue a successful response; missing Message fields get defaults.

        Defaults: ``id`` ``msg_fake_N``, ``type`` ``message``, ``role`` ``assistant``,
        ``model`` from the request, ``content`` ``[]``, ``stop_reason`` ``tool_use`` if
        the content holds a ``tool_use`` block else ``end_turn``, ``stop_sequence``
        ``None`` and a usage of 10 input / 5 output tokens (missing usage keys only).
        Anything else is served as given, malformed or not, to test how a client copes.
        """
        self.enqueue(Reply(copy.deepcopy(dict(response))))

    def reply_text(self, text: str, **fields: Any) -> None:
        """Queue an ``end_turn`` reply holding one text block."""
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
        """Queue a ``tool_use`` reply (optionally preceded by text); returns the tool_use id."""
        tool_id = tool_use_id or f"toolu_fake_{next(self._tool_use_ids)}"
        content: list[dict[str, Any]] = []
        if text is not None:
            content.append({"type": "text", "text": text})
        content.append({"type": "tool_use", "id": tool_id, "name": name, "input": dict(tool_input)})
        self.reply({"content": content, **fields})
        return tool_id

    def fail(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Queue an API error in the real ``{"type": "error", "error": {...}}`` shape.

        ``error_type`` defaults from the status (see `DEFAULT_ERROR_TYPES`). The answer
        carries a ``request-id`` header, ``retry-after: 0`` for 429, and ``headers``
        on top (which may override those).
        """
        body = _error_body(error_type or _default_error_type(status), message)
        self.enqueue(Failure(status, body, headers or {}))

    def reply_events(self, events: list[dict[str, Any]], *, drop_connection: bool = False) -> None:
        """Queue a stream served exactly as given, for a ``stream: true`` request.

        Build it from `sse_events` and `error_event`: e.g. the first events of a reply then
        an ``error`` event (the API ends the stream after one). ``drop_connection`` closes
        the connection after the events without ending the HTTP body. A non-streaming
        request meeting this item gets 500 ``api_error``, so the test fails loudly.
        """
        self.enqueue(Stream(_encoded(copy.deepcopy(events)), drop_connection))

    def reset_counters(self) -> None:
        """Restart the message and tool_use ids (see :meth:`FakeServer.reset`)."""
        self._message_ids = itertools.count(1)
        self._tool_use_ids = itertools.count(1)
        self._signed = {}

    # -- serving

    def not_found(self, path: str) -> Answer:
        """Answer like the API does for unknown routes."""
        return Answer(404, _error_body("not_found_error", f"Not found: {path}"))

    def check_request(self, path: str, headers: dict[str, str], parsed: object) -> Answer | None:
        """Route, key, version header and the body as :func:`validate_messages_request` judges it."""
        if path.rstrip("/") != "/v1/messages":
            return self.not_found(path)
        auth = headers.get("authorization", "")
        if not headers.get("x-api-key") and not auth.lower().startswith("bearer "):
            # This client version sends the key as a Bearer token; older ones used x-api-key.
            return Answer(401, _error_body("authentication_error", "x-api-key header is required"))
        if not headers.get("anthropic-version"):
            return Answer(400, _error_body("invalid_request_error", "anthropic-version: header is required"))
        if parsed is None:
            return Answer(400, _error_body("invalid_request_error", "There was an error parsing the body"))
        error = validate_messages_request(parsed) or self._changed_thinking(parsed)
        if error is not None:
            return Answer(400, _error_body("invalid_request_error", error))
        return None

    def _changed_thinking(self, body: object) -> str | None:
        """The API's error for a thinking block this server signed, sent back changed (it must be verbatim)."""
        for i, message in enumerate(cast(dict[str, Any], body)["messages"]):
            content = message.get("content")
            for j, block in enumerate(content if isinstance(content, list) else []):
                if block.get("type") != "thinking":
                    continue
                with self._lock:
                    signed = self._signed.get(block["signature"])
                if signed is not None and signed != block["thinking"]:
                    return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
        return None

    def error_body(self, message: str) -> dict[str, Any]:
        """An ``api_error`` body."""
        return _error_body("api_error", message)

    def stream_of(self, body: dict[str, Any], request: Mapping[str, Any]) -> list[bytes]:
        """The Message as the API streams it (see :func:`sse_events`)."""
        return _encoded(sse_events(body))

    def complete(self, response: dict[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
        """Fill a Message's missing fields (see :meth:`reply`)."""
        with self._lock:
            n = next(self._message_ids)
        response.setdefault("id", f"msg_fake_{n}")
        response.setdefault("type", "message")
        response.setdefault("role", "assistant")
        response.setdefault("model", request.get("model", "fake-model"))
        content = response.setdefault("content", [])
        has_tool_use = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
        response.setdefault("stop_reason", "tool_use" if has_tool_use else "end_turn")
        response.setdefault("stop_sequence", None)
        for block in content:
            if isinstance(block, dict) and block.get("type") == "thinking" and isinstance(block.get("signature"), str):
                with self._lock:
                    self._signed[block["signature"]] = str(block.get("thinking"))
        usage = response.get("usage") or {}
        if isinstance(usage, Mapping):  # anything else is a malformed usage scripted on purpose
            response["usage"] = {**_DEFAULT_USAGE, **usage}
        return response
