"""Events: the append-only facts a run's steps recorded.

A run is nothing but its events; :mod:`tether.core.state` folds them into the current state,
so a resumed run is rebuilt exactly, and each step writes only what it added.

Each kind of fact is a frozen dataclass with a literal tag (``kind``); :data:`Fact` is their
union, which readers take apart with ``match``. A fact's JSON form is its ``to_json()``, the
payload stored in a row's ``data`` column beside its kind; :func:`decode` reads a stored row
back (one pydantic adapter per kind) and is the only place payloads are parsed. Optional
fields are left out of the JSON when unset, so the payloads are those tether always wrote
and databases written before this vocabulary load unchanged.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeAlias, TypeVar, dataclass_transform

import pydantic

from tether.errors import CorruptData
from tether.facts.usage import Usage

Json: TypeAlias = dict[str, Any]
"""Free JSON: a spec, a tool's input, a message or content block, a final result."""
_Cls = TypeVar("_Cls", bound=type)


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def _frozen(cls: _Cls) -> _Cls:
    """A dataclass the type checker holds frozen; at run time plain (with slots).

    Frozen at run time, each field is set through ``object.__setattr__``: building a fact cost
    five times as much, and the engine builds several facts and events per step, on the hot path.
    """
    return dataclass(slots=True)(cls)  # type: ignore[return-value]


@_frozen
class Allowed:
    """Who let a call run without asking anyone then (see ``tether.core.engine._verdict``), for the audit."""

    by: str | None
    """``policy`` (a rule or the tool's approval callable), ``approved_for_run`` (a person's
    earlier ``remember_for_run``), or None: the tool needs no approval."""
    reason: str

    def to_json(self) -> Json:
        """The stored form."""
        return {"by": self.by, "reason": self.reason}


@_frozen
class RequestedCall:
    """One call shown to a person in an ``approval_requested``."""

    call_id: str
    tool: str
    input: Any
    """What would run: the model's input, or a person's earlier edit (free JSON)."""
    reason: str = ""
    fingerprint: str = ""
    """Hash of ``input`` (``tether.core.engine.fingerprint``): a decision binds to what was shown."""
    last_error: str | None = None
    """The error of the last failed attempt, when a retry policy escalated the call."""
    note: str = ""
    """Markdown the rule (or the tool's approval callable) that asked gives the person (see ``Rule.description``)."""

    def to_json(self) -> Json:
        """The stored form."""
        data = {
            "call_id": self.call_id,
            "tool": self.tool,
            "input": self.input,
            "reason": self.reason,
            "fingerprint": self.fingerprint,
        }
        if self.last_error is not None:
            data["last_error"] = self.last_error
        if self.note:
            data["note"] = self.note
        return data


@_frozen
class RunStarted:
    """The run's spec and opening history (a continued conversation's earlier messages too)."""

    kind: ClassVar[Literal["run_started"]] = "run_started"
    spec: Json
    messages: list[Json]
    created_at: float = 0.0

    def to_json(self) -> Json:
        """The stored form."""
        return {"spec": self.spec, "messages": self.messages, "created_at": self.created_at}


@_frozen
class ModelResponded:
    """One model answer, with its usage, cost and latency."""

    kind: ClassVar[Literal["model_responded"]] = "model_responded"
    content: list[Json]
    stop_reason: str | None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    """None: the model's price is unknown."""
    model: str | None = None
    id: str | None = None
    latency: float = 0.0
    retry_waits: list[float] | None = None
    """Seconds the adapter waited before each retry the API asked for."""
    discarded: bool = False
    """Not kept in the history (an incomplete tool_use, a refused turn...)."""
    next_max_tokens: int | None = None
    """The raised ``max_tokens`` to ask again with, after a tool_use was cut off."""

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {
            "content": self.content,
            "stop_reason": self.stop_reason,
            "usage": self.usage.to_dict(),
            "cost_usd": self.cost_usd,
            "model": self.model,
            "id": self.id,
            "latency": self.latency,
        }
        if self.retry_waits is not None:
            data["retry_waits"] = self.retry_waits
        if self.discarded:
            data["discarded"] = True
        if self.next_max_tokens is not None:
            data["next_max_tokens"] = self.next_max_tokens
        return data


