"""Run statuses: the one place a status is spelt.

:class:`RunStatus` is a run's machine state, spelt as the machine's state ids
(``executing_tool``) everywhere people and programs read it: ``--json``, ``tether runs``, the
terminal, the web inspector, OpenTelemetry. Databases keep the spelling every tether has written
(``executingTool``, ``awaitingApproval``): the stores map it at their edge (:func:`to_stored`,
:func:`from_stored`) and nothing else sees it. :class:`tether.core.machine.AgentMachine` is built
from this enum, so the machine, the store and the CLI cannot disagree on the set. Nothing here
imports anything of tether's: every layer, down to the stores, may use it.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A run's machine state. A ``str``: compare it with a run's ``status`` directly."""

    thinking = "thinking"
    """The model is asked next (the initial state)."""
    executing_tool = "executing_tool"
    """The batch's tool calls run, one at a time."""
    awaiting_approval = "awaiting_approval"
    """Parked: a person decides the batch's gated calls."""
    done = "done"
    """Finished with an answer (final)."""
    failed = "failed"
    """Not final: a run that failed on a transient model error can be retried."""
    cancelled = "cancelled"
    """Stopped on request (final)."""

    @property
    def shown(self) -> str:
        """The name people read (``executing_tool``): the machine's state id, which is the value."""
        return self.value


INITIAL = RunStatus.thinking
"""The state a new run enters."""
FINAL: frozenset[RunStatus] = frozenset({RunStatus.done, RunStatus.cancelled})
"""States nothing can leave (the machine's final states)."""
ENDED: frozenset[RunStatus] = FINAL | {RunStatus.failed}
"""States where a drive stops for good (a failed run moves again only when resumed)."""
AWAITING = RunStatus.awaiting_approval
"""The state of a run parked until a person decides."""

WAITING_RETRY = "waiting_retry"
"""Shown only, never stored: a run in ``executing_tool`` whose next step is a tool retry due
later (a drive with ``max_wait`` parked it there; its row has ``next_due_at``)."""
WAITING_RETRY_STATUS = RunStatus.executing_tool
"""The status of a run shown as :data:`WAITING_RETRY`."""
SHOWN: tuple[str, ...] = (*sorted(status.shown for status in RunStatus), WAITING_RETRY)
"""Every status people can see or ask for (``tether runs --status``), sorted, then waiting_retry."""

STORED_SPELLING: dict[str, str] = {
    RunStatus.executing_tool: "executingTool",
    RunStatus.awaiting_approval: "awaitingApproval",
}
"""How databases spell the statuses whose spelling differs (as every tether has written them)."""
_FROM_STORED = {stored: status for status, stored in STORED_SPELLING.items()}


def to_stored(status: str) -> str:
    """A status as a database keeps it (``executing_tool`` → ``executingTool``): for the stores' writes only."""
    return STORED_SPELLING.get(status, status)


def from_stored(value: str) -> str:
    """A status a database kept, as everything else spells it (``executingTool`` → ``executing_tool``)."""
    return _FROM_STORED.get(value, value)


def status_name(value: str | None) -> str:
    """A status as people read it, ``"unknown"`` for none; one spelt as a database keeps it is spelt as the rest."""
    if not value:
        return "unknown"
    return from_stored(value)


def stored_status(name: str) -> RunStatus:
    """The status a shown name asks for (``executing_tool``; ``waiting_retry`` → ``executing_tool``).

    The database spelling (``executingTool``) is taken too, for whoever copied it from an older tether.

    Raises:
        KeyError: ``name`` is no status's shown name.
    """
    return WAITING_RETRY_STATUS if name == WAITING_RETRY else RunStatus[from_stored(name)]


def stored_filter(name: str) -> tuple[RunStatus, bool | None]:
    """What to ask a store's ``list_runs`` for the runs shown as ``name``: (``status``, ``waiting_retry``).

    A run waiting for a retry is ``executing_tool``: ``executing_tool`` asks for those without a
    due retry, ``waiting_retry`` for those with one (the store filters before its limit).

    Raises:
        KeyError: ``name`` is no status's shown name.
    """
    status = stored_status(name)
    return status, (name == WAITING_RETRY) if status == WAITING_RETRY_STATUS else None
