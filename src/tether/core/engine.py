"""The engine decides; drivers do I/O.

Given a run's state, :func:`next_action` says what must happen next (call the model with
this request, run this tool attempt, wait, or stop), and the ``on_*`` functions turn what
happened into a :class:`Step`: the events to record and the machine event to send.
:func:`commit` applies a step to the state and returns the events to persist. Nothing in
this module touches the network, the clock or the database, so the sync and async drivers
(and any queue worker) share every decision.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pydantic

from tether.agent import Agent
from tether.core import budgets
from tether.core.approvals import Approve, Deny, PendingApproval, fingerprint, pending_call
from tether.core.machine import bind
from tether.core.state import PendingCall, RunState
from tether.errors import (
    AlreadyDecided,
    DeniedByPolicy,
    IncompatibleRun,
    InvalidEditedInput,
    ModelError,
    NotAwaitingApproval,
    StaleFingerprint,
    UnknownCall,
)
from tether.facts.events import (
    Allowed,
    ApprovalDecided,
    ApprovalRequested,
    BudgetExhausted,
    CacheHit,
    CallAbandoned,
    ContextExceeded,
    Event,
    Fact,
    HistoryCompacted,
    ModelResponded,
    RequestedCall,
    ResultDemanded,
    ResultsReturned,
    RetryScheduled,
    RunFinished,
    RunStarted,
    ToolFinished,
    ToolStarted,
    Transition,
    Warned,
)
from tether.facts.history import check_pairing, text_of, tool_uses
from tether.facts.status import AWAITING, ENDED, RunStatus
from tether.models import ModelAdapter, ModelRequest, ModelResponse
from tether.policy import compaction
from tether.policy.compaction import SummaryPlan
from tether.policy.policies import ApprovalContext, ApprovalVerdict
from tether.policy.pricing import price_for
from tether.policy.rules import decide_call, denial
from tether.tools import (
    ModelRetry,
    OutcomeUnknown,
    Tool,
    ToolExit,
    ToolTimeout,
    UnserializableResult,
    field_problems,
    plain_errors,
)
from tether.tools import output as results

DONE_STOP_REASONS = frozenset({"end_turn", "stop_sequence"})
CONTEXT_EXCEEDED = "model_context_window_exceeded"


# Actions: what a driver must do next ---------------------------------------------------
@dataclass(frozen=True)
class CallModel:
    """Make one model call with this request."""

    request: ModelRequest
    summary: SummaryPlan | None = None
    """The call writes a summary of the history (see :mod:`tether.policy.compaction`), not the agent's next turn."""
    model: ModelAdapter | None = None
    """Who answers: the adapter of the agent in charge (after a handoff, not the driver's own); None: the driver's."""
    run_id: str = ""
    """The run it is made for: whose followers the text of the answer goes to as it arrives."""
    cursor: int = -1
    """The seq of the run's last event when the call is made: the answer's text belongs right after it in its stream."""


@dataclass(frozen=True)
class RunTool:
    """Record the start, run one attempt of one call, then report the outcome."""

    call: PendingCall
    tool: Tool
    arguments: pydantic.BaseModel
    attempt: int
    edited: bool = False
    max_result_chars: int | None = None
    """The agent's cap on the result text the model sees (see :func:`truncate_result`)."""
    warnings: tuple[Warned, ...] = ()
    """Policy ``warn`` and limit warnings, committed with the start so the log has them before the tool runs."""
    execution_warnings: tuple[Warned, ...] = ()
    """Those of ``warnings`` that count this attempt as a tool execution (limit warnings): a cache
    hit runs nothing, so it records only the others."""
    allowed: Allowed | None = None
    """Who let the call run without asking anyone now (see :func:`_verdict`), recorded with its
    start for the audit; None when a person decided this very call."""


@dataclass(frozen=True)
class WaitUntil:
    """Nothing to do before ``due_at`` (a retry's persisted schedule)."""

    due_at: float


@dataclass(frozen=True)
class Commit:
    """A step decided without I/O (an error result, a gate, a limit): just commit it."""

    step: Step


@dataclass(frozen=True)
class Stop:
    """The run is finished or parked waiting for a person."""

    status: str | None


Action = CallModel | RunTool | WaitUntil | Commit | Stop


@dataclass
class Step:
    """What one unit of work produced: facts, then one machine event."""

    trigger: str
    """The machine event to send (``tools_requested``, ``tool_finished``, ``fail``...)."""
    records: list[Fact] = field(default_factory=list)
    error: str | None = None
    """Why the run failed, when ``trigger`` is ``fail``."""
    retryable: bool = False
    """The failure is transient: resuming the run tries again."""


