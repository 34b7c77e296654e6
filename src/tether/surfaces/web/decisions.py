"""Decisions from the inbox, through the one decision API, and the run's resumption after them; forks.

A decision is :meth:`tether.Runner.decide`, exactly as ``tether approve`` / ``tether deny`` make
it: bound to the fingerprint of the input the person was shown, so one decider wins and a
decision about other arguments is refused. An approval loads the run's tools (to check an
edited input against the tool's schema and the rules); a denial needs none. Once the run's
last pending call is decided, :class:`InProcess` drives it on in a background thread, as
``tether resume`` would; pass another :data:`Resume` to queue it to a worker instead. A fork
(:meth:`tether.Runner.fork`, as ``tether fork`` makes it) is driven the same way once made.

A call waiting in a child run is decided as ``tether approve`` decides it: with the root run's
agent, whose agent tools lead down to the child's, and the root is what is driven on. The agent
is rebuilt from the root's record (as ``tether resume`` does) unless one is given: a service
whose runs were started in Python gives its own (:func:`~tether.surfaces.web.app.create_app`'s ``agent``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tether.agent import Agent
from tether.core.approvals import Approve, DecideLater, Decision, Deny, edited_input, fingerprint
from tether.core.forks import MessageEdit
from tether.core.links import chain_of
from tether.core.state import RunState
from tether.drivers.loader import NOT_FROM_SPEC, AgentFor, NoModel, agent_for, agent_spec, made_in_python, reader_agent
from tether.drivers.queue import queue_of, requeue
from tether.drivers.runner import Runner, RunResult
from tether.drivers.telemetry import Telemetry
from tether.errors import ApprovalError, ConfigError, RunEnded, StaleRun, TetherError
from tether.facts.status import ENDED, RunStatus, status_name
from tether.stores import RunRecord, Store
from tether.surfaces.web import fields

log = logging.getLogger(__name__)

Resume = Callable[[str, str | None], None]
"""Drives a run on after its decisions: ``resume(run_id, tenant)``; must not block the request."""
ACTIONS = ("approve", "deny", "edit")
TURN_ACTIONS = ("approve-all", "deny-all")
ALL = "all."
"""The prefix of each call's fingerprint in a form deciding a whole turn (``all.CALL_ID``)."""


class BadForm(ConfigError):
    """A decision form that cannot be read (answered 422; nothing is recorded)."""


class BadFields(BadForm):
    """Fields of an edited input that cannot be read: each problem is shown beside its field."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        said = "; ".join(f"{key}: {problem}" for key, problem in problems.items())
        super().__init__(f"the edited input cannot be read: {said}")
        self.problems = dict(problems)
        """What is wrong, by the field's key."""


UNCONFIRMED_EDIT = (
    "you edited the input, but Approve approves the input as it was shown: press "
    "“Approve the edited input” to approve your edit, or undo it. Nothing was decided."
)
"""Why a plain approval of an edited form is refused: what a person approves is what they see."""
TWO_EDITS = (
    "the fields and the raw JSON say different inputs: change one of them back (or reload the page). "
    "Nothing was decided."
)
"""Why an edit is refused when the form's two ways of editing disagree (possible without the page's script)."""


