"""Events: the append-only facts a run's steps recorded.

A run is nothing but its events; :mod:`tether.state` folds them into the current state,
so a resumed run is rebuilt exactly, and each step writes only what it added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

RUN_STARTED: Final = "run_started"
MODEL_RESPONDED: Final = "model_responded"
TOOL_STARTED: Final = "tool_started"
TOOL_FINISHED: Final = "tool_finished"
RETRY_SCHEDULED: Final = "retry_scheduled"
APPROVAL_REQUESTED: Final = "approval_requested"
APPROVAL_DECIDED: Final = "approval_decided"
RESULTS_RETURNED: Final = "results_returned"
TRANSITION: Final = "transition"
WARNING: Final = "warning"
BUDGET_EXHAUSTED: Final = "budget_exhausted"
RUN_FINISHED: Final = "run_finished"
CACHE_HIT: Final = "cache_hit"
"""A cached result answered a call; the tool did not run (see :mod:`tether.cache`)."""
CACHE_MISS: Final = "cache_miss"
"""A cached tool found nothing usable; written with its ``tool_started``."""
CALL_ABANDONED: Final = "call_abandoned"
"""An operator took the run over from the driver of a started call (``tether resume --force``):
the call is in doubt, for the audit and for every later drive."""

EVENT_TYPES: Final = frozenset(
    {
        RUN_STARTED,
        MODEL_RESPONDED,
        TOOL_STARTED,
        TOOL_FINISHED,
        RETRY_SCHEDULED,
        APPROVAL_REQUESTED,
        APPROVAL_DECIDED,
        RESULTS_RETURNED,
        TRANSITION,
        WARNING,
        BUDGET_EXHAUSTED,
        RUN_FINISHED,
        CACHE_HIT,
        CACHE_MISS,
        CALL_ABANDONED,
    }
)


@dataclass(frozen=True)
class Event:
    """One fact, numbered within its run."""

    seq: int
    """Position in the run's log, from 0, without gaps."""
    type: str
    """One of :data:`EVENT_TYPES`."""
    data: dict[str, Any] = field(default_factory=dict)
    """JSON-able payload; its shape depends on ``type``."""
    at: float = 0.0
    """Unix time it was recorded."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form, as ``tether show --json`` prints it."""
        return {"seq": self.seq, "type": self.type, "at": self.at, **self.data}