# Deciding --------------------------------------------------------------------------------
def next_action(
    state: RunState,
    agent: Agent,
    *,
    now: float,
    can_ask: bool = True,
) -> Action:
    """The next thing to do for ``state``; pure.

    The caller holds the run's lease (see :mod:`tether.stores.leases`), so a call in flight (its
    start recorded, its end not) was abandoned by the driver that started it: it is in doubt.
    ``can_ask`` says whether anyone can answer a question (the driver has an approver): if
    not, a call in doubt whose policy is ``"ask"`` gets the ``"error"`` result instead.
    """
    if state.status in ENDED or state.status == AWAITING:
        return Stop(state.status)
    if state.status == RunStatus.executing_tool:
        return _next_tool_action(state, agent, now, can_ask)
    max_steps = state.spec.get("max_steps", agent.limits.max_steps)
    if max_steps is not None and state.steps >= max_steps:
        return Commit(_failure(f"max_steps limit reached: {max_steps} model invocations"))
    budget = agent.limits.budget
    if budget is not None and not state.final_answer_requested:
        hit = budgets.reached(agent, state, now=now)
        if hit is not None:
            if budget.on_limit == "fail":
                return Commit(_failure(f"budget exceeded: {hit.describe()}"))
            prompt = budgets.FINAL_ANSWER_PROMPT.format(limit=hit.describe())
            return Commit(Step("reinvoked", [BudgetExhausted(hit.limit, hit.used, hit.allowed, prompt)]))
    compacting = _compaction(state, agent)
    if compacting is not None:
        return compacting
    check_pairing(state.messages, run_id=state.id, start=checked_prefix(state))
    state.pairing_checked = (state.messages, len(state.messages), state.messages[-1])  # a memo, not a decision
    request = ModelRequest(
        model=agent.model_name,
        messages=list(state.messages),
        max_tokens=state.max_tokens or agent.max_tokens,
        system=agent.system,
        tools=agent.tool_definitions,
        invocation=state.steps,
        tool_choice=_tool_choice(state, agent),
        settings=agent.settings,
    )
    return CallModel(request, model=agent.model, run_id=state.id, cursor=state.next_seq - 1)


def _compaction(state: RunState, agent: Agent) -> Action | None:
    """A step compacting the history with the agent's processors, or the summary call one needs; None: none due.

    A turn being continued (pause_turn) is never cut.
    """
    if not agent.history_processors or state.continuing_turn:
        return None
    forced = state.compaction_forced
    planned = compaction.next_compaction(agent.history_processors, state.messages, forced=forced)
    if planned is None:
        return None
    if isinstance(planned, SummaryPlan):
        request = ModelRequest(
            model=agent.model_name,
            messages=planned.request_messages(),
            max_tokens=planned.processor.max_tokens,
            invocation=state.steps,
        )
        return CallModel(request, summary=planned, model=agent.model, run_id=state.id, cursor=state.next_seq - 1)
    processor, messages = planned
    removed = len(state.messages) - len(messages)
    return Commit(Step("compacted", [HistoryCompacted(processor.name, messages, removed, forced)]))


def on_summary(state: RunState, agent: Agent, plan: SummaryPlan, response: ModelResponse, *, latency: float) -> Step:
    """The summary call answered: the history from now on holds the summary instead of the rounds it covers."""
    summary = text_of({"content": response.content}).strip()
    if not summary:
        error = "the history's summary call answered no text; the history was left as it was (resume to try again)"
        return Step("fail", error=error, retryable=True)
    price = price_for(response.model or agent.model_name, agent.prices)
    messages = plan.apply(state.messages, summary)
    compacted = HistoryCompacted(
        plan.processor.name,
        messages,
        len(state.messages) - len(messages),
        state.compaction_forced,
        summary=summary,
        usage=response.usage,
        cost_usd=round(price.cost(response.usage), 8) if price is not None else None,
        model=response.model,
        latency=round(latency, 6),
    )
    return Step("compacted", [compacted])


def _tool_choice(state: RunState, agent: Agent) -> dict[str, Any] | None:
    """No tools for a budget's last answer; the result tool when a typed result was asked for; else the settings'."""
    if state.final_answer_requested:
        return {"type": "none"}
    if state.demanding_result:
        return {"type": "tool", "name": results.OUTPUT_TOOL}
    return agent.settings.tool_choice_param()


def checked_prefix(state: RunState) -> int:
    """How many leading messages an earlier pairing check of this state already covered.

    History only grows, or has its newest message replaced (a pause_turn continued); a
    rebuilt or replaced list, or a replaced last checked message, is checked whole again.
    """
    if state.pairing_checked is None:
        return 0
    messages, count, last = state.pairing_checked
    if messages is not state.messages or not 0 < count <= len(messages) or messages[count - 1] is not last:
        return 0
    return int(count)


def _next_tool_action(state: RunState, agent: Agent, now: float, can_ask: bool) -> Action:
    """The batch's next call that can go ahead; gated calls wait until nothing else can.

    Calls that need no one run first; the run parks only when every unfinished call waits
    for a person, so all the batch's gated calls are shown and decided together.
    """
    parked: Action | None = None
    for call in state.unfinished_calls():
        action = _call_action(state, agent, call, now, can_ask=can_ask)
        if isinstance(action, Commit) and action.step.trigger == "approval_needed":
            parked = parked or action
            continue
        return action
    # no call at all cannot happen after a valid log: fail loudly rather than loop
    return parked or Commit(_failure("executing a tool with no pending call"))


def next_concurrent(
    state: RunState, agent: Agent, *, now: float, busy: Collection[str], can_ask: bool = True
) -> RunTool | None:
    """The batch's next concurrent call that may start now beside the calls in ``busy``; pure.

    ``busy``: the call ids this drive launched whose outcome is not committed yet (running,
    or held back: see :func:`held_back`); each running attempt counts against the tool-call
    limits as if it had ended. Only an attempt to run now is given: a call that is gated,
    denied, invalid, due for a retry later or not concurrent is left for a later step, in
    the model's order (see :func:`next_action`).
    """
    for call in state.unfinished_calls():
        tool = agent.tool_index.get(call.tool)
        if call.call_id in busy or tool is None or not agent.runs_concurrently(tool):
            continue
        action = _call_action(state, agent, call, now, can_ask=can_ask, running=len(busy))
        if isinstance(action, RunTool):
            return action
    return None


