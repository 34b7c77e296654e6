"""History processors: keep a long run within the model's context, pairing intact.

An agent's ``history_processors`` run before each model call, in order; the first that
would change the history makes a step of its own (the machine's ``compacted``), recorded as a
``history_compacted`` event holding the new history whole, so a resume rebuilds exactly what
the model was sent from then on. Each processor is pure and returns None once there is
nothing (more) to do, so it runs again only when the history has grown past it.

The history is cut only between *rounds*: a round is one assistant turn and the user turn
after it (its tool results, or a new prompt), so a ``tool_use`` never loses its
``tool_result``. The first message, the task the run was given, is always kept.

- :class:`KeepLastTurns` keeps the task and the last N rounds.
- :class:`DropToolResults` keeps every call but replaces the bodies of results older than the
  last N rounds with a note.
- :class:`Summarise` replaces the rounds before the last N with a summary written by the model,
  in a model call that is its own recorded step.

After the API says the conversation no longer fits (``model_context_window_exceeded``, or a
"prompt is too long" error) a run with processors is compacted *forced* (a processor with a
threshold compacts even below it) and asked again, once; a second overflow fails the run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tether.errors import ConfigError
from tether.facts.history import Message, text_block, text_of

DROPPED_RESULT = "[result omitted to save context]"
"""What an old tool result's body becomes under :class:`DropToolResults`."""
SUMMARY_HEADER = "Summary of the conversation so far (earlier turns were summarised to save context):"
SUMMARY_INSTRUCTIONS = (
    "Summarise the conversation below for the assistant who will continue it: the facts found, "
    "the tool results that matter, what was decided and what is left to do. Be complete but brief; "
    "answer with the summary only."
)
SUMMARY_MAX_TOKENS = 2048


def rounds(messages: list[Message]) -> list[int]:
    """The index of each round's assistant turn (a round: one assistant turn and the user turn after it)."""
    return [index for index, message in enumerate(messages) if index > 0 and message["role"] == "assistant"]


def _kept(messages: list[Message], keep_last: int) -> int | None:
    """Where the kept tail starts (an assistant turn), or None when there are no more than ``keep_last`` rounds."""
    starts = rounds(messages)
    return starts[len(starts) - keep_last] if len(starts) > keep_last else None


@runtime_checkable
class HistoryProcessor(Protocol):
    """Compacts a history, or says there is nothing to do (None)."""

    @property
    def name(self) -> str:
        """How the ``history_compacted`` event names it."""
        ...

    def compact(self, messages: list[Message], *, forced: bool) -> list[Message] | None:
        """The compacted history (never changing ``messages``), or None."""
        ...


@dataclass(frozen=True)
class KeepLastTurns:
    """Keep the task (the first message) and the last ``turns`` rounds; drop the rounds between."""

    turns: int

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ConfigError("KeepLastTurns needs turns >= 1")

    @property
    def name(self) -> str:
        """``keep_last_turns``."""
        return "keep_last_turns"

    def compact(self, messages: list[Message], *, forced: bool) -> list[Message] | None:
        """The task and the last rounds, when there are more."""
        start = _kept(messages, self.turns)
        if start is None:
            return None
        return [messages[0], *messages[start:]]


@dataclass(frozen=True)
class DropToolResults:
    """Replace the bodies of tool results older than the last ``keep_last`` rounds with a note.

    The calls and their results stay (the pairing, and the fact a call was made and whether it
    failed); only what a result said is dropped.
    """

    keep_last: int = 2

    def __post_init__(self) -> None:
        if self.keep_last < 1:  # the latest results are the ones the model has not read yet
            raise ConfigError("DropToolResults needs keep_last >= 1")

    @property
    def name(self) -> str:
        """``drop_tool_results``."""
        return "drop_tool_results"

    def compact(self, messages: list[Message], *, forced: bool) -> list[Message] | None:
        """The history with old results' bodies replaced, when one still has its body."""
        start = _kept(messages, self.keep_last)
        if start is None:
            return None
        compacted, changed = list(messages), False
        for index in range(1, start):
            content = messages[index]["content"]
            if messages[index]["role"] != "user" or not isinstance(content, list):
                continue
            blocks = [_dropped(block) for block in content]
            if blocks != content:
                compacted[index] = {"role": "user", "content": blocks}
                changed = True
        return compacted if changed else None


