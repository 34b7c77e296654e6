"""Model settings: how the model is asked, the same for every call of a run.

An agent holds one :class:`ModelSettings`; a run stores it in its spec (``model_settings``),
so ``tether resume`` asks the model exactly as the run started. Each adapter sends the
settings its API has, and refuses the others when the agent is made (``check_settings``),
never dropping one silently: stop sequences, tool choice and max tokens go to both
providers; temperature and top_p to Chat Completions only (the Messages API version the
``anthropic`` SDK speaks, 2026-10-21, refuses sampling parameters); ``thinking_budget`` is
Claude's extended thinking (its thinking blocks are kept verbatim in the history, as the API
requires when they are sent back).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tether.errors import ConfigError

TOOL_CHOICES = ("auto", "any", "none")
"""``tool_choice`` values besides a tool's name: the model decides, must call a tool, may not."""
MIN_THINKING_BUDGET = 1024
"""The smallest thinking budget the Messages API takes."""


@dataclass(frozen=True)
class ModelSettings:
    """How each model call of a run is made; None (or empty) leaves the API's default."""

    temperature: float | None = None
    """Sampling temperature (0 to 2); Chat Completions only."""
    top_p: float | None = None
    """Nucleus sampling (0 to 1); Chat Completions only."""
    max_tokens: int | None = None
    """The answer's length in tokens; overrides :attr:`tether.policy.policies.Limits.max_tokens`."""
    stop_sequences: tuple[str, ...] = ()
    """Texts that end the answer where they appear (OpenAI takes at most 4)."""
    tool_choice: str | None = None
    """``"auto"``, ``"any"`` (some tool must be called), ``"none"``, or a tool's name (that tool must be)."""
    thinking_budget: int | None = None
    """Claude's extended thinking: tokens it may think in (at least 1024, below the answer's max_tokens)."""

    def __post_init__(self) -> None:
        if isinstance(self.stop_sequences, str) or not all(isinstance(s, str) and s for s in self.stop_sequences):
            raise ConfigError(f"stop sequences must be non-empty texts, not {self.stop_sequences!r}")
        object.__setattr__(self, "stop_sequences", tuple(self.stop_sequences))
        _check_number("temperature", self.temperature, 0, 2)
        _check_number("top_p", self.top_p, 0, 1)
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ConfigError(f"max_tokens must be a whole number >= 1, not {self.max_tokens!r}")
        if self.tool_choice is not None and (not isinstance(self.tool_choice, str) or not self.tool_choice):
            raise ConfigError(f"tool_choice must be auto, any, none or a tool's name, not {self.tool_choice!r}")
        if self.thinking_budget is not None:
            self._check_thinking(self.thinking_budget)

    def _check_thinking(self, budget: int) -> None:
        if not _is_int(budget) or budget < MIN_THINKING_BUDGET:
            raise ConfigError(f"thinking_budget must be a whole number >= {MIN_THINKING_BUDGET}, not {budget!r}")
        if self.max_tokens is not None and self.max_tokens <= budget:
            raise ConfigError(f"max_tokens ({self.max_tokens}) must be above thinking_budget ({budget})")
        if self.forces_tools:
            raise ConfigError("with thinking_budget, tool_choice cannot force a tool (use auto or none)")

    @property
    def forces_tools(self) -> bool:
        """Whether the model must call a tool (``any``, or a tool's name)."""
        return self.tool_choice is not None and self.tool_choice not in ("auto", "none")

    def tool_choice_param(self) -> dict[str, Any] | None:
        """The Messages API ``tool_choice`` (adapters for other APIs convert it), or None for the default."""
        if self.tool_choice is None:
            return None
        if self.tool_choice in TOOL_CHOICES:
            return {"type": self.tool_choice}
        return {"type": "tool", "name": self.tool_choice}

    def check_tools(self, tools: Mapping[str, object]) -> None:
        """Refuse a ``tool_choice`` naming a tool the agent does not have."""
        if self.tool_choice is not None and self.tool_choice not in TOOL_CHOICES and self.tool_choice not in tools:
            known = ", ".join(sorted(tools)) or "none"
            raise ConfigError(f"tool_choice {self.tool_choice!r} is not one of the agent's tools ({known})")

    def to_dict(self) -> dict[str, Any]:
        """The stored form (a run's spec): only what is set."""
        data: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and value != ():
                data[item.name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ModelSettings:
        """The inverse of :meth:`to_dict`; an unknown or bad value is a :class:`ConfigError`."""
        data = dict(data or {})
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model settings {unknown}: known are {sorted(known)}")
        if "stop_sequences" in data:
            stops = data["stop_sequences"]
            data["stop_sequences"] = tuple(stops) if isinstance(stops, list | tuple) else stops
        return cls(**data)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(name: str, value: object, low: float, high: float) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number from {low:g} to {high:g}, not {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"{name} must be from {low:g} to {high:g}, not {value!r}")
