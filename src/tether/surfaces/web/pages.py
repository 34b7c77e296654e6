"""What each page of the inspector shows, read from the store alone (no tool is imported here).

Each function reads what one page needs, scoped to the viewer's tenant, and returns plain
data for its template: :func:`runs` for the list, :func:`run_page` for one run (its row, its
log folded into a timeline, its messages, its tool calls as :mod:`tether.views.audit` reads
them), :func:`waiting` for the inbox's count. What a person deciding is shown (the inbox, and a
run's waiting calls) is :mod:`~tether.surfaces.web.inbox`'s. The same event vocabulary the CLI
reads (:mod:`tether.facts.events`) is the only source.
"""

from __future__ import annotations

import bisect
import datetime
import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

from tether.core import forks
from tether.core.links import link_of, parent_of
from tether.core.state import RunState
from tether.drivers.runner import result_of, shown_status
from tether.facts.events import (
    ApprovalDecided,
    ApprovalRequested,
    BudgetExhausted,
    CacheHit,
    CallAbandoned,
    Event,
    ModelResponded,
    RetryScheduled,
    RunFinished,
    RunStarted,
    ToolFinished,
    ToolStarted,
    Transition,
    Warned,
)
from tether.facts.history import text_of
from tether.facts.status import AWAITING, ENDED, SHOWN, RunStatus, status_name, stored_filter
from tether.facts.usage import Usage
from tether.stores import DUE_KEY, RunQuery, RunRecord, Store, holders
from tether.views import audit
from tether.views.pending import pending_approvals
from tether.views.tree import started_by

LIST_LIMIT = 200
"""Runs the list's live digest watches (the newest: a change among them refreshes the page)."""
PER_PAGE = 50
"""Runs a page of the list shows."""
PREVIEW = 160
"""Characters of a text shown in a timeline row (the whole text is in the messages and calls)."""
STATUSES = SHOWN
"""The statuses the list filters on, as people read them."""
DAY = 86_400.0


@dataclass(frozen=True)
class RunsFilter:
    """The list's filters and page, as the query string gave them."""

    status: str | None = None
    tenant: str | None = None
    search: str = ""
    agent: str = ""
    model: str = ""
    since: str = ""
    """The first day of runs created (``YYYY-MM-DD``, in the server's time zone), as typed."""
    until: str = ""
    """The last day (included)."""
    page: int = 1
    problems: tuple[str, ...] = ()
    """What in the query string was not understood (and so filters nothing)."""

    @classmethod
    def of(cls, params: dict[str, str]) -> RunsFilter:
        """Read the query string; an unknown status, an empty field or a date that is not one filters nothing."""
        status = params.get("status") or None
        problems = []
        if status is not None and status not in STATUSES:
            problems.append(f"status {status!r} is not one of {', '.join(STATUSES)}: all statuses are shown")
            status = None
        since, until = ((params.get(key) or "").strip() for key in ("since", "until"))
        for key, day in (("from", since), ("to", until)):
            if day and _midnight(day) is None:
                problems.append(f"the date {key} {day!r} is not a date (YYYY-MM-DD): it filters nothing")
        return cls(
            status=status,
            tenant=(params.get("tenant") or "").strip() or None,
            search=(params.get("q") or "").strip(),
            agent=(params.get("agent") or "").strip(),
            model=(params.get("model") or "").strip(),
            since=since,
            until=until,
            page=max(_positive(params.get("page")), 1),
            problems=tuple(problems),
        )

    def query(self, viewer_tenant: str | None) -> RunQuery:
        """The store's query: a viewer bound to a tenant sees that tenant's runs, whatever ``tenant`` says."""
        status, waiting_retry = stored_filter(self.status) if self.status else (None, None)
        first, last = _midnight(self.since), _midnight(self.until)
        return RunQuery(
            status=status,
            waiting_retry=waiting_retry,
            tenant=viewer_tenant if viewer_tenant is not None else self.tenant,
            agent=self.agent or None,
            model=self.model or None,
            created_from=first,
            created_before=None if last is None else _midnight(self.until, days=1),
            text=self.search,
        )

    def address(self, page: int) -> str:
        """The list's address with these filters, on ``page``."""
        given = {
            "status": self.status or "",
            "tenant": self.tenant or "",
            "q": self.search,
            "agent": self.agent,
            "model": self.model,
            "since": self.since,
            "until": self.until,
        }
        kept = {key: value for key, value in given.items() if value}
        return "/?" + urlencode({**kept, **({"page": page} if page > 1 else {})})


