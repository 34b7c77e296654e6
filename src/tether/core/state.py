"""A run's current state, folded from its events.

Applying an event is pure and deterministic, so the state built live while a run is
driven and the state rebuilt from the store after a crash are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.facts import events as ev
from tether.facts.events import Event, Fact
from tether.facts.history import Message, append_user_text, text_of, tool_result_block, tool_uses
from tether.facts.status import RunStatus
from tether.facts.usage import Usage


@dataclass
class Decision:
    """A person's (or policy's) decision on one gated call."""

    approved: bool
    actor: str
    reason: str = ""
    input: dict[str, Any] | None = None
    """Edited input to run with instead of the model's, already validated."""
    attempt: int = 0
    """Attempts the call had started when decided: an attempt in doubt after a crash that
    began after the decision needs a new one (never silently twice)."""


@dataclass
class PendingCall:
    """One ``tool_use`` of the current batch."""

    call_id: str
    tool: str
    input: Any


@dataclass
class ToolOutcome:
    """The ``tool_result`` a call got."""

    content: str
    is_error: bool


@dataclass(frozen=True)
class InFlightCall:
    """Who started a tool call whose end is not recorded.

    Not who runs it now: whoever holds the run's lease owns the run (see :mod:`tether.stores.leases`),
    so to that driver every call in flight was abandoned.
    """

    owner: str
    """``host:pid:token`` of the driver that recorded the start (for messages)."""
    abandoned: bool = False
    """An operator declared the owner gone (``call_abandoned``, ``tether resume --force``)."""


