"""A run told as a conversation: what ``tether show`` prints (``--events`` prints the log instead).

A reviewer reads a run as it went, not as the log recorded it: the system prompt and the prompt,
then each step (one model invocation) with the model's text and the calls it asked for, each
with the input that ran (and the model's own when a person edited it), who let it run or refused
it and why, what came back, and the child runs an agent tool started for it (and an operator's
taking it over from its driver, told with the call, where it happened). Between steps, what
tether itself did: a handoff, a warning, a budget's last call, a compaction.

Nothing new is recorded for it: :func:`conversation` folds one run's events (pure), reusing the
calls' audit entries (:mod:`tether.views.audit`) and the run's tree (:mod:`tether.views.tree`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.facts.events import (
    BudgetExhausted,
    CallAbandoned,
    ContextExceeded,
    Event,
    HandedOff,
    HistoryCompacted,
    ModelResponded,
    ResultDemanded,
    RunStarted,
    Warned,
)
from tether.views.audit import AuditEntry, entries
from tether.views.tree import RunNode


@dataclass(frozen=True)
class Abandonment:
    """A started call declared abandoned by its driver: from then on it was in doubt."""

    at: float
    by: str
    reason: str


@dataclass(frozen=True)
class Call:
    """One tool call the model asked for, as it went."""

    entry: AuditEntry
    """Its input, decision, attempts and outcome (see :class:`~tether.views.audit.AuditEntry`)."""
    children: tuple[RunNode, ...] = ()
    """The child runs an agent tool started to serve it (one per attempt)."""
    abandoned: tuple[Abandonment, ...] = ()
    """Each time an operator took the run over while the call ran (``tether resume --force``)."""


@dataclass(frozen=True)
class Turn:
    """One step: a model invocation, its text and the calls it asked for."""

    step: int
    """1 for the run's first model invocation (``tether runs`` counts them as its steps)."""
    text: str
    """The answer's text blocks, joined; empty when the model only called tools."""
    calls: tuple[Call, ...] = ()
    agent: str | None = None
    """The agent whose turn it was (None: an unnamed agent)."""
    discarded: str | None = None
    """Why the answer was not kept (a tool call cut off, a refusal); None: it was kept."""
    tokens: int = 0
    """Input (cache included) plus output tokens of the invocation."""
    cost_usd: float | None = None
    """None: the model's price is unknown."""
    latency: float = 0.0
    """Seconds the model took."""


@dataclass(frozen=True)
class Aside:
    """What tether itself did or said between steps."""

    text: str
    warning: bool = False


@dataclass(frozen=True)
class Conversation:
    """A run from its prompt to its last step."""

    run_id: str
    prompt: str | None
    """The text of the last user message the run started with: what it was asked (None: no text)."""
    system: str | None
    """The system prompt the run started with."""
    earlier: int = 0
    """Messages before the prompt: a continued conversation's or a fork's history (``--json`` has them)."""
    beats: tuple[Turn | Aside, ...] = field(default_factory=tuple)


def conversation(run_id: str, events: Sequence[Event], children: Sequence[RunNode] = ()) -> Conversation:
    """The run ``events`` record, with the child runs (of its tree) placed under the calls they serve; pure."""
    served: dict[str, list[RunNode]] = {}
    for child in children:
        if child.call_id is not None:
            served.setdefault(child.call_id, []).append(child)
    abandoned: dict[str, list[Abandonment]] = {}
    for event in events:  # told with its call: it happened before the call was asked about again
        if isinstance(event.fact, CallAbandoned):
            abandoned.setdefault(event.fact.call_id, []).append(Abandonment(event.at, event.fact.by, event.fact.reason))
    calls = {
        entry.call_id: Call(entry, tuple(served.get(entry.call_id, ())), tuple(abandoned.get(entry.call_id, ())))
        for entry in entries(run_id, events)
    }
    prompt: str | None = None
    system: str | None = None
    earlier, step = 0, 0
    agent: str | None = None
    beats: list[Turn | Aside] = []
    for event in events:
        match event.fact:
            case RunStarted(spec=spec, messages=messages):
                system, agent = spec.get("system"), spec.get("agent")
                asked = [i for i, message in enumerate(messages) if message.get("role") == "user" and _text(message)]
                if asked:
                    prompt, earlier = _text(messages[asked[-1]]), asked[-1]
            case ModelResponded() as answer:
                step += 1
                beats.append(_turn(answer, step, agent, calls))
            case HandedOff(from_agent=from_agent, to_agent=to_agent):
                agent = to_agent
                beats.append(Aside(f"handed off from {from_agent or 'the first agent'} to {to_agent}"))
            case HistoryCompacted(processor=processor, removed=removed, usage=usage):
                step += usage is not None  # a summary is a model invocation too
                beats.append(Aside(f"history compacted by {processor}: {removed} message(s) removed"))
            case Warned(message=message, call_id=None):  # a call's warnings are shown with the call
                beats.append(Aside(message, warning=True))
            case BudgetExhausted(limit=limit, used=used, allowed=allowed):
                beats.append(Aside(f"budget {limit} reached ({used:g} of {allowed:g}): asked for a final answer", True))
            case ResultDemanded(attempt=attempt):
                beats.append(Aside(f"asked the model for its final result (attempt {attempt})"))
            case ContextExceeded(error=error):
                beats.append(Aside(f"the history no longer fits the model's context: {error}", warning=True))
    return Conversation(run_id, prompt, system, earlier, tuple(beats))


def _turn(answer: ModelResponded, step: int, agent: str | None, calls: dict[str, Call]) -> Turn:
    """One model invocation: its text, and the calls it asked for (none if the answer was not kept)."""
    uses = [block["id"] for block in answer.content if block.get("type") == "tool_use" and "id" in block]
    kept = not answer.discarded
    shown = tuple(calls[i] for i in uses if kept and i in calls)
    why = None if kept else f"not kept (stop reason {answer.stop_reason}): the model was asked again"
    text = _text({"content": answer.content})
    return Turn(step, text, shown, agent, why, answer.usage.total, answer.cost_usd, answer.latency)


def _text(message: dict[str, Any]) -> str:
    """A message's text: a plain string, or its text blocks joined by blank lines."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    texts = [str(block.get("text") or "") for block in content or () if block.get("type") == "text"]
    return "\n\n".join(text for text in texts if text)


__all__ = ["Abandonment", "Aside", "Call", "Conversation", "Turn", "conversation"]