@_frozen
class ToolStarted:
    """An attempt of a call is about to run (committed before it does)."""

    kind: ClassVar[Literal["tool_started"]] = "tool_started"
    call_id: str
    tool: str
    attempt: int
    owner: str = ""
    """``host:pid:token`` of the driver running it (for people)."""
    allowed: Allowed | None = None
    """Who let it run unasked; None when a person decided this very call."""
    lease_until: float | None = None
    """Written by tether 0.1 only (a per-call lease, before run leases)."""

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {"call_id": self.call_id, "tool": self.tool, "attempt": self.attempt, "owner": self.owner}
        if self.lease_until is not None:
            data["lease_until"] = self.lease_until
        if self.allowed is not None:
            data["allowed"] = self.allowed.to_json()
        return data


@_frozen
class ToolFinished:
    """A call's result, as the model gets it: from its tool, the cache, or a refusal."""

    kind: ClassVar[Literal["tool_finished"]] = "tool_finished"
    call_id: str
    tool: str
    content: str
    """What the model sees (cut to the agent's cap)."""
    is_error: bool
    attempt: int | None = None
    duration: float | None = None
    error_type: str | None = None
    """The exception class the attempt raised."""
    error_class: str | None = None
    in_doubt: bool = False
    """A timed-out attempt of a tool not idempotent may still complete."""
    interrupted: bool = False
    """A crash left the call in doubt and it was not run again."""
    denied_by: str | None = None
    reason: str | None = None
    """Why it was denied, with ``denied_by``."""
    budget_limit: str | None = None
    """The budget limit that kept the call from running."""
    cached: bool = False
    final_result: Json | None = None
    """A final tool's validated arguments: the run's result."""
    allowed: Allowed | None = None
    full_content: str | None = None
    """The whole result, when ``content`` is cut."""
    truncated_from: int | None = None

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {"call_id": self.call_id, "tool": self.tool, "content": self.content, "is_error": self.is_error}
        if self.attempt is not None:
            data["attempt"] = self.attempt
        if self.duration is not None:
            data["duration"] = self.duration
        if self.error_type is not None:
            data["error_type"] = self.error_type
        if self.error_class is not None:
            data["error_class"] = self.error_class
        if self.in_doubt:
            data["in_doubt"] = True
        if self.interrupted:
            data["interrupted"] = True
        if self.denied_by is not None:
            data["denied_by"] = self.denied_by
        if self.reason is not None:
            data["reason"] = self.reason
        if self.budget_limit is not None:
            data["budget_limit"] = self.budget_limit
        if self.cached:
            data["cached"] = True
        if self.final_result is not None:
            data["final_result"] = self.final_result
        if self.allowed is not None:
            data["allowed"] = self.allowed.to_json()
        if self.full_content is not None:
            data["full_content"] = self.full_content
        if self.truncated_from is not None:
            data["truncated_from"] = self.truncated_from
        return data


@_frozen
class RetryScheduled:
    """An attempt failed and the tool's retry policy tries again at ``due_at``."""

    kind: ClassVar[Literal["retry_scheduled"]] = "retry_scheduled"
    call_id: str
    tool: str
    attempt: int
    duration: float
    error_type: str
    due_at: float
    error: str
    error_class: str

    def to_json(self) -> Json:
        """The stored form."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "attempt": self.attempt,
            "duration": self.duration,
            "error_type": self.error_type,
            "due_at": self.due_at,
            "error": self.error,
            "error_class": self.error_class,
        }


@_frozen
class ApprovalRequested:
    """The run parks until a person decides these calls."""

    kind: ClassVar[Literal["approval_requested"]] = "approval_requested"
    calls: list[RequestedCall]
    escalation: bool = False
    """A retry policy escalated a failing call to a person."""
    duration: float | None = None
    """The escalated call's failed attempt."""

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {"calls": [call.to_json() for call in self.calls]}
        if self.escalation:
            data["escalation"] = True
        if self.duration is not None:
            data["duration"] = self.duration
        return data


@_frozen
class ApprovalDecided:
    """A person's decision on one call."""

    kind: ClassVar[Literal["approval_decided"]] = "approval_decided"
    call_id: str
    tool: str
    approved: bool
    actor: str
    reason: str
    input: Json | None
    """Edited input to run with instead of the model's."""
    fingerprint: str
    remember_for_run: bool

    def to_json(self) -> Json:
        """The stored form."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "approved": self.approved,
            "actor": self.actor,
            "reason": self.reason,
            "input": self.input,
            "fingerprint": self.fingerprint,
            "remember_for_run": self.remember_for_run,
        }


@_frozen
class ResultsReturned:
    """The batch's results went back to the model as one user message."""

    kind: ClassVar[Literal["results_returned"]] = "results_returned"

    def to_json(self) -> Json:
        """The stored form."""
        return {}


