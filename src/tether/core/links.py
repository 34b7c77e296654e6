"""A run's place among runs: the link from a child run to the call it serves, and a fork's origin.

A child run (see :mod:`tether.core.children`) records in its spec's ``parent`` entry the run and
call it serves, its depth and the chain of runs above it. A fork of a child run is a root run,
yet it is driven with the child's agent: its ``forked_from["agent_of"]`` keeps the link that names
that agent (see :mod:`tether.core.forks`). Reading these links is all this module does, for the
core, the drivers and every view alike.
"""

from __future__ import annotations

from typing import Any

from tether.core.state import RunState
from tether.stores import PARENT_KEY


def link_of(spec: dict[str, Any]) -> dict[str, Any] | None:
    """A run's link to its parent (``run_id``, ``call_id``, ``tool``, ``depth``, ``chain``), or None for a root run."""
    link = spec.get(PARENT_KEY)
    return link if isinstance(link, dict) else None


def parent_of(spec: dict[str, Any]) -> str | None:
    """The id of the run a child run serves; None for a root run."""
    link = link_of(spec)
    return str(link["run_id"]) if link is not None else None


def depth_of(spec: dict[str, Any]) -> int:
    """A run's depth in its tree (a root run is 0)."""
    link = link_of(spec)
    return int(link["depth"]) if link is not None else 0


def chain_of(run_id: str, spec: dict[str, Any]) -> list[str]:
    """The run ids from the root of ``run_id``'s tree down to it."""
    link = link_of(spec)
    return [*(link.get("chain") or []), run_id] if link is not None else [run_id]


def agent_link(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The parent link that names a run's agent: its own (a child run), its origin's (a fork of one), or None."""
    link = link_of(spec)
    if link is not None:
        return link
    origin = spec.get("forked_from")
    found = origin.get("agent_of") if isinstance(origin, dict) else None
    return found if isinstance(found, dict) else None


def pending_below(state: RunState, call_id: str) -> str | None:
    """The run below ``state`` (a child, or deeper) where ``call_id`` waits for a decision; None if not below.

    ``state``'s own call of that id comes first: call ids are the models', and two runs' may meet.
    """
    if state.call(call_id) is not None:
        return None
    return next((str(item["run_id"]) for item in state.child_pending if item.get("call_id") == call_id), None)


__all__ = ["agent_link", "chain_of", "depth_of", "link_of", "parent_of", "pending_below"]