@dataclass
class RunState:
    """Everything the engine needs to decide the next step of one run."""

    id: str
    spec: dict[str, Any] = field(default_factory=dict)
    """How the run was started: model, tools, system, limits (for resume)."""
    tenant: str | None = None
    status: str | None = None
    """The machine's persisted state value (a :class:`~tether.facts.status.RunStatus` value)."""
    version: int = 0
    """Optimistic-concurrency version: the number of committed steps."""
    next_seq: int = 0
    messages: list[Message] = field(default_factory=list)
    batch: list[PendingCall] = field(default_factory=list)
    """Every tool_use of the latest assistant turn, in call order."""
    outcomes: dict[str, ToolOutcome] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    awaiting: list[str] = field(default_factory=list)
    """Call ids shown to a person and not yet all decided."""
    approval_reasons: dict[str, str] = field(default_factory=dict)
    edited_inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Input a person approved a call with instead of the model's; kept when the call is asked
    about again (in doubt after a crash, or escalated), since it is what would run."""
    approved_tools: set[str] = field(default_factory=set)
    """Tools a person approved for the rest of the run: later calls skip the approval gate."""
    attempts: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, InFlightCall] = field(default_factory=dict)
    """Calls whose start was recorded and whose end was not: running, or in doubt after a crash."""
    retry_due: dict[str, float] = field(default_factory=dict)
    continuing_turn: bool = False
    """The last response was pause_turn: the next one extends the same assistant turn."""
    max_tokens: int | None = None
    """Raised above the agent's limit after a tool_use was cut off at max_tokens."""
    steps: int = 0
    """Model invocations, across resumes."""
    tool_calls: int = 0
    """Tool executions (attempts that ran)."""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    """Summed cost of the model calls whose price was known."""
    cost_unknown: bool = False
    """Some call's model had no known price, so ``cost_usd`` is a lower bound."""
    model_seconds: float = 0.0
    """Summed latency of the model calls."""
    tool_seconds: float = 0.0
    """Summed duration of the tool attempts."""
    budget_warned: set[str] = field(default_factory=set)
    """Limits already warned about (each is warned once; see :attr:`tether.core.budgets.Reading.key`)."""
    final_answer_requested: bool = False
    """A budget ran out: the next model call has tools disabled and must answer."""
    result_demands: int = 0
    """Times a prose answer was asked again for the agent's typed result."""
    demanding_result: bool = False
    """The next model call forces the result tool (see :mod:`tether.tools.output`)."""
    compaction_forced: bool = False
    """The conversation overflowed the model's context and no model call answered since: the
    history processors compact even below their thresholds, and another overflow fails the run."""
    output: str | None = None
    result: Any = None
    has_final_result: bool = False
    can_retry: bool = False
    """The run failed transiently; resuming it may try again (a machine guard)."""
    error: str | None = None
    children: dict[str, str] = field(default_factory=dict)
    """The child run serving each call of an agent tool, by call id (its latest attempt's)."""
    waiting_on: dict[str, str] = field(default_factory=dict)
    """Parked children this run waits on, by call id (see :mod:`tether.core.children`)."""
    child_pending: list[dict[str, Any]] = field(default_factory=list)
    """The calls those children wait on a person for, as their runs list them."""
    child_due: dict[str, float] = field(default_factory=dict)
    """When the retry a child parked on is due, by the call it serves (the run waits with it)."""
    agent: str | None = None
    """The agent in charge after a handoff, by name (None: the run's own agent; see :mod:`tether.core.handoffs`)."""
    handing_to: str | None = None
    """The agent a handoff of the current turn hands to once the turn's results go back."""
    handoffs: int = 0
    """Handoffs recorded in all (what ``Limits.max_handoffs`` bounds)."""
    last_handoff: ev.HandedOff | None = None
    """The latest handoff recorded (whose ``input_filter`` :attr:`filter_due` is about)."""
    filter_due: bool = False
    """The last handoff's ``input_filter`` has yet to be applied to the history (before the next model call)."""
    created_at: float = 0.0
    updated_at: float = 0.0
    awaiting_since: float | None = None
    """When the run last parked for a person (its latest ``approval_requested``): a wait's start, for tracing."""
    bound_machine: Any = field(default=None, init=False, repr=False, compare=False)
    """Cache for :func:`tether.core.machine.bind`: building a machine costs more than a whole step."""
    pairing_checked: tuple[Any, int, Any] | None = field(default=None, init=False, repr=False, compare=False)
    """Memo of the engine's last pairing check: (messages list, its length, its last message)."""
    started_here: Any = field(default=None, init=False, repr=False, compare=False)
    """The tool attempt (an ``engine.RunTool``) whose start the driver holding this very object committed
    with the step before, not yet run: its next step runs it (see ``Flow.step``). A run loaded anew
    has none, so such a start found there is a call in doubt, as any other."""

    # Guards read by the machine -------------------------------------------------
    @property
    def has_pending_calls(self) -> bool:
        """Some call of the batch has no result yet."""
        return any(call.call_id not in self.outcomes for call in self.batch)

    @property
    def has_undecided_approvals(self) -> bool:
        """Some call shown for approval has no decision yet."""
        return any(call_id not in self.decisions for call_id in self.awaiting)

    # Queries ---------------------------------------------------------------------
    def unfinished_calls(self) -> list[PendingCall]:
        """The batch's calls without a result, in call order."""
        return [c for c in self.batch if c.call_id not in self.outcomes]

    @property
    def next_due_at(self) -> float | None:
        """When the retry the run waits for is due (None unless one is pending).

        The first unfinished call's with a retry scheduled, in call order, as the engine picks it.
        """
        if self.status != RunStatus.executing_tool:
            return None
        for call in self.unfinished_calls():
            due = self.retry_due.get(call.call_id)
            if due is not None and call.call_id not in self.in_flight:
                return due
            if call.call_id in self.child_due:  # its child run waits for a retry: so does this run
                return self.child_due[call.call_id]
        return None

    def pending_approvals(self) -> list[PendingCall]:
        """Calls waiting for a person, in call order."""
        waiting = set(self.awaiting) - set(self.decisions)
        return [call for call in self.batch if call.call_id in waiting]

    def input_to_run(self, call: PendingCall) -> Any:
        """What ``call`` would run with: a person's edit, else the model's input (what approvers are shown)."""
        return self.edited_inputs.get(call.call_id, call.input)

    def call(self, call_id: str) -> PendingCall | None:
        """The batch's call with this id."""
        return next((c for c in self.batch if c.call_id == call_id), None)

    # Folding ---------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Fold one event into the state."""
        _fold(self, event.fact)
        if isinstance(event.fact, ev.ApprovalRequested):
            self.awaiting_since = event.at
        self.next_seq = event.seq + 1
        self.updated_at = event.at or self.updated_at

    @classmethod
    def rebuild(cls, run_id: str, events: list[Event], *, version: int, tenant: str | None) -> RunState:
        """The state after ``events`` (a run's whole log, oldest first)."""
        state = cls(id=run_id, tenant=tenant)
        for event in events:
            state.apply(event)
        state.version = version
        return state


