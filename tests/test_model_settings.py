"""Model settings: checked when made, sent by each adapter as its API says, stored in the run's spec.

Claude's extended thinking is one of them: its thinking blocks must go back to the API
verbatim (FakeMessagesAPI refuses a turn in a tool loop that lost its thinking, or a thinking
block changed since it signed it), through a resume too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from support import fake_api_model
from tether import Runner, tool
from tether.agent import Agent
from tether.drivers.loader import agent_from_spec, continued_spec
from tether.errors import ConfigError
from tether.models import ModelRequest, ModelSettings
from tether.models.anthropic import AnthropicModel
from tether.models.openai import OpenAIModel
from tether.models.scripted import ScriptedModel
from tether.policy.policies import Limits
from tether.stores.memory import MemoryStore
from tether.testing import FakeChatCompletionsAPI, FakeMessagesAPI, validate_messages_request

PROMPT: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
THOUGHT = {"type": "thinking", "thinking": "The user wants the weather. I will look it up.", "signature": "sig-1"}


@tool
def weather(city: str) -> str:
    """Get the weather."""
    return f"{city}: sunny"


def request(settings: ModelSettings, **fields: Any) -> ModelRequest:
    return ModelRequest(**{"model": "m", "messages": [PROMPT], "max_tokens": 4096, "settings": settings, **fields})


# Checked when made ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"temperature": 2.5}, "temperature must be from 0 to 2"),
        ({"temperature": float("nan")}, "temperature must be a number"),
        ({"top_p": 1.5}, "top_p must be from 0 to 1"),
        ({"max_tokens": 0}, "max_tokens must be a whole number >= 1"),
        ({"stop_sequences": "END"}, "stop sequences must be non-empty texts"),
        ({"stop_sequences": ("",)}, "stop sequences must be non-empty texts"),
        ({"tool_choice": ""}, "tool_choice must be auto, any, none or a tool's name"),
        ({"thinking_budget": 1000}, "thinking_budget must be a whole number >= 1024"),
        ({"thinking_budget": 2048, "max_tokens": 2048}, "max_tokens (2048) must be above thinking_budget (2048)"),
        ({"thinking_budget": 2048, "tool_choice": "any"}, "tool_choice cannot force a tool"),
    ],
)
def test_bad_settings_are_refused_when_made(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        ModelSettings(**fields)


def test_settings_round_trip_through_their_stored_form() -> None:
    settings = ModelSettings(
        temperature=0.3, top_p=0.9, max_tokens=900, stop_sequences=("END", "STOP"), tool_choice="any"
    )

    stored = settings.to_dict()

    assert stored == {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 900,
        "stop_sequences": ["END", "STOP"],
        "tool_choice": "any",
    }
    assert ModelSettings.from_dict(stored) == settings
    assert ModelSettings().to_dict() == {}
    assert ModelSettings.from_dict(None) == ModelSettings()
    with pytest.raises(ConfigError, match=r"unknown model settings \['temprature'\]"):
        ModelSettings.from_dict({"temprature": 1})


def test_the_agent_checks_settings_against_its_tools_limits_and_model() -> None:
    with pytest.raises(ConfigError, match="tool_choice 'search' is not one of the agent's tools \\(weather\\)"):
        Agent(model=ScriptedModel([]), tools=[weather], settings=ModelSettings(tool_choice="search"))
    with pytest.raises(ConfigError, match=r"max_tokens \(4096\) must be above thinking_budget \(8000\)"):
        Agent(model=ScriptedModel([]), settings=ModelSettings(thinking_budget=8000))
    with pytest.raises(ConfigError, match="thinking_budget is Claude's extended thinking"):
        Agent(
            model=OpenAIModel("gpt-test", api_key="k"),
            settings=ModelSettings(thinking_budget=2048),
            limits=Limits(max_tokens=9000),
        )
    with pytest.raises(ConfigError, match="at most 4 stop sequences"):
        Agent(model=OpenAIModel("gpt-test", api_key="k"), settings=ModelSettings(stop_sequences=tuple("abcde")))
    agent = Agent(model=ScriptedModel([]), settings=ModelSettings(max_tokens=777), limits=Limits(max_tokens=100))
    assert agent.max_tokens == 777


# Sent as each API says -----------------------------------------------------------------------
@pytest.fixture
def claude(api: FakeMessagesAPI) -> Iterator[AnthropicModel]:
    model = fake_api_model(api, prompt_caching=False)
    yield model
    model.close()


def test_claude_gets_the_settings_by_the_messages_api_names(api: FakeMessagesAPI, claude: AnthropicModel) -> None:
    api.reply_text("ok")
    settings = ModelSettings(stop_sequences=("END",), tool_choice="weather")
    tools = [weather.definition()]

    claude.complete(request(settings, tools=tools, tool_choice=settings.tool_choice_param()))

    body = api.requests[0]
    assert validate_messages_request(body) is None
    assert body["stop_sequences"] == ["END"]
    assert body["tool_choice"] == {"type": "tool", "name": "weather"}
    assert "thinking" not in body


@pytest.mark.parametrize("fields", [{"temperature": 0.2}, {"top_p": 0.9}, {"temperature": 1, "top_p": 1}])
def test_claude_refuses_sampling_parameters_its_api_version_does_not_take(
    api: FakeMessagesAPI, claude: AnthropicModel, fields: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match="Claude's Messages API \\(anthropic-version 2026-10-21\\) takes no sampling"):
        Agent(model=claude, settings=ModelSettings(**fields))
    with pytest.raises(ConfigError, match="takes no sampling"):
        claude.complete(request(ModelSettings(**fields)))  # a hand-made request too: never dropped silently
    assert api.requests == []
    assert "sampling parameters" in (
        validate_messages_request({"model": "m", "max_tokens": 1, "messages": [PROMPT], **fields}) or ""
    )


def test_openai_gets_the_settings_by_the_chat_completions_names(chat_api: FakeChatCompletionsAPI) -> None:
    chat_api.reply_text("ok")
    model = OpenAIModel("gpt-test", api_key="k", base_url=chat_api.url, max_retries=0)
    settings = ModelSettings(temperature=1.5, top_p=0.9, stop_sequences=("END",), tool_choice="any")

    model.complete(request(settings, tools=[weather.definition()], tool_choice=settings.tool_choice_param()))

    body = chat_api.requests[0]
    assert (body["temperature"], body["top_p"], body["stop"], body["tool_choice"]) == (1.5, 0.9, ["END"], "required")
    model.close()


def test_a_runs_requests_carry_the_agents_settings_and_its_spec_stores_them() -> None:
    model = ScriptedModel([{"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}])
    settings = ModelSettings(temperature=0.2, max_tokens=1234, stop_sequences=("END",), tool_choice="auto")
    runner = Runner(Agent(model=model, tools=[weather], settings=settings))

    result = runner.run("Hi")

    assert result.status == "done", result.error
    (sent,) = model.requests
    assert sent.settings == settings
    assert sent.max_tokens == 1234
    assert sent.tool_choice == {"type": "auto"}
    stored = runner.load(result.run_id).spec["model_settings"]
    assert stored == settings.to_dict()
    assert agent_from_spec({**runner.load(result.run_id).spec, "tools": []}, model=model).settings == settings


def test_a_run_without_settings_stores_none() -> None:
    runner = Runner(
        Agent(model=ScriptedModel([{"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}]))
    )

    assert runner.load(runner.run("Hi").run_id).spec["model_settings"] is None


def test_a_continued_run_keeps_the_earlier_settings_but_those_it_sets() -> None:
    earlier = {"model": "m", "model_settings": {"temperature": 0.2, "stop_sequences": ["END"]}}

    spec = continued_spec(earlier, {"model_settings": {"temperature": 0.7}})

    assert spec["model_settings"] == {"temperature": 0.7, "stop_sequences": ["END"]}


# Extended thinking ---------------------------------------------------------------------------
def thinking_agent(model: AnthropicModel) -> Agent:
    return Agent(model=model, tools=[weather], settings=ModelSettings(thinking_budget=2048), model_name="claude-test")


def script_a_thought_then_an_answer(api: FakeMessagesAPI) -> None:
    api.reply(
        {
            "content": [
                copy.deepcopy(THOUGHT),
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
            ]
        }
    )
    api.reply(
        {
            "content": [
                {"type": "thinking", "thinking": "Sunny, then.", "signature": "sig-2"},
                {"type": "text", "text": "Sunny in Oslo."},
            ]
        }
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
def test_thinking_blocks_go_back_verbatim_in_the_tool_loop(
    api: FakeMessagesAPI, claude: AnthropicModel, streamed: bool
) -> None:
    script_a_thought_then_an_answer(api)
    runner = Runner(thinking_agent(claude), on_text=(lambda _: None) if streamed else None)

    result = runner.run("Weather in Oslo?")

    assert result.status == "done", result.error
    assert result.output == "Sunny in Oslo."
    first, second = api.requests
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] == Limits().max_tokens
    assert second["messages"][1]["content"][0] == THOUGHT  # verbatim: the fake refuses anything else
    assert runner.load(result.run_id).messages[-1]["content"][0]["type"] == "thinking"


def test_thinking_survives_a_resume_from_the_store(api: FakeMessagesAPI, claude: AnthropicModel) -> None:
    script_a_thought_then_an_answer(api)
    store = MemoryStore()
    first = Runner(thinking_agent(claude), store)
    state = first.create("Weather in Oslo?")
    with first.hold(state.id):
        first.step(state)  # the model's turn, thinking included, is committed; then the process "dies"

    result = Runner(thinking_agent(claude), store).drive(state.id)

    assert result.status == "done", result.error
    assert api.requests[1]["messages"][1]["content"][0] == THOUGHT


def test_the_fake_refuses_a_tool_loop_that_lost_its_thinking() -> None:
    body = {
        "model": "m",
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [
            PROMPT,
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "sunny"}]},
        ],
    }

    assert "must start with a thinking block" in (validate_messages_request(body) or "")
    forced = {**body, "tools": [weather.definition()], "tool_choice": {"type": "any"}}
    assert "Thinking may not be enabled when tool_choice forces tool use" in (validate_messages_request(forced) or "")


def test_the_fake_refuses_a_thinking_block_changed_since_it_signed_it(
    api: FakeMessagesAPI, claude: AnthropicModel
) -> None:
    api.reply(
        {"content": [copy.deepcopy(THOUGHT), {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]}
    )
    turn = claude.complete(request(ModelSettings(thinking_budget=2048)))
    changed = [{**turn.content[0], "thinking": "Something else."}, turn.content[1]]
    results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}

    with pytest.raises(Exception, match="Invalid `signature` in `thinking` block"):
        claude.complete(
            request(
                ModelSettings(thinking_budget=2048),
                messages=[PROMPT, {"role": "assistant", "content": changed}, results],
            )
        )
