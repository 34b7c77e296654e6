"""What a driver tells a tracer: the moments of a run it can see, in tether's own types.

A driver calls these hooks as it performs a run's effects (see :mod:`tether.drivers.runner`);
:class:`tether.drivers.otel.OpenTelemetry` turns them into spans. The core knows nothing of
tracing: it only stores the opaque trace context a tracer hands over when a run is created, so
that every later drive, in whatever process, continues the run's trace. Without a tracer the
drivers call none of this and nothing imports OpenTelemetry.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from tether.agent import Agent
from tether.core.engine import CallModel
from tether.core.flow import Activity, Attempt
from tether.core.state import RunState
from tether.facts.events import Event


@runtime_checkable
class Telemetry(Protocol):
    """Told what a runner does, to trace it (one object may serve many runs at once)."""

    def run(self, agent: Agent, *, forked_from: str | None = None) -> AbstractContextManager[dict[str, Any] | None]:
        """A run is being created (and, for ``Runner.run``, driven) in the block.

        Gives the trace context to store in the run's spec (see :func:`tether.core.lifecycle.create`).
        """
        ...

    def child_trace(self, link: dict[str, Any]) -> dict[str, Any] | None:
        """The trace context a child run serving the call ``link`` names starts under, if known."""
        ...

    def drive(self, run_id: str, agent: Agent) -> AbstractContextManager[None]:
        """The block drives ``run_id`` with ``agent`` (holding the run's lease)."""
        ...

    def announced(self, state: RunState, activity: Activity) -> None:
        """Slow work on ``state`` is about to start (a model call, a tool attempt, a wait)."""
        ...

    def performing(self, effect: CallModel | Attempt) -> AbstractContextManager[None]:
        """The block performs ``effect`` (a model call, a tool attempt): spans made in it nest under its span."""
        ...

    def committed(self, state: RunState, events: list[Event]) -> None:
        """``events`` of ``state`` were just committed (in a drive, or by a decision or a cancel)."""
        ...