def held_back(step: Step) -> bool:
    """Whether a concurrent call's outcome moves the run out of executing_tool (a failure, an escalation).

    Such a step is committed only once no call of its batch runs any more (see :func:`settle`),
    so the others' results are recorded first and no result lands on a run that moved on.
    """
    return step.trigger not in ("tool_finished", "retry_scheduled")


def settle(held: Sequence[Step]) -> list[Step]:
    """The steps a batch held back (in the model's order), as the machine can take them in turn.

    Escalations become one question showing every escalated call (parked runs are asked about
    together); failures become one failure, with the first call's error, committed last.
    """
    settled: list[Step] = []
    escalations = [step for step in held if step.trigger == "approval_needed"]
    if escalations:
        records = [fact for step in escalations for fact in step.records]
        asked = [fact for fact in records if isinstance(fact, ApprovalRequested)]
        durations = [fact.duration for fact in asked if fact.duration is not None]
        question = ApprovalRequested(
            [call for fact in asked for call in fact.calls],
            escalation=True,
            duration=round(sum(durations), 6) if durations else None,
        )
        others = [fact for fact in records if not isinstance(fact, ApprovalRequested)]
        settled.append(Step("approval_needed", [*others, question]))
    failures = [step for step in held if step.trigger == "fail"]
    if failures:
        settled.append(Step("fail", [fact for step in failures for fact in step.records], error=failures[0].error))
    return settled


def _call_action(
    state: RunState, agent: Agent, call: PendingCall, now: float, *, can_ask: bool, running: int = 0
) -> Action:
    """What ``call`` needs now; ``running``: attempts of other calls under way, counted as spent."""
    tool = agent.tool_index.get(call.tool)
    if tool is None:
        known = ", ".join(sorted(agent.tool_index)) or "none"
        return Commit(_result(call, f"Error: unknown tool {call.tool!r} (available tools: {known})", True))
    try:
        arguments = tool.validate(call.input)
    except pydantic.ValidationError as error:
        full = f"Error: invalid arguments for tool {tool.name!r}: {error}"
        shown = f"Error: invalid arguments for tool {tool.name!r}: {_capped(str(error), agent.limits.max_result_chars)}"
        return Commit(_result(call, shown, True, **_full_content(shown, full)))
    decision = state.decisions.get(call.call_id)
    in_doubt = call.call_id in state.in_flight and not tool.idempotent  # in flight means abandoned
    if decision is not None and not decision.approved:
        why = f": {decision.reason}" if decision.reason else ""
        if in_doubt:
            detail = f"{decision.actor} declined to re-run it{why}"
            return Commit(_result(call, interrupted_message(detail), True, interrupted=True))
        return Commit(_result(call, f"Error: the call was denied by {decision.actor}{why}", True))
    edited_input = decision.input if decision is not None else None
    if edited_input is not None:
        arguments = tool.validate(edited_input)  # validated when decided; the rules judge what runs
    budget = agent.limits.budget
    spent_up = (
        None if tool.final else budgets.reached(agent, state, now=now, only=budgets.TOOL_LIMITS, tool_calls=running)
    )
    if budget is not None and spent_up is not None:  # tools would spend more: stop before asking anyone
        if budget.on_limit == "fail":
            return Commit(_failure(f"budget exceeded: {spent_up.describe()}"))
        message = f"Error: not run: the budget is used up ({spent_up.describe()})"
        return Commit(_result(call, message, True, budget_limit=spent_up.limit))
    warnings: list[Warned] = []
    allowed: Allowed | None = None
    if decision is None or (in_doubt and decision.attempt < state.attempts.get(call.call_id, 0)):
        gate = _gate(state, agent, call, tool, arguments, can_ask=can_ask)
        if isinstance(gate, Step):
            return Commit(gate)
        warnings, allowed = gate
    else:
        # A person's approval (plain, for the run, or edited) never outranks a deny rule: the
        # rules as they are now judge what is about to run, whatever they said when it was decided.
        denial = _denial(state, agent, call, tool, arguments)
        if denial is not None:
            return Commit(_denied_by_policy(call, denial, []))
    if tool.final:
        data = arguments.model_dump(mode="json")
        final = _result(call, "Final result recorded.", False, final_result=data, allowed=allowed)
        return Commit(Step(final.trigger, [*warnings, *final.records]))
    max_tool_calls = agent.limits.max_tool_calls
    hands_off = any(tool is handoff for handoff in agent.handoff_tools)  # answered by the drive: runs nothing
    if max_tool_calls is not None and not hands_off and state.tool_calls + running >= max_tool_calls:
        return Commit(_failure(f"max_tool_calls limit reached: {max_tool_calls} tool executions"))
    due = state.retry_due.get(call.call_id)
    if due is not None and due > now:
        return WaitUntil(due)
    attempt = state.attempts.get(call.call_id, 0) + 1
    limit = agent.limits.max_result_chars
    edited = edited_input is not None
    spending = budgets.new_warnings(agent, state, now=now, tool_calls=1 + running)
    return RunTool(
        call,
        tool,
        arguments,
        attempt,
        edited=edited,
        max_result_chars=limit,
        warnings=(*warnings, *spending),
        execution_warnings=tuple(spending),
        allowed=allowed,
    )


