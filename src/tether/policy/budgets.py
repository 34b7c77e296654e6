"""How much of its limits a run has spent, and which one (if any) it has reached. Pure.

Two kinds of limit are read here: a :class:`~tether.policy.policies.Budget` (soft: at the limit the
run stops gracefully, per ``on_limit``) and the hard caps of :class:`~tether.policy.policies.Limits`
(``max_steps``, ``max_tool_calls``: the run fails), which are only warned about here and
enforced by the engine. A run's spending is read from its state (tokens, cost, calls, age)
plus what earlier runs of the same conversation spent (recorded in the run's spec when it was
continued).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from tether.agent import Agent
from tether.core.events import Warned
from tether.core.state import RunState
from tether.models import Usage

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
    total = state.usage + (usage or Usage())
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
    """Every limit the agent sets, with what is spent (plus ``pending`` spending, see :func:`spent`)."""
    values = spent(state, now=now, **pending)
    found = []
    budget = agent.limits.budget
    if budget is not None:
        found = [Reading(name, float(values[name]), float(allowed)) for name, allowed in budget.limits().items()]
    max_steps = state.spec.get("max_steps", agent.limits.max_steps)
    for name, used, allowed in (
        ("max_steps", values["max_model_calls"], max_steps),
        ("max_tool_calls", values["max_tool_calls"], agent.limits.max_tool_calls),
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
