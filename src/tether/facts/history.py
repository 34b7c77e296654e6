"""The conversation as the exact Messages API list of content blocks.

History is never flattened to text: a continued conversation keeps every ``tool_use`` and
its ``tool_result``. This module holds the rules that keep the list valid (the pairing
invariant checked before every model call) and the prompt-caching marks.
"""

from __future__ import annotations

import copy
from typing import Any

from tether.errors import InvalidHistory

Block = dict[str, Any]
"""One Messages API content block (``{"type": "text", ...}``, ``tool_use``, ...)."""
Message = dict[str, Any]
"""One Messages API message: ``{"role": "user" | "assistant", "content": [Block, ...]}``."""

CACHE_BREAKPOINT: dict[str, str] = {"type": "ephemeral"}
MAX_CACHE_BREAKPOINTS = 4
"""The API refuses a request with more ``cache_control`` marks (tools, system and messages together)."""


def text_block(text: str) -> Block:
    """A text content block."""
    return {"type": "text", "text": text}


def tool_result_block(call_id: str, content: str, *, is_error: bool) -> Block:
    """A ``tool_result`` answering the ``tool_use`` with id ``call_id``."""
    block: Block = {"type": "tool_result", "tool_use_id": call_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def tool_uses(message: Message) -> list[Block]:
    """The ``tool_use`` blocks of a message, in order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if b.get("type") == "tool_use"]


def text_of(message: Message) -> str:
    """The concatenated text blocks of a message (the model's prose answer)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def append_user_text(messages: list[Message], text: str) -> None:
    """Add a user prompt, joining a trailing user message so roles keep alternating.

    A continued run may end with the user message holding tool results; the new prompt
    then goes after those results in the same message, as the API requires.
    """
    if messages and messages[-1]["role"] == "user":
        content = messages[-1]["content"]
        if isinstance(content, str):
            content = [text_block(content)]
        messages[-1] = {"role": "user", "content": [*content, text_block(text)]}
    else:
        messages.append({"role": "user", "content": [text_block(text)]})


def close_unanswered(messages: list[Message], note: str) -> None:
    """Answer a trailing turn's unanswered ``tool_use`` blocks with ``is_error`` results.

    A run that ended mid-batch (cancelled at a gate, failed on a limit) leaves calls without
    results; a conversation continued from it must still be a valid request.
    """
    if not messages or messages[-1]["role"] != "assistant":
        return
    calls = tool_uses(messages[-1])
    if calls:
        messages.append({"role": "user", "content": [tool_result_block(c["id"], note, is_error=True) for c in calls]})


def check_pairing(messages: list[Message], *, run_id: str, start: int = 0) -> None:
    """Raise :class:`InvalidHistory` unless every ``tool_use`` is answered exactly once.

    The rule is the API's: the message after an assistant turn with ``tool_use`` blocks is
    a user message that starts with one ``tool_result`` per ``tool_use`` id, and a
    ``tool_result`` answers only a ``tool_use`` of the message right before it.

    ``start`` > 0 says the first ``start`` messages, unchanged since, passed this check as a
    whole list: only the pair they end with and the later messages are checked again (the
    result is the same as for the whole list, in O(new messages) instead of O(history)).
    """
    if not messages or messages[0]["role"] != "user":
        raise InvalidHistory("history must start with a user message", run_id=run_id)
    answered: set[int] = set()
    first = max(0, min(start, len(messages)) - 1)
    if first > 0 and messages[first - 1]["role"] == "assistant" and tool_uses(messages[first - 1]):
        answered.add(first)
    for index in range(first, len(messages)):
        message = messages[index]
        wanted = [b["id"] for b in tool_uses(message)] if message["role"] == "assistant" else []
        following = messages[index + 1] if index + 1 < len(messages) else None
        if wanted:
            if following is None or following["role"] != "user":
                raise InvalidHistory(
                    f"messages.{index}: tool_use ids {wanted} have no tool_result after them",
                    run_id=run_id,
                )
            _check_results(following, wanted, index + 1, run_id)
            answered.add(index + 1)
        elif index not in answered and _result_ids(message):
            raise InvalidHistory(
                f"messages.{index}: tool_result without a tool_use in the previous message",
                run_id=run_id,
            )


def _result_ids(message: Message) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]


def _check_results(message: Message, wanted: list[str], index: int, run_id: str) -> None:
    content = message["content"] if isinstance(message["content"], list) else []
    leading = 0
    while leading < len(content) and content[leading].get("type") == "tool_result":
        leading += 1
    got = _result_ids(message)
    if len(got) != leading:
        raise InvalidHistory(f"messages.{index}: tool_result blocks must come first in the message", run_id=run_id)
    if sorted(got) != sorted(wanted) or len(set(got)) != len(got):
        raise InvalidHistory(
            f"messages.{index}: tool_result ids {got} do not answer tool_use ids {wanted}",
            run_id=run_id,
        )


def with_cache_breakpoints(messages: list[Message], *, budget: int = MAX_CACHE_BREAKPOINTS) -> list[Message]:
    """A copy of ``messages`` with cache breakpoints where this request ends and where the previous one did.

    The API writes the prompt cache at a request's breakpoints, and a breakpoint finds an
    earlier entry only within about 20 blocks before it. The breakpoint on the newest block
    writes this request's prefix for the next request. The one on the last block before the
    newest assistant turn sits exactly where the previous request ended (its own newest block,
    so written then), and reads that prefix however many blocks the model's turn and its tool
    results added since: a batch of 11 parallel calls adds 23, past the lookback of a single
    breakpoint on the newest block.

    Args:
        messages: the history as sent, never modified: only the marked messages are copied.
        budget: breakpoints the request can still take (the API's 4, less those on tools and
            system); with 1, only the newest block is marked.
    """
    if not messages or budget < 1:
        return list(messages)
    newest = len(messages) - 1
    marked = list(messages)
    marked[newest] = _with_breakpoint(messages[newest])
    previous = _previous_request_end(messages)
    if budget >= 2 and previous is not None and previous != newest:
        marked[previous] = _with_breakpoint(messages[previous])
    return marked


def _previous_request_end(messages: list[Message]) -> int | None:
    """The index of the message the previous request ended with: the one before the newest assistant turn.

    The newest assistant turn is what that request was answered with (or, after ``pause_turn``,
    its partial answer that this request continues).
    """
    for index in range(len(messages) - 1, 0, -1):
        if messages[index]["role"] == "assistant":
            return index - 1
    return None


def _with_breakpoint(message: Message) -> Message:
    content = message["content"]
    blocks = [text_block(content)] if isinstance(content, str) else list(content)
    if not blocks:
        return message
    marked = copy.copy(blocks[-1])
    marked["cache_control"] = dict(CACHE_BREAKPOINT)
    blocks[-1] = marked
    return {"role": message["role"], "content": blocks}
