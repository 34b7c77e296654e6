"""Approvers: who decides a gated call, as data keyed by call id.

An :class:`Approver` sees every pending call of a batch at once and answers with
:class:`Approve` / :class:`Deny` per call id; a call it leaves out stays pending and the run
stays parked. Nothing here knows about terminals — :mod:`tether.terminal` has that one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ApprovalRequest:
    """One call waiting for a decision, with what a person needs to decide."""

    run_id: str
    call_id: str
    tool: str
    input: Any
    reason: str
    """Why it needs approval (the rule or the tool's setting)."""
    description: str
    fingerprint: str
    """Hash of the exact arguments shown; a decision is bound to it."""
    tenant: str | None = None
    """The run's tenant (what an approval callable sees when edited input is checked)."""


@dataclass(frozen=True)
class Approve:
    """Run the call, optionally with edited input (validated against the tool's schema)."""

    input: dict[str, Any] | None = None
    actor: str = "approver"
    remember_for_run: bool = False
    """Also approve this tool's later calls in this run (and its other pending ones).

    Recorded in the ``approval_decided`` event, so it holds in any process. It never
    skips a ``deny`` rule, nor the question asked after a crash left a call in doubt.
    """


@dataclass(frozen=True)
class Deny:
    """Do not run the call; the model gets an ``is_error`` result with the reason."""

    reason: str = ""
    actor: str = "approver"


Decision = Approve | Deny


class Approver(Protocol):
    """Decides pending calls; returns decisions for some, all or none of them."""

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """Decisions keyed by call id."""
        ...


class DecideLater:
    """Decides nothing now: the run parks until a decision comes from elsewhere.

    For services and the CLI, where a person answers later (``runner.decide`` from any
    process, ``tether approve``). Unlike ``approver=None`` ("nobody will be asked"), it
    counts as someone to ask, so a call a crash left in doubt parks for that person too
    instead of reaching the model as not re-run (see ``Agent.on_interrupted``).
    """

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """No decision: every call stays pending."""
        return {}


class AutoApprover:
    """Approves (or denies) everything: ``--approve-all`` / ``--deny-all``."""

    def __init__(self, *, approve: bool, actor: str | None = None) -> None:
        self.approve = approve
        self.actor = actor or ("approve-all" if approve else "deny-all")

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """The same answer for every call."""
        if self.approve:
            return {r.call_id: Approve(actor=self.actor) for r in requests}
        return {r.call_id: Deny("denied by --deny-all", actor=self.actor) for r in requests}


class CallbackApprover:
    """Decides inline with a function of one request (returning None leaves it pending)."""

    def __init__(self, callback: Callable[[ApprovalRequest], Decision | None]) -> None:
        self.callback = callback

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """Ask the callback about each call."""
        decisions: dict[str, Decision] = {}
        for request in requests:
            answer = self.callback(request)
            if answer is not None:
                decisions[request.call_id] = answer
        return decisions
