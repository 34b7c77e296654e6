"""A run's life outside a drive, as flows: canned outcomes in, effects out, no store.

``create``, ``read``, ``decide`` and ``cancel`` yield the same effects whichever driver performs
them (Runner calls, AsyncRunner awaits), so what they read and write is checked here once.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import tool_use, tool_use_turn
from tether import Agent, Approve, Deny, tool
from tether.core import lifecycle
from tether.core.engine import CallModel
from tether.core.flow import CheckLease, CreateRun, Flow, Flowing, LoadLog, Notify, Persist
from tether.core.state import RunState
from tether.errors import ApprovalError, RunEnded
from tether.facts.events import Event
from tether.models import ModelResponse
from tether.stores import RunLog
from tether.testing import ScriptedModel

NOW = 1_000.0


@tool(approval=True)
def delete(path: str) -> str:
    """Delete a file."""
    raise AssertionError("no tool runs here")


def flow() -> Flow:
    agent = Agent(model=ScriptedModel([tool_use_turn(tool_use("t1", "delete", {"path": "/tmp/x"}))]), tools=[delete])
    return Flow(agent, clock=lambda: NOW)


def perform(flowing: Flowing[Any], outcomes: dict[type, Any]) -> tuple[list[Any], Any]:
    """Run ``flowing`` to its end, answering each effect from ``outcomes`` by type (None if absent)."""
    effects: list[Any] = []
    try:
        effect = next(flowing)
        while True:
            effects.append(effect)
            effect = flowing.send(outcomes.get(type(effect)))
    except StopIteration as stop:
        return effects, stop.value


def created(prompt: str = "Delete /tmp/x.") -> tuple[RunState, list[Event]]:
    effects, state = perform(lifecycle.create(flow(), prompt, continue_from=None, tenant="acme", run_id="run_1"), {})
    assert [type(e) for e in effects] == [CreateRun, Notify]
    assert effects[0].state is state
    return state, effects[0].events


def test_create_yields_the_new_run_then_tells_the_listeners() -> None:
    state, events = created()
    assert (state.id, state.tenant, state.version) == ("run_1", "acme", 1)
    assert [e.type for e in events] == ["run_started", "transition"]
    assert state.spec["tool_schemas"]["delete"]["properties"]["path"]["type"] == "string"
    assert state.messages == [{"role": "user", "content": [{"type": "text", "text": "Delete /tmp/x."}]}]


def test_create_continuing_a_run_reads_it_first() -> None:
    parent, events = created()
    effects, child = perform(
        lifecycle.create(flow(), "And /tmp/y.", continue_from="run_1", tenant="acme", run_id="run_2"),
        {LoadLog: RunLog(parent.version, "acme", events)},
    )
    assert [type(e) for e in effects] == [LoadLog, CreateRun, Notify]
    assert effects[0] == LoadLog("run_1", "acme")
    assert child.spec["continued_from"] == "run_1"
    assert "And /tmp/y." in str(child.messages)
    assert "Delete /tmp/x." in str(child.messages)


def parked_log() -> RunLog:
    """The log of a run parked on its ``delete`` call: created, the model asked, the gate closed."""
    state, events = created()
    drive = flow()
    answer = ModelResponse.from_dict(tool_use_turn(tool_use("t1", "delete", {"path": "/tmp/x"})))
    for _ in range(2):  # the model's answer, then the gate
        effects, _ = perform(drive.step(state), {CallModel: answer})
        events += [event for effect in effects if isinstance(effect, Persist) for event in effect.events]
    assert state.status == "awaiting_approval"
    return RunLog(state.version, "acme", events)


def test_decide_deny_reads_the_run_without_its_tools_and_commits_the_decision() -> None:
    log = parked_log()
    effects, state = perform(
        lifecycle.decide(flow(), "run_1", "t1", Deny("no"), fingerprint=None, tenant="acme"), {LoadLog: log}
    )
    assert [type(e) for e in effects] == [LoadLog, CheckLease, Persist, Notify]
    assert state.version == log.version + 1
    assert "approval_decided" in [e.type for e in effects[2].events]


def test_decide_approve_is_refused_when_nothing_waits() -> None:
    state, events = created()
    with pytest.raises(ApprovalError):  # the run is thinking: no call waits for a decision
        perform(
            lifecycle.decide(flow(), "run_1", "t1", Approve(), fingerprint=None, tenant="acme"),
            {LoadLog: RunLog(state.version, "acme", events)},
        )


def test_cancel_commits_one_step_and_an_ended_run_is_refused_with_nothing_written() -> None:
    log = parked_log()
    effects, cancelled = perform(lifecycle.cancel(flow(), "run_1", "changed my mind", "acme"), {LoadLog: log})
    assert [type(e) for e in effects] == [LoadLog, CheckLease, Persist, Notify]
    assert cancelled.status == "cancelled"
    ended = RunLog(cancelled.version, "acme", [*log.events, *effects[2].events])
    again = lifecycle.cancel(flow(), "run_1", "again", "acme")
    assert next(again) == LoadLog("run_1", "acme")
    with pytest.raises(RunEnded, match="cancelled"):
        again.send(ended)


def test_read_rebuilds_the_run_from_one_consistent_read() -> None:
    state, events = created()
    effects, read = perform(lifecycle.read("run_1", None), {LoadLog: RunLog(7, "acme", events)})
    assert effects == [LoadLog("run_1", None)]
    assert (read.version, read.tenant, read.messages) == (7, "acme", state.messages)
