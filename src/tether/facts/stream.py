"""A run's events as a consumer follows them: a small tagged union, each stored one with its cursor.

The store's event log is the stream. Each event a consumer sees here stands for one recorded
event (:mod:`tether.facts.events`) and carries its ``cursor``, that event's ``seq``: a consumer
that keeps the cursor of the last event it saw and asks again with it (``after=cursor``, an
SSE ``Last-Event-ID``) misses nothing and sees nothing twice, whichever process drove the run
meanwhile. Only :class:`TextDelta`, the model's text as it arrives, is live: it is never stored,
so it has no cursor and a consumer that was away does not see it again (the whole text comes in
the :class:`ModelStepDone` that follows).

========================= ============================================================
:class:`TextDelta`        text of the model's answer as it arrives (live only)
:class:`ModelStepDone`    the model answered: its text and the calls it asks for
:class:`ToolCallStarted`  an attempt of a call is about to run (its start is committed)
:class:`ToolCallFinished` an attempt ended: the result the model gets, or a retry ahead
:class:`ChildRunStarted`  a call of an agent tool is served by a run of its own: follow it there
:class:`ApprovalNeeded`   the run parks until people decide these calls
:class:`CallDecided`      a person decided one call
:class:`StatusChanged`    the machine moved (``thinking`` → ``executing_tool`` ...)
:class:`RunEnded`         the run ended: done, failed or cancelled
========================= ============================================================

Other facts (warnings, cache lookups, compactions, handoffs) have no event here: they
are in the log (:meth:`tether.stores.Store.load_events`), and a consumer that follows from a
cursor passes over them. Like the facts, these are frozen dataclasses with a literal tag
(``kind``), taken apart with ``match``; :func:`to_json` gives the JSON an SSE ``data`` line holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

from tether.facts import events as ev
from tether.facts.history import text_of
from tether.facts.usage import Usage

Json: TypeAlias = dict[str, Any]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text of the model's answer as it arrives; live only (never stored, so no cursor)."""

    kind: ClassVar[Literal["text_delta"]] = "text_delta"
    cursor: ClassVar[None] = None
    """Always None: a delta is not in the log (the :class:`ModelStepDone` after it holds the whole text)."""
    run_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model asks for in a :class:`ModelStepDone`."""

    call_id: str
    tool: str
    input: Any


@dataclass(frozen=True, slots=True)
class _Recorded:
    """What every event standing for a recorded one says: whose, where in its log, when."""

    run_id: str
    cursor: int
    """The recorded event's seq: ask again ``after`` it to go on from here."""
    at: float
    """Unix time it was recorded."""


@dataclass(frozen=True, slots=True)
class ModelStepDone(_Recorded):
    """The model answered (one step): what it said and the calls it asks for."""

    kind: ClassVar[Literal["model_step_done"]] = "model_step_done"
    text: str
    """The answer's text blocks, joined."""
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str | None
    usage: Usage
    cost_usd: float | None
    """None: the model's price is unknown."""
    kept: bool
    """False when the answer was not kept in the history (a tool_use cut off at max_tokens, a refusal)."""


@dataclass(frozen=True, slots=True)
class ToolCallStarted(_Recorded):
    """An attempt of a call is about to run: its start is committed first."""

    kind: ClassVar[Literal["tool_call_started"]] = "tool_call_started"
    call_id: str
    tool: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ToolCallFinished(_Recorded):
    """An attempt of a call ended, or the call was answered without running (cached, denied, refused).

    With ``retry_at`` set, the attempt failed and the tool's retry policy runs it again then
    (``content`` is the error); otherwise ``content`` is the result the model gets.
    """

    kind: ClassVar[Literal["tool_call_finished"]] = "tool_call_finished"
    call_id: str
    tool: str
    content: str
    is_error: bool
    attempt: int | None
    """None: nothing ran (a cached result, a denial, invalid arguments)."""
    duration: float | None
    retry_at: float | None = None
    """Unix time the next attempt is due, when the tool's retry policy tries again."""


@dataclass(frozen=True, slots=True)
class ChildRunStarted(_Recorded):
    """A call of an agent tool is served by a child run of its own: its events are in that run's stream."""

    kind: ClassVar[Literal["child_run_started"]] = "child_run_started"
    call_id: str
    tool: str
    child_run_id: str
    """The child run's id: ``stream(child_run_id)`` follows what it does."""


