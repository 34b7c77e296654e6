"""The audit log: every tool call, with its input, decision, attempts and outcome.

Nothing new is recorded for it: the event log already holds every fact, so an audit
entry is a fold of one run's events (:func:`entries`, pure), and :func:`query` reads the
runs a question touches from any :class:`~tether.stores.Store`. One entry per tool call
the model made:

- **input** the model gave, and the input a reviewer edited it to, if any;
- **decision**: who let it run or refused it, when, and why (a person's
  ``approval_decided``, a policy's denial, a rule or approval callable allowing it unasked
  (``by: policy``), an earlier approval for the rest of the run (that person's decision), or
  nobody, for a tool that needs no approval);
- **attempts** (``tool_started`` events) and each failed attempt's retry;
- **outcome**: ``ok`` (the full result, even when the model saw a truncated one; from the
  cache or not), ``error`` (its message, exception type and class), ``denied``, or a call
  still ``awaiting_approval`` / ``running`` / ``not_run``, or ``never_decided`` (the run ended
  while the call waited for a person);
- **duration**: seconds spent running the tool, summed over its attempts;
- **agent**: who made the call: the run's agent, or the one a handoff handed the run to (a child
  run's calls are its own agent's).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tether.durations import parse_ago
from tether.errors import RunNotFound
from tether.facts.events import (
    Allowed,
    ApprovalDecided,
    ApprovalRequested,
    CacheHit,
    CacheMiss,
    CallAbandoned,
    Event,
    Fact,
    HandedOff,
    ModelResponded,
    RequestedCall,
    RetryScheduled,
    RunFinished,
    RunStarted,
    ToolFinished,
    ToolStarted,
    Warned,
)
from tether.stores import RunRecord, Store

DEFAULT_RUN_LIMIT = 1_000_000
"""Runs read by :func:`query` when no run is named (newest first)."""


@dataclass
class AuditEntry:
    """One tool call of one run, as an auditor reads it."""

    run_id: str
    call_id: str
    tool: str
    input: Any
    """The arguments the model gave."""
    requested_at: float
    """When the model asked for the call (its response was recorded)."""
    status: str = "not_run"
    """ok, error, denied, awaiting_approval, running, not_run, or never_decided (the run ended first)."""
    decision: dict[str, Any] | None = None
    """The last decision: ``verdict`` (allowed, approved, denied, pending, never_decided), ``by``, ``at``,
    ``reason``; for a person's decision also ``asked_because`` and ``edited_input`` (``note``: the
    Markdown the asking rule gave them), ``for_run`` when they approved the tool for the rest of the
    run, and ``for_run_call`` when it was their approval of another call for the rest of the run.
    ``by`` is None for a tool that needs no approval (reason ``no approval needed``). None
    when the call never reached the gate (unknown tool, invalid arguments)."""
    approvals: list[dict[str, Any]] = field(default_factory=list)
    """Every time a person was asked, and what they answered (a call can be asked again)."""
    attempts: int = 0
    """Attempts that started running."""
    retries: list[dict[str, Any]] = field(default_factory=list)
    """Failed attempts that were retried: attempt, at, error, error_type, error_class, due_at."""
    result: str | None = None
    """The tool's whole result when it succeeded."""
    error: str | None = None
    """The is_error result, when the call failed or was refused (whole, even when the model saw it cut)."""
    error_type: str | None = None
    """The exception class the last attempt raised."""
    error_class: str | None = None
    """retryable, user_fixable, permission, conflict or fatal, when the engine classified the error."""
    duration: float | None = None
    """Seconds spent running the tool, over all attempts (None: it never ran)."""
    started_at: float | None = None
    finished_at: float | None = None
    cached: bool = False
    """The result came from the tool-result cache; the tool did not run."""
    truncated_from: int | None = None
    """The result's full length when the model was shown only its head."""
    warnings: list[str] = field(default_factory=list)
    last_at: float = 0.0
    """The latest event about this call (what ``since`` filters on)."""
    agent: str | None = None
    """The agent whose turn asked for the call (None: an unnamed agent)."""

    @property
    def edited(self) -> bool:
        """Whether a person changed the input before it ran (or would run)."""
        return (self.decision or {}).get("edited_input") is not None

    @property
    def input_ran(self) -> Any:
        """The input the tool ran with, or would run with: a person's edit, else the model's :attr:`input`."""
        return self.decision["edited_input"] if self.decision and self.edited else self.input

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``tether audit --json``."""
        return asdict(self)


def entries(run_id: str, events: Iterable[Event]) -> list[AuditEntry]:
    """The audit entries of one run, in the order the model asked for the calls; pure."""
    calls: dict[str, AuditEntry] = {}
    approved_for_run: dict[str, str] = {}
    """Tool name -> the call whose approval covered the rest of the run (the first one)."""
    agent: str | None = None
    ended: str | None = None
    """How the run ended (done, cancelled, failed for good), if nothing came after."""
    for event in events:
        fact, at = event.fact, event.at
        ended = fact.status if isinstance(fact, RunFinished) and not fact.retryable else None
        match fact:
            case RunStarted(spec=spec):
                agent = spec.get("agent")
            case HandedOff(to_agent=to_agent):  # the turns after this one are the other agent's
                agent = to_agent
            case ModelResponded(discarded=False, content=content):  # a discarded call was never run nor shown
                for block in content:
                    if block.get("type") == "tool_use" and block.get("id") not in calls:
                        calls[block["id"]] = AuditEntry(
                            run_id, block["id"], str(block.get("name")), block.get("input"), at, last_at=at, agent=agent
                        )
            case ApprovalRequested(calls=asked, escalation=escalation):
                for item in asked:
                    if item.call_id in calls:
                        _ask(calls[item.call_id], at, item, escalation=escalation)
        entry = calls.get(_call_of(fact) or "")
        if entry is None:
            continue
        entry.last_at = max(entry.last_at, at)
        if isinstance(fact, ApprovalDecided) and fact.approved and fact.remember_for_run:
            approved_for_run.setdefault(entry.tool, entry.call_id)
        passed, allowed = _let_through(fact)
        if entry.decision is None and passed:
            covering = calls.get(approved_for_run.get(entry.tool, ""))
            entry.decision = _allowed(allowed, at, covering)
        _fold(entry, fact, at)
    if ended is not None:
        for entry in calls.values():
            if entry.decision is not None and entry.decision["verdict"] == "pending":  # nobody will be asked now
                entry.status = "never_decided"
                entry.decision = {**entry.decision, "verdict": "never_decided", "reason": f"the run ended {ended}"}
    return list(calls.values())


def _call_of(fact: Fact) -> str | None:
    """The call a fact is about, if it is about one call (an approval request is about several)."""
    match fact:
        case (
            ToolStarted(call_id=call_id)
            | ToolFinished(call_id=call_id)
            | RetryScheduled(call_id=call_id)
            | ApprovalDecided(call_id=call_id)
            | CacheHit(call_id=call_id)
            | CacheMiss(call_id=call_id)
            | CallAbandoned(call_id=call_id)
            | Warned(call_id=call_id)
        ):
            return call_id
    return None


def _let_through(fact: Fact) -> tuple[bool, Allowed | None]:
    """Whether a fact shows its call passed the gate (its start, a cache hit, a final tool's result), and who let it."""
    match fact:
        case ToolStarted(allowed=allowed) | CacheHit(allowed=allowed) | ToolFinished(is_error=False, allowed=allowed):
            return True, allowed
    return False, None


def _allowed(allowed: Allowed | None, at: float, covering: AuditEntry | None) -> dict[str, Any]:
    """Who let a call through unasked, as the engine recorded it (``allowed``) with its start.

    A call let through by an approval for the rest of the run is that approval's, given by
    ``covering`` (the call it was given on).
    """
    if allowed is None:  # a log from before the engine recorded it
        return {"verdict": "allowed", "by": "policy", "at": at, "reason": "no approval required"}
    earlier = covering.decision if covering is not None else None
    if allowed.by == "approved_for_run" and covering is not None and earlier is not None:
        given = {key: value for key, value in earlier.items() if key != "for_run"}  # given on the covering call
        return {**given, "reason": allowed.reason, "edited_input": None, "for_run_call": covering.call_id}
    return {"verdict": "allowed", "by": allowed.by, "at": at, "reason": allowed.reason}


def _fold(entry: AuditEntry, fact: Fact, at: float) -> None:
    """What a fact about one call adds to its entry (a cache miss adds nothing: its start follows)."""
    match fact:
        case ApprovalDecided():
            _decided(entry, fact, at)
        case ToolStarted():
            entry.attempts += 1
            entry.status = "running"
            if entry.started_at is None:
                entry.started_at = at
        case RetryScheduled():
            _retried(entry, fact, at)
        case CacheHit():
            entry.cached = True
        case ToolFinished():
            _finished(entry, fact, at)
        case Warned(message=message):
            entry.warnings.append(message)


def _ask(entry: AuditEntry, at: float, item: RequestedCall, *, escalation: bool) -> None:
    entry.last_at = max(entry.last_at, at)
    entry.status = "awaiting_approval"
    asked: dict[str, Any] = {"requested_at": at, "reason": item.reason, "escalation": escalation}
    if item.last_error is not None:  # an escalation after the retries ran out
        asked["last_error"] = item.last_error
    if item.note:
        asked["note"] = item.note
    entry.approvals.append(asked)
    entry.decision = {
        "verdict": "pending",
        "by": None,
        "at": None,
        "reason": None,
        "asked_because": item.reason,
        **({"note": item.note} if item.note else {}),
    }


def _decided(entry: AuditEntry, fact: ApprovalDecided, at: float) -> None:
    asked: dict[str, Any] = entry.approvals[-1] if entry.approvals else {"requested_at": None, "reason": ""}
    answer: dict[str, Any] = {
        "decided_at": at,
        "by": fact.actor,
        "approved": fact.approved,
        "why": fact.reason,
        "edited_input": fact.input,
    }
    asked.update(answer)
    entry.decision = {
        "verdict": "approved" if fact.approved else "denied",
        "by": fact.actor,
        "at": at,
        "reason": fact.reason,
        "asked_because": asked.get("reason", ""),
        "edited_input": fact.input,
        **({"note": asked["note"]} if asked.get("note") else {}),
        **({"for_run": True} if fact.approved and fact.remember_for_run else {}),
    }
    entry.status = "not_run" if fact.approved else "denied"


def _retried(entry: AuditEntry, fact: RetryScheduled, at: float) -> None:
    entry.retries.append(
        {
            "attempt": fact.attempt,
            "at": at,
            "error": fact.error,
            "error_type": fact.error_type,
            "error_class": fact.error_class,
            "due_at": fact.due_at,
        }
    )
    entry.error_type = fact.error_type
    entry.status = "running"
    _add_duration(entry, fact.duration)


def _finished(entry: AuditEntry, fact: ToolFinished, at: float) -> None:
    entry.finished_at = at
    _add_duration(entry, fact.duration)
    entry.truncated_from = fact.truncated_from
    if fact.denied_by == "policy":
        entry.decision = {"verdict": "denied", "by": "policy", "at": at, "reason": fact.reason or ""}
    whole = fact.full_content if fact.full_content is not None else fact.content
    if not fact.is_error:
        entry.status = "ok"
        entry.result = whole
        return
    entry.error = whole
    if fact.error_type is not None:
        entry.error_type = fact.error_type
    entry.error_class = fact.error_class
    denied = entry.decision is not None and entry.decision["verdict"] == "denied"
    entry.status = "denied" if denied else "error"


def _add_duration(entry: AuditEntry, duration: float | None) -> None:
    if duration is not None:
        entry.duration = round((entry.duration or 0.0) + duration, 6)


def decision_said(entry: AuditEntry) -> list[tuple[str, str]]:
    """Who let the call run or refused it, and every reason given, as ``(label, text)`` lines a person reads.

    ``asked`` says why a person was asked (``note``: what the asking rule told them, ``after``: the
    error that escalated it), then one line of the verdict (``approved``, ``denied``, ``allowed``,
    ``pending``, ``never decided``) with who and why. None of it for a call that never reached the
    gate (an unknown tool, invalid arguments).
    """
    decision = entry.decision
    if decision is None:
        return []
    lines: list[tuple[str, str]] = []
    verdict, by, reason = str(decision["verdict"]), decision.get("by"), str(decision.get("reason") or "")
    if decision.get("asked_because") is not None:
        lines.append(("asked", str(decision["asked_because"]) or "approval required"))
        if decision.get("note"):
            lines.append(("note", str(decision["note"])))
        if entry.approvals and entry.approvals[-1].get("last_error"):
            lines.append(("after", f"the last attempt failed: {entry.approvals[-1]['last_error']}"))
    said = {"never_decided": "never decided"}.get(verdict, verdict)
    if verdict == "allowed":
        text = f"by {by}: {reason}" if by else reason or "no approval needed"
    elif verdict == "pending":
        text = "waiting for a person"
    else:
        text = f"by {by}" if by else ""
        if decision.get("for_run_call"):
            text += f", for the run with {decision['for_run_call']}"
        elif decision.get("for_run"):
            text += ", for the rest of the run"
        if reason:
            text = f"{text}: {reason}" if text else reason
    lines.append((said, text or "-"))
    return lines


def select(found: Iterable[AuditEntry], *, tool: str | None = None, since: float | None = None) -> list[AuditEntry]:
    """Entries of ``tool`` with activity at or after ``since``, oldest request first."""
    kept = [e for e in found if (tool is None or e.tool == tool) and (since is None or e.last_at >= since)]
    return sorted(kept, key=lambda e: e.requested_at)  # stable: call order within a run


def query(
    store: Store,
    *,
    run_id: str | None = None,
    tool: str | None = None,
    since: float | None = None,
    tenant: str | None = None,
    run_limit: int = DEFAULT_RUN_LIMIT,
) -> list[AuditEntry]:
    """Audit entries across the store's runs (or one run), filtered.

    A run last updated before ``since`` cannot hold newer activity, so its log is not read.

    Raises:
        RunNotFound: ``run_id`` is not visible to ``tenant``.
    """
    runs: Sequence[RunRecord]
    runs = [store.load_run(run_id, tenant=tenant)] if run_id else store.list_runs(tenant=tenant, limit=run_limit)
    found: list[AuditEntry] = []
    for record in runs:
        if since is not None and record.updated_at < since:
            continue
        try:
            log = store.load_events(record.id, tenant=tenant)
        except RunNotFound:
            if run_id:
                raise
            continue  # deleted by retention since it was listed
        found.extend(entries(record.id, log))
    return select(found, tool=tool, since=since)


def parse_since(text: str, *, now: float) -> float:
    """A Unix time from an age (``30min``, ``2h``, ``7d``, ``1w``...) before ``now``, or an ISO date-time.

    A date or date-time without a zone is local time, as a person typing it means (see
    :mod:`tether.durations`).
    """
    return parse_ago(text, now=now, option="--since")


__all__ = ["AuditEntry", "decision_said", "entries", "parse_since", "query", "select"]
