"""A tree of runs: a run, the child runs its calls of agent tools started, theirs, and so on.

Read from the store alone (each run's row, and its log: the runs it started, the agent in charge
after a handoff), so no agent, tool or model is needed: what ``tether show`` draws and what
``--json`` lists as ``children``. Each run's figures are its row's: a parent's include what its ended children spent
(it rolls up, see :mod:`tether.core.children`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.core.links import link_of
from tether.core.state import RunState
from tether.drivers.runner import shown_status
from tether.errors import RunNotFound
from tether.facts.events import ChildStarted, Event
from tether.facts.usage import Usage
from tether.stores import Store

MAX_RUNS = 1000
"""At most this many runs are read for one tree (a runaway tree is cut, and says so)."""
NOT_CREATED = "not_created"
"""Status of a child whose start its parent committed but a crash left uncreated (until the parent resumes)."""


@dataclass
class RunNode:
    """One run of a tree and the runs it started, in the order it started them."""

    run_id: str
    status: str
    """As every CLI surface shows it (``waiting_retry`` included)."""
    agent: str | None = None
    """The name of the agent in charge of the run: after a handoff, the one handed to (None: an agent
    without a name)."""
    handed_off_from: str | None = None
    """The agent the run started with, when a handoff put another in charge (None: no handoff)."""
    call_id: str | None = None
    """The parent's call this run serves (None for a root run)."""
    tool: str | None = None
    """The parent's agent tool that started it."""
    attempt: int = 1
    """Which attempt of that call it serves (a retried call starts a new child)."""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    tool_calls: int = 0
    children: list[RunNode] = field(default_factory=list)
    cut: bool = False
    """Its children were not read: the tree reached :data:`MAX_RUNS`."""

    @property
    def tokens(self) -> int:
        """Input (cache included) plus output tokens."""
        return self.usage.total

    def entry(self) -> dict[str, Any]:
        """How a parent's ``--json`` names this child: ``run_id``, ``call_id``, ``agent``, ``status``."""
        return {"run_id": self.run_id, "call_id": self.call_id, "agent": self.agent, "status": self.status}

    def to_dict(self) -> dict[str, Any]:
        """The subtree: each child's :meth:`entry`, figures, ``children`` (``handed_off_from`` after a handoff)."""
        return {
            **self.entry(),
            "tool": self.tool,
            "attempt": self.attempt,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "tool_calls": self.tool_calls,
            "children": [child.to_dict() for child in self.children],
            **({"handed_off_from": self.handed_off_from} if self.handed_off_from is not None else {}),
            **({"cut": True} if self.cut else {}),
        }


def run_tree(store: Store, run_id: str, *, tenant: str | None = None) -> RunNode:
    """``run_id`` and every run below it.

    Raises:
        RunNotFound: the store has no such run (visible to ``tenant``).
    """
    return _Reader(store, tenant).node(run_id, None, depth=None)


def child_entries(store: Store, run_id: str, *, tenant: str | None = None) -> list[dict[str, Any]]:
    """The runs ``run_id`` started, as its ``--json`` lists them (see :meth:`RunNode.entry`)."""
    return [child.entry() for child in _Reader(store, tenant).node(run_id, None, depth=1).children]


def started_by(store: Store, events: list[Event], *, tenant: str | None = None) -> list[dict[str, Any]]:
    """:func:`child_entries` of a run whose log (``events``) is already read: only its children are read."""
    return [child.entry() for child in _Reader(store, tenant).children(events, depth=0)[0]]


class _Reader:
    """Reads a tree's rows and logs, at most :data:`MAX_RUNS` of them."""

    def __init__(self, store: Store, tenant: str | None) -> None:
        self.store, self.tenant, self.left = store, tenant, MAX_RUNS

    def node(self, run_id: str, started: ChildStarted | None, *, depth: int | None) -> RunNode:
        """The run and, ``depth`` levels down (None: all), the runs it started."""
        self.left -= 1
        try:
            record = self.store.load_run(run_id, tenant=self.tenant)
        except RunNotFound:
            if started is None:
                raise
            # its start is committed before the child is created: the parent's next drive creates it
            return RunNode(run_id, NOT_CREATED, call_id=started.call_id, tool=started.tool, attempt=started.attempt)
        summary, link = record.summary, link_of(record.spec) or {}
        events = self.store.load_events(run_id, tenant=self.tenant)
        started_with = record.spec.get("agent")
        in_charge = RunState.rebuild(run_id, events, version=record.version, tenant=record.tenant).agent or started_with
        node = RunNode(
            run_id=record.id,
            status=shown_status(record),
            agent=in_charge,
            handed_off_from=started_with if in_charge != started_with else None,
            call_id=link.get("call_id"),
            tool=link.get("tool"),
            attempt=started.attempt if started is not None else 1,
            usage=Usage.from_dict(summary.get("usage")),
            cost_usd=summary.get("cost_usd"),
            tool_calls=int(summary.get("tool_calls") or 0),
        )
        if depth == 0:
            return node
        node.children, node.cut = self.children(events, depth=None if depth is None else depth - 1)
        return node

    def children(self, events: list[Event], *, depth: int | None) -> tuple[list[RunNode], bool]:
        """The runs a log's events started, ``depth`` levels below them (None: all); and whether that was cut."""
        found: list[RunNode] = []
        for event in events:
            if not isinstance(event.fact, ChildStarted):
                continue
            if self.left <= 0:
                return found, True
            found.append(self.node(event.fact.run_id, event.fact, depth=depth))
        return found, False
