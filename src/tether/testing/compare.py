"""Comparing a changed agent with stored runs: each run's prompt asked again, its trajectory compared.

What ``tether replay`` does. The changed agent is the run's own (its spec: tools module, system
prompt, model, settings) with what :class:`Changes` sets instead. Its tools never run: a call whose
input the recording holds gets the recorded result; any other is gated (``unmatched``: parked for a
person, or refused), since a comparison must have no side effects.

Who answers the model calls:

- with a changed ``model``, that model (a real one, or ``scripted:PATH``): the only way to see
  what a new system prompt or new tools make a model do;
- without, the recorded model, by turn, for as long as the conversation is the recorded one: it
  lets a changed system prompt, tool description or setting through (it cannot react to them; the
  comparison says so), and stops, with a diff, where the history goes elsewhere (a tool answering
  otherwise, a schema refusing a recorded call). So without a model a comparison answers "do the
  changed tools still accept and answer the recorded calls alike", never "would the model act
  otherwise".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tether.drivers.loader import agent_from_spec, load_model, normalise_model_spec
from tether.errors import ConfigError
from tether.stores import RunQuery, Store
from tether.testing.recording import Recording
from tether.testing.replay_model import ReplayModel
from tether.testing.replay_tools import Unmatched
from tether.testing.replaying import Replay, Replayed


@dataclass(frozen=True)
class Changes:
    """What differs from each run's own agent (None or empty: as the run had it)."""

    system: str | None = None
    model: str | None = None
    """``PROVIDER:NAME`` (or ``scripted:PATH``) answering instead of the recording."""
    tools: tuple[str, ...] = ()
    """``MODULE:ATTR`` tools specs replacing the run's, imported from ``cwd``."""
    cwd: str | None = None
    """Where ``tools`` are imported from (default: the current directory)."""
    unmatched: Unmatched = "ask"
    """A call the recording does not answer: ``ask`` parks the replay there, ``deny`` refuses it."""

    def applied(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``spec`` (a run's) with these changes."""
        changed = dict(spec)
        if self.system is not None:
            changed["system"] = self.system
        if self.tools:
            changed["tools"], changed["cwd"] = list(self.tools), self.cwd or os.getcwd()
        if self.model is not None:
            changed["model"] = normalise_model_spec(self.model)
        return changed


@dataclass(frozen=True)
class Comparison:
    """One run compared: the replay, or why there was none."""

    run_id: str
    replayed: Replayed | None = None
    problem: str | None = None
    """Why the run could not be replayed (a continued conversation, its tools failing to load...)."""
    answered_by: str = "the recording"
    let_through: list[str] = field(default_factory=list)
    """What the recorded model answered despite (a changed system prompt...), one line each."""

    @property
    def verdict(self) -> str:
        """``agrees``, ``differs`` or ``not replayed``."""
        if self.replayed is None:
            return "not replayed"
        return "agrees" if self.replayed.agrees else "differs"

    @property
    def where(self) -> str:
        """The first difference and why the replay stopped (or the problem), for a summary; empty if it agrees."""
        if self.replayed is None:
            return self.problem or ""
        if not self.replayed.differences:
            return ""
        error = (self.replayed.result.error or "").splitlines()
        cause = error[0].removeprefix(f"model call failed: replay of run {self.run_id}, ") if error else ""
        return "; ".join(part for part in (self.replayed.differences[0], cause) if part)

    def to_dict(self) -> dict[str, Any]:
        """JSON form, as ``tether replay --json`` prints it (every key, null where there was no replay)."""
        replayed = self.replayed
        return {
            "run_id": self.run_id,
            "verdict": self.verdict,
            "where": self.where,
            "problem": self.problem,
            "answered_by": self.answered_by if replayed is not None else None,
            "replay_run_id": replayed.result.run_id if replayed is not None else None,
            "recorded": replayed.expected.to_json() if replayed is not None else None,
            "replay": replayed.trajectory.to_json() if replayed is not None else None,
            "differences": list(replayed.differences) if replayed is not None else [],
            "error": replayed.result.error if replayed is not None else None,
            "let_through": list(self.let_through),
        }


def compare(store: Store, run_id: str, changes: Changes, *, tenant: str | None = None) -> Comparison:
    """Replay ``run_id`` with its agent changed by ``changes`` (its prompt, as recorded) and compare.

    Raises:
        RunNotFound: no such run.
    """
    try:
        recording = Recording.from_events(run_id, store.load_events(run_id, tenant=tenant))
    except ConfigError as error:
        return Comparison(run_id, problem=str(error))
    return compare_recording(recording, changes)


def compare_recording(recording: Recording, changes: Changes) -> Comparison:
    """:func:`compare` for a recording already read."""
    run_id = recording.run_id
    replay = Replay(recording, strict=False)
    spec = changes.applied(recording.spec)
    try:
        model = load_model(spec["model"]) if changes.model is not None else replay.model
        agent = agent_from_spec(spec, model=model)
    except ConfigError as error:
        return Comparison(run_id, problem=str(error))
    try:
        replayed = replay.run(replay.agent(agent, model=model, unmatched=changes.unmatched))
    except ConfigError as error:  # a run handed off: its other agent's tools would run
        return Comparison(run_id, problem=str(error))
    finally:
        agent.close()
    answered_by = "the recording" if isinstance(model, ReplayModel) else str(spec["model"])
    return Comparison(run_id, replayed, answered_by=answered_by, let_through=_let_through(replay.model))


def _let_through(model: ReplayModel) -> list[str]:
    """Each kind of difference the recorded model answered despite, once, with the calls it concerned."""
    calls: dict[str, list[str]] = {}
    for line in model.ignored:
        call, _, what = line.partition(": ")
        calls.setdefault(what, []).append(call.removeprefix("call "))
    return [f"{what} (model calls {', '.join(numbers)})" for what, numbers in calls.items()]


def compare_many(
    store: Store, query: RunQuery, changes: Changes, *, tool: str | None = None, limit: int = 50
) -> Iterator[Comparison]:
    """:func:`compare` each run ``query`` finds (newest first; root runs only), at most ``limit``.

    ``tool``: only runs that called that tool.
    """
    found = store.query_runs(query, limit=limit)
    for record in found.records:
        try:
            recording = Recording.from_events(record.id, store.load_events(record.id, tenant=record.tenant))
        except ConfigError as error:
            yield Comparison(record.id, problem=str(error))
            continue
        if tool is None or any(call.tool == tool for call in recording.trajectory.calls):
            yield compare_recording(recording, changes)


__all__ = ["Changes", "Comparison", "compare", "compare_many", "compare_recording"]
