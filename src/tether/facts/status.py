"""Run statuses: the one place a status is spelt.

:class:`RunStatus` is what a run's row and its ``transition`` events store (the member's
value, ``"executingTool"``); people read the member's name (``executing_tool``) everywhere:
``--json``, ``tether runs``, the terminal. :class:`tether.core.machine.AgentMachine` is built from
this enum, so the machine, the store and the CLI cannot disagree on the set. Nothing here
imports anything of tether's: every layer, down to the stores, may use it.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A run's machine state, as persisted. A ``str``: compare it with stored values directly."""

    thinking = "thinking"
    """The model is asked next (the initial state)."""
    executing_tool = "executingTool"
    """The batch's tool calls run, one at a time."""
    awaiting_approval = "awaitingApproval"
    """Parked: a person decides the batch's gated calls."""
    done = "done"
    """Finished with an answer (final)."""
    failed = "failed"
    """Not final: a run that failed on a transient model error can be retried."""
    cancelled = "cancelled"
    """Stopped on request (final)."""

    @property
    def shown(self) -> str:
        """The name people read (``executing_tool``): the machine's state id."""
        return self.name


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
"""The stored status of a run shown as :data:`WAITING_RETRY`."""
SHOWN: tuple[str, ...] = (*sorted(status.shown for status in RunStatus), WAITING_RETRY)
"""Every status people can see or ask for (``tether runs --status``), sorted, then waiting_retry."""


def status_name(value: str | None) -> str:
    """A stored status as people read it (``"executingTool"`` → ``executing_tool``); unknown ones as they are."""
    if not value:
        return "unknown"
    return RunStatus(value).shown if value in _VALUES else value


def stored_status(name: str) -> RunStatus:
    """The stored status of a shown name (``executing_tool`` or ``waiting_retry`` → ``executingTool``).

    Raises:
        KeyError: ``name`` is no status's shown name.
    """
    return WAITING_RETRY_STATUS if name == WAITING_RETRY else RunStatus[name]


def stored_filter(name: str) -> tuple[RunStatus, bool | None]:
    """What to ask a store's ``list_runs`` for the runs shown as ``name``: (``status``, ``waiting_retry``).

    A run waiting for a retry is stored ``executingTool``: ``executing_tool`` asks for those
    without a due retry, ``waiting_retry`` for those with one (the store filters before its limit).

    Raises:
        KeyError: ``name`` is no status's shown name.
    """
    stored = stored_status(name)
    return stored, (name == WAITING_RETRY) if stored == WAITING_RETRY_STATUS else None


_VALUES = frozenset(status.value for status in RunStatus)