def _positive(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return 1


def _midnight(day: str, *, days: int = 0) -> float | None:
    """Unix time of the start of ``day`` (``YYYY-MM-DD``, the server's local time) plus ``days``; None if not a date."""
    try:
        parsed = datetime.date.fromisoformat(day)
    except ValueError:
        return None
    return time.mktime((parsed + datetime.timedelta(days=days)).timetuple())


@dataclass(frozen=True)
class RunRow:
    """One line of the runs list."""

    id: str
    status: str
    tenant: str | None
    steps: int
    tool_calls: int
    tokens: int
    cost_usd: float | None
    created_at: float
    updated_at: float
    pending: int
    outcome: str
    """The answer, the error, or what the run waits for (short)."""
    unreadable: str | None = None
    parent: str | None = None
    """The run a child run serves (see :meth:`tether.Agent.as_tool`); None for a root run."""
    agent: str | None = None
    model: str | None = None
    prompt: str = ""
    """The start of what it was asked."""
    due_at: float | None = None
    """When the tool retry it waits for is due (a run ``waiting_retry``)."""


@dataclass(frozen=True)
class RunsList:
    """One page of the runs list."""

    rows: list[RunRow]
    total: int
    """Runs matching the filters, on every page."""
    page: int
    pages: int

    @property
    def first(self) -> int:
        """The number of this page's first run among all those matching (1 the newest)."""
        return (self.page - 1) * PER_PAGE + 1 if self.rows else 0


def runs(store: Store, viewer_tenant: str | None, wanted: RunsFilter, *, per_page: int = PER_PAGE) -> RunsList:
    """The page of runs the viewer may see that match the filters, newest first, and how many match."""
    found = store.query_runs(wanted.query(viewer_tenant), limit=per_page, offset=(wanted.page - 1) * per_page)
    pages = max(1, -(-found.total // per_page))
    return RunsList([_row(record) for record in found.records], found.total, wanted.page, pages)


def _row(record: RunRecord) -> RunRow:
    summary = record.summary
    usage = Usage.from_dict(summary.get("usage") or {})
    pending = summary.get("pending_approvals") or []
    status = shown_status(record)
    if record.unreadable:
        outcome = record.unreadable
    elif summary.get("error"):
        outcome = str(summary["error"])
    elif pending:
        outcome = "waits for a decision on " + ", ".join(str(item.get("tool")) for item in pending)
    else:
        outcome = str(summary.get("output") or "")
    due = summary.get(DUE_KEY)
    return RunRow(
        id=record.id,
        status=status,
        tenant=record.tenant,
        steps=int(summary.get("steps") or 0),
        tool_calls=int(summary.get("tool_calls") or 0),
        tokens=usage.input_tokens + usage.output_tokens,
        cost_usd=summary.get("cost_usd"),
        created_at=record.created_at,
        updated_at=record.updated_at,
        pending=len(pending),
        outcome=_preview(outcome),
        unreadable=record.unreadable,
        parent=parent_of(record.spec),
        agent=record.spec.get("agent"),
        model=record.spec.get("model"),
        prompt=_preview(str(record.spec.get("prompt") or "")),
        due_at=float(due) if isinstance(due, int | float) else None,
    )


def suggestions(rows: list[RunRow], name: str) -> list[str]:
    """The values of ``name`` (tenant, agent, model) among ``rows``, for a filter's suggestions."""
    return sorted({value for row in rows if isinstance(value := getattr(row, name), str) and value})


def digest(store: Store, viewer_tenant: str | None) -> str:
    """A short hash of every visible run's id and version: it changes whenever any of them moves."""
    records = store.list_runs(tenant=viewer_tenant, limit=LIST_LIMIT)
    marks = ",".join(f"{r.id}:{r.version}:{r.updated_at}" for r in records)
    return hashlib.sha256(marks.encode(errors="surrogatepass")).hexdigest()[:16]


# One run ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One row of a run's timeline: an event worth reading, with its measures."""

    seq: int
    at: float
    kind: str
    """What happened, in words (``step 2``, ``tool finished``, ``approval requested``...)."""
    detail: str
    """Short; the whole text is in the messages and the calls."""
    tone: str = ""
    """``start``, ``model``, ``tool``, ``person``, ``error``, ``warning``, ``move`` or ``end``: how it is styled,
    and which of the timeline's filters shows it (moves between states are hidden at first)."""
    call_id: str | None = None
    """The tool call it is about, linked to its card."""
    usage: Usage | None = None
    cost_usd: float | None = None
    seconds: float | None = None
    """Model latency, or the tool's duration."""
    fork_at: int | None = None
    """The step a fork offered on this row starts from: this one, or the nearest before it that can be
    forked (see :mod:`tether.core.forks`); None when there is none."""


@dataclass
class RunPage:
    """Everything the run page shows."""

    state: RunState
    status: str
    """As people read it: the machine's, or waiting_retry."""
    ended: bool
    """Nothing more will happen to it (a run a retry may mend has not): no live updates needed."""
    steps: list[Step]
    calls: list[audit.AuditEntry]
    cost_usd: float | None = None
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    parent: dict[str, Any] | None = None
    """The link to the run this child run serves (``run_id``, ``call_id``, ``tool``); None for a root run."""
    children: list[dict[str, Any]] = field(default_factory=list)
    """The child runs its agent tools started (``run_id``, ``call_id``, ``agent``, ``status``...), oldest first."""
    controls: tuple[str, ...] = ()
    """What a person may do to it from its page (see :data:`~tether.surfaces.web.confirm.CONTROLS`)."""
    due_at: float | None = None
    """When the tool retry it waits for is due (a run ``waiting_retry``)."""
    moves: int = 0
    """Moves between the machine's states so far (what its diagram draws)."""


def run_page(store: Store, run_id: str, viewer_tenant: str | None) -> RunPage:
    """One run, from one consistent read of its log.

    Raises:
        RunNotFound: no such run, or another tenant's.
    """
    log = store.load_log(run_id, tenant=viewer_tenant)
    state = RunState.rebuild(run_id, log.events, version=log.version, tenant=log.tenant)
    result = result_of(state)
    ended = state.status in ENDED
    retryable = state.status == RunStatus.failed and state.can_retry
    controls = [
        *(["resume"] if not ended and state.status != AWAITING and not driven(store, run_id) else []),
        *(["retry"] if retryable else []),
        *(["cancel"] if not ended or retryable else []),
    ]
    return RunPage(
        state=state,
        status=result.status,
        ended=ended and not retryable,
        steps=with_forks(timeline(log.events), forks.fork_points(log.events)),
        calls=audit.entries(run_id, log.events),
        cost_usd=result.cost_usd,
        model_seconds=result.model_seconds,
        tool_seconds=result.tool_seconds,
        parent=link_of(state.spec),
        children=started_by(store, log.events, tenant=viewer_tenant),
        controls=tuple(controls),
        due_at=result.next_due_at,
        moves=sum(isinstance(event.fact, Transition) for event in log.events),
    )


def driven(store: Store, run_id: str) -> bool:
    """Whether a process drives the run now (a retry under way): its lease is live and its holder not gone."""
    lease = store.lease_of(run_id)
    if lease is None or lease.expires_at <= time.time():
        return False
    return lease.holder is None or not holders.is_gone(lease.holder)


def timeline(events: list[Event]) -> list[Step]:
    """The rows of a run's timeline: its moves, model calls, tool calls, decisions, warnings and end."""
    rows: list[Step] = []
    model_calls = 0
    for event in events:
        seq, at, fact = event.seq, event.at, event.fact
        match fact:
            case RunStarted(messages=messages):
                prompt = text_of(messages[-1]) if messages else ""
                rows.append(Step(seq, at, "run started", _preview(prompt), "start"))
            case Transition(event=name, source=source, target=target):
                moved = f"{status_name(source)} → {status_name(target)}" if source else status_name(target)
                rows.append(Step(seq, at, "moved", f"{moved} ({name})", "move"))
            case ModelResponded():
                model_calls += 1
                rows.append(_model_step(seq, at, fact, model_calls))
            case ToolStarted(call_id=call_id, tool=tool, attempt=attempt):
                rows.append(Step(seq, at, "tool started", f"{tool} (attempt {attempt})", "tool", call_id))
            case ToolFinished():
                rows.append(_tool_step(seq, at, fact))
            case RetryScheduled(call_id=call_id, tool=tool, error=error, duration=duration):
                rows.append(
                    Step(seq, at, "retry scheduled", f"{tool}: {_preview(error)}", "warning", call_id, seconds=duration)
                )
            case ApprovalRequested(calls=asked):
                names = ", ".join(f"{call.tool} ({call.reason})" if call.reason else call.tool for call in asked)
                rows.append(Step(seq, at, "approval requested", names, "person"))
            case ApprovalDecided(call_id=call_id, tool=tool, approved=approved, actor=actor, reason=reason):
                verdict = "approved" if approved else "denied"
                said = f"{tool} {verdict} by {actor}" + (f": {reason}" if reason else "")
                rows.append(Step(seq, at, verdict, _preview(said), "person", call_id))
            case CacheHit(call_id=call_id, tool=tool):
                rows.append(Step(seq, at, "cache hit", tool, "tool", call_id))
            case CallAbandoned(call_id=call_id, by=by, reason=reason):
                rows.append(Step(seq, at, "call abandoned", f"by {by}: {reason}", "warning", call_id))
            case Warned(message=message, call_id=call_id):
                rows.append(Step(seq, at, "warning", _preview(message), "warning", call_id))
            case BudgetExhausted(limit=limit, used=used, allowed=allowed):
                rows.append(Step(seq, at, "budget reached", f"{limit}: {used:g} of {allowed:g}", "warning"))
            case RunFinished(status=status, error=error, output=output):
                said = error or output or ""
                tone = "end" if status == RunStatus.done else "error"
                rows.append(Step(seq, at, f"run {status_name(status)}", _preview(said), tone))
    return rows


def with_forks(rows: list[Step], points: list[int]) -> list[Step]:
    """Each row with the step a fork from it starts at: the nearest that can be forked, at or before it."""
    return [replace(row, fork_at=_at_or_before(points, row.seq)) for row in rows]


def _at_or_before(points: list[int], seq: int) -> int | None:
    index = bisect.bisect_right(points, seq)
    return points[index - 1] if index else None


def _model_step(seq: int, at: float, fact: ModelResponded, number: int) -> Step:
    texts = [str(block.get("text", "")) for block in fact.content if block.get("type") == "text"]
    asked = [str(block.get("name")) for block in fact.content if block.get("type") == "tool_use"]
    parts = [" ".join(texts).strip()]
    if asked:
        parts.append("asks for " + ", ".join(asked))
    parts.append(f"stop: {fact.stop_reason}" + (" (discarded)" if fact.discarded else ""))
    detail = _preview(" · ".join(part for part in parts if part))
    return Step(seq, at, f"step {number}", detail, "model", None, fact.usage, fact.cost_usd, fact.latency)


def _tool_step(seq: int, at: float, fact: ToolFinished) -> Step:
    outcome = "error" if fact.is_error else "ok"
    detail = f"{fact.tool} {outcome}: {_preview(fact.content)}"
    tone = "error" if fact.is_error else "tool"
    return Step(seq, at, "tool finished", detail, tone, fact.call_id, seconds=fact.duration)


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"


# The inbox's count --------------------------------------------------------------------------
def waiting(store: Store, viewer_tenant: str | None) -> int:
    """How many calls wait for a decision the viewer may make (the inbox's count, in the header)."""
    return len(pending_approvals(store, tenant=viewer_tenant))


def pretty(value: Any) -> str:
    """JSON as a person reads it (indented; any text kept as it is)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


__all__ = [
    "LIST_LIMIT",
    "PER_PAGE",
    "STATUSES",
    "RunPage",
    "RunRow",
    "RunsFilter",
    "RunsList",
    "Step",
    "digest",
    "pretty",
    "run_page",
    "runs",
    "suggestions",
    "timeline",
    "waiting",
]
