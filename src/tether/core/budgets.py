"""How much of its limits a run has spent, and which one (if any) it has reached. Pure.

Two kinds of limit are read here: a :class:`~tether.policy.policies.Budget` (soft: at the limit the
run stops gracefully, per ``on_limit``) and the hard caps of :class:`~tether.policy.policies.Limits`
(``max_steps``, ``max_tool_calls``: the run fails), which are only warned about here and
enforced by the engine. A run's spending is read from its state (tokens, cost, calls, age)
plus what earlier runs of the same conversation spent (recorded in the run's spec when it was
continued).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from tether.agent import Agent
from tether.core.state import RunState
from tether.facts.events import Warned
from tether.facts.usage import Usage
from tether.policy.policies import Budget, Limits

FINAL_ANSWER_PROMPT = (
    "The budget for this task is used up ({limit}). Do not call any tools: answer now with what you have found so far."
)
TOOL_LIMITS = frozenset({"max_tool_calls", "conversation_max_tool_calls", "max_seconds", "conversation_max_seconds"})
"""Budget limits that tools spend too: checked before each tool call, not only before model calls."""
DEFAULT_WARN_AT = 0.8
"""Warn threshold of the hard limits when the agent has no budget."""
COST_UNKNOWN = "cost_unknown"
"""Key of the one warning that a response's cost is unknown while a cost budget is set."""


@dataclass(frozen=True)
class Reading:
    """One limit and how much of it is spent."""

    limit: str
    """Name of the Budget (or Limits) field, e.g. ``max_cost_usd``."""
    used: float
    allowed: float
    hard: bool = False
    """A :class:`~tether.policy.policies.Limits` cap: the run fails there, no final answer."""

    @property
    def fraction(self) -> float:
        """Share of the limit spent."""
        return self.used / self.allowed if self.allowed else 1.0

    @property
    def key(self) -> str:
        """How the warning about it is remembered (a budget and a hard cap may share a name)."""
        return f"limits.{self.limit}" if self.hard else self.limit

    def describe(self) -> str:
        """``max_cost_usd: 0.4213 of 0.5``."""
        return f"{self.limit}: {self.used:g} of {self.allowed:g}"

    def warning(self) -> Warned:
        """The ``warning`` event recorded when this limit crosses the warn threshold."""
        if self.hard:
            message = f"limit {self.fraction:.0%} reached: {self.describe()} (the run fails at the limit)"
            return Warned(message, limit=self.limit)
        return Warned(f"budget {self.fraction:.0%} spent: {self.describe()}", budget=self.limit)


def spent(
    state: RunState,
    *,
    now: float,
    usage: Usage | None = None,
    cost: float = 0.0,
    model_calls: int = 0,
    tool_calls: int = 0,
) -> dict[str, float]:
    """What the run (and its conversation) spent, by Budget field, plus what is not folded yet."""
    total = state.usage if usage is None else state.usage + usage
    spent_cost = state.cost_usd + cost
    prior = state.spec.get("conversation") or {}
    inputs = total.input_tokens + total.cache_creation_input_tokens + total.cache_read_input_tokens
    tokens = inputs + total.output_tokens
    calls = state.steps + model_calls
    tools = state.tool_calls + tool_calls
    age = max(0.0, now - state.created_at)
    started = prior.get("started_at")
    return {
        "max_input_tokens": inputs,
        "max_output_tokens": total.output_tokens,
        "max_total_tokens": tokens,
        "max_cost_usd": spent_cost,
        "max_seconds": age,
        "max_model_calls": calls,
        "max_tool_calls": tools,
        "conversation_max_tokens": tokens + int(prior.get("tokens", 0)),
        "conversation_max_cost_usd": spent_cost + float(prior.get("cost_usd", 0.0)),
        "conversation_max_model_calls": calls + int(prior.get("model_calls", 0)),
        "conversation_max_tool_calls": tools + int(prior.get("tool_calls", 0)),
        "conversation_max_seconds": age if started is None else max(0.0, now - float(started)),
    }


def readings(agent: Agent, state: RunState, *, now: float, **pending: Any) -> list[Reading]:
    """Every limit the agent sets, with what is spent (plus ``pending`` spending, see :func:`spent`).

    Without a budget only the hard caps are read: what they count is summed here, not all of
    :func:`spent` (this runs on every step).
    """
    found = []
    budget = agent.limits.budget
    if budget is not None:
        values = spent(state, now=now, **pending)
        found = [Reading(name, float(values[name]), float(allowed)) for name, allowed in budget.limits().items()]
    max_steps = state.spec.get("max_steps", agent.limits.max_steps)
    for name, used, allowed in (
        ("max_steps", state.steps + pending.get("model_calls", 0), max_steps),
        ("max_tool_calls", state.tool_calls + pending.get("tool_calls", 0), agent.limits.max_tool_calls),
    ):
        if allowed is not None:
            found.append(Reading(name, float(used), float(allowed), hard=True))
    return found


