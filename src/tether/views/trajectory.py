"""A run's trajectory: the tool calls it made, with their inputs, in order, and how it ended.

What a replay compares (see :mod:`tether.testing.recording`): two runs of an agent agree when the
model asked for the same calls with the same inputs, in the same order, and the runs ended the
same way (status, answer, typed result). Timings, ids, usage and wording of tool results are left
out: they change from run to run without the agent behaving differently. A fold of the run's
events, like the audit; nothing new is recorded for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tether.canonical import canonical_json
from tether.facts.events import Event, ModelResponded, RunFinished, RunStarted, Transition
from tether.facts.status import RunStatus, status_name


@dataclass(frozen=True)
class TrajectoryCall:
    """One tool call the model asked for."""

    tool: str
    input: Any
    """The input the model gave (free JSON)."""

    def shown(self) -> str:
        """``tool {"input": ...}``: one line, keys sorted."""
        return f"{self.tool} {canonical_json(self.input)}"


@dataclass(frozen=True)
class Trajectory:
    """What a run did, as a replay compares it."""

    calls: tuple[TrajectoryCall, ...]
    status: str
    """The state it ended (or parked) in: ``done``, ``failed``, ``awaiting_approval``..."""
    answer: str | None = None
    """The model's final text, when the run is done."""
    result: Any = None
    """The typed result (an ``output_type`` or ``final`` tool's input), when it has one."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (a recording's ``trajectory``)."""
        return {
            "calls": [{"tool": call.tool, "input": call.input} for call in self.calls],
            "status": self.status,
            "answer": self.answer,
            "result": self.result,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        """The inverse of :meth:`to_json`."""
        calls = tuple(TrajectoryCall(str(call["tool"]), call.get("input")) for call in data.get("calls", []))
        return cls(calls, str(data["status"]), data.get("answer"), data.get("result"))

    def differences(self, other: Trajectory) -> list[str]:
        """How ``other`` differs from this one, one readable line each; empty when they agree."""
        found: list[str] = []
        for index in range(max(len(self.calls), len(other.calls))):
            expected = self.calls[index].shown() if index < len(self.calls) else "(no call)"
            actual = other.calls[index].shown() if index < len(other.calls) else "(no call)"
            if expected != actual:
                found.append(f"call {index + 1}: expected {expected}, got {actual}")
        for name in ("status", "answer", "result"):
            expected, actual = getattr(self, name), getattr(other, name)
            if canonical_json(expected) != canonical_json(actual):
                found.append(f"{name}: expected {json.dumps(expected)}, got {json.dumps(actual)}")
        return found


def trajectory_of(events: Iterable[Event]) -> Trajectory:
    """The trajectory a run's events tell (all of them, in order; a run still under way ends where it stands)."""
    calls: list[TrajectoryCall] = []
    status = "unknown"
    answer: str | None = None
    result: Any = None
    for event in events:
        match event.fact:
            case RunStarted():
                status = RunStatus.thinking.shown
            case ModelResponded(discarded=False, content=content):
                calls.extend(
                    TrajectoryCall(str(b["name"]), b.get("input")) for b in content if b.get("type") == "tool_use"
                )
            case Transition(target=target):
                status = status_name(target)
            case RunFinished(status=ended, output=output, result=value):
                status, answer, result = status_name(ended), output, value
    return Trajectory(tuple(calls), status, answer if status == RunStatus.done.shown else None, result)


__all__ = ["Trajectory", "TrajectoryCall", "trajectory_of"]