@_frozen
class Transition:
    """The machine moved (``source`` None: it entered its initial state)."""

    kind: ClassVar[Literal["transition"]] = "transition"
    event: str
    source: str | None
    target: str

    def to_json(self) -> Json:
        """The stored form."""
        return {"event": self.event, "source": self.source, "target": self.target}


@_frozen
class Warned:
    """A warning: a ``warn`` rule matched, a limit is near, an attempt's thread runs on..."""

    kind: ClassVar[Literal["warning"]] = "warning"
    message: str
    call_id: str | None = None
    tool: str | None = None
    rule: int | None = None
    """The index of the ``warn`` rule that matched."""
    rule_name: str | None = None
    """Its name (stored with ``rule``, even when None)."""
    abandoned_thread: bool = False
    limit: str | None = None
    """A hard cap of Limits near its end."""
    budget: str | None = None
    """A budget limit near its end (or ``cost_unknown``)."""
    retry_waits: list[float] | None = None
    """The model API's retries before a failed call."""

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {"message": self.message}
        if self.call_id is not None:
            data["call_id"] = self.call_id
        if self.tool is not None:
            data["tool"] = self.tool
        if self.rule is not None:
            data["rule"] = self.rule
            data["rule_name"] = self.rule_name
        if self.abandoned_thread:
            data["abandoned_thread"] = True
        if self.limit is not None:
            data["limit"] = self.limit
        if self.budget is not None:
            data["budget"] = self.budget
        if self.retry_waits is not None:
            data["retry_waits"] = self.retry_waits
        return data


@_frozen
class BudgetExhausted:
    """A budget ran out: the model is asked for a final answer with tools disabled."""

    kind: ClassVar[Literal["budget_exhausted"]] = "budget_exhausted"
    limit: str
    used: float
    allowed: float
    prompt: str

    def to_json(self) -> Json:
        """The stored form."""
        return {"limit": self.limit, "used": self.used, "allowed": self.allowed, "prompt": self.prompt}


@_frozen
class ResultDemanded:
    """The model answered in prose where a typed result is required: it is asked again for it."""

    kind: ClassVar[Literal["result_demanded"]] = "result_demanded"
    prompt: str
    """What the model is told (added to the history as a user turn)."""
    attempt: int
    """How many times the result was asked for again, this one included."""
    forced: bool
    """The next call forces the result tool (not with extended thinking, which forbids it)."""

    def to_json(self) -> Json:
        """The stored form."""
        return {"prompt": self.prompt, "attempt": self.attempt, "forced": self.forced}


@_frozen
class HistoryCompacted:
    """The agent's history processors compacted the history: from here on it is ``messages``.

    The whole new history is kept, so a resume rebuilds exactly what the model is sent. A
    summary (``summarise``) was written by a model call of its own, whose usage and cost are here.
    """

    kind: ClassVar[Literal["history_compacted"]] = "history_compacted"
    processor: str
    messages: list[Json]
    removed: int
    """How many messages fewer the history has."""
    forced: bool = False
    """Compacted after the conversation overflowed the model's context."""
    summary: str | None = None
    usage: Usage | None = None
    """The summary call's."""
    cost_usd: float | None = None
    model: str | None = None
    latency: float = 0.0

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {"processor": self.processor, "messages": self.messages, "removed": self.removed}
        if self.forced:
            data["forced"] = True
        if self.usage is not None:
            data.update(
                summary=self.summary,
                usage=self.usage.to_dict(),
                cost_usd=self.cost_usd,
                model=self.model,
                latency=self.latency,
            )
        return data


@_frozen
class ContextExceeded:
    """The conversation no longer fit the model's context: the history is compacted, forced, and asked again."""

    kind: ClassVar[Literal["context_exceeded"]] = "context_exceeded"
    error: str

    def to_json(self) -> Json:
        """The stored form."""
        return {"error": self.error}


@_frozen
class RunFinished:
    """The run ended (``status`` done, failed or cancelled)."""

    kind: ClassVar[Literal["run_finished"]] = "run_finished"
    status: str
    error: str | None
    output: str | None
    result: Json | None
    retryable: bool

    def to_json(self) -> Json:
        """The stored form."""
        return {
            "status": self.status,
            "error": self.error,
            "output": self.output,
            "result": self.result,
            "retryable": self.retryable,
        }


@_frozen
class CacheHit:
    """A cached result answered a call; the tool did not run (see :mod:`tether.core.cache`)."""

    kind: ClassVar[Literal["cache_hit"]] = "cache_hit"
    call_id: str
    tool: str
    key: str
    allowed: Allowed | None = None

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {"call_id": self.call_id, "tool": self.tool, "key": self.key}
        if self.allowed is not None:
            data["allowed"] = self.allowed.to_json()
        return data


