"""How much of its budget a run has spent, and which limit (if any) it has reached. Pure.

A run's spending is read from its state (tokens, cost, age) plus what earlier runs of the
same conversation spent (recorded in the run's spec when it was continued).
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.models import Usage
from tether.policies import Budget
from tether.state import RunState

FINAL_ANSWER_PROMPT = (
    "The budget for this task is used up ({limit}). Do not call any tools: answer now with what you have found so far."
)


@dataclass(frozen=True)
class Reading:
    """One budget limit and how much of it is spent."""

    limit: str
    """Name of the Budget field, e.g. ``max_cost_usd``."""
    used: float
    allowed: float

    @property
    def fraction(self) -> float:
        """Share of the limit spent."""
        return self.used / self.allowed if self.allowed else 1.0

    def describe(self) -> str:
        """``max_cost_usd: 0.4213 of 0.5``."""
        return f"{self.limit}: {self.used:g} of {self.allowed:g}"


def readings(
    budget: Budget, state: RunState, *, now: float, usage: Usage | None = None, cost: float = 0.0
) -> list[Reading]:
    """Every limit the budget sets, with what is spent (plus ``usage``/``cost`` not yet folded)."""
    total = state.usage + (usage or Usage())
    spent_cost = state.cost_usd + cost
    prior = state.spec.get("conversation") or {}
    inputs = total.input_tokens + total.cache_creation_input_tokens + total.cache_read_input_tokens
    values = {
        "max_input_tokens": inputs,
        "max_output_tokens": total.output_tokens,
        "max_cost_usd": spent_cost,
        "max_seconds": max(0.0, now - state.created_at),
        "conversation_max_tokens": inputs + total.output_tokens + int(prior.get("tokens", 0)),
        "conversation_max_cost_usd": spent_cost + float(prior.get("cost_usd", 0.0)),
    }
    found = []
    for name, used in values.items():
        allowed = getattr(budget, name)
        if allowed is not None:
            found.append(Reading(name, float(used), float(allowed)))
    return found


def reached(budget: Budget, state: RunState, *, now: float) -> Reading | None:
    """The first limit spent in full, if any."""
    return next((r for r in readings(budget, state, now=now) if r.used >= r.allowed), None)


def new_warnings(budget: Budget, state: RunState, *, now: float, usage: Usage, cost: float) -> list[Reading]:
    """Limits that cross ``warn_at`` with this spending and were not warned about yet."""
    return [
        r
        for r in readings(budget, state, now=now, usage=usage, cost=cost)
        if r.fraction >= budget.warn_at and r.limit not in state.budget_warned
    ]