@dataclass(frozen=True)
class DecisionForm:
    """What a person sent about one call."""

    action: str
    """approve, deny, or edit (approve with the edited input)."""
    fingerprint: str
    """Of the input the page showed: the decision is refused if the call's input changed since."""
    reason: str = ""
    input_text: str = ""
    """The input as raw JSON, as the person left it."""
    by: str = ""
    field_values: Mapping[str, str] = field(default_factory=dict)
    """The edit form's fields as posted (``f.KEY`` and ``t.KEY``: see :mod:`~tether.surfaces.web.fields`)."""

    @classmethod
    def of(cls, posted: Mapping[str, str]) -> DecisionForm:
        """Read a submitted form.

        Raises:
            BadForm: an unknown action, or no fingerprint (a form that did not come from a page).
        """
        action = posted.get("action", "")
        if action not in ACTIONS:
            raise BadForm(f"unknown action {action!r}: approve, deny or edit")
        fingerprint = posted.get("fingerprint", "").strip()
        if not fingerprint:
            raise BadForm("the form carries no fingerprint of the input it showed: reload the page")
        return cls(
            action=action,
            fingerprint=fingerprint,
            reason=posted.get("reason", "").strip(),
            input_text=posted.get("input", ""),
            by=posted.get("by", "").strip(),
            field_values={k: v for k, v in posted.items() if k.startswith((fields.VALUE, fields.KIND))},
        )

    def edit(self) -> dict[str, Any] | None:
        """The input the form says, if it differs from the one shown; None if it says the one shown.

        The fields and the raw JSON are two ways to edit one input: either may carry the edit,
        and if both do they must agree.

        Raises:
            BadFields: a field that cannot be read.
            BadForm: raw JSON that is not an object, or fields and raw JSON that disagree.
        """
        from_fields, problems = fields.input_of(self.field_values)
        if problems:
            raise BadFields(problems)
        try:
            raw = edited_input(self.input_text) if self.input_text.strip() else None
        except ConfigError as error:
            raise BadForm(str(error)) from None
        changed = [said for said in (from_fields, raw) if said is not None and fingerprint(said) != self.fingerprint]
        if len(changed) == 2 and fingerprint(changed[0]) != fingerprint(changed[1]):
            raise BadForm(TWO_EDITS)
        return changed[0] if changed else None

    @property
    def edited(self) -> bool:
        """Whether the form says another input than the one shown (one it cannot read counts as another)."""
        try:
            return self.edit() is not None
        except BadForm:
            return True

    def decision(self, actor: str) -> Decision:
        """The decision this form asks for.

        Raises:
            BadForm: a plain approval of an edited input (:data:`UNCONFIRMED_EDIT`: approving what was
                shown while the page shows another input would run what the person no longer sees); an
                edit that cannot be read (:class:`BadFields` for a field), or an edit with no input.
        """
        if self.action == "deny":
            return Deny(self.reason, actor=actor)
        if self.action == "approve":
            if self.edited:
                raise BadForm(UNCONFIRMED_EDIT)
            return Approve(actor=actor)
        if not self.input_text.strip() and not self.field_values:
            raise BadForm("no edited input was sent: edit the fields or the raw JSON")
        return Approve(input=self.edit(), actor=actor)  # None: nothing was changed, the input as shown


@dataclass(frozen=True)
class TurnForm:
    """What a person sent about every call of one turn at once: approve each as shown, or deny each."""

    action: str
    """approve-all or deny-all."""
    calls: tuple[tuple[str, str], ...]
    """Each call's id and the fingerprint of the input shown for it, in the turn's order."""
    reason: str = ""
    by: str = ""

    @classmethod
    def of(cls, posted: Mapping[str, str]) -> TurnForm:
        """Read a submitted form (``all.CALL_ID`` = that call's fingerprint, for each call).

        Raises:
            BadForm: an unknown action, or no call.
        """
        action = posted.get("action", "")
        if action not in TURN_ACTIONS:
            raise BadForm(f"unknown action {action!r}: {' or '.join(TURN_ACTIONS)}")
        calls = tuple((name[len(ALL) :], value) for name, value in posted.items() if name.startswith(ALL))
        if not calls:
            raise BadForm("the form names no call to decide: reload the page")
        return cls(action, calls, posted.get("reason", "").strip(), posted.get("by", "").strip())

    def forms(self) -> list[tuple[str, DecisionForm]]:
        """The decision on each call, as its own card would send it untouched."""
        single = self.action.removesuffix("-all")
        return [(call_id, DecisionForm(single, shown, self.reason, by=self.by)) for call_id, shown in self.calls]