@_frozen
class CacheMiss:
    """A cached tool found nothing usable; written with its ``tool_started``."""

    kind: ClassVar[Literal["cache_miss"]] = "cache_miss"
    call_id: str
    tool: str
    key: str

    def to_json(self) -> Json:
        """The stored form."""
        return {"call_id": self.call_id, "tool": self.tool, "key": self.key}


@_frozen
class CallAbandoned:
    """An operator took the run over from the driver of a started call (``tether resume --force``).

    The call is in doubt, for the audit and for every later drive.
    """

    kind: ClassVar[Literal["call_abandoned"]] = "call_abandoned"
    call_id: str
    owner: str
    by: str
    reason: str

    def to_json(self) -> Json:
        """The stored form."""
        return {"call_id": self.call_id, "owner": self.owner, "by": self.by, "reason": self.reason}


@_frozen
class ChildStarted:
    """A call of an agent tool is served by a child run (committed with the call's start, before the child exists).

    The child's id is derived from the parent, the call and the attempt, so whoever resumes the
    parent finds (or creates) that very child: never a second one for the same attempt.
    """

    kind: ClassVar[Literal["child_started"]] = "child_started"
    call_id: str
    tool: str
    run_id: str
    """The child run's id."""
    attempt: int
    depth: int
    """The child's depth in the tree (the root run is 0)."""

    def to_json(self) -> Json:
        """The stored form."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "depth": self.depth,
        }


@_frozen
class ChildParked:
    """The child serving a call waits for a person: the parent waits with it (``awaiting_approval``)."""

    kind: ClassVar[Literal["child_parked"]] = "child_parked"
    call_id: str
    run_id: str
    pending: list[Json] = field(default_factory=list)
    """The child's calls waiting for a decision, as the child's run lists them (with ``run_id`` and ``chain``)."""

    def to_json(self) -> Json:
        """The stored form."""
        return {"call_id": self.call_id, "run_id": self.run_id, "pending": self.pending}


@_frozen
class ChildResumed:
    """The parked child no longer waits for a person: the parent goes back to its call."""

    kind: ClassVar[Literal["child_resumed"]] = "child_resumed"
    call_id: str
    run_id: str

    def to_json(self) -> Json:
        """The stored form."""
        return {"call_id": self.call_id, "run_id": self.run_id}


@_frozen
class ChildWaiting:
    """The child serving a call is parked until a tool retry is due: so is the parent (its root finds it then).

    Recorded when a drive of the parent leaves the child waiting (``max_wait``); the parent's
    ``next_due_at`` is then the child's, so :meth:`tether.stores.Store.list_due` lists the parent
    when the child's retry is due, and driving the parent drives the child on.
    """

    kind: ClassVar[Literal["child_waiting"]] = "child_waiting"
    call_id: str
    run_id: str
    due_at: float
    """Unix time the child's retry is due."""

    def to_json(self) -> Json:
        """The stored form."""
        return {"call_id": self.call_id, "run_id": self.run_id, "due_at": self.due_at}


@_frozen
class ChildEnded:
    """The child serving a call ended; what it spent counts toward the parent's usage and budget."""

    kind: ClassVar[Literal["child_ended"]] = "child_ended"
    call_id: str
    run_id: str
    status: str
    """The child's status as shown (``done``, ``failed``, ``cancelled``)."""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    """None: some model's price in the child (or below it) is unknown."""
    tool_calls: int = 0

    def to_json(self) -> Json:
        """The stored form."""
        return {
            "call_id": self.call_id,
            "run_id": self.run_id,
            "status": self.status,
            "usage": self.usage.to_dict(),
            "cost_usd": self.cost_usd,
            "tool_calls": self.tool_calls,
        }


@_frozen
class HandedOff:
    """The model handed the conversation to another agent (a handoff tool's call, answered in the same write).

    It takes effect when the turn's results go back: from then on ``to_agent``'s system prompt,
    tools, policy, model and limits drive the run (see :mod:`tether.core.handoffs`).
    """

    kind: ClassVar[Literal["handed_off"]] = "handed_off"
    from_agent: str | None
    """The agent in charge until now (None: the run's own agent, unnamed)."""
    to_agent: str
    """The agent in charge from the next model call, found by name among the run's agents."""
    call_id: str
    """The handoff tool's call, answered in the same write."""
    tool: str
    """The handoff tool the model called."""
    filtered: bool = False
    """The handoff has an ``input_filter``: a ``history_compacted`` applying it follows the switch."""
    tool_schemas: dict[str, Any] | None = None
    """``to_agent``'s tools' input schemas then, by name: a resume checks that agent against them, as
    the run's spec checks its own agent (None in runs recorded before tether kept them)."""

    def to_json(self) -> Json:
        """The stored form."""
        data: Json = {
            "from_agent": self.from_agent,
            "to_agent": self.to_agent,
            "call_id": self.call_id,
            "tool": self.tool,
        }
        if self.filtered:
            data["filtered"] = True
        if self.tool_schemas is not None:
            data["tool_schemas"] = self.tool_schemas
        return data