def _fold(state: RunState, fact: Fact) -> None:
    match fact:
        case ev.Transition(source=source, target=target):
            state.status = target
            if source == RunStatus.failed:  # retried: the earlier failure no longer stands
                state.error, state.can_retry = None, False
        case ev.ModelResponded():
            _model_responded(state, fact)
        case ev.ToolStarted(call_id=call_id, attempt=attempt, owner=owner):
            state.attempts[call_id] = attempt
            state.in_flight[call_id] = InFlightCall(owner)
            state.retry_due.pop(call_id, None)
        case ev.ToolFinished():
            _tool_finished(state, fact)
        case ev.ResultsReturned():
            _results_returned(state)
        case ev.RunStarted(spec=spec, messages=messages, created_at=created_at):
            state.spec = dict(spec)
            state.agent = spec.get("handed_to")  # a continued conversation's agent in charge
            state.messages = [dict(m) for m in messages]
            state.created_at = created_at
        case ev.RetryScheduled():
            _retry_scheduled(state, fact)
        case ev.ApprovalRequested():
            _approval_requested(state, fact)
        case ev.ApprovalDecided():
            _approval_decided(state, fact)
        case ev.Warned():
            _warned(state, fact)
        case ev.CallAbandoned(call_id=call_id):
            started = state.in_flight.get(call_id)
            if started is not None:
                state.in_flight[call_id] = InFlightCall(started.owner, abandoned=True)
        case ev.BudgetExhausted(prompt=prompt):
            append_user_text(state.messages, prompt)
            state.final_answer_requested = True
        case ev.HistoryCompacted():
            _history_compacted(state, fact)
        case ev.ContextExceeded():
            state.compaction_forced = True
        case ev.ResultDemanded():
            _result_demanded(state, fact)
        case ev.RunFinished(error=error, retryable=retryable):
            state.error, state.can_retry = error, retryable
        case ev.ChildStarted() | ev.ChildParked() | ev.ChildResumed() | ev.ChildWaiting() | ev.ChildEnded():
            _child_fact(state, fact)
        case ev.HandedOff():
            _handed_off(state, fact)
        case ev.CacheHit() | ev.CacheMiss():
            pass  # the audit's; the result that follows a hit is folded as any other


def _model_call(state: RunState, usage: Usage, cost_usd: float | None, latency: float) -> None:
    """Count one model call: a step, its usage, cost and latency."""
    state.steps += 1
    state.model_seconds += latency
    state.usage = state.usage + usage
    if cost_usd is None:
        state.cost_unknown = True
    else:
        state.cost_usd += cost_usd


def _model_responded(state: RunState, fact: ev.ModelResponded) -> None:
    _model_call(state, fact.usage, fact.cost_usd, fact.latency)
    state.demanding_result = False
    if not fact.discarded:
        state.compaction_forced = False
    if fact.discarded:
        if fact.next_max_tokens is not None:
            state.max_tokens = fact.next_max_tokens
        return
    content = list(fact.content)
    if not content and not state.continuing_turn:
        state.continuing_turn = False
        return  # an empty turn (e.g. a bare refusal) is not valid history: nothing to keep
    if state.continuing_turn and state.messages and state.messages[-1]["role"] == "assistant":
        previous = state.messages[-1]["content"]
        state.messages[-1] = {"role": "assistant", "content": [*previous, *content]}
    else:
        state.messages.append({"role": "assistant", "content": content})
    state.continuing_turn = fact.stop_reason == "pause_turn"
    calls = tool_uses(state.messages[-1])
    if calls and not state.continuing_turn:
        state.batch = [PendingCall(b["id"], b["name"], b.get("input")) for b in calls]
        state.outcomes, state.decisions, state.awaiting = {}, {}, []
        state.approval_reasons, state.attempts, state.retry_due = {}, {}, {}
        state.child_due = {}
        state.edited_inputs = {}
        state.in_flight = {}
    if fact.stop_reason in ("end_turn", "stop_sequence", "max_tokens"):
        state.output = text_of(state.messages[-1])


