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
  still ``awaiting_approval`` / ``running`` / ``not_run``;
- **duration**: seconds spent running the tool, summed over its attempts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tether import events as ev
from tether.durations import parse_ago
from tether.errors import RunNotFound
from tether.events import Event
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
    """ok, error, denied, awaiting_approval, running, or not_run."""
    decision: dict[str, Any] | None = None
    """The last decision: ``verdict`` (allowed, approved, denied, pending), ``by``, ``at``,
    ``reason``; for a person's decision also ``asked_because`` and ``edited_input``, and
    ``for_run_call`` when it was their approval of another call for the rest of the run.
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

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``tether audit --json``."""
        return asdict(self)


def entries(run_id: str, events: Iterable[Event]) -> list[AuditEntry]:
    """The audit entries of one run, in the order the model asked for the calls; pure."""
    calls: dict[str, AuditEntry] = {}
    approved_for_run: dict[str, str] = {}
    """Tool name -> the call whose approval covered the rest of the run (the first one)."""
    for event in events:
        data = event.data
        if event.type == ev.MODEL_RESPONDED:
            if data.get("discarded"):
                continue  # an incomplete call that was never run nor shown
            for block in data.get("content") or []:
                if block.get("type") == "tool_use" and block.get("id") not in calls:
                    calls[block["id"]] = AuditEntry(
                        run_id, block["id"], str(block.get("name")), block.get("input"), event.at, last_at=event.at
                    )
            continue
        if event.type == ev.APPROVAL_REQUESTED:
            for item in data.get("calls") or []:
                entry = calls.get(item.get("call_id"))
                if entry is not None:
                    _ask(entry, event, item, escalation=bool(data.get("escalation")))
            continue
        entry = calls.get(data.get("call_id", ""))
        if entry is None:
            continue
        entry.last_at = max(entry.last_at, event.at)
        if event.type == ev.APPROVAL_DECIDED and data.get("approved") and data.get("remember_for_run"):
            approved_for_run.setdefault(entry.tool, entry.call_id)
        if entry.decision is None and _lets_through(event):
            covering = calls.get(approved_for_run.get(entry.tool, ""))
            entry.decision = _allowed(event, covering)
        _FOLDS.get(event.type, _ignore)(entry, event)
    return list(calls.values())


def _lets_through(event: Event) -> bool:
    """An event that shows a call passed the gate: its start, a cache hit, or a final tool's result."""
    if event.type == ev.TOOL_FINISHED:
        return not event.data.get("is_error")
    return event.type in (ev.TOOL_STARTED, ev.CACHE_HIT)


def _allowed(event: Event, covering: AuditEntry | None) -> dict[str, Any]:
    """Who let a call through unasked, as the engine recorded it (``allowed``) with its start.

    A call let through by an approval for the rest of the run is that approval's, given by
    ``covering`` (the call it was given on).
    """
    allowed = event.data.get("allowed")
    if not isinstance(allowed, dict):  # a log from before the engine recorded it
        return {"verdict": "allowed", "by": "policy", "at": event.at, "reason": "no approval required"}
    reason = str(allowed.get("reason") or "")
    earlier = covering.decision if covering is not None else None
    if allowed.get("by") == "approved_for_run" and covering is not None and earlier is not None:
        return {**earlier, "reason": reason, "edited_input": None, "for_run_call": covering.call_id}
    return {"verdict": "allowed", "by": allowed.get("by"), "at": event.at, "reason": reason}


def _ignore(entry: AuditEntry, event: Event) -> None:
    """Events that say nothing about a call's audit (a cache miss is followed by its start)."""


def _ask(entry: AuditEntry, event: Event, item: dict[str, Any], *, escalation: bool) -> None:
    entry.last_at = max(entry.last_at, event.at)
    entry.status = "awaiting_approval"
    asked: dict[str, Any] = {"requested_at": event.at, "reason": item.get("reason", ""), "escalation": escalation}
    if "last_error" in item:  # an escalation after the retries ran out
        asked["last_error"] = item["last_error"]
    entry.approvals.append(asked)
    entry.decision = {
        "verdict": "pending",
        "by": None,
        "at": None,
        "reason": None,
        "asked_because": item.get("reason", ""),
    }


def _decided(entry: AuditEntry, event: Event) -> None:
    data = event.data
    approved = bool(data.get("approved"))
    asked: dict[str, Any] = entry.approvals[-1] if entry.approvals else {"requested_at": None, "reason": ""}
    answer: dict[str, Any] = {
        "decided_at": event.at,
        "by": data.get("actor"),
        "approved": approved,
        "why": data.get("reason") or "",
        "edited_input": data.get("input"),
    }
    asked.update(answer)
    entry.decision = {
        "verdict": "approved" if approved else "denied",
        "by": data.get("actor"),
        "at": event.at,
        "reason": data.get("reason") or "",
        "asked_because": asked.get("reason", ""),
        "edited_input": data.get("input"),
    }
    entry.status = "not_run" if approved else "denied"


def _started(entry: AuditEntry, event: Event) -> None:
    entry.attempts += 1
    entry.status = "running"
    if entry.started_at is None:
        entry.started_at = event.at


def _retried(entry: AuditEntry, event: Event) -> None:
    data = event.data
    entry.retries.append(
        {
            "attempt": data.get("attempt"),
            "at": event.at,
            "error": data.get("error"),
            "error_type": data.get("error_type"),
            "error_class": data.get("error_class"),
            "due_at": data.get("due_at"),
        }
    )
    entry.error_type = data.get("error_type", entry.error_type)
    entry.status = "running"
    _add_duration(entry, data)


def _cache_hit(entry: AuditEntry, event: Event) -> None:
    entry.cached = True


def _finished(entry: AuditEntry, event: Event) -> None:
    data = event.data
    entry.finished_at = event.at
    _add_duration(entry, data)
    entry.truncated_from = data.get("truncated_from")
    if data.get("denied_by") == "policy":
        entry.decision = {"verdict": "denied", "by": "policy", "at": event.at, "reason": data.get("reason", "")}
    if not data.get("is_error"):
        entry.status = "ok"
        entry.result = data.get("full_content", data.get("content"))
        return
    entry.error = data.get("full_content", data.get("content"))
    entry.error_type = data.get("error_type", entry.error_type)
    entry.error_class = data.get("error_class")
    denied = entry.decision is not None and entry.decision["verdict"] == "denied"
    entry.status = "denied" if denied else "error"


def _warned(entry: AuditEntry, event: Event) -> None:
    entry.warnings.append(str(event.data.get("message", "")))


def _add_duration(entry: AuditEntry, data: dict[str, Any]) -> None:
    if isinstance(data.get("duration"), int | float):
        entry.duration = round((entry.duration or 0.0) + float(data["duration"]), 6)


_FOLDS = {
    ev.APPROVAL_DECIDED: _decided,
    ev.TOOL_STARTED: _started,
    ev.RETRY_SCHEDULED: _retried,
    ev.CACHE_HIT: _cache_hit,
    ev.TOOL_FINISHED: _finished,
    ev.WARNING: _warned,
}


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


__all__ = ["AuditEntry", "entries", "parse_since", "query", "select"]