def _gate(
    state: RunState, agent: Agent, call: PendingCall, tool: Tool, arguments: pydantic.BaseModel, *, can_ask: bool
) -> Step | tuple[list[Warned], Allowed]:
    """A step parking the run (or denying the call), else what to record with its start: warnings, who allowed it.

    A ``deny`` rule always wins; a call in doubt after a crash is resolved by its
    ``on_interrupted`` policy (asked about, or reported as not re-run); only then may a tool
    approved for the rest of the run skip the question.
    """
    verdict, warnings, allowed = _verdict(state, agent, call, tool, arguments)
    if verdict.verdict == "deny":
        return _denied_by_policy(call, verdict.reason, warnings)
    if call.call_id in state.in_flight and not tool.idempotent:
        policy = tool.on_interrupted or agent.on_interrupted
        if policy == "ask" and can_ask:
            reason = "it was interrupted mid-run and may already have run; run it again?"
            earlier = state.decisions.get(call.call_id)
            if earlier is not None and earlier.input is not None:
                reason += f" (with its input as {earlier.actor} edited it)"
            return _approval_step(state, agent, call, reason, warnings)
        why = "its policy is not to re-run" if policy == "error" else "there is no approver to ask"
        reported = _result(call, interrupted_message(why), True, interrupted=True)
        return Step(reported.trigger, [*warnings, *reported.records])
    if verdict.verdict == "allow":
        return warnings, allowed
    # only "allow" ever runs unasked
    return _approval_step(state, agent, call, verdict.reason, warnings, note=verdict.note)


def _denied_by_policy(call: PendingCall, reason: str, warnings: list[Warned]) -> Step:
    denied = _result(call, f"Error: the call was denied by policy: {reason}", True, denied_by="policy", reason=reason)
    return Step(denied.trigger, [*warnings, *denied.records])


def _context(state: RunState, agent: Agent, call: PendingCall, tool: Tool) -> ApprovalContext:
    return ApprovalContext(run_id=state.id, tool=tool.name, call_id=call.call_id, tenant=state.tenant, agent=agent.name)


def _denial(state: RunState, agent: Agent, call: PendingCall, tool: Tool, arguments: pydantic.BaseModel) -> str | None:
    return denial(agent.policy, tool, arguments, _context(state, agent, call, tool))


def _verdict(
    state: RunState, agent: Agent, call: PendingCall, tool: Tool, arguments: pydantic.BaseModel
) -> tuple[ApprovalVerdict, list[Warned], Allowed]:
    """The agent's policy, else the tool's setting, softened by an approval for the run.

    Also says who would let the call run unasked (see :class:`~tether.facts.events.Allowed`).
    Warnings are only produced before a call's first attempt: retries and re-runs after a
    crash were warned about already.
    """
    decided = decide_call(agent.policy, tool, arguments, _context(state, agent, call, tool))
    verdict = decided.verdict
    allowed = Allowed(None, "no approval needed")
    if decided.rule is not None or not isinstance(tool.approval, bool):
        allowed = Allowed("policy", verdict.reason or f"the approval gate of {tool.name!r} allows it")
    if verdict.verdict == "require_approval" and tool.name in state.approved_tools:
        verdict = ApprovalVerdict("allow", f"{tool.name} was approved for the rest of the run")
        allowed = Allowed("approved_for_run", verdict.reason)
    if call.call_id in state.attempts:
        return verdict, [], allowed
    warnings = [
        Warned(match.reason, call_id=call.call_id, tool=tool.name, rule=match.index, rule_name=match.rule.name)
        for match in decided.warnings
    ]
    return verdict, warnings, allowed


def _approval_step(
    state: RunState, agent: Agent, first: PendingCall, reason: str, warnings: list[Warned], *, note: str = ""
) -> Step:
    """Park with every still-undecided gated call of the batch, to be decided together."""
    records: list[Fact] = list(warnings)
    shown = [_shown(first, state.input_to_run(first), reason, note=note)]
    for call in state.batch:
        if call.call_id in state.outcomes or call.call_id in state.decisions or call is first:
            continue
        tool = agent.tool_index.get(call.tool)
        if tool is None:
            continue
        try:
            arguments = tool.validate(call.input)
        except pydantic.ValidationError:
            continue
        verdict, more, _ = _verdict(state, agent, call, tool, arguments)
        if verdict.verdict == "require_approval":
            shown.append(_shown(call, state.input_to_run(call), verdict.reason, note=verdict.note))
            records.extend(more)  # decided now, so never gated (nor warned about) again
    return Step("approval_needed", [*records, ApprovalRequested(shown)])


def _shown(
    call: PendingCall, to_run: Any, reason: str, last_error: str | None = None, *, note: str = ""
) -> RequestedCall:
    """A call as a person is asked about it: what would run, bound to its fingerprint."""
    return RequestedCall(call.call_id, call.tool, to_run, reason, fingerprint(to_run), last_error, note)


