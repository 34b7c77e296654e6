"""Replaying a stored run offline: its recording drives the model, and can stand in for its tools.

:func:`replay` reads a run into a :class:`Replay`:

- :attr:`Replay.model` answers each model call as recorded, and refuses, with a readable diff, a
  request that differs from the recorded one in what matters (see :mod:`tether.testing.replay_model`);
- :meth:`Replay.tools` gives tools answered from the recorded results (no side effects), matched
  by tool and input; :attr:`Replay.approver` decides gated calls as people did
  (see :mod:`tether.testing.replay_tools`);
- :meth:`Replay.run` drives the agent through all that and compares the trajectory (calls and
  inputs in order, end state) with the recorded one; :meth:`Replay.check` asserts they agree.

A replay of an unchanged agent reaches the same end with the same calls. What is not replayed:
the requests of history summaries (answered as recorded, never compared), a run handed to another
agent (that agent's model and tools are its own: refused unless the tools may run), a run that
continues a conversation or is a fork (refused).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.agent import Agent, HandoffTool
from tether.drivers.loader import agent_from_spec, import_tools_module
from tether.drivers.runner import Runner, RunResult
from tether.errors import ConfigError
from tether.models import ModelAdapter
from tether.stores import Store
from tether.testing.recording import Recording
from tether.testing.replay_model import ReplayModel
from tether.testing.replay_tools import ReplayApprover, Unmatched, stub_tool
from tether.tools import Tool
from tether.tools.output import OUTPUT_TOOL
from tether.views.trajectory import Trajectory, trajectory_of


@dataclass(frozen=True)
class Replayed:
    """A replay's outcome: the new run, its trajectory, and how it differs from the recorded one."""

    recorded_run: str
    result: RunResult
    trajectory: Trajectory
    expected: Trajectory
    differences: list[str]
    """One line per difference; empty when the replay agrees with the recording."""

    @property
    def agrees(self) -> bool:
        """Whether the replay made the same calls and ended the same way."""
        return not self.differences

    def report(self) -> str:
        """Why the replayed run stopped (a :class:`ReplayMismatch`'s diff), then how its trajectory differs."""
        if self.agrees:
            return f"the replay agrees with run {self.recorded_run}"
        lines = [f"the replay differs from run {self.recorded_run}"]
        if self.result.error:
            lines.append(f"the replayed run failed: {self.result.error}")
        lines += ["trajectory (expected as recorded, got in the replay):", *(f"  {line}" for line in self.differences)]
        return "\n".join(lines)