def _child_fact(
    state: RunState, fact: ev.ChildStarted | ev.ChildParked | ev.ChildResumed | ev.ChildWaiting | ev.ChildEnded
) -> None:
    """A child run's link, its parking and its end (see :mod:`tether.core.children`)."""
    if not isinstance(fact, ev.ChildWaiting):
        state.child_due.pop(fact.call_id, None)  # whatever else the child did, it no longer waits for a retry
    match fact:
        case ev.ChildStarted(call_id=call_id, run_id=child):
            state.children[call_id] = child
        case ev.ChildParked(call_id=call_id, run_id=child, pending=pending):
            state.waiting_on[call_id] = child
            state.child_pending = [*state.child_pending, *pending]
        case ev.ChildResumed(call_id=call_id):
            state.waiting_on.pop(call_id, None)
            state.child_pending = []
        case ev.ChildWaiting(call_id=call_id, due_at=due_at):
            state.child_due[call_id] = due_at
        case ev.ChildEnded():  # its spending rolls up into the parent's (what the parent's budget counts)
            state.usage = state.usage + fact.usage
            state.tool_calls += fact.tool_calls
            if fact.cost_usd is None:
                state.cost_unknown = True
            else:
                state.cost_usd += fact.cost_usd


def _warned(state: RunState, fact: ev.Warned) -> None:
    if fact.budget:
        state.budget_warned.add(fact.budget)
    if fact.limit:  # a hard cap of Limits (see tether.core.budgets.Reading.key)
        state.budget_warned.add(f"limits.{fact.limit}")


def _handed_off(state: RunState, fact: ev.HandedOff) -> None:
    """A handoff: the other agent takes over when the turn's results go back (see :func:`_results_returned`)."""
    state.handing_to, state.filter_due, state.last_handoff = fact.to_agent, fact.filtered, fact
    state.handoffs += 1


def _result_demanded(state: RunState, fact: ev.ResultDemanded) -> None:
    append_user_text(state.messages, fact.prompt)
    state.result_demands, state.demanding_result = fact.attempt, fact.forced


def _history_compacted(state: RunState, fact: ev.HistoryCompacted) -> None:
    state.messages = [dict(message) for message in fact.messages]
    state.filter_due = False  # a handoff's filter is applied as a compaction (see tether.core.handoffs)
    if fact.usage is not None:  # a summary: one more model call
        _model_call(state, fact.usage, fact.cost_usd, fact.latency)


def _retry_scheduled(state: RunState, fact: ev.RetryScheduled) -> None:
    state.tool_seconds += fact.duration
    state.in_flight.pop(fact.call_id, None)
    state.tool_calls += 1
    state.retry_due[fact.call_id] = fact.due_at


def _tool_finished(state: RunState, fact: ev.ToolFinished) -> None:
    state.tool_seconds += fact.duration or 0.0
    state.outcomes[fact.call_id] = ToolOutcome(fact.content, fact.is_error)
    if state.in_flight.pop(fact.call_id, None) is not None:
        state.tool_calls += 1
    if fact.final_result is not None:
        state.result = fact.final_result
        state.has_final_result = True


def _approval_requested(state: RunState, fact: ev.ApprovalRequested) -> None:
    state.tool_seconds += fact.duration or 0.0  # an escalation's failed attempt
    state.awaiting = [item.call_id for item in fact.calls]
    for call_id in state.awaiting:
        state.decisions.pop(call_id, None)  # a call asked about again needs a new decision
        if fact.escalation and state.in_flight.pop(call_id, None) is not None:
            state.tool_calls += 1  # the failed attempt that led to the escalation ran
    state.approval_reasons.update({item.call_id: item.reason for item in fact.calls})


def _approval_decided(state: RunState, fact: ev.ApprovalDecided) -> None:
    state.decisions[fact.call_id] = Decision(
        approved=fact.approved,
        actor=fact.actor or "unknown",
        reason=fact.reason,
        input=fact.input,
        attempt=state.attempts.get(fact.call_id, 0),
    )
    if fact.approved and fact.input is not None:
        state.edited_inputs[fact.call_id] = fact.input
    if fact.approved and fact.remember_for_run:
        state.approved_tools.add(fact.tool)


def _results_returned(state: RunState) -> None:
    blocks = [
        tool_result_block(c.call_id, state.outcomes[c.call_id].content, is_error=state.outcomes[c.call_id].is_error)
        for c in state.batch
    ]
    state.messages.append({"role": "user", "content": blocks})
    state.batch, state.awaiting = [], []
    if state.handing_to is not None:  # the turn that handed off is answered: the other agent takes over
        state.agent, state.handing_to = state.handing_to, None
