"""Approvers: who decides a gated call, as data keyed by call id.

An :class:`Approver` sees every pending call of a batch at once and answers with
:class:`Approve` / :class:`Deny` per call id; a call it leaves out stays pending and the run
stays parked. Nothing here knows about terminals — :mod:`tether.surfaces.terminal` has that one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tether.canonical import canonical_json
from tether.errors import ConfigError
from tether.facts.status import AWAITING, status_name

if TYPE_CHECKING:
    from tether.agent import Agent
    from tether.core.state import PendingCall, RunState


@dataclass(frozen=True)
class PendingApproval:
    """One call waiting for a decision, with what a person needs to decide.

    The one shape of a pending call: approvers get it, ``tether pending`` and the service
    list it, :class:`tether.RunResult` holds its :meth:`item`. Built from a run state by
    :func:`pending_of`, from a run's row by :func:`tether.views.pending.pending_approvals`.
    """

    run_id: str
    call_id: str
    tool: str
    input: Any
    """What would run: the model's arguments, or a person's earlier edit of them."""
    reason: str
    """Why it needs approval (the rule or the tool's setting)."""
    fingerprint: str
    """Hash of the exact arguments shown; a decision is bound to it."""
    description: str = ""
    """The tool's description (known where the agent is: not when read from a row)."""
    tenant: str | None = None
    """The run's tenant (what an approval callable sees when edited input is checked)."""
    waiting_since: float | None = None
    """Unix time the run last changed (when it parked, or a sibling call was decided); known from a row."""
    chain: tuple[str, ...] = ()
    """For a child run's call, read from a row: the runs from the root of its tree down to it
    (parent → child). Such a call is decided on the child (``run_id``), from any process."""

    @property
    def root(self) -> str:
        """The run that drives this call's run once it is decided: its chain's first, or its own."""
        return self.chain[0] if self.chain else self.run_id

    def item(self) -> dict[str, Any]:
        """The run's own list entry (``pending_approvals`` of ``--json`` and of the run's row)."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "input": self.input,
            "reason": self.reason,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_item(
        cls,
        item: Mapping[str, Any],
        *,
        run_id: str,
        tenant: str | None,
        waiting_since: float,
        chain: tuple[str, ...] = (),
    ) -> PendingApproval:
        """An :meth:`item` read back from a run's row (which has no tool descriptions)."""
        return cls(
            run_id=run_id,
            call_id=str(item["call_id"]),
            tool=str(item["tool"]),
            input=item.get("input"),
            reason=str(item.get("reason") or ""),
            fingerprint=str(item.get("fingerprint") or ""),
            tenant=tenant,
            waiting_since=waiting_since,
            chain=chain,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``tether pending --json`` and the service's ``GET /approvals`` (``chain``: a child's call)."""
        shown = {"run_id": self.run_id, **self.item(), "tenant": self.tenant, "waiting_since": self.waiting_since}
        if len(self.chain) > 1:  # a child run's call: the runs above it, root first
            shown["chain"] = list(self.chain)
        return shown


ApprovalRequest = PendingApproval
"""What an :class:`Approver` is asked about: the one pending-call shape, under its older name."""


def fingerprint(arguments: Any) -> str:
    """A short hash of canonical JSON: binds a decision to the exact arguments shown."""
    canonical = canonical_json(arguments)  # the spelling the tool cache hashes too
    return hashlib.sha256(canonical.encode(errors="surrogatepass")).hexdigest()[:16]  # any str, lone surrogates too


def pending_call(state: RunState, call: PendingCall, agent: Agent | None = None) -> PendingApproval:
    """``call`` of ``state`` as a person is shown it: what would run, and its fingerprint.

    With ``agent``, the tool's description is filled in.
    """
    to_run = state.input_to_run(call)
    tool = agent.tool_index.get(call.tool) if agent is not None else None
    return PendingApproval(
        run_id=state.id,
        call_id=call.call_id,
        tool=call.tool,
        input=to_run,
        reason=state.approval_reasons.get(call.call_id, ""),
        fingerprint=fingerprint(to_run),
        description=tool.description if tool is not None else "",
        tenant=state.tenant,
    )


def pending_of(state: RunState, agent: Agent | None = None) -> list[PendingApproval]:
    """Every call of ``state`` waiting for a decision, in call order (see :func:`pending_call`)."""
    return [pending_call(state, call, agent) for call in state.pending_approvals()]


def overruled(state: RunState, call_id: str, shown: str) -> str | None:
    """What became of ``call_id`` since it was shown (fingerprint ``shown``); None while it still waits as shown.

    For an approver whose answer came too late: ``already approved in another process (by bob)``,
    ``already denied in another process (by bob: why)``, ``no longer waiting: the run is now cancelled``.
    """
    if state.status == AWAITING and any(p.call_id == call_id and p.fingerprint == shown for p in pending_of(state)):
        return None
    decision = state.decisions.get(call_id)
    if decision is not None:
        verdict = "approved" if decision.approved else "denied"
        edited = " with edited input" if decision.approved and decision.input is not None else ""
        why = f": {decision.reason}" if not decision.approved and decision.reason else ""
        return f"already {verdict}{edited} in another process (by {decision.actor}{why})"
    if state.status != AWAITING:
        return f"no longer waiting: the run is now {status_name(state.status)}"
    return "asked about again with other arguments"


MAX_INPUT_DEPTH = 100
"""How deeply an edited input may nest: far beyond any tool's schema, well within what the
JSON parser, pydantic (about 255) and the stores handle."""


def edited_input(text: str, *, what: str = "the edited input") -> dict[str, Any]:
    """A person's edit of a call's input, typed as JSON: an object of sane depth.

    Only the shape is checked here; the tool's schema and the rules judge the content when
    the approval is decided (:class:`~tether.errors.InvalidEditedInput`, :class:`~tether.errors.DeniedByPolicy`).

    Raises:
        ConfigError: not JSON, not an object, or nested too deeply (``what`` names the input).
    """
    too_deep = ConfigError(f"{what} is nested too deeply (more than {MAX_INPUT_DEPTH} levels)")
    try:
        value = json.loads(text)
    except RecursionError:  # deeper than the parser goes
        raise too_deep from None
    except ValueError as error:
        raise ConfigError(f"{what} is not valid JSON: {error}") from error
    if _depth(value) > MAX_INPUT_DEPTH:
        raise too_deep
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object")
    return value


def _depth(value: Any) -> int:
    """How many arrays and objects nest in a parsed JSON value (without recursing, so any depth works)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


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
    """Decides pending calls; returns decisions for some, all or none of them.

    Another process may decide some of the calls (or cancel the run) while the approver takes
    its time: the drive then records the approver's answers for the calls still waiting only.
    An approver with a ``decided_elsewhere(notes)`` method is told of the others, each a
    ``(call id, what became of it)`` pair (``("toolu_1", "approved by bob")``).
    """

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """Decisions keyed by call id."""
        ...


class AsyncApprover(Protocol):
    """An :class:`Approver` whose answer is awaited (a web form, a chat message): for :class:`tether.AsyncRunner`.

    :class:`tether.AsyncRunner` awaits an ``async def decide``; it runs a sync approver's
    ``decide`` in a worker thread, as it may block (a terminal prompt), and awaits its answer
    if that is awaitable. :class:`tether.Runner` takes sync approvers only.
    """

    async def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """Decisions keyed by call id."""
        ...


def is_async_approver(approver: Approver | AsyncApprover) -> bool:
    """Whether ``approver.decide`` is a coroutine function (its answer must be awaited)."""
    return inspect.iscoroutinefunction(approver.decide)


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