@dataclass(frozen=True, slots=True)
class AskedCall:
    """A call shown to people in an :class:`ApprovalNeeded`."""

    call_id: str
    tool: str
    input: Any
    """What would run: the model's input, or an earlier edit."""
    reason: str
    fingerprint: str
    """Pass it with a decision: it binds the decision to this very input."""


@dataclass(frozen=True, slots=True)
class ApprovalNeeded(_Recorded):
    """The run parks until people decide these calls (``escalation``: a failing call's retry policy asks)."""

    kind: ClassVar[Literal["approval_needed"]] = "approval_needed"
    calls: tuple[AskedCall, ...]
    escalation: bool


@dataclass(frozen=True, slots=True)
class CallDecided(_Recorded):
    """A person (or a program) decided one call."""

    kind: ClassVar[Literal["call_decided"]] = "call_decided"
    call_id: str
    tool: str
    approved: bool
    actor: str
    reason: str
    input: Json | None
    """The edited input it runs with instead of the model's, if any."""


@dataclass(frozen=True, slots=True)
class StatusChanged(_Recorded):
    """The run's machine moved from ``previous`` to ``status`` on ``trigger`` (``previous`` None: it began)."""

    kind: ClassVar[Literal["status_changed"]] = "status_changed"
    status: str
    previous: str | None
    trigger: str


@dataclass(frozen=True, slots=True)
class RunEnded(_Recorded):
    """The run ended: ``done``, ``cancelled``, or ``failed`` (``retryable``: resuming it tries again).

    A follower's stream ends with it. A run that failed resumably goes on when it is resumed:
    follow it again from this cursor to see what comes next.
    """

    kind: ClassVar[Literal["run_ended"]] = "run_ended"
    status: str
    output: str | None
    result: Json | None
    error: str | None
    retryable: bool


StreamEvent: TypeAlias = (
    TextDelta
    | ModelStepDone
    | ToolCallStarted
    | ToolCallFinished
    | ChildRunStarted
    | ApprovalNeeded
    | CallDecided
    | StatusChanged
    | RunEnded
)
"""Every event a run's stream may give."""


def stream_event(run_id: str, event: ev.Event) -> StreamEvent | None:
    """The stream's event for the recorded ``event`` of run ``run_id``; None for a fact the stream passes over."""
    seq, at, fact = event.seq, event.at, event.fact
    match fact:
        case ev.ModelResponded():
            calls = tuple(
                ToolCall(block["id"], block["name"], block.get("input"))
                for block in fact.content
                if block.get("type") == "tool_use"
            )
            text = text_of({"content": fact.content})
            return ModelStepDone(
                run_id, seq, at, text, calls, fact.stop_reason, fact.usage, fact.cost_usd, not fact.discarded
            )
        case ev.ToolStarted():
            return ToolCallStarted(run_id, seq, at, fact.call_id, fact.tool, fact.attempt)
        case ev.ToolFinished():
            return ToolCallFinished(
                run_id, seq, at, fact.call_id, fact.tool, fact.content, fact.is_error, fact.attempt, fact.duration
            )
        case ev.RetryScheduled():
            return ToolCallFinished(
                run_id, seq, at, fact.call_id, fact.tool, fact.error, True, fact.attempt, fact.duration, fact.due_at
            )
        case ev.ChildStarted():
            return ChildRunStarted(run_id, seq, at, fact.call_id, fact.tool, fact.run_id)
        case ev.ApprovalRequested():
            asked = tuple(AskedCall(c.call_id, c.tool, c.input, c.reason, c.fingerprint) for c in fact.calls)
            return ApprovalNeeded(run_id, seq, at, asked, fact.escalation)
        case ev.ApprovalDecided():
            return CallDecided(
                run_id, seq, at, fact.call_id, fact.tool, fact.approved, fact.actor, fact.reason, fact.input
            )
        case ev.Transition():
            return StatusChanged(run_id, seq, at, fact.target, fact.source, fact.event)
        case ev.RunFinished():
            return RunEnded(run_id, seq, at, fact.status, fact.output, fact.result, fact.error, fact.retryable)
    return None


def to_json(event: StreamEvent) -> Json:
    """The event as JSON: its ``kind``, its ``cursor`` (null for a text delta) and its fields."""
    return {"kind": event.kind, "cursor": event.cursor, **dataclasses.asdict(event)}


__all__ = [
    "ApprovalNeeded",
    "AskedCall",
    "CallDecided",
    "ChildRunStarted",
    "ModelStepDone",
    "RunEnded",
    "StatusChanged",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolCallFinished",
    "ToolCallStarted",
    "stream_event",
    "to_json",
]