def _dropped(block: dict[str, Any]) -> dict[str, Any]:
    if block.get("type") != "tool_result" or block.get("content") == DROPPED_RESULT:
        return block
    return {**block, "content": DROPPED_RESULT}


@dataclass(frozen=True)
class Summarise:
    """Replace the rounds before the last ``keep_last`` with a summary the model writes.

    It runs once there are more than ``when_over`` rounds (or, forced after an overflow, more
    than ``keep_last``). The summary call is one model call of its own, with no tools, recorded
    with its usage and cost; the summary joins the task as a text block of the first message.
    """

    keep_last: int = 4
    when_over: int = 12
    instructions: str = SUMMARY_INSTRUCTIONS
    max_tokens: int = SUMMARY_MAX_TOKENS

    def __post_init__(self) -> None:
        if self.keep_last < 1 or self.when_over < self.keep_last:
            raise ConfigError("Summarise needs keep_last >= 1 and when_over >= keep_last")

    @property
    def name(self) -> str:
        """``summarise``."""
        return "summarise"

    def compact(self, messages: list[Message], *, forced: bool) -> list[Message] | None:
        """Nothing without a model call: see :meth:`plan`."""
        return None

    def plan(self, messages: list[Message], *, forced: bool) -> SummaryPlan | None:
        """What to summarise, when there is enough to."""
        count = len(rounds(messages))
        if count <= (self.keep_last if forced else self.when_over):
            return None
        start = _kept(messages, self.keep_last)
        assert start is not None  # more rounds than keep_last
        return SummaryPlan(self, start, _transcript(messages[1:start]))


@dataclass(frozen=True)
class SummaryPlan:
    """A summary to ask for: the rounds before ``keep_from`` go, as ``transcript`` says them."""

    processor: Summarise
    keep_from: int
    transcript: str

    def request_messages(self) -> list[Message]:
        """The summary call's one user message."""
        text = f"{self.processor.instructions}\n\n<conversation>\n{self.transcript}\n</conversation>"
        return [{"role": "user", "content": [text_block(text)]}]

    def apply(self, messages: list[Message], summary: str) -> list[Message]:
        """The history with the summarised rounds replaced by ``summary``, joined to the task."""
        first = messages[0]
        content = first["content"]
        blocks = [text_block(content)] if isinstance(content, str) else list(content)
        task = {"role": first["role"], "content": [*blocks, text_block(f"{SUMMARY_HEADER}\n{summary}")]}
        return [task, *messages[self.keep_from :]]


def _transcript(messages: list[Message]) -> str:
    """The rounds as plain text for the summary call: what was said, called and returned."""
    lines: list[str] = []
    for message in messages:
        content = message["content"]
        blocks = [text_block(content)] if isinstance(content, str) else content
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                lines.append(f"{message['role']}: {block['text']}")
            elif kind == "tool_use":
                lines.append(f"assistant called {block['name']} {json.dumps(block['input'], ensure_ascii=False)}")
            elif kind == "tool_result":
                failed = " (failed)" if block.get("is_error") else ""
                lines.append(f"tool result{failed}: {text_of({'content': block.get('content') or ''})}")
    return "\n".join(lines)


Compaction = tuple[HistoryProcessor, list[Message]] | SummaryPlan


def next_compaction(
    processors: Sequence[HistoryProcessor], messages: list[Message], *, forced: bool
) -> Compaction | None:
    """What the first processor with something to do would do (None: the history is fine as it is)."""
    for processor in processors:
        if isinstance(processor, Summarise):
            plan = processor.plan(messages, forced=forced)
            if plan is not None:
                return plan
            continue
        compacted = processor.compact(messages, forced=forced)
        if compacted is not None and compacted != messages:
            return processor, compacted
    return None


def check_processors(processors: Sequence[object]) -> None:
    """Refuse anything that is not a history processor (a typo'd list would silently do nothing)."""
    for processor in processors:
        if not isinstance(processor, HistoryProcessor):
            raise ConfigError(f"{processor!r} is not a history processor (it needs name and compact())")


__all__ = [
    "DropToolResults",
    "HistoryProcessor",
    "KeepLastTurns",
    "Summarise",
    "SummaryPlan",
    "check_processors",
    "next_compaction",
    "rounds",
]
