"""A capability plugs in beside the flow through its extension point, without editing the flow.

Agents as tools and handoffs are two such extensions (:mod:`tether.core.children`,
:mod:`tether.core.handoffs`); import-linter's contracts keep :mod:`tether.core.flow` from naming
either. Here a third one, written in the test, serves the calls of a tool from a table of
canned answers (a stand-in for a slow service) and the run goes on as with any tool.
"""

from __future__ import annotations

from typing import Any

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, Runner, tool
from tether.core import engine
from tether.core.flow import Extension, Flow, Flowing
from tether.core.state import RunState
from tether.drivers.runner import EXTENSIONS
from tether.facts.events import ToolFinished
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel
from tether.tools import Tool

CALLED: list[str] = []


@tool
def weather(city: str) -> str:
    """The weather in a city (slow: a remote service)."""
    CALLED.append(city)
    return "unknown"


class CannedAnswers(Extension):
    """Serves calls of ``tool_name`` from ``answers`` by input, committing the result as a tool's own."""

    def __init__(self, tool_name: str, answers: dict[str, str]) -> None:
        self.tool_name = tool_name
        self.answers = answers

    def serves(self, tool: Tool) -> bool:
        return tool.name == self.tool_name

    def serve(self, flow: Flow, state: RunState, action: engine.RunTool, max_wait: float | None) -> Flowing[bool]:
        answer = self.answers.get(str(action.call.input.get("city")), "no canned answer")
        finished = ToolFinished(action.call.call_id, action.tool.name, answer, False)
        yield from flow.commit(state, engine.Step("tool_finished", [finished]))
        return True


def agent() -> Agent:
    script: list[Any] = [
        tool_use_turn(tool_use("toolu_1", "weather", {"city": "Oslo"})),
        model_reply([{"type": "text", "text": "Oslo is sunny."}], "end_turn"),
    ]
    return Agent(ScriptedModel(script), tools=[weather])


def test_an_extension_serves_calls_beside_the_flow_and_the_run_goes_on() -> None:
    CALLED.clear()
    canned = CannedAnswers("weather", {"Oslo": "sunny, 21 C"})
    runner = Runner(agent(), MemoryStore(), extensions=(*EXTENSIONS, canned))

    result = runner.run("Weather in Oslo?")

    assert result.status == "done"
    assert result.output == "Oslo is sunny."
    assert CALLED == []  # served by the extension: the function never ran
    [finished] = [event.fact for event in runner.store.load_events(result.run_id) if event.type == "tool_finished"]
    assert isinstance(finished, ToolFinished)
    assert finished.content == "sunny, 21 C"


def test_without_the_extension_the_same_agent_runs_its_tool() -> None:
    CALLED.clear()
    result = Runner(agent(), MemoryStore()).run("Weather in Oslo?")

    assert result.status == "done"
    assert CALLED == ["Oslo"]
