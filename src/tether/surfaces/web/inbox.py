"""What a person deciding is shown: each waiting turn with its context, its calls with theirs.

A *turn* is one model response of one run whose calls wait for a person: the run's prompt, what the
model said in that response, where the run sits in its tree (root → child → ...), and one *card*
per call (its input, the tool's description and input schema, why it is asked: the rule's reason and
the Markdown note a rule or an approval callable gave). The inbox lists the turns of every parked root
run and of the runs below it, a page at a time; a run's page lists those of its own tree (a parent
parked by its child shows the child's calls). Read from the store alone: rows to find the runs, then
each waiting run's log once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.core.approvals import PendingApproval
from tether.core.lifecycle import prompt_of
from tether.core.links import chain_of, link_of
from tether.core.state import RunState
from tether.errors import RunNotFound
from tether.facts.events import ApprovalRequested, Event, RunStarted
from tether.facts.history import text_of
from tether.facts.status import AWAITING
from tether.stores import RunQuery, RunRecord, Store
from tether.views.pending import pending_approvals

PER_PAGE = 20
"""Parked root runs an inbox page shows (each with the runs below it)."""


@dataclass(frozen=True)
class Card:
    """One call waiting for a person, with what they need to decide it."""

    call: PendingApproval
    schema: Any
    """The tool's input schema, as the run recorded it (None if it recorded none)."""
    description: str = ""
    """The tool's description (Markdown), as the run recorded it."""
    note: str = ""
    """Markdown the rule (or the tool's approval callable) that asked gives the person."""
    last_error: str | None = None
    """The error of the call's last attempt, when its retry policy asks a person whether to go on."""


@dataclass(frozen=True)
class Hop:
    """One run of a tree, from the root down: the run and the call of the run above that started it."""

    run_id: str
    call_id: str | None = None
    tool: str | None = None
    """The agent tool that call used (None for the root)."""


@dataclass(frozen=True)
class Turn:
    """The calls one model response of one run waits on, with what the run was asked and what the model said."""

    run_id: str
    tenant: str | None
    agent: str | None
    model: str | None
    waiting_since: float | None
    prompt: str
    """What the run was asked (its whole prompt)."""
    said: str
    """The model's text in the response that asked for these calls ("" if it only asked)."""
    chain: tuple[Hop, ...]
    """From the root of the run's tree down to the run (just the run, for a root run)."""
    cards: tuple[Card, ...]

    @property
    def is_child(self) -> bool:
        """Whether the run serves a call of another run."""
        return len(self.chain) > 1


@dataclass(frozen=True)
class InboxPage:
    """One page of the inbox."""

    turns: list[Turn]
    runs: int
    """Parked root runs in all, on every page."""
    page: int
    """This page's number (1 the first)."""
    pages: int


def inbox_page(store: Store, tenant: str | None, page: int = 1) -> InboxPage:
    """The ``page``-th page of waiting turns the viewer may decide, the longest waiting root run first."""
    query = RunQuery(status=AWAITING, tenant=tenant, roots_only=True, longest_waiting_first=True)
    page = max(page, 1)
    found = store.query_runs(query, limit=PER_PAGE, offset=(page - 1) * PER_PAGE)
    turns = [turn for root in found.records for turn in turns_below(store, root, tenant)]
    return InboxPage(turns, found.total, page, max(1, -(-found.total // PER_PAGE)))


def turns_below(store: Store, record: RunRecord, tenant: str | None) -> list[Turn]:
    """The waiting turns of ``record``'s run and of the runs below it (a parent waits with its children)."""
    if record.status != AWAITING:
        return []
    try:
        waiting = pending_approvals(store, tenant=tenant, run_id=record.id)
    except RunNotFound:  # a child deleted meanwhile (tether gc): the page shows what is left
        return []
    by_run: dict[str, list[PendingApproval]] = {}
    for call in waiting:
        by_run.setdefault(call.run_id, []).append(call)
    turns = []
    for run_id, calls in by_run.items():
        try:
            turns.append(_turn(store, run_id, calls, tenant))
        except RunNotFound:
            continue
    return turns


def _turn(store: Store, run_id: str, calls: list[PendingApproval], tenant: str | None) -> Turn:
    """One run's waiting calls with their context, from its log read once."""
    log = store.load_log(run_id, tenant=tenant)
    state = RunState.rebuild(run_id, log.events, version=log.version, tenant=log.tenant)
    spec = state.spec
    asked = _asked(log.events)
    descriptions = dict(spec.get("tool_descriptions") or {})
    schemas = dict(spec.get("tool_schemas") or {})
    cards = []
    for call in calls:
        requested = asked.get(call.call_id)
        cards.append(
            Card(
                call=call,
                schema=schemas.get(call.tool),
                description=str(descriptions.get(call.tool) or ""),
                note=requested.note if requested is not None else "",
                last_error=requested.last_error if requested is not None else None,
            )
        )
    return Turn(
        run_id=run_id,
        tenant=state.tenant,
        agent=state.agent or spec.get("agent"),
        model=spec.get("model"),
        waiting_since=calls[0].waiting_since if calls else state.updated_at,
        prompt=_prompt(log.events),
        said=_said(state, calls[0].call_id) if calls else "",
        chain=_chain(store, run_id, spec, tenant),
        cards=tuple(cards),
    )


def _asked(events: list[Event]) -> dict[str, Any]:
    """The latest request of a person's decision on each call (its note, its last error)."""
    found = {}
    for event in events:
        if isinstance(event.fact, ApprovalRequested):
            found.update({call.call_id: call for call in event.fact.calls})
    return found


def _prompt(events: list[Event]) -> str:
    """The whole prompt the run was started with (its spec keeps only the start of it)."""
    for event in events:
        if isinstance(event.fact, RunStarted):
            return prompt_of(event.fact.messages) or ""
    return ""


def _said(state: RunState, call_id: str) -> str:
    """The text of the model's response that asked for ``call_id``."""
    for message in reversed(state.messages):
        content = message.get("content")
        asks = isinstance(content, list) and any(
            b.get("type") == "tool_use" and b.get("id") == call_id for b in content
        )
        if message.get("role") == "assistant" and asks:
            return text_of(message).strip()
    return ""


def _chain(store: Store, run_id: str, spec: dict[str, Any], tenant: str | None) -> tuple[Hop, ...]:
    """The runs from the root of ``run_id``'s tree down to it, each with the call that started it."""
    ids = chain_of(run_id, spec)
    hops = [Hop(ids[0])]
    for below in ids[1:]:
        try:
            link = link_of(spec if below == run_id else store.load_run(below, tenant=tenant).spec) or {}
        except RunNotFound:
            link = {}
        hops.append(Hop(below, link.get("call_id"), link.get("tool")))
    return tuple(hops)


__all__ = ["PER_PAGE", "Card", "Hop", "InboxPage", "Turn", "inbox_page", "turns_below"]