Fact: TypeAlias = (
    RunStarted
    | ModelResponded
    | ToolStarted
    | ToolFinished
    | RetryScheduled
    | ApprovalRequested
    | ApprovalDecided
    | ResultsReturned
    | Transition
    | Warned
    | BudgetExhausted
    | ResultDemanded
    | HistoryCompacted
    | ContextExceeded
    | RunFinished
    | CacheHit
    | CacheMiss
    | CallAbandoned
    | ChildStarted
    | ChildParked
    | ChildResumed
    | ChildWaiting
    | ChildEnded
    | HandedOff
)
"""Every fact a run can record."""

_KINDS: dict[str, type[Fact]] = {
    cls.kind: cls
    for cls in (
        RunStarted,
        ModelResponded,
        ToolStarted,
        ToolFinished,
        RetryScheduled,
        ApprovalRequested,
        ApprovalDecided,
        ResultsReturned,
        Transition,
        Warned,
        BudgetExhausted,
        ResultDemanded,
        HistoryCompacted,
        ContextExceeded,
        RunFinished,
        CacheHit,
        CacheMiss,
        CallAbandoned,
        ChildStarted,
        ChildParked,
        ChildResumed,
        ChildWaiting,
        ChildEnded,
        HandedOff,
    )
}
EVENT_TYPES = frozenset(_KINDS)
"""Every kind a stored event may have."""


@functools.cache
def _adapter(kind: str) -> pydantic.TypeAdapter[Any]:
    """The one reader of a kind's stored payloads (its JSON to its dataclass, checked field by field).

    Built on the kind's first read, not at import: building all of them took about a sixth of
    ``import tether``, which every command pays, most of them reading a few kinds or none.
    """
    return pydantic.TypeAdapter(_KINDS[kind])


@_frozen
class Event:
    """One fact, numbered within its run."""

    seq: int
    """Position in the run's log, from 0, without gaps."""
    at: float
    """Unix time it was recorded."""
    fact: Fact

    @property
    def type(self) -> str:
        """The fact's kind, one of :data:`EVENT_TYPES` (the stored ``type`` column)."""
        return self.fact.kind

    @property
    def data(self) -> Json:
        """The fact's JSON payload, as stored (the ``data`` column)."""
        return self.fact.to_json()

    def to_dict(self) -> Json:
        """JSON form, as ``tether show --json`` prints it."""
        return {"seq": self.seq, "type": self.fact.kind, "at": self.at, **self.fact.to_json()}


def decode(run_id: str, seq: int, kind: str, data: Json, at: float) -> Event:
    """A stored row as an :class:`Event`: the store edge's one way in.

    Keys no field holds are ignored (none were ever written); a row of an unknown kind or
    missing a field the kind needs cannot be folded.

    Raises:
        CorruptData: naming the run and the event's seq.
    """
    if kind not in _KINDS:
        raise CorruptData(run_id, f"its stored event {seq} has an unknown type {kind!r}")
    try:
        fact = _adapter(kind).validate_python(data)
    except pydantic.ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}" for e in error.errors())
        raise CorruptData(run_id, f"its stored event {seq} is not a valid {kind} event ({problems})") from None
    return Event(seq, at, fact)


__all__ = [
    "EVENT_TYPES",
    "Allowed",
    "ApprovalDecided",
    "ApprovalRequested",
    "BudgetExhausted",
    "CacheHit",
    "CacheMiss",
    "CallAbandoned",
    "ChildEnded",
    "ChildParked",
    "ChildResumed",
    "ChildStarted",
    "ChildWaiting",
    "Event",
    "Fact",
    "HandedOff",
    "Json",
    "ModelResponded",
    "RequestedCall",
    "ResultsReturned",
    "RetryScheduled",
    "RunFinished",
    "RunStarted",
    "ToolFinished",
    "ToolStarted",
    "Transition",
    "Warned",
    "decode",
]
