"""Budgets stop runaway runs gracefully; the price table turns usage (cache included) into cost."""

from __future__ import annotations

import pytest

from tether import Agent, Limits, Runner, tool
from tether.models import ModelRequest, Usage
from tether.policies import Budget
from tether.pricing import PRICES, Price, price_for
from tether.testing import ScriptedModel


@tool
def search(query: str) -> str:
    """Search."""
    return f"results for {query}"


def runaway(request: ModelRequest) -> dict[str, object]:
    """A model that never stops calling tools, unless tools are disabled."""
    if request.tool_choice == {"type": "none"}:
        return {
            "content": [{"type": "text", "text": "Best answer so far: cats."}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 100, "output_tokens": 10},
        }
    n = request.invocation
    return {
        "content": [{"type": "tool_use", "id": f"t{n}", "name": "search", "input": {"query": str(n)}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 1000},
    }


def agent(budget: Budget, model_name: str = "claude-sonnet-4-5", **options: object) -> Agent:
    return Agent(
        model=ScriptedModel(runaway),
        tools=[search],
        model_name=model_name,
        limits=Limits(max_steps=100, budget=budget),
        **options,
    )  # type: ignore[arg-type]


def events(runner: Runner, run_id: str, kind: str) -> list[dict[str, object]]:
    return [e.data for e in runner.store.load_events(run_id) if e.type == kind]


def test_a_runaway_model_gets_a_warning_then_one_last_call_without_tools() -> None:
    model_agent = agent(Budget(max_output_tokens=500))
    runner = Runner(model_agent)
    result = runner.run("find cats")
    assert result.status == "done"
    assert result.output == "Best answer so far: cats."
    warnings = [w for w in events(runner, result.run_id, "warning") if w.get("budget")]
    assert [w["budget"] for w in warnings] == ["max_output_tokens"]
    assert "80%" in str(warnings[0]["message"]) or "90%" in str(warnings[0]["message"])
    (exhausted,) = events(runner, result.run_id, "budget_exhausted")
    assert exhausted["limit"] == "max_output_tokens"
    requests = model_agent.model.requests  # type: ignore[attr-defined]
    assert requests[-1].tool_choice == {"type": "none"}
    assert all(r.tool_choice is None for r in requests[:-1])
    assert "budget for this task is used up" in str(requests[-1].messages[-1]["content"][-1]["text"])
    assert result.usage.output_tokens >= 500  # stopped at the limit, then one answer
    assert result.steps == 11


def test_on_limit_fail_fails_the_run_naming_the_limit() -> None:
    runner = Runner(agent(Budget(max_input_tokens=3000, on_limit="fail")))
    result = runner.run("find cats")
    assert result.status == "failed"
    assert result.error is not None
    assert "max_input_tokens" in result.error  # cache reads count as input


def test_cost_budget_uses_the_price_table_with_cache_tokens() -> None:
    runner = Runner(agent(Budget(max_cost_usd=0.01)))
    result = runner.run("find cats")
    price = PRICES["claude-sonnet-4-5"]
    per_call = (100 * price.input + 50 * price.output + 1000 * price.cache_read) / 1_000_000
    costs = [e["cost_usd"] for e in events(runner, result.run_id, "model_responded")]
    assert costs[0] == pytest.approx(per_call)
    assert result.cost_usd == pytest.approx(sum(c for c in costs if c is not None))
    assert result.status == "done"
    assert events(runner, result.run_id, "budget_exhausted")[0]["limit"] == "max_cost_usd"


def test_prices_can_be_overridden_and_unknown_models_are_not_guessed() -> None:
    cheap = {"claude-sonnet-4-5": Price(0.0, 0.0, 0.0, 0.0)}
    runner = Runner(agent(Budget(max_output_tokens=200), prices=cheap))
    assert runner.run("x").cost_usd == 0.0
    unknown = Runner(agent(Budget(max_output_tokens=200), model_name="some-other-model"))
    assert unknown.run("x").cost_usd is None
    assert price_for("claude-sonnet-4-5-20250929") == PRICES["claude-sonnet-4-5"]
    assert price_for("claude-opus-4-1-20250805") == PRICES["claude-opus-4-1"]
    assert price_for("gpt-x") is None


def test_price_applies_to_every_kind_of_token() -> None:
    price = Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.30)
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cache_creation_input_tokens=1_000_000,
        cache_read_input_tokens=1_000_000,
    )
    assert price.cost(usage) == pytest.approx(3.0 + 15.0 + 3.75 + 0.30)


def test_wall_clock_budget() -> None:
    now = [1000.0]

    def clock() -> float:
        now[0] += 10.0  # every look at the clock is ten seconds later
        return now[0]

    runner = Runner(agent(Budget(max_seconds=60)), clock=clock)
    result = runner.run("find cats")
    assert result.status == "done"
    assert events(runner, result.run_id, "budget_exhausted")[0]["limit"] == "max_seconds"


def test_conversation_budget_counts_earlier_runs() -> None:
    budget = Budget(conversation_max_tokens=2000, on_limit="fail")
    runner = Runner(agent(budget))
    first = runner.run("find cats")  # runs until the conversation budget is spent
    assert first.status == "failed"
    second = runner.drive(runner.create("and dogs?", continue_from=first.run_id))
    assert second.status == "failed"
    assert second.steps == 0  # the earlier run already spent the conversation's budget
    assert second.error is not None
    assert "conversation_max_tokens" in second.error


def test_budget_validation() -> None:
    with pytest.raises(ValueError, match="warn_at"):
        Budget(warn_at=0)
    with pytest.raises(ValueError, match="on_limit"):
        Budget(on_limit="explode")  # type: ignore[arg-type]


def test_the_default_model_and_the_current_lineup_have_prices() -> None:
    from tether.models.anthropic import DEFAULT_MODEL

    assert price_for(DEFAULT_MODEL) is not None
    assert price_for("claude-opus-5-5") == PRICES["claude-opus-5-5"]
    assert price_for("claude-opus-5-20260724") == PRICES["claude-opus-5"]  # not the 5.5 row
    assert price_for("claude-fable-5-1") != price_for("claude-fable-5")


def test_a_long_prompt_is_billed_at_its_band_for_every_token() -> None:
    price = PRICES["claude-haiku-5-5"]
    short = Usage(input_tokens=60_000, output_tokens=1_000, cache_read_input_tokens=40_000)
    long = Usage(input_tokens=60_000, output_tokens=1_000, cache_read_input_tokens=40_001)
    assert price.cost(short) == pytest.approx((60_000 * 0.10 + 1_000 * 0.50 + 40_000 * 0.01) / 1e6)
    assert price.cost(long) == pytest.approx((60_000 * 0.50 + 1_000 * 2.50 + 40_001 * 0.05) / 1e6)