def reached(
    agent: Agent, state: RunState, *, now: float, only: Collection[str] | None = None, **pending: Any
) -> Reading | None:
    """The first budget limit (of ``only``, if given) spent in full, if any; hard caps aside.

    ``pending``: spending not folded into ``state`` yet (see :func:`spent`), such as the
    attempts of concurrent calls still running.
    """
    if agent.limits.budget is None:  # only a budget is reached here: the hard caps fail the run elsewhere
        return None
    return next(
        (
            r
            for r in readings(agent, state, now=now, **pending)
            if not r.hard and r.used >= r.allowed and (only is None or r.limit in only)
        ),
        None,
    )


def new_warnings(agent: Agent, state: RunState, *, now: float, **pending: Any) -> list[Warned]:
    """Warnings for limits that cross the warn threshold with ``pending`` spending, once each."""
    budget = agent.limits.budget
    warn_at = budget.warn_at if budget is not None else DEFAULT_WARN_AT
    return [
        r.warning()
        for r in readings(agent, state, now=now, **pending)
        if r.fraction >= warn_at and r.key not in state.budget_warned
    ]


def unknown_cost_warning(agent: Agent, state: RunState, model: str) -> list[Warned]:
    """A warning (once per run) that a response has no price while a cost budget counts."""
    budget = agent.limits.budget
    if budget is None or not budget.counts_cost or COST_UNKNOWN in state.budget_warned:
        return []
    message = f"the cost of a response from {model!r} is unknown (no price): the cost budget counts only priced calls"
    return [Warned(message, budget=COST_UNKNOWN)]


ROLLED_UP = {
    "max_input_tokens": "max_input_tokens",
    "max_output_tokens": "max_output_tokens",
    "max_total_tokens": "max_total_tokens",
    "conversation_max_tokens": "max_total_tokens",
    "max_cost_usd": "max_cost_usd",
    "conversation_max_cost_usd": "max_cost_usd",
    "max_tool_calls": "max_tool_calls",
    "conversation_max_tool_calls": "max_tool_calls",
}
"""A parent's budget limits on what a child's spending rolls up into (tokens, cost, tool calls), and
the child's budget limit each caps. Model calls, steps and seconds do not roll up: they are not capped."""


def child_limits(parent: Agent, state: RunState, child: Limits, *, now: float, priced: bool) -> Limits | Reading:
    """A child run's limits, capped by what its parent (``state``, of agent ``parent``) has left, or the limit used up.

    Each parent limit of :data:`ROLLED_UP` left with ``L`` caps the child's budget limit at
    ``L`` (the child's own, if lower, stays); the parent's ``Limits.max_tool_calls`` caps the
    child's the same way, less the parent's call of the agent tool itself (a hard cap: past it
    the parent fails, so the child fails there too). A child without a budget gets one
    with the parent's ``on_limit`` and ``warn_at``. ``priced``: whether the child's model has a
    price; if not, its cost cannot count and is not capped (the parent's cost is then a lower
    bound, as its warning says). The parent's limit (a :class:`Reading`) when one is already
    used up: no child may start (the engine checks tool-call budgets before any call runs; a
    model turn may have spent the tokens or the cost since).
    """
    caps: dict[str, float] = {}
    hard_left: int | None = None
    for reading in readings(parent, state, now=now):
        capped = ROLLED_UP.get(reading.limit)
        if capped is None:
            continue
        left = reading.allowed - reading.used
        if reading.hard:  # Limits.max_tool_calls, less the agent tool's own call
            hard_left = max(0, math.floor(left) - 1)
            continue
        if capped == "max_cost_usd" and not priced:
            continue
        left = left if capped == "max_cost_usd" else math.floor(left)
        if left <= 0:
            return reading
        caps[capped] = min(caps.get(capped, left), left)
    budget, parents = child.budget, parent.limits.budget
    if caps and parents is not None:  # (caps come from the parent's budget)
        own = budget or Budget(on_limit=parents.on_limit, warn_at=parents.warn_at)
        tightened = {
            name: min(value, getattr(own, name)) if getattr(own, name) is not None else value
            for name, value in caps.items()
        }
        values: dict[str, Any] = {k: v if k == "max_cost_usd" else int(v) for k, v in tightened.items()}
        budget = replace(own, **values)
    tool_calls = child.max_tool_calls
    if hard_left is not None:
        tool_calls = hard_left if tool_calls is None else min(tool_calls, hard_left)
    return replace(child, budget=budget, max_tool_calls=tool_calls)
