"""Budgets stop runaway runs gracefully; the price table turns usage (cache included) into cost."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import Cli, runs_made, tool_use, tool_use_turn
from tether import Agent, ConfigError, Limits, Runner, tool
from tether.models import ModelRequest, Usage
from tether.policy.policies import Budget
from tether.policy.pricing import PRICES, Price, parse_price, price_for
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


def agent(budget: Budget, model_name: str = "claude-sonnet-4-5", **options: Any) -> Agent:
    return Agent(
        model=ScriptedModel(runaway),
        tools=[search],
        model_name=model_name,
        limits=Limits(max_steps=100, budget=budget),
        **options,
    )


def events(runner: Runner, run_id: str, kind: str) -> list[dict[str, Any]]:
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
    with pytest.raises(ConfigError, match="warn_at"):
        Budget(warn_at=0)
    with pytest.raises(ConfigError, match="on_limit"):
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


def test_a_model_call_budget_warns_then_gets_a_final_answer() -> None:
    model_agent = agent(Budget(max_model_calls=5))
    runner = Runner(model_agent)
    result = runner.run("find cats")
    assert result.status == "done"
    assert result.output == "Best answer so far: cats."
    assert result.steps == 6  # five calls, then the one last answer without tools
    (warning,) = [w for w in events(runner, result.run_id, "warning") if w.get("budget")]
    assert warning["budget"] == "max_model_calls"
    assert "80%" in str(warning["message"])  # at the fourth call of five
    assert events(runner, result.run_id, "budget_exhausted")[0]["limit"] == "max_model_calls"


def three_tools_then_runaway(request: ModelRequest) -> dict[str, object]:
    if request.invocation == 0 and request.tool_choice is None:
        uses = [{"type": "tool_use", "id": f"b{i}", "name": "search", "input": {"query": str(i)}} for i in range(3)]
        return {"content": uses, "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 10}}
    return runaway(request)


def test_a_tool_call_budget_skips_the_calls_left_and_gets_a_final_answer() -> None:
    runner = Runner(
        Agent(
            model=ScriptedModel(three_tools_then_runaway),
            tools=[search],
            limits=Limits(budget=Budget(max_tool_calls=2)),
        )
    )
    result = runner.run("find cats")
    assert result.status == "done"
    assert result.output == "Best answer so far: cats."
    assert result.tool_calls == 2
    results = [e for e in events(runner, result.run_id, "tool_finished")]
    assert [r["is_error"] for r in results] == [False, False, True]
    assert results[2]["content"] == "Error: not run: the budget is used up (max_tool_calls: 2 of 2)"
    warned = [w["budget"] for w in events(runner, result.run_id, "warning") if w.get("budget")]
    assert warned == ["max_tool_calls"]  # committed with the second call's start
    assert events(runner, result.run_id, "budget_exhausted")[0]["limit"] == "max_tool_calls"


def test_a_tool_call_budget_with_on_limit_fail_fails_before_the_call() -> None:
    runner = Runner(
        Agent(
            model=ScriptedModel(three_tools_then_runaway),
            tools=[search],
            limits=Limits(budget=Budget(max_tool_calls=2, on_limit="fail")),
        )
    )
    result = runner.run("find cats")
    assert result.status == "failed"
    assert result.error == "budget exceeded: max_tool_calls: 2 of 2"
    assert result.tool_calls == 2


def test_hard_limits_warn_first_then_fail_naming_the_limit() -> None:
    runner = Runner(Agent(model=ScriptedModel(runaway), tools=[search], limits=Limits(max_steps=5)))
    result = runner.run("find cats")
    assert result.status == "failed"
    assert result.error == "max_steps limit reached: 5 model invocations"
    (warning,) = [w for w in events(runner, result.run_id, "warning") if w.get("limit")]
    assert warning["limit"] == "max_steps"
    assert warning["message"] == "limit 80% reached: max_steps: 4 of 5 (the run fails at the limit)"

    tools_runner = Runner(Agent(model=ScriptedModel(runaway), tools=[search], limits=Limits(max_tool_calls=2)))
    capped = tools_runner.run("find cats")
    assert capped.status == "failed"
    assert capped.error == "max_tool_calls limit reached: 2 tool executions"
    limits = [w["limit"] for w in events(tools_runner, capped.run_id, "warning") if w.get("limit")]
    assert limits == ["max_tool_calls"]


@pytest.mark.parametrize(
    ("budget", "limit"),
    [
        (Budget(conversation_max_model_calls=3, on_limit="fail"), "conversation_max_model_calls"),
        (Budget(conversation_max_tool_calls=3, on_limit="fail"), "conversation_max_tool_calls"),
    ],
)
def test_conversation_call_budgets_count_earlier_runs(budget: Budget, limit: str) -> None:
    runner = Runner(agent(budget))
    first = runner.run("find cats")
    assert first.status == "failed"
    assert first.error is not None
    assert limit in first.error
    second = runner.drive(runner.create("and dogs?", continue_from=first.run_id))
    assert second.status == "failed"
    assert (second.steps, second.tool_calls) == (0, 0)
    assert second.error is not None
    assert limit in second.error


def test_conversation_wall_clock_counts_from_the_first_run() -> None:
    now = [1000.0]
    runner = Runner(agent(Budget(conversation_max_seconds=50, on_limit="fail")), clock=lambda: now[0])
    first = runner.run("find cats")  # the clock stands still: the budget is never reached
    assert first.status == "failed"  # at max_steps of the test agent, not the budget
    now[0] = 1060.0  # the conversation began 60 s ago
    second = runner.drive(runner.create("and dogs?", continue_from=first.run_id))
    assert second.status == "failed"
    assert second.error == "budget exceeded: conversation_max_seconds: 60 of 50"


def test_a_run_keeps_its_budget_in_its_spec_for_resume() -> None:
    from tether.drivers.loader import limits_from_spec

    budget = Budget(max_total_tokens=10_000, max_tool_calls=7, conversation_max_seconds=3600, on_limit="fail")
    runner = Runner(agent(budget))
    state = runner.create("find cats")
    stored = runner.store.load_run(state.id).spec
    limits = limits_from_spec(stored)
    assert limits.budget == budget
    assert limits.max_steps == 100


def test_a_cost_budget_needs_a_priced_model() -> None:
    from tether.errors import ConfigError

    with pytest.raises(ConfigError, match="cost budget needs the model's price"):
        agent(Budget(max_cost_usd=1.0), model_name="mystery-model")
    with pytest.raises(ConfigError, match="'mystery-model' has none"):
        agent(Budget(conversation_max_cost_usd=1.0), model_name="mystery-model")
    priced = agent(Budget(max_cost_usd=1.0), model_name="mystery-model", prices={"mystery": Price(1, 1, 1, 1)})
    assert priced.limits.budget is not None
    agent(Budget(max_output_tokens=10), model_name="mystery-model")  # no cost limit: no price needed


def test_a_response_from_an_unpriced_model_is_warned_about_once_under_a_cost_budget() -> None:
    def other_model(request: ModelRequest) -> dict[str, object]:
        return {**runaway(request), "model": "some-unpriced-model"}

    runner = Runner(
        Agent(
            model=ScriptedModel(other_model),
            tools=[search],
            model_name="claude-sonnet-4-5",
            limits=Limits(max_steps=3, budget=Budget(max_cost_usd=5.0)),
        )
    )
    result = runner.run("find cats")
    assert result.cost_usd is None
    unknown = [w for w in events(runner, result.run_id, "warning") if w.get("budget") == "cost_unknown"]
    assert len(unknown) == 1
    assert "some-unpriced-model" in str(unknown[0]["message"])


def test_budget_limits_must_be_positive_and_known() -> None:
    with pytest.raises(ConfigError, match="max_cost_usd must be positive"):
        Budget(max_cost_usd=0)
    with pytest.raises(ConfigError, match="max_seconds must be positive and finite"):
        Budget(max_seconds=float("inf"))  # no limit is None: a run's record, which is JSON, cannot hold inf
    with pytest.raises(ConfigError, match="unknown budget field"):
        Budget.from_dict({"max_dollars": 5})
    assert Budget.from_dict(Budget(max_seconds=5).to_dict()) == Budget(max_seconds=5)


BUDGET_TOOLS = textwrap.dedent(
    """
    from tether import tool


    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add.\"\"\"
        return a + b


    @tool(approval=True)
    def danger(path: str) -> str:
        \"\"\"Needs a person.\"\"\"
        return "ran on " + path
    """
)


@pytest.mark.slow
def test_cli_budget_flags_are_kept_for_resume(tmp_path: Path) -> None:
    (tmp_path / "budgettools.py").write_text(BUDGET_TOOLS)
    script = [tool_use_turn(tool_use("t1", "danger", {"path": "x"}))] + [
        tool_use_turn(tool_use(f"t{i}", "add", {"a": i, "b": i})) for i in range(2, 6)
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    cli = Cli(tmp_path)
    base = ["--tools", "budgettools:add", "--tools", "budgettools:danger", "--model", "scripted:script.json"]
    parked = cli("run", "go", *base, "--max-tool-calls", "2", "--on-limit", "fail", "--json")
    assert parked.returncode == 3, parked
    run_id = parked.data["run_id"]
    assert cli("approve", run_id, "t1").returncode == 0
    resumed = cli("resume", run_id, "--json")  # no budget flag here: the run remembers its own
    assert resumed.returncode == 1, resumed
    assert resumed.data["error"] == "budget exceeded: max_tool_calls: 2 of 2"
    assert resumed.data["tool_calls"] == 2


@pytest.mark.slow
def test_cli_refuses_a_cost_budget_it_cannot_count(tmp_path: Path) -> None:
    (tmp_path / "budgettools.py").write_text(BUDGET_TOOLS)
    (tmp_path / "script.json").write_text(json.dumps([tool_use_turn(tool_use("t1", "add", {"a": 1, "b": 2}))]))
    cli = Cli(tmp_path)
    refused = cli("run", "go", "--tools", "budgettools:add", "--model", "scripted:script.json", "--max-cost", "1")
    assert refused.returncode == 2, refused
    assert "cost budget needs the model's price" in refused.err
    assert runs_made(cli) == []  # refused before any run was created


@pytest.mark.parametrize(
    ("text", "model", "price"),
    [
        ("3,15", "my-model", Price(3.0, 15.0, 3.75, 0.3)),  # cache prices at Claude's ratios to input
        ("3,15,4,0.5", "my-model", Price(3.0, 15.0, 4.0, 0.5)),
        ("other-model=0.5, 2", "other-model", Price(0.5, 2.0, 0.625, 0.05)),
        ("scripted:/x/y=1,1,0,0", "scripted:/x/y", Price(1.0, 1.0, 0.0, 0.0)),
    ],
)
def test_a_price_is_read_from_its_command_line_form(text: str, model: str, price: Price) -> None:
    parsed_model, parsed = parse_price(text, model="my-model")
    assert parsed_model == model
    assert parsed == price
    assert Price.from_dict(parsed.to_dict()) == parsed


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("3", "expected [MODEL=]INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]"),
        ("3,15,4", "expected [MODEL=]INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]"),
        ("3,cheap", "'cheap' is not a number"),
        ("3,-1", "'-1' must be a number >= 0"),
        ("3,nan", "'nan' must be a number >= 0"),
        ("=3,15", "the model name before '=' is empty"),
    ],
)
def test_a_bad_price_says_what_is_wrong(text: str, problem: str) -> None:
    from tether.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_price(text, model="my-model")


def test_cli_price_makes_a_cost_budget_work_with_any_model_and_is_kept_for_resume(tmp_path: Path) -> None:
    (tmp_path / "budgettools.py").write_text(BUDGET_TOOLS)
    script = [
        tool_use_turn(tool_use("t1", "danger", {"path": "x"})),
        tool_use_turn(tool_use("t2", "add", {"a": 1, "b": 2})),
        {"content": [{"type": "text", "text": "3"}], "stop_reason": "end_turn", "usage": {}},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    cli = Cli(tmp_path)
    base = ["--tools", "budgettools:add", "--tools", "budgettools:danger", "--model", "scripted:script.json"]
    # each scripted reply uses 1 input and 1 output token: 2e-6 USD at 1 USD per million each way
    flags = ["--max-cost", "0.000003", "--on-limit", "fail", "--price", "1,1", "--json"]
    parked = cli("run", "go", *base, *flags)
    assert parked.returncode == 3, parked  # the first call cost 2e-6: under the limit
    run_id = parked.data["run_id"]
    shown = cli("show", run_id, "--json").data
    assert shown["cost_usd"] == pytest.approx(2e-6)
    assert cli("approve", run_id, "t1").returncode == 0
    resumed = cli("resume", run_id, "--json")  # no --price here: the run remembers its own
    assert resumed.returncode == 1, resumed
    assert resumed.data["error"] == "budget exceeded: max_cost_usd: 4e-06 of 3e-06"


def test_cli_refuses_a_bad_price_before_creating_a_run(tmp_path: Path) -> None:
    (tmp_path / "budgettools.py").write_text(BUDGET_TOOLS)
    (tmp_path / "script.json").write_text(json.dumps([tool_use_turn(tool_use("t1", "add", {"a": 1, "b": 2}))]))
    cli = Cli(tmp_path)
    base = ["--tools", "budgettools:add", "--model", "scripted:script.json", "--max-cost", "1"]
    refused = cli("run", "go", *base, "--price", "1,lots")
    assert refused.returncode == 2, refused
    assert "--price '1,lots': 'lots' is not a number" in refused.err
    assert runs_made(cli) == []
