"""Typed results: ``Agent(output_type=Model)`` makes a run's result a validated instance.

The agent gets a final tool whose input is the model; a prose answer where a result is
required is asked again with that tool forced (a recorded ``result_demanded`` step, bounded),
then the run fails saying so.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from tether import Runner, tool
from tether.agent import Agent
from tether.errors import ConfigError
from tether.facts import events as ev
from tether.models import ModelSettings
from tether.models.scripted import ScriptedModel
from tether.policy.policies import Limits
from tether.stores.memory import MemoryStore
from tether.tools.output import MAX_RESULT_DEMANDS, OUTPUT_TOOL


class Invoice(pydantic.BaseModel):
    """An invoice the agent found."""

    invoice_id: str
    amount: float
    paid: bool = False


def text(words: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": words}], "stop_reason": "end_turn"}


def result_call(data: dict[str, Any], call_id: str = "toolu_result") -> dict[str, Any]:
    return {
        "content": [{"type": "tool_use", "id": call_id, "name": OUTPUT_TOOL, "input": data}],
        "stop_reason": "tool_use",
    }


def kinds(runner: Runner, run_id: str) -> list[str]:
    return [event.type for event in runner.store.load_events(run_id)]


def test_the_agent_gets_a_final_tool_whose_input_is_the_output_type() -> None:
    agent = Agent(model=ScriptedModel([]), output_type=Invoice)

    (definition,) = agent.tool_definitions
    assert definition["name"] == OUTPUT_TOOL
    assert definition["description"] == "Give the final result: An invoice the agent found."
    assert definition["input_schema"]["required"] == ["invoice_id", "amount"]
    assert agent.tool_index[OUTPUT_TOOL].final


def test_a_tool_of_the_same_name_is_refused() -> None:
    @tool
    def final_result(x: int) -> int:
        """Clash."""
        return x

    with pytest.raises(ConfigError, match=f"a tool is already named {OUTPUT_TOOL!r}"):
        Agent(model=ScriptedModel([]), tools=[final_result], output_type=Invoice)


def test_the_result_is_a_validated_instance_and_json_in_the_runs_dict() -> None:
    runner = Runner(
        Agent(model=ScriptedModel([result_call({"invoice_id": "INV-7", "amount": "120.5"})]), output_type=Invoice)
    )

    result = runner.run("Find INV-7")

    assert result.status == "done", result.error
    assert result.result == Invoice(invoice_id="INV-7", amount=120.5)
    assert isinstance(result.result, Invoice)
    assert result.to_dict()["result"] == {"invoice_id": "INV-7", "amount": 120.5, "paid": False}
    assert runner.store.load_run(result.run_id).summary["result"] == {
        "invoice_id": "INV-7",
        "amount": 120.5,
        "paid": False,
    }


def test_the_result_is_typed_after_a_resume_in_another_process() -> None:
    store = MemoryStore()
    script = [result_call({"invoice_id": "INV-8", "amount": 3})]
    first = Runner(Agent(model=ScriptedModel(script), output_type=Invoice), store)
    state = first.create("Find INV-8")
    with first.hold(state.id):
        first.step(state)  # the model's call of the final tool is committed, then the process "dies"

    result = Runner(Agent(model=ScriptedModel(script), output_type=Invoice), store).drive(state.id)

    assert result.result == Invoice(invoice_id="INV-8", amount=3.0)


def test_invalid_result_input_is_an_error_the_model_can_fix() -> None:
    model = ScriptedModel(
        [
            result_call({"invoice_id": "INV-7"}, "toolu_1"),
            result_call({"invoice_id": "INV-7", "amount": 9}, "toolu_2"),
        ]
    )

    result = Runner(Agent(model=model, output_type=Invoice)).run("Find INV-7")

    assert result.result == Invoice(invoice_id="INV-7", amount=9)
    (error,) = model.requests[1].messages[-1]["content"]
    assert error["is_error"] is True
    assert "amount" in error["content"]


def test_a_prose_answer_is_asked_again_with_the_result_tool_forced() -> None:
    model = ScriptedModel([text("It is 120 dollars."), result_call({"invoice_id": "INV-7", "amount": 120})])
    runner = Runner(Agent(model=model, output_type=Invoice))

    result = runner.run("Find INV-7")

    assert result.status == "done", result.error
    assert result.result == Invoice(invoice_id="INV-7", amount=120)
    first, second = model.requests
    assert first.tool_choice is None
    assert second.tool_choice == {"type": "tool", "name": OUTPUT_TOOL}
    assert second.messages[-2] == {"role": "assistant", "content": [{"type": "text", "text": "It is 120 dollars."}]}
    assert second.messages[-1]["role"] == "user"
    assert OUTPUT_TOOL in second.messages[-1]["content"][0]["text"]
    assert kinds(runner, result.run_id).count(ev.ResultDemanded.kind) == 1
    demanded = next(e.fact for e in runner.store.load_events(result.run_id) if isinstance(e.fact, ev.ResultDemanded))
    assert demanded.attempt == 1


def test_prose_every_time_fails_clearly_after_the_bounded_demands() -> None:
    model = ScriptedModel([text(f"Answer {n} in prose.") for n in range(MAX_RESULT_DEMANDS + 1)])
    runner = Runner(Agent(model=model, output_type=Invoice))

    result = runner.run("Find INV-7")

    assert result.status == "failed"
    assert result.error == (
        f"a result of type Invoice was required, and the model answered in prose {MAX_RESULT_DEMANDS + 1} times "
        f"(asked again {MAX_RESULT_DEMANDS} times to call {OUTPUT_TOOL!r})"
    )
    assert len(model.requests) == MAX_RESULT_DEMANDS + 1
    assert result.result is None


def test_with_thinking_the_result_is_asked_for_without_forcing_a_tool() -> None:
    model = ScriptedModel([text("Prose."), result_call({"invoice_id": "A", "amount": 1})])
    agent = Agent(
        model=model, output_type=Invoice, settings=ModelSettings(thinking_budget=2048), limits=Limits(max_tokens=8000)
    )

    result = Runner(agent).run("Find A")

    assert result.result == Invoice(invoice_id="A", amount=1)
    assert model.requests[1].tool_choice is None  # thinking may not be combined with a forced tool


def test_an_agent_without_output_type_keeps_plain_results() -> None:
    @tool(final=True)
    def submit(answer: str) -> None:
        """Submit."""

    result = Runner(Agent(model=ScriptedModel([text("Just prose.")]), tools=[submit])).run("Go")

    assert result.status == "done"
    assert result.result is None
    assert result.output == "Just prose."