class Replay:
    """What a replay of one recorded run needs: its prompt, a model, tools and an approver answering as recorded."""

    def __init__(self, recording: Recording, *, strict: bool = True) -> None:
        self.recording = recording
        self.prompt = recording.prompt
        """The run's prompt."""
        self.model = ReplayModel(recording, strict=strict)
        self.approver = ReplayApprover(recording.decisions)
        self.expected = recording.trajectory
        """The recorded trajectory."""

    def tools(self, tools: Sequence[Tool], *, unmatched: Unmatched | None = None) -> list[Tool]:
        """``tools`` answered from the recorded results (see :func:`~tether.testing.replay_tools.stub_tool`).

        Handoff tools stay as they are. ``unmatched``: what becomes of a call the recording does not answer.
        """
        stubbed: list[Tool] = []
        for tool in tools:
            if isinstance(tool, HandoffTool):
                stubbed.append(tool)
            else:
                results = [r for r in self.recording.results if r.tool == tool.name]
                stubbed.append(stub_tool(tool, results, unmatched=unmatched))
        return stubbed

    def agent(
        self,
        agent: Agent,
        *,
        stub_tools: bool = True,
        model: ModelAdapter | None = None,
        unmatched: Unmatched | None = None,
    ) -> Agent:
        """``agent`` answered by the recording: its model (or ``model``), and its tools unless ``stub_tools`` is False.

        A toolset's tools are listed (its servers reached) and stubbed like the rest (see :meth:`tools`).

        Raises:
            ConfigError: the run was handed to another agent, whose tools would run (only ``agent``'s
                are stubbed): replay it with ``stub_tools=False`` where they may.
        """
        if stub_tools and self.recording.handed_off:
            raise ConfigError(
                f"run {self.recording.run_id} was handed off to another agent, whose tools a replay does not "
                "stub: they would run (replay it with stub_tools=False where they may)"
            )
        added = {id(tool) for tool in agent.handoff_tools}  # the agent adds them again from its handoffs
        own = [tool for tool in agent.all_tools if id(tool) not in added]
        if agent.output_type is not None:
            own = [tool for tool in own if tool.name != OUTPUT_TOOL]  # the agent adds it again
        tools = self.tools(own, unmatched=unmatched) if stub_tools else own
        return dataclasses.replace(agent, model=model or self.model, tools=tools, toolsets=())

    @classmethod
    def load(cls, path: str | Path, *, strict: bool = True) -> Replay:
        """The replay of a recording file (what ``tether export --as-test`` writes)."""
        return cls(Recording.load(path), strict=strict)

    def agent_from_spec(self, given: Mapping[str, Any], *, cwd: str | Path) -> Agent:
        """The agent ``tether run`` made for the run, with ``given`` spec entries instead (tools, system...).

        Its tools modules are imported from ``cwd`` (the directory the run was started in, as a
        test finds it); its model is this replay's.
        """
        spec = {**self.recording.spec, **given, "cwd": str(Path(cwd).resolve())}
        return agent_from_spec(spec, model=self.model)

    def check(self, agent: Agent, *, stub_tools: bool = True) -> Replayed:
        """Replay with ``agent`` (see :meth:`agent`) and fail unless it agrees with the recording.

        Raises:
            AssertionError: the replay differs; its message lists how, with the request's diff.
        """
        __tracebackhide__ = True  # pytest shows the test's line and the message, not this frame
        replayed = self.run(self.agent(agent, stub_tools=stub_tools))
        if not replayed.agrees:
            raise AssertionError(replayed.report())
        return replayed

    def run(self, agent: Agent, *, store: Store | None = None) -> Replayed:
        """Drive a new run of ``agent`` (as :meth:`agent` makes it: pass it made) with the recorded prompt.

        The run is kept in ``store`` (default: in memory); nothing else is touched.
        """
        self.approver = ReplayApprover(self.recording.decisions)  # each run is decided afresh
        self.model.ignored.clear()
        runner = Runner(agent, store, approver=self.approver)
        result = runner.run(self.prompt)
        trajectory = trajectory_of(runner.store.load_events(result.run_id))
        differences = self.expected.differences(trajectory)
        return Replayed(self.recording.run_id, result, trajectory, self.expected, differences)


def agent_at(reference: str, *, cwd: str | Path) -> Agent:
    """The agent ``MODULE:ATTR`` names: an :class:`~tether.Agent`, or a function of no arguments making one.

    The module is imported as ``tether run`` imports a tools module: from ``cwd`` first, else installed.

    Raises:
        ConfigError: not ``MODULE:ATTR``, the module does not import, or the attribute is no agent.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"agent {reference!r}: expected MODULE:ATTR, e.g. myapp.agents:support")
    try:
        found = getattr(import_tools_module(module_name, Path(cwd).resolve()), attribute)
    except Exception as error:
        raise ConfigError(f"agent {reference!r}: {type(error).__name__}: {error}") from error
    made = found() if callable(found) and not isinstance(found, Agent) else found
    if not isinstance(made, Agent):
        raise ConfigError(f"agent {reference!r} is {made!r}, not a tether Agent (nor a function making one)")
    return made


def replay(store: Store, run_id: str, *, tenant: str | None = None, strict: bool = True) -> Replay:
    """What running ``run_id``'s agent again offline needs, read from ``store`` (see :class:`Replay`).

    Raises:
        RunNotFound: no such run.
        ConfigError: the run cannot be replayed (it continues a conversation or is a fork).
    """
    return Replay(Recording.from_events(run_id, store.load_events(run_id, tenant=tenant)), strict=strict)


__all__ = ["Replay", "Replayed", "agent_at", "replay"]
