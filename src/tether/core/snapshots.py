"""Snapshots of a run's folded state, so a resume reads the latest one and only the events after it.

Folding is pure and deterministic (see :mod:`tether.core.state`), so the state after event
``seq`` can be kept and a later load can start from it instead of from event 0: O(tail), not
O(log). A snapshot is derived data: the events stay the truth. It is trusted only by code that
folds exactly as the code that wrote it did: :func:`snapshot_format` fingerprints the fold
(the modules that define the state and fold events into it, and the machine's version), and a
store hands back only a snapshot of the current format, so after an upgrade a run is folded
whole once more until its next snapshot is written.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Sequence
from typing import Any

import pydantic

from tether.core import engine, machine, state
from tether.core.state import RunState
from tether.facts import events, history, status
from tether.facts.events import Event
from tether.facts.usage import Usage
from tether.stores import RunLog, Snapshot

_ADAPTER = pydantic.TypeAdapter(RunState)
_NOT_KEPT = frozenset({"id", "tenant", "version", "bound_machine", "pairing_checked", "started_here"})
"""Fields a snapshot leaves out: the run's identity and version come from its row; the rest are caches."""
_CHECKED = "pairing_checked_messages"
"""How many leading messages had passed the engine's pairing check (see ``engine.checked_prefix``): a
resume checks only the rest, as the live run would have."""
_AS_IS = frozenset({"messages"})
"""Fields already plain JSON (folded from stored events): kept as they are, not walked again (the bulk of a state)."""


@functools.cache
def snapshot_format() -> str:
    """A fingerprint of the code that folds events: a snapshot written under another is never used."""
    digest = hashlib.sha256(f"machine {machine.MACHINE_VERSION}".encode())
    for part in (state, events, history, status, Usage):
        digest.update(inspect.getsource(part).encode())
    return digest.hexdigest()[:32]


def take(run: RunState) -> Snapshot:
    """A snapshot of ``run`` as folded so far (its last event is ``run.next_seq - 1``).

    It shares the run's message list: a store writes it before the run moves on.
    """
    data: dict[str, Any] = _ADAPTER.dump_python(run, mode="json", exclude=set(_NOT_KEPT | _AS_IS))
    data.update((name, getattr(run, name)) for name in _AS_IS)
    data[_CHECKED] = engine.checked_prefix(run)
    return Snapshot(run.next_seq - 1, snapshot_format(), data)


def due(events: Sequence[Event], every: int) -> bool:
    """Whether a write of ``events`` crosses a snapshot boundary (see :func:`spacing`; ``every`` 0: never)."""
    if every <= 0 or not events:
        return False
    step = spacing(events[-1].seq + 1, every)
    return (events[-1].seq + 1) // step > events[0].seq // step


def spacing(count: int, every: int) -> int:
    """Events between snapshots once a log holds ``count``: ``every``, doubling each time the log does past 8x that.

    Each snapshot holds the whole history, so at a fixed spacing a long run would spend ever
    more of each step writing them (quadratic in its length). Growing the spacing with the log
    keeps their cost a constant share of a step, and the tail a resume folds under 1/8 of the log.
    """
    return every << max(0, (count // (every * TAIL_FRACTION)).bit_length() - 1)


TAIL_FRACTION = 8
"""A resume folds at most 1/TAIL_FRACTION of a long log after its snapshot (and ``every`` events of a short one)."""


def rebuild(run_id: str, log: RunLog) -> RunState:
    """The run's state from its log: its snapshot (if any) with the events after it folded in."""
    if log.snapshot is None:
        return RunState.rebuild(run_id, log.events, version=log.version, tenant=log.tenant)
    checked = log.snapshot.state.get(_CHECKED)
    run = _ADAPTER.validate_python({**log.snapshot.state, "id": run_id})
    run.tenant = log.tenant
    if isinstance(checked, int) and 0 < checked <= len(run.messages):  # the same messages, checked when live
        run.pairing_checked = (run.messages, checked, run.messages[checked - 1])
    for event in log.events:
        run.apply(event)
    run.version = log.version
    return run


__all__ = ["TAIL_FRACTION", "due", "rebuild", "snapshot_format", "spacing", "take"]
