"""The recorded model: answers each call as the recorded run's model did, while the request is the recorded one.

A request that differs in what matters (messages, system prompt, tools offered, settings) is refused
with a :class:`ReplayMismatch` holding a readable diff: the agent under test no longer behaves as it did.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from tether.canonical import canonical_json
from tether.errors import ModelError
from tether.facts.history import Message
from tether.models import ModelRequest, ModelResponse
from tether.testing.recording import Exchange, Recording


class ReplayMismatch(ModelError):
    """The agent asked the model something the recorded run did not: the recording cannot answer.

    A model error, so the replayed run fails with it (its ``error`` holds the diff).
    """

    def __init__(self, message: str, *, invocation: int) -> None:
        super().__init__(message)
        self.invocation = invocation
        """The model call (from 0) that differs."""


class ReplayModel:
    """Answers each model call as the recording did, while the request is the recorded one.

    ``strict`` (the default) compares everything that matters: messages, system prompt, tools
    offered (names, descriptions, schemas) and settings. Not strict, only the messages are
    compared, and what else differs is kept in :attr:`ignored`: how ``tether replay`` lets the
    recorded model answer an agent with another system prompt or tools, by turn, until the
    conversation itself goes elsewhere.
    """

    def __init__(self, recording: Recording, *, strict: bool = True) -> None:
        self.recording = recording
        self.strict = strict
        self.name = f"replay:{recording.run_id}"
        self.ignored: list[str] = []
        """Differences let through (not strict), one line each."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        """The recorded answer to call number ``request.invocation``.

        Raises:
            ReplayMismatch: the recording holds no such call, or the request differs from it.
        """
        exchanges, index = self.recording.exchanges, request.invocation
        if index >= len(exchanges):
            raise ReplayMismatch(
                f"replay of run {self.recording.run_id}: the recorded run made {len(exchanges)} model calls; "
                f"this one asks for call #{index + 1}",
                invocation=index,
            )
        exchange = exchanges[index]
        where = f"replay of run {self.recording.run_id}, model call #{index + 1}"
        if exchange.messages is not None:
            changed = _messages_diff(exchange.messages, request.messages)
            if changed:
                raise ReplayMismatch(
                    f"{where}: the messages differ from the recorded ones\n{changed}", invocation=index
                )
        found = request_differences(exchange, request)
        if found and self.strict:
            raise ReplayMismatch(
                f"{where}: the request differs from the recorded one\n" + "\n".join(found), invocation=index
            )
        self.ignored.extend(f"call #{index + 1}: {line.splitlines()[0]}" for line in found)
        return ModelResponse.from_dict(exchange.response, source=f"the recording of run {self.recording.run_id}")

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Same as :meth:`complete`; nothing to wait for."""
        return self.complete(request)


def request_differences(exchange: Exchange, request: ModelRequest) -> list[str]:
    """How ``request`` differs from the recorded one besides its messages, one entry each (with its diff)."""
    found: list[str] = []
    if exchange.messages is None:
        return found
    known = exchange.system is not None or exchange.tools is not None  # not after a handoff
    if known and (exchange.system or None) != (request.system or None):
        found.append("system prompt changed\n" + _text_diff(exchange.system or "", request.system or ""))
    if exchange.tools is not None:
        offered = {tool["name"]: tool for tool in request.tools}
        for name in sorted(set(exchange.tools) | set(offered)):
            if name not in offered:
                found.append(f"tool {name!r} is no longer offered")
            elif name not in exchange.tools:
                found.append(f"tool {name!r} is offered and was not")
            else:
                found.extend(_tool_diff(name, exchange.tools[name], offered[name]))
    settings = {"model": request.model, **request.settings.to_dict(), "tool_choice": request.tool_choice}
    for key in sorted(set(exchange.settings) | set(settings)):
        if canonical_json(exchange.settings.get(key)) != canonical_json(settings.get(key)):
            was, now = json.dumps(exchange.settings.get(key)), json.dumps(settings.get(key))
            found.append(f"setting {key}: recorded {was}, now {now}")
    return found


def _tool_diff(name: str, recorded: Mapping[str, Any], offered: Mapping[str, Any]) -> list[str]:
    found = []
    if recorded.get("description") is not None and recorded.get("description") != offered.get("description"):
        diff = _text_diff(str(recorded.get("description")), str(offered.get("description")))
        found.append(f"tool {name!r}: description changed\n{diff}")
    if canonical_json(recorded.get("input_schema")) != canonical_json(offered.get("input_schema")):
        diff = _text_diff(_pretty(recorded.get("input_schema")), _pretty(offered.get("input_schema")))
        found.append(f"tool {name!r}: input schema changed\n{diff}")
    return found


def _messages_diff(recorded: list[Message], sent: list[Message]) -> str:
    """A unified diff of the two histories, from the first message that differs; empty when equal."""
    was, now = [_plain(m) for m in recorded], [_plain(m) for m in sent]
    if canonical_json(was) == canonical_json(now):
        return ""
    first = next(
        (i for i, (a, b) in enumerate(zip(was, now, strict=False)) if canonical_json(a) != canonical_json(b)), None
    )
    if first is None:
        first = min(len(was), len(now))
    head = f"first difference at message {first} (of {len(was)} recorded, {len(now)} sent)"
    return head + "\n" + _text_diff(_pretty(was[first:]), _pretty(now[first:]))


def _plain(message: Message) -> dict[str, Any]:
    """A message as compared: text content as a block, without cache marks (an adapter's detail)."""
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    return {
        "role": message.get("role"),
        "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks],
    }


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _text_diff(recorded: str, now: str) -> str:
    lines = difflib.unified_diff(
        recorded.splitlines(), now.splitlines(), fromfile="recorded", tofile="now", lineterm="", n=2
    )
    return "\n".join(lines)


__all__ = ["ReplayMismatch", "ReplayModel", "request_differences"]