def interrupted_message(why: str) -> str:
    """What the model reads about a call a crash left in doubt that was not run again."""
    return (
        "Error: this call was interrupted mid-run (the process running it stopped before its "
        "result was recorded), so it may already have taken effect; it was not run again "
        f"({why}). Check its effect before calling it again."
    )


def _result(call: PendingCall, content: str, is_error: bool, **extra: Any) -> Step:
    return Step("tool_finished", [ToolFinished(call.call_id, call.tool, content, is_error, **extra)])


def _failure(message: str) -> Step:
    return Step("fail", error=message)


# Reacting to outcomes --------------------------------------------------------------------
def on_model_response(state: RunState, agent: Agent, response: ModelResponse, *, latency: float, now: float) -> Step:
    """Turn one model answer into a step: by ``stop_reason``, with its cost and budget warnings."""
    price = price_for(response.model or agent.model_name, agent.prices)
    cost = round(price.cost(response.usage), 8) if price is not None else None
    content, renamed = unique_call_ids(state, response.content)
    if renamed:
        response = replace(response, content=content)
    step = _response_step(state, agent, response, latency=latency, cost=cost)
    if renamed and any(isinstance(fact, ModelResponded) and not fact.discarded for fact in step.records):
        step.records += renamed  # only a turn the history keeps had its calls renamed
    if state.final_answer_requested and step.trigger == "tools_requested":
        discarded = [replace(f, discarded=True) if isinstance(f, ModelResponded) else f for f in step.records]
        return Step("fail", discarded, error="the budget is used up and the model still asked for tools")
    step.records += budgets.new_warnings(agent, state, now=now, usage=response.usage, cost=cost or 0.0, model_calls=1)
    if cost is None:
        step.records += budgets.unknown_cost_warning(agent, state, response.model or agent.model_name)
    return step


def _response_step(
    state: RunState, agent: Agent, response: ModelResponse, *, latency: float, cost: float | None
) -> Step:
    record = ModelResponded(
        response.content,
        response.stop_reason,
        response.usage,
        cost,
        response.model or agent.model_name,  # an adapter that names no model (scripted) answered as itself
        response.id,
        round(latency, 6),
        list(response.retry_waits) or None,  # the API asked to wait this long first
    )
    reason = response.stop_reason
    has_tool_use = any(b.get("type") == "tool_use" for b in response.content)
    if reason == "max_tokens" and response.content and response.content[-1].get("type") == "tool_use":
        current = state.max_tokens or agent.max_tokens
        ceiling = agent.limits.max_tokens_ceiling
        if current >= ceiling:
            return Step(
                "fail",
                [replace(record, discarded=True)],
                error=f"the response was cut off at max_tokens={current} inside a tool_use, "
                f"even at the ceiling ({ceiling}); the incomplete call was not run",
            )
        raised = min(current * 2, ceiling)
        warning = Warned(f"tool_use cut off at max_tokens={current}; asking again with {raised}")
        return Step("reinvoked", [replace(record, discarded=True, next_max_tokens=raised), warning])
    if reason == "pause_turn":
        return Step("reinvoked", [record])
    if reason == "refusal":
        details = json.dumps(response.stop_details) if response.stop_details else ""
        why = text_of({"content": response.content}) or details
        return Step("fail", [record], error=f"the model refused: {why or 'no reason given'}")
    if reason == CONTEXT_EXCEEDED:
        message = "context window exceeded: the conversation no longer fits the model's context"
        if _compacts_on_overflow(state, agent):
            return Step("reinvoked", [replace(record, discarded=True), ContextExceeded(message)])
        return Step("fail", [replace(record, discarded=True)], error=_overflow_error(state, message))
    if has_tool_use and reason in ("tool_use", "end_turn", "stop_sequence"):
        return Step("tools_requested", [record])
    if reason == "tool_use":
        return _malformed(record, "its stop_reason is tool_use but it holds no tool_use block")
    if reason in DONE_STOP_REASONS:
        return _answered(state, agent, [record])
    if reason == "max_tokens":
        return _answered(state, agent, [record, Warned("the answer was cut off at max_tokens")])
    if reason is None:
        return _malformed(record, "it has no stop_reason")
    return _malformed(record, f"its stop_reason {reason!r} is none the Messages API defines")


def _malformed(record: ModelResponded, problem: str) -> Step:
    """A reply the engine cannot act on: kept in the log but not the history, and the run fails resumably.

    Guessing what the model meant could run a tool nobody asked for, or end a run that was not
    done; a later resume asks the model again instead (a broken proxy or a model's glitch may pass).
    """
    which = f"reply {record.id}" if record.id else "reply"
    error = f"the model's {which} was malformed: {problem}; it was not used (resume the run to ask the model again)"
    return Step("fail", [replace(record, discarded=True)], error=error, retryable=True)


