"""Cost and usage reporting: per step in `tether show`, summed in `show --json`."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import flat, run_tether, token_usage, tool_use, tool_use_turn
from tether import Agent, RetryPolicy, Runner, tool
from tether.policy.pricing import PRICES
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

pytestmark = pytest.mark.slow  # whole `tether` commands (in-process: support.run_tether)


def test_show_reports_each_step_and_the_totals(tmp_path: Path) -> None:
    attempts: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=0))
    def lookup(key: str) -> str:
        """Fails once, then answers."""
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("flap")
        return f"value of {key}"

    script = [
        {**tool_use_turn(tool_use("t1", "lookup", {"key": "k"})), "usage": token_usage(100, 50, 0, 1000)},
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "usage": token_usage(200, 7, 30, 0)},
    ]
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SQLStore(url)
    agent = Agent(model=ScriptedModel(script), tools=[lookup], model_name="claude-sonnet-4-5")
    run_id = Runner(agent, store).run("go").run_id
    store.close()

    shown = run_tether(tmp_path, "show", run_id, "--db", url, "--json")
    assert shown.returncode == 0, shown
    data = shown.data
    events = data["events"]
    responses = [e for e in events if e["type"] == "model_responded"]
    price = PRICES["claude-sonnet-4-5"]
    first = (100 * price.input + 50 * price.output + 1000 * price.cache_read) / 1e6
    assert responses[0]["cost_usd"] == pytest.approx(first)
    assert data["cost_usd"] == pytest.approx(sum(e["cost_usd"] for e in responses))
    assert data["model_seconds"] == pytest.approx(sum(e["latency"] for e in responses), abs=1e-5)
    tool_steps = [e for e in events if e["type"] in ("retry_scheduled", "tool_finished")]
    assert len(tool_steps) == 2  # the failed attempt's time counts too
    assert data["tool_seconds"] == pytest.approx(sum(e["duration"] for e in tool_steps), abs=1e-5)
    assert data["tool_seconds"] > 0

    told = run_tether(tmp_path, "show", run_id, "--db", url)
    assert told.returncode == 0, told
    step = f"step 1 · {100 + 50 + 1000} tokens · ${first:.6f} · {responses[0]['latency']:.3f}s"
    assert step in flat(told.stdout)  # each step of the conversation says what it cost
    human = run_tether(tmp_path, "show", run_id, "--events", "--db", url)
    assert human.returncode == 0, human
    text = flat(human.stdout)
    assert "tokens in/out/cache w/r" in text
    assert "100/50/0/1000" in text  # the first call's tokens by kind
    assert "200/7/30/0" in text
    assert f"{first:.6f}" in text  # its cost
    assert f"{responses[0]['latency']:.3f}" in text  # its latency
    assert f"{tool_steps[0]['duration']:.3f}" in text  # the failed attempt's duration
    assert f"model {data['model_seconds']:.2f}s, tools {data['tool_seconds']:.2f}s" in text
