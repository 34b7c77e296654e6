"""The Messages API response shape, checked where a response enters tether.

The ``anthropic`` SDK builds its response objects without validating them, so a broken API,
proxy or script can hand over a ``tool_use`` without an ``id``, ``usage`` as a list, a string
where a content block should be... Past the adapter that would surface as a traceback deep in
the engine, after the paid call, and again on every resume. :func:`check_response` refuses it
at the edge instead, as a transient :class:`~tether.errors.ModelError` that names each
problem: the run fails resumably, with nothing of the response in its history.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether.errors import ModelError

MAX_PROBLEMS = 5
"""Problems named in one error; more are counted."""
MAX_NESTING = 100
"""How deeply a content block's values may nest (objects and arrays in a tool's input): a block
nested deeper is refused. Whatever reads a value past the edge walks it recursively (pydantic
serialises at most ~250 levels, Python's ``json`` ~1,000 less the stack in use), and no tool's
input comes near this depth; refused here, the run fails resumably instead of with a traceback."""
_CLASS_NAME = re.compile(r" or instance of \w+")


class _Shape(BaseModel):
    """Fields tether reads are checked strictly (no ``"5"`` for 5); any other field passes.

    Validators are built at the first response checked, not at import (``defer_build``): every
    command imports this module, and only those that call a model need them.
    """

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)


Count = Annotated[int, Field(ge=0)] | None


class _Usage(_Shape):
    input_tokens: Count = None
    output_tokens: Count = None
    cache_creation_input_tokens: Count = None
    cache_read_input_tokens: Count = None


class _Response(_Shape):
    content: list[Any]
    stop_reason: str | None = None
    usage: _Usage | None = None
    id: str | None = None
    model: str | None = None


class _Text(_Shape):
    text: str


class _Thinking(_Shape):
    thinking: str
    signature: str


class _RedactedThinking(_Shape):
    data: str


class _ToolUse(_Shape):
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]


class _ServerToolResult(_Shape):
    tool_use_id: str


class _ContainerUpload(_Shape):
    file_id: str


BLOCK_SHAPES: dict[str, type[_Shape]] = {
    "text": _Text,
    "thinking": _Thinking,
    "redacted_thinking": _RedactedThinking,
    "tool_use": _ToolUse,
    "server_tool_use": _ToolUse,
    "web_search_tool_result": _ServerToolResult,
    "web_fetch_tool_result": _ServerToolResult,
    "code_execution_tool_result": _ServerToolResult,
    "bash_code_execution_tool_result": _ServerToolResult,
    "text_editor_code_execution_tool_result": _ServerToolResult,
    "tool_search_tool_result": _ServerToolResult,
    "container_upload": _ContainerUpload,
}
"""The content blocks an assistant turn may hold, by ``type``: what the API documents for a
response. An unknown type is refused, since the history is sent back as it is."""


def check_response(data: object, *, source: str = "the model") -> None:
    """Raise a transient :class:`ModelError` naming every problem unless ``data`` is a valid response.

    Args:
        data: a Messages API response object, as JSON.
        source: who sent it, for the message (``"the Anthropic API"``).
    """
    problems = response_problems(data)
    if not problems:
        return
    named = "; ".join(problems[:MAX_PROBLEMS])
    if len(problems) > MAX_PROBLEMS:
        named += f" (and {len(problems) - MAX_PROBLEMS} more)"
    response_id = data.get("id") if isinstance(data, dict) else None
    which = f"a malformed response {response_id}" if isinstance(response_id, str) else "a malformed response"
    raise ModelError(f"{source} sent {which}: {named}", retryable=True)


def response_problems(data: object) -> list[str]:
    """What is wrong with a response object, one phrase each (``[]``: nothing)."""
    try:
        response = _Response.model_validate(data)
    except ValidationError as error:
        problems = _phrases(error)
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            return problems
        return problems + _content_problems(data["content"])
    return _content_problems(response.content)


def _content_problems(content: list[Any]) -> list[str]:
    problems: list[str] = []
    tool_use_ids: set[str] = set()
    for index, block in enumerate(content):
        where = f"content.{index}"
        if not isinstance(block, dict):
            problems.append(f"{where}: a content block should be an object, not {type(block).__name__}")
            continue
        kind = block.get("type")
        if not isinstance(kind, str):
            problems.append(f"{where}: a content block needs a 'type'")
            continue
        shape = BLOCK_SHAPES.get(kind)
        if shape is None:
            problems.append(f"{where}: unknown block type {kind!r}")
            continue
        if _nested_too_deeply(block):
            problems.append(f"{where} ({kind}): nested more than {MAX_NESTING} levels deep")
            continue
        try:
            shape.model_validate(block)
        except ValidationError as error:
            problems += _phrases(error, f"{where} ({kind})")
            continue
        if shape is _ToolUse:
            if block["id"] in tool_use_ids:
                problems.append(f"{where} ({kind}).id: {block['id']!r} is used by another tool_use block")
            tool_use_ids.add(block["id"])
    return problems


def _nested_too_deeply(block: dict[str, Any]) -> bool:
    """Whether ``block``'s values nest objects or arrays more than :data:`MAX_NESTING` deep (walked, not recursed)."""
    level = [value for value in block.values() if isinstance(value, dict | list)]  # depth 1: a tool's input
    for _ in range(MAX_NESTING):
        if not level:
            return False
        level = [
            inner
            for value in level
            for inner in (value.values() if isinstance(value, dict) else value)
            if isinstance(inner, dict | list)
        ]
    return bool(level)


def _phrases(error: ValidationError, prefix: str = "") -> list[str]:
    """Pydantic's errors as ``where: what`` phrases, without its documentation links or class names."""
    phrases = []
    for item in error.errors(include_url=False):
        path = ".".join(str(part) for part in item["loc"])
        where = f"{prefix}.{path}" if prefix and path else prefix or path or "the response"
        message = _CLASS_NAME.sub("", str(item["msg"]))
        phrases.append(f"{where}: {message[:1].lower()}{message[1:]}")
    return phrases