def unique_call_ids(state: RunState, content: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Warned]]:
    """``content`` with every ``tool_use`` id an earlier call of the run had renamed, and a warning for each.

    A call's id is its idempotency key (tools get it as ``tool_use_id``; a child run's id is made
    from it), and the Messages API refuses a conversation in which two ``tool_use`` blocks share
    one. A model (or a proxy) that reuses an id of an earlier turn would have two different calls
    share a key, and the next request refused for good: the new call gets the id ``ID_2`` (or the
    next number free) instead, the model sees that id from then on, and a warning says so.
    """
    if not any(block.get("type") == "tool_use" and block.get("id") in state.call_ids for block in content):
        return content, []
    taken = state.call_ids | {block.get("id") for block in content if block.get("type") == "tool_use"}
    repaired: list[dict[str, Any]] = []
    warnings: list[Warned] = []
    for block in content:
        old = block.get("id")
        if block.get("type") != "tool_use" or old not in state.call_ids:
            repaired.append(block)
            continue
        new = next(f"{old}_{n}" for n in itertools.count(2) if f"{old}_{n}" not in taken)
        taken.add(new)
        repaired.append({**block, "id": new})
        message = (
            f"the model reused the tool_use id {old!r} of an earlier call in this run: this call is recorded as "
            f"{new!r}, so that each call keeps an id (and idempotency key) of its own"
        )
        warnings.append(Warned(message, call_id=new, tool=block.get("name")))
    return repaired, warnings


def _answered(state: RunState, agent: Agent, records: list[Fact]) -> Step:
    """The model ended its turn in prose: done, unless the agent requires a typed result.

    Then the model is asked again for it (bounded), and the run fails once the asking is
    used up. A budget's last answer (tools off) ends the run as it is, without a result.
    """
    output_type = agent.output_type
    if output_type is None or state.final_answer_requested:
        return Step("answered", records)
    if state.result_demands >= results.MAX_RESULT_DEMANDS:
        return Step("fail", records, error=results.prose_failure(output_type, state.result_demands + 1))
    forced = agent.settings.thinking_budget is None  # thinking forbids forcing a tool
    demand = ResultDemanded(results.demand_prompt(output_type), state.result_demands + 1, forced)
    return Step("reinvoked", [*records, demand])


def on_model_failure(state: RunState, agent: Agent, error: ModelError) -> Step:
    """A model call failed: a context overflow is compacted and asked again (once) when the agent can compact."""
    if error.context_exceeded and _compacts_on_overflow(state, agent):
        return Step("reinvoked", [ContextExceeded(str(error))])
    if error.context_exceeded and state.compaction_forced:
        return Step("fail", error=f"model call failed: {_overflow_error(state, str(error))}")
    return on_model_error(error)


def _compacts_on_overflow(state: RunState, agent: Agent) -> bool:
    """Whether an overflow is compacted and asked again: with processors, and not right after doing so."""
    return bool(agent.history_processors) and not state.compaction_forced


def _overflow_error(state: RunState, message: str) -> str:
    if state.compaction_forced:
        return f"{message} (even after the history processors compacted it)"
    return message


def on_model_error(error: ModelError) -> Step:
    """A model call that failed after the SDK's retries: the run fails, history intact.

    A transient failure (rate limit, overload, 5xx, network) leaves the run resumable.
    """
    records: list[Fact] = []
    if error.retry_waits:
        waits = ", ".join(f"{wait:g}s" for wait in error.retry_waits)
        message = f"the model API was retried {len(error.retry_waits)} time(s), waiting {waits}, before the call failed"
        records.append(Warned(message, retry_waits=list(error.retry_waits)))
    if error.retryable:
        message = f"model call failed: {error} (transient: resume the run to try again)"
        return Step("fail", records, error=message, retryable=True)
    return Step("fail", records, error=f"model call failed: {error}")


def retry_after_failure() -> Step:
    """Move a run that failed transiently back to thinking (on resume, never in the same drive)."""
    return Step("retried", [Warned("retrying after a transient model failure")])


def tool_started(action: RunTool, *, owner: str) -> ToolStarted:
    """The record written (and committed) before the tool runs, naming the driver running it (for people)."""
    return ToolStarted(action.call.call_id, action.tool.name, action.attempt, owner, allowed=action.allowed)


def abandon_in_flight(state: RunState, *, by: str, reason: str) -> list[CallAbandoned]:
    """Records declaring every call now in flight abandoned by its driver (an operator's override).

    From then on each is in doubt, resolved like any call a crash interrupted; written
    without a transition, like a tool's start.
    """
    return [
        CallAbandoned(call_id, started.owner, by, reason)
        for call_id, started in state.in_flight.items()
        if not started.abandoned
    ]


def on_tool_success(action: RunTool, content: str, *, duration: float) -> Step:
    """The tool returned; its serialised value is the result."""
    return _success(action, content, attempt=action.attempt, duration=round(duration, 6))


def on_cache_hit(action: RunTool, content: str, *, key: str) -> Step:
    """A cached value of the same tool and input answers the call: the tool does not run.

    The driver looked ``key`` up (I/O); this only records the hit and the result, which
    reaches the model exactly as a fresh one would (same cap, same reviewer note).
    """
    step = _success(action, content, cached=True)
    warnings = [w for w in action.warnings if w not in action.execution_warnings]  # no start: warn here
    hit = CacheHit(action.call.call_id, action.tool.name, key, action.allowed)  # in place of a start
    step.records[:0] = [*warnings, hit]
    return step


def _success(action: RunTool, content: str, **extra: Any) -> Step:
    # The model sees the head; the event keeps the whole value, for people and audits.
    shown = _capped(content, action.max_result_chars)
    extra.update(_full_content(shown, content))
    content = shown
    if action.edited:
        content = f"(Note: a reviewer edited the input before running the tool.)\n{content}"
    return _result(action.call, content, False, **extra)


