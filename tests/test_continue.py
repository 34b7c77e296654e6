"""``tether run --continue RUN``: the new run keeps the earlier run's agent unless a flag says otherwise.

The earlier run's tools, model, system prompt, policy and limits are in its spec; a continued
run started from another directory with no flags gets them all, and each flag given replaces
only what it names. Claude's client talks to FakeMessagesAPI, which records every request, so
the test sees exactly the system prompt, tools and model the continued run sent.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from support import Cli, CliResult, fake_api_env, model_reply, tool_results, tool_use, tool_use_turn
from tether.testing import FakeMessagesAPI

TOOLS = textwrap.dedent(
    '''
    """Tools for the continue tests."""

    from tether import tool


    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b


    @tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()


    TOOLS = [add, shout]
    '''
)
RULES = '[[rules]]\ntool = "add"\nwhen = { a = { equals = 666 } }\naction = "deny"\nmessage = "not that number"\n'
FIRST = ["run", "first", "--tools", "mytools:TOOLS", "--model", "claude-test", "--system", "Be brief."]
LIMITS = ["--max-steps", "4", "--max-tokens", "5000", "--on-limit", "fail", "--policy", "rules.toml"]


def answer(text: str) -> dict[str, Any]:
    return model_reply([{"type": "text", "text": text}], "end_turn")


def tether(api: FakeMessagesAPI, cwd: Path, db: str, *args: str) -> CliResult:
    return Cli(cwd)(*args, "--json", "--db", db, env=fake_api_env(api))


def test_continue_keeps_the_earlier_runs_agent_unless_a_flag_overrides_it(api: FakeMessagesAPI, tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "mytools.py").write_text(TOOLS, encoding="utf-8")
    (project / "rules.toml").write_text(RULES, encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    api.reply(tool_use_turn(tool_use("toolu_1", "add", {"a": 2, "b": 3})))
    api.reply(answer("5"))
    first = tether(api, project, db, *FIRST, *LIMITS)
    assert first.returncode == 0, first

    api.reply(tool_use_turn(tool_use("toolu_2", "add", {"a": 666, "b": 1})))
    api.reply(answer("Denied, then."))
    second = tether(api, elsewhere, db, "run", "second", "--continue", first.data["run_id"])
    assert second.returncode == 0, second
    assert second.data["status"] == "done"
    requests = api.requests[2:]
    assert [r["model"] for r in requests] == ["claude-test", "claude-test"]
    assert [r["system"][0]["text"] if isinstance(r["system"], list) else r["system"] for r in requests] == [
        "Be brief.",
        "Be brief.",
    ]
    assert [[t["name"] for t in r["tools"]] for r in requests] == [["add", "shout"], ["add", "shout"]]
    shown = tether(api, elsewhere, db, "show", second.data["run_id"]).data
    denied = tool_results(shown)["toolu_2"]
    assert denied["is_error"] is True
    assert "not that number" in json.dumps(denied["content"])  # the first run's policy file
    spec = shown["events"][0]["spec"]
    assert spec["max_steps"] == 4
    assert spec["budget"]["max_total_tokens"] == 5000
    assert spec["budget"]["on_limit"] == "fail"
    assert spec["policy"] == str((project / "rules.toml").resolve())
    assert spec["continued_from"] == first.data["run_id"]

    api.reply(answer("Sure."))
    third = tether(
        api, elsewhere, db, "run", "third", "--continue", second.data["run_id"], "--system", "Be kind.",
        "--max-steps", "9", "--max-tool-calls", "2",
    )  # fmt: skip
    assert third.returncode == 0, third
    request = api.requests[-1]
    assert request["model"] == "claude-test"
    assert json.dumps(request["system"]).count("Be kind.") == 1
    assert [t["name"] for t in request["tools"]] == ["add", "shout"]
    spec = tether(api, elsewhere, db, "show", third.data["run_id"]).data["events"][0]["spec"]
    assert spec["max_steps"] == 9
    assert spec["budget"] == {**spec["budget"], "max_total_tokens": 5000, "max_tool_calls": 2, "on_limit": "fail"}
    assert spec["policy"] == str((project / "rules.toml").resolve())


def test_continue_with_other_tools_replaces_them(api: FakeMessagesAPI, tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS, encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    api.reply(answer("hi"))
    first = tether(api, tmp_path, db, *FIRST)
    assert first.returncode == 0, first
    api.reply(answer("again"))
    second = tether(api, tmp_path, db, "run", "more", "--continue", first.data["run_id"], "--tools", "mytools:shout")
    assert second.returncode == 0, second
    assert [t["name"] for t in api.requests[-1]["tools"]] == ["shout"]
    assert api.requests[-1]["model"] == "claude-test"


def test_continue_keeps_a_cost_budget_and_the_prices_it_needs(tmp_path: Path) -> None:
    """A scripted model has no price: the earlier run's --price goes on with its --max-cost."""
    (tmp_path / "answer.json").write_text(json.dumps([answer("hi")]), encoding="utf-8")
    cli, db = Cli(tmp_path), f"sqlite:///{tmp_path / 'runs.db'}"
    cost = ["--max-cost", "1", "--price", "3,15"]
    first = cli("run", "hi", "--model", "scripted:answer.json", *cost, "--json", "--db", db)
    assert first.returncode == 0, first
    second = cli("run", "again", "--continue", first.data["run_id"], "--json", "--db", db)
    assert second.returncode == 0, second
    spec = cli("show", second.data["run_id"], "--json", "--db", db).data["events"][0]["spec"]
    assert spec["budget"]["max_cost_usd"] == 1
    assert second.data["status"] == "done"