class Decider:
    """Records decisions for a viewer's tenant and resumes runs once nothing waits."""

    def __init__(
        self,
        store: Store,
        resume: Resume,
        *,
        agent: Agent | AgentFor | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.resume = resume
        self.agent = agent
        """The agent that checks an approval of a root run's calls (or makes it from the root's spec); None: rebuilt."""
        self.telemetry = telemetry
        """Traces the decisions and forks made here (the wait for a person ends in a span)."""

    def decide(self, run_id: str, call_id: str, form: DecisionForm, *, tenant: str | None) -> RunResult:
        """Record the form's decision; resume the run's root if nothing in its tree waits for anyone.

        Raises:
            RunNotFound: no such run for this tenant.
            ApprovalError: refused (already decided, stale fingerprint, invalid edit, denied by a rule...).
            BadForm: the form cannot be read.
            ConfigError: the run's tools cannot be loaded to check an approval (made in Python, no agent given).
        """
        actor = form.by or "tether ui"
        decision = form.decision(actor)
        run = self.store.load_run(run_id, tenant=tenant)
        root_id = chain_of(run_id, run.spec)[0]
        root = run if root_id == run_id else self.store.load_run(root_id, tenant=tenant)
        spec = agent_spec(self.store, root)
        if isinstance(decision, Deny):
            result = Runner(reader_agent(), self.store, telemetry=self.telemetry).decide(  # a denial runs nothing
                run_id, call_id, decision, fingerprint=form.fingerprint, tenant=tenant
            )
        else:  # the agent checking the approval: no model is called
            with agent_for(self.agent, spec, model=NoModel()) as agent:
                runner = Runner(agent, self.store, telemetry=self.telemetry)
                result = runner.decide(run_id, call_id, decision, fingerprint=form.fingerprint, tenant=tenant)
        if result.status != RunStatus.awaiting_approval.shown and self._drives_here(root, spec):
            self.resume(root.id, tenant)
        return result

    def decide_turn(self, run_id: str, form: TurnForm, *, tenant: str | None) -> tuple[list[str], TetherError | None]:
        """Decide each call of ``form`` as :meth:`decide` does; the calls decided, and the refusal that stopped it.

        The calls decided before one is refused stay decided (each decision is its own); the run
        is resumed once its last call is decided, as after single decisions.
        """
        decided: list[str] = []
        for call_id, single in form.forms():
            try:
                self.decide(run_id, call_id, single, tenant=tenant)
            except (ConfigError, ApprovalError, StaleRun) as error:
                return decided, error
            decided.append(call_id)
        return decided, None

    def cancel(self, run_id: str, *, tenant: str | None, reason: str = "", by: str = "") -> RunResult:
        """Stop a run that has not ended (its child runs after it), as ``tether cancel`` does: needs no tools.

        Raises:
            RunNotFound: no such run for this tenant.
            RunEnded: it has ended already.
        """
        said = reason or "cancelled in tether ui"
        return Runner(reader_agent(), self.store, telemetry=self.telemetry).cancel(
            run_id, f"{said} (by {by})" if by else said, tenant=tenant
        )

    def go_on(self, run_id: str, *, tenant: str | None) -> str:
        """Drive a run on (its tree's root, which drives its children first), as ``tether resume`` does.

        For a run left mid-step, waiting for a tool retry, or failed in a way a new try may mend;
        a submitted run is queued again for its worker instead. Returns what was done, in words.

        Raises:
            RunNotFound: no such run for this tenant.
            RunEnded: it has ended, and no new try can change that.
            ConfigError: made in Python, and no agent was given to drive it with (its program resumes it).
        """
        record = self.store.load_run(run_id, tenant=tenant)
        root_id = chain_of(run_id, record.spec)[0]
        root = record if root_id == run_id else self.store.load_run(root_id, tenant=tenant)
        if root.status in ENDED and not (root.status == RunStatus.failed and root.summary.get("retryable")):
            raise RunEnded(root.id, status_name(root.status), "resume")
        if queue_of(root.spec) is not None:
            queued = requeue(self.store, root.id)
            return f"run {root.id} {'queued again' if queued else 'was queued already'} for its worker"
        spec = agent_spec(self.store, root)
        if self.agent is None and made_in_python(spec):
            raise ConfigError(NOT_FROM_SPEC)
        self.resume(root.id, tenant)
        return f"run {root.id} is driven on" + ("" if root.id == run_id else f" (the root of {run_id})")

    def _drives_here(self, root: RunRecord, spec: dict[str, Any]) -> bool:
        """Whether this process drives the root on (its agent rebuilt from ``spec``, unless one was given).

        Not a submitted run (the decision queued it for ``tether worker``), nor one made in Python
        when no agent was given (the program that made it resumes it).
        """
        if queue_of(root.spec) is not None:
            return False
        if self.agent is None and made_in_python(spec):
            log.info("tether ui: run %s was made in Python: the program that made it drives it on", root.id)
            return False
        return True

    def fork(self, run_id: str, at: str, *, tenant: str | None, text: str = "", message: str = "") -> RunState:
        """Start a new run from event ``at`` of ``run_id`` (the original untouched) and drive it on.

        ``text``, unless blank, replaces the text of the fork's message number ``message`` (0 the
        first, -1 the last; blank: the last user message holding text, the prompt the model answers
        next, which after tool results is the one that began the turn).

        Raises:
            RunNotFound: no such run for this tenant.
            InvalidForkPoint: no such event, one in the middle of a turn, no such message, or one without text.
            BadForm: ``at`` or ``message`` is not a number.
        """
        try:
            event = int(at)
        except ValueError:
            raise BadForm(f"the event to fork at must be a number, not {at!r}") from None
        try:
            index = int(message) if message.strip() else None
        except ValueError:
            raise BadForm(f"the message to edit must be a number (0 the first, -1 the last), not {message!r}") from None
        runner = Runner(reader_agent(), self.store, telemetry=self.telemetry)  # a fork needs no tools
        edit = MessageEdit(index, text) if text.strip() else None
        fork = runner.fork(run_id, at_event=event, tenant=tenant, edit=edit)
        self.resume(fork.id, fork.tenant)
        return fork


class InProcess:
    """Drives decided runs in this process's background threads, as ``tether resume`` would.

    A retry due later than ``max_wait`` parks the run (``tether runs --due`` finds it); a run
    another process drives meanwhile is left to it. Failures are logged: the run's row tells
    its status either way.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_wait: float = 5.0,
        workers: int = 2,
        agent: Agent | AgentFor | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.max_wait = max_wait
        self.agent = agent
        """Drives the runs (or makes the agent from a run's spec); None: rebuilt per drive, and closed."""
        self.telemetry = telemetry
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tether-ui-drive")

    def __call__(self, run_id: str, tenant: str | None) -> None:
        """Queue the drive; return at once."""
        self._pool.submit(self.drive, run_id, tenant)

    def drive(self, run_id: str, tenant: str | None) -> None:
        """Drive the run until it parks or ends (in the calling thread)."""
        try:
            spec = agent_spec(self.store, self.store.load_run(run_id, tenant=tenant))
            with agent_for(self.agent, spec) as agent:  # one rebuilt per drive goes with it, servers and connections
                runner = Runner(agent, self.store, approver=DecideLater(), telemetry=self.telemetry)
                runner.drive(run_id, tenant=tenant, max_wait=self.max_wait)
        except TetherError as error:  # busy elsewhere, ended meanwhile, tools gone: the row says the rest
            log.warning("tether ui: run %s was not driven on: %s", run_id, error)
        except Exception:  # a tool module that fails to import, a model without credentials...
            log.exception("tether ui: driving run %s failed", run_id)

    def close(self) -> None:
        """Let running drives finish; drop the queued ones (their runs stay decided, for a resume)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = [
    "ACTIONS",
    "TWO_EDITS",
    "UNCONFIRMED_EDIT",
    "BadFields",
    "BadForm",
    "Decider",
    "DecisionForm",
    "InProcess",
    "Resume",
    "TurnForm",
]