def truncate_result(content: str, limit: int) -> str:
    """The first ``limit`` characters, and a note telling the model the rest was cut."""
    if len(content) <= limit:
        return content
    return f"{content[:limit]}\n[truncated: {len(content)} characters, showing the first {limit}]"


def on_tool_error(
    action: RunTool, error: BaseException, *, now: float, duration: float, rng: Callable[[], float]
) -> Step:
    """The tool raised or timed out: retry as its policy decides, else what the policy says instead.

    One rule is the engine's, not the policy's: a timed-out call of a tool not marked
    idempotent may still complete, so it is never retried automatically. ``rng`` is the
    driver's random source for the policy's jitter.
    """
    tool, call, policy = action.tool, action.call, action.tool.retry
    took, error_type = round(duration, 6), _raised_type(error)
    facts: dict[str, Any] = {"attempt": action.attempt, "duration": took, "error_type": error_type}
    limit = action.max_result_chars
    if isinstance(error, ModelRetry):
        shown, full = f"Error: {_capped(str(error), limit)}", f"Error: {error}"
        return _result(call, shown, True, **facts, error_class="user_fixable", **_full_content(shown, full))
    error_class = policy.error_class(error)
    message = _describe_tool_error(tool, error, error_class, _capped(str(error), limit))
    full_message = _describe_tool_error(tool, error, error_class, str(error))
    decision = policy.decide(error, action.attempt, rng=rng)
    lingering = isinstance(error, ToolTimeout) and error.still_running
    records: list[Fact] = [_abandoned_thread(action)] if lingering else []
    in_doubt = (lingering or isinstance(error, OutcomeUnknown)) and not tool.idempotent  # never run twice unasked
    if decision.retry_in is not None and not in_doubt:
        due = now + decision.retry_in
        retry = RetryScheduled(call.call_id, tool.name, action.attempt, took, error_type, due, message, error_class)
        return Step("retry_scheduled", [*records, retry])
    suffix = ""
    if in_doubt:
        suffix += "; it may still complete, so it was not run again automatically (the tool is not idempotent)"
    if action.attempt > 1:
        suffix += f" (after {action.attempt} attempts)"
    message, full_message = message + suffix, full_message + suffix
    finished = ToolFinished(
        call.call_id,
        tool.name,
        message,
        True,
        **facts,
        error_class=error_class,
        in_doubt=in_doubt,
        **_full_content(message, full_message),
    )
    if decision.otherwise == "fail":
        return Step("fail", [*records, finished], error=f"{message}; the tool's retry policy fails the run")
    if decision.otherwise == "escalate":
        reason = f"it failed {action.attempt} time(s), last: {message}. Try again?"
        to_run = action.arguments.model_dump(mode="json") if action.edited else call.input  # shown: what would run
        asked = ApprovalRequested([_shown(call, to_run, reason, last_error=message)], escalation=True, duration=took)
        return Step("approval_needed", [*records, asked])
    return Step("tool_finished", [*records, finished])


def _abandoned_thread(action: RunTool) -> Warned:
    """The warning that a timed-out sync attempt's thread runs on (Python cannot stop one)."""
    message = (
        f"tool {action.tool.name!r} call {action.call.call_id}: a thread of it is still running after its "
        "timeout (Python cannot stop a thread); no attempt of this call starts in this process until it ends"
    )
    return Warned(message, call_id=action.call.call_id, tool=action.tool.name, abandoned_thread=True)


def _describe_tool_error(tool: Tool, error: BaseException, error_class: str, text: str) -> str:
    """The model's ``is_error`` text for ``error``, whose own message is ``text``."""
    if isinstance(error, ToolTimeout):
        return f"Error ({error_class}): tool {tool.name!r} {text}"
    if isinstance(error, UnserializableResult):
        return f"Error ({error_class}): tool {tool.name!r} returned an unusable result: {text}"
    return f"Error ({error_class}): tool {tool.name!r} raised {_raised_type(error)}: {text}"


def _raised_type(error: BaseException) -> str:
    """The name of what the tool raised (``SystemExit``, not the :class:`ToolExit` carrying it)."""
    return type(error.original if isinstance(error, ToolExit) else error).__name__


def _capped(text: str, limit: int | None) -> str:
    """``text`` cut to the agent's result cap (an exception's message can be as long as any result)."""
    return text if limit is None else truncate_result(text, limit)


def _full_content(shown: str, full: str) -> dict[str, Any]:
    """What a ``tool_finished`` event keeps besides what the model saw, when that was cut."""
    return {} if shown == full else {"full_content": full, "truncated_from": len(full)}


def check_edit(agent: Agent, request: PendingApproval, edited: dict[str, Any]) -> dict[str, Any]:
    """Edited input for ``request`` as it would run: valid for the tool's schema, allowed by the rules.

    The one check of an edit: :func:`on_decision` makes it, and a prompt asking for an edit
    (the terminal's) calls it to ask again until the edit passes.

    Raises:
        InvalidEditedInput: the tool's schema refuses it.
        DeniedByPolicy: a deny rule (or the tool's approval callable) forbids what would run.
        IncompatibleRun: the agent has no such tool (the runner refuses such runs before this).
    """
    tool = agent.tool_index.get(request.tool)
    if tool is None:
        raise IncompatibleRun(f"unknown tool {request.tool!r}", run_id=request.run_id)
    try:
        arguments = tool.validate(edited)
    except pydantic.ValidationError as error:
        problems, details = plain_errors(error), str(error)
        raise InvalidEditedInput(
            run_id=request.run_id,
            call_id=request.call_id,
            tool=tool.name,
            problems=problems,
            details=details,
            by_field=field_problems(error),
        ) from error
    context = ApprovalContext(
        run_id=request.run_id, tool=tool.name, call_id=request.call_id, tenant=request.tenant, agent=agent.name
    )
    reason = denial(agent.policy, tool, arguments, context)  # the rules judge what will run
    if reason is not None:
        raise DeniedByPolicy(run_id=request.run_id, call_id=request.call_id, reason=reason)
    return arguments.model_dump(mode="json")


