"""Model names with a provider prefix: which adapter, which price, and never a stored credential."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tether import Runner, tool
from tether.agent import Agent
from tether.drivers.loader import DEMO_MODEL, agent_from_spec, load_model, normalise_model_spec
from tether.errors import ConfigError
from tether.models import Usage
from tether.models.anthropic import AnthropicModel
from tether.models.openai import OpenAIModel
from tether.models.providers import bare_name, split_model
from tether.models.scripted import ScriptedModel
from tether.policy.policies import Budget, Limits
from tether.policy.pricing import PRICES, Price, price_for
from tether.stores.memory import MemoryStore
from tether.testing import FakeChatCompletionsAPI, FakeMessagesAPI


@pytest.mark.parametrize(
    ("spec", "split"),
    [
        ("openai:gpt-6-sol", ("openai", "gpt-6-sol")),
        ("openai:llama3.1:8b", ("openai", "llama3.1:8b")),  # an Ollama tag keeps its colon
        ("OpenAI:gpt-6-sol", ("openai", "gpt-6-sol")),
        ("anthropic:claude-sonnet-5-5", ("anthropic", "claude-sonnet-5-5")),
        ("claude-sonnet-5-5", ("anthropic", "claude-sonnet-5-5")),
        ("scripted:/tmp/replies.json", ("scripted", "/tmp/replies.json")),
    ],
)
def test_a_prefix_names_the_provider_and_a_bare_name_is_claudes(spec: str, split: tuple[str, str]) -> None:
    assert split_model(spec) == split


def test_each_provider_gets_its_adapter_with_the_name_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    replies = tmp_path / "replies.json"
    replies.write_text("[]")

    openai_model = load_model("openai:gpt-6-sol")
    claude = load_model("anthropic:claude-sonnet-5-5")
    bare = load_model("claude-haiku-5-5")
    scripted = load_model(f"scripted:{replies}")

    assert isinstance(openai_model, OpenAIModel)
    assert openai_model.name == "gpt-6-sol"
    assert isinstance(claude, AnthropicModel)
    assert claude.name == "claude-sonnet-5-5"
    assert isinstance(bare, AnthropicModel)
    assert bare.name == "claude-haiku-5-5"
    assert isinstance(scripted, ScriptedModel)
    assert isinstance(load_model(DEMO_MODEL), ScriptedModel)


@pytest.mark.parametrize("spec", ["groq:llama-3.3-70b", "gemini:flash", "azure-openai:gpt-4o"])
def test_an_unknown_prefix_is_refused_naming_the_known_ones(spec: str) -> None:
    for check in (split_model, load_model, normalise_model_spec):
        with pytest.raises(ConfigError) as raised:
            check(spec)
        message = str(raised.value)
        assert f"unknown provider {spec.split(':', maxsplit=1)[0]!r}" in message
        assert "anthropic:, openai:, scripted:" in message


@pytest.mark.parametrize("spec", ["openai:", "anthropic:  "])
def test_a_prefix_without_a_name_is_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"the model name after .* is empty"):
        split_model(spec)


def test_normalising_makes_a_scripted_path_absolute_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    assert normalise_model_spec("scripted:replies.json") == f"scripted:{tmp_path / 'replies.json'}"
    assert normalise_model_spec("openai:gpt-6-sol") == "openai:gpt-6-sol"
    assert normalise_model_spec("claude-sonnet-5-5") == "claude-sonnet-5-5"
    assert normalise_model_spec(DEMO_MODEL) == DEMO_MODEL


def test_the_spec_names_the_model_and_holds_no_key_or_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-stored")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")

    agent = agent_from_spec({"model": "openai:gpt-6-sol", "tools": []})

    assert agent.model_name == "openai:gpt-6-sol"
    stored = json.dumps(agent.spec)
    assert "sk-never-stored" not in stored
    assert "127.0.0.1" not in stored


# Prices --------------------------------------------------------------------------------------
def test_openai_models_are_priced_by_their_own_name() -> None:
    assert bare_name("openai:gpt-6-sol") == "gpt-6-sol"
    assert bare_name("gpt-6-sol") == "gpt-6-sol"
    assert price_for("openai:gpt-6-sol") == PRICES["gpt-6-sol"]
    assert price_for("gpt-6.2-astra") == PRICES["gpt-6.2-astra"]
    assert price_for("gpt-5.4-mini-2026-03-17") == PRICES["gpt-5.4-mini"]  # a dated snapshot, not gpt-5.4
    assert price_for("gpt-4o-2024-08-06") == PRICES["gpt-4o"]
    assert price_for("openai:llama3.1:8b") is None  # a local model has no price: cost unknown, not guessed


def test_an_override_may_name_the_prefixed_model() -> None:
    mine = Price(1.0, 2.0, 1.0, 0.1)

    assert price_for("openai:gpt-6-sol", {"openai:gpt-6-sol": mine}) == mine
    assert price_for("openai:my-local", {"my-local": mine}) == mine


def test_cached_tokens_cost_the_cache_read_price() -> None:
    price = PRICES["gpt-6-sol"]

    cost = price.cost(Usage(input_tokens=100_000, output_tokens=10_000, cache_read_input_tokens=100_000))

    assert cost == pytest.approx((100_000 * 2.0 + 10_000 * 10.0 + 100_000 * 0.20) / 1_000_000)


def test_a_gpt6_prompt_over_272k_tokens_is_billed_at_the_long_context_band() -> None:
    price = PRICES["gpt-6-astra"]

    cost = price.cost(Usage(input_tokens=300_000, output_tokens=1_000))

    assert cost == pytest.approx((300_000 * 20.0 + 1_000 * 75.0) / 1_000_000)


def test_a_cost_budget_works_with_a_prefixed_openai_model() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        model_name="openai:gpt-6-luna",
        limits=Limits(budget=Budget(max_cost_usd=1.0)),
    )

    assert agent.model_name == "openai:gpt-6-luna"


def test_the_demo_model_without_the_demo_tools_says_what_it_needs_instead_of_calling_them() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    result = Runner(Agent(model=load_model(DEMO_MODEL), tools=[add])).run("Add 2 and 3.")
    assert result.status == "done"
    assert "this run lacks run_python, write_file" in str(result.output)
    assert "ANTHROPIC_API_KEY" in str(result.output)
    assert result.tool_calls == 0


# The adapter's own model is the run's ------------------------------------------------------
@pytest.mark.filterwarnings("ignore:The model 'claude-sonnet-4-5' is deprecated:DeprecationWarning")  # the SDK's
def test_an_agent_of_a_named_claude_adapter_records_that_model_and_prices_it(api: FakeMessagesAPI) -> None:
    """Not "default": a cost budget counts it, and traces name it (gen_ai.request.model)."""
    api.reply_text("Hello.")
    model = AnthropicModel("claude-sonnet-4-5", base_url=api.url, api_key="k")
    agent = Agent(model=model, limits=Limits(budget=Budget(max_cost_usd=1.0)))  # refused if it had no price
    assert agent.model_name == "claude-sonnet-4-5"
    store = MemoryStore()
    result = Runner(agent, store).run("Say hello.")
    assert (result.status, store.load_run(result.run_id).spec["model"]) == ("done", "claude-sonnet-4-5")
    assert result.cost_usd is not None
    assert api.requests[0]["model"] == "claude-sonnet-4-5"


def test_an_agent_of_a_named_openai_adapter_records_that_model(chat_api: FakeChatCompletionsAPI) -> None:
    chat_api.reply_text("Hello.")
    agent = Agent(model=OpenAIModel("gpt-6-sol", base_url=chat_api.url, api_key="k"))
    store = MemoryStore()
    result = Runner(agent, store).run("Say hello.")
    assert (result.status, store.load_run(result.run_id).spec["model"]) == ("done", "gpt-6-sol")
    assert result.cost_usd is not None


def test_a_model_name_given_wins_and_an_adapter_naming_none_is_default() -> None:
    named = AnthropicModel("claude-sonnet-4-5", api_key="k")
    assert Agent(model=named, model_name="claude-sonnet-4-5-20250929").model_name == "claude-sonnet-4-5-20250929"
    assert Agent(model=ScriptedModel([])).model_name == "scripted"

    class Nameless:
        def complete(self, request: Any) -> Any:
            raise NotImplementedError

    assert Agent(model=Nameless()).model_name == "default"