def on_decision(
    state: RunState,
    agent: Agent,
    call_id: str,
    decision: Approve | Deny,
    *,
    expected_fingerprint: str | None = None,
) -> Step:
    """Apply one approval decision, refusing anything that is not exactly pending.

    ``Approve(remember_for_run=True)`` approves the tool for the rest of the run: its other
    calls shown in this batch are approved in the same step (they were shown together), and
    the gate skips later ones (see :func:`_gate` for what it never skips).
    """
    approved = isinstance(decision, Approve)
    edited_input = decision.input if isinstance(decision, Approve) else None
    remember_for_run = isinstance(decision, Approve) and decision.remember_for_run
    reason = decision.reason if isinstance(decision, Deny) else ""
    earlier = state.decisions.get(call_id)
    if earlier is not None:  # checked first: deciding a one-call batch already moved the run on
        raise AlreadyDecided(run_id=state.id, call_id=call_id, actor=earlier.actor, approved=earlier.approved)
    if not _requested(state, call_id):
        raise UnknownCall(run_id=state.id, call_id=call_id)
    parked = state.status == AWAITING
    call = state.call(call_id)
    if not parked or call is None or call_id not in state.awaiting:
        raise NotAwaitingApproval(run_id=state.id, call_id=call_id, status=state.status, run_waits=parked)
    request = pending_call(state, call)
    shown = request.fingerprint  # what the person was shown: an earlier edit, if any
    if expected_fingerprint is not None and expected_fingerprint != shown:
        raise StaleFingerprint(run_id=state.id, call_id=call_id, expected=expected_fingerprint, shown=shown)
    if edited_input is not None and fingerprint(edited_input) == shown:
        edited_input = None  # "edited" to what was shown: an approval as it is, and the model is told of no edit
    if edited_input is not None:
        edited_input = check_edit(agent, request, edited_input)
    elif approved:
        edited_input = state.edited_inputs.get(call_id)  # approving what was shown: an earlier edit stands
    decided = ApprovalDecided(
        call_id, call.tool, approved, decision.actor, reason, edited_input, shown, remember_for_run
    )
    records: list[Fact] = [decided]
    if remember_for_run:
        for other in state.pending_approvals():
            if other.call_id == call_id or other.tool != call.tool or other.call_id in state.in_flight:
                continue  # a call in doubt after a crash is still asked about on its own
            shown_other = pending_call(state, other).fingerprint
            why = f"{call.tool} approved for the run with {call_id}"
            records.append(replace(decided, call_id=other.call_id, reason=why, input=None, fingerprint=shown_other))
    return Step("decided", records)


def _requested(state: RunState, call_id: str) -> bool:
    """Whether the model ever asked for this call in the run's history (newest first: nearly always the last turn)."""
    return any(
        block.get("id") == call_id
        for message in reversed(state.messages)
        if message["role"] == "assistant"
        for block in tool_uses(message)
    )


def cancellation(reason: str) -> Step:
    """Stop the run on request."""
    return Step("cancel", error=RunStatus.cancelled.shown + (f": {reason}" if reason else ""))


# Committing -------------------------------------------------------------------------------
def commit(state: RunState, step: Step, *, now: float) -> list[Event]:
    """Apply ``step`` to ``state`` through the machine; return the events to persist.

    Records are folded first so the guards see the new facts; then the machine event is
    sent (an illegal move raises ``TransitionNotAllowed``); the transition, the batch's
    results message and the run's end are recorded as facts too.
    """
    produced: list[Event] = []

    def record(fact: Fact) -> None:
        event = Event(state.next_seq, now, fact)
        state.apply(event)
        produced.append(event)

    for fact in step.records:
        record(fact)
    source = state.status
    bind(state).send(step.trigger)
    target = state.status
    assert target is not None  # a bound machine is always in some state
    if source == RunStatus.executing_tool and target in (RunStatus.thinking, RunStatus.done):
        record(ResultsReturned())
    record(Transition(step.trigger, source, target))
    if target in ENDED:
        record(RunFinished(target, step.error, state.output, state.result, step.retryable))
    state.version += 1
    return produced


def start_events(state: RunState, *, spec: dict[str, Any], messages: list[dict[str, Any]], now: float) -> list[Event]:
    """The first events of a run: its spec and opening history, and entry into thinking."""
    produced = [Event(0, now, RunStarted(spec, messages, now))]
    state.apply(produced[0])
    bind(state)  # enters the initial state, setting status
    assert state.status is not None
    entered = Event(1, now, Transition("start", None, state.status))
    state.apply(entered)
    produced.append(entered)
    state.version = 1
    return produced
