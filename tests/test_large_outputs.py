"""Large tool outputs: the model sees a capped head with a note; the store keeps the whole value.

The ``tool_finished`` event holds ``content`` (exactly what the model gets, the note
included), ``full_content`` (the whole value) and ``truncated_from`` (its length), so
the history rebuilt from events matches what was sent and ``tether show --json`` still
has everything.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import run_tether, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Limits, Runner, RunResult, tool
from tether.core.engine import truncate_result
from tether.models.scripted import ScriptedModel
from tether.stores.memory import MemoryStore
from tether.testing import RecordingApprover
from tether.tools import ModelRetry, Tool
from tether.views.audit import entries

BIG = "".join(f"line {i:05d}\n" for i in range(5000))  # 55,000 characters
NOTE = "\n[truncated: 55000 characters, showing the first 20000]"


ANSWER = {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "usage": {"input_tokens": 1}}


@tool
def dump(size: int = len(BIG)) -> str:
    """Return a large text."""
    return BIG[:size]


@tool(cache_ttl=60)
def cached_dump() -> str:
    """A large text, cached."""
    return BIG


@tool(approval=True)
def gated_dump(size: int) -> str:
    """A large text, after a person agreed."""
    return BIG[:size]


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def drive(
    kind: str,
    script: list[dict[str, Any]],
    *,
    tools: list[Tool] | None = None,
    limits: Limits | None = None,
    store: MemoryStore | None = None,
    approver: Any = None,
) -> tuple[RunResult, ScriptedModel, MemoryStore]:
    model = ScriptedModel(script)
    store = store or MemoryStore()
    agent = Agent(model=model, tools=tools or [dump, cached_dump, gated_dump], limits=limits or Limits())
    if kind == "sync":
        return Runner(agent, store, approver=approver).run("go"), model, store
    return asyncio.run(AsyncRunner(agent, store, approver=approver).run("go")), model, store


def sent_result(model: ScriptedModel, call_id: str = "toolu_1") -> dict[str, Any]:
    """The tool_result block the model received in its second request."""
    last_user = model.requests[1].messages[-1]
    return next(b for b in last_user["content"] if b["tool_use_id"] == call_id)


def finished(store: MemoryStore, run_id: str) -> dict[str, Any]:
    return next(e.data for e in store.load_events(run_id) if e.type == "tool_finished")


def test_truncate_result_keeps_the_head_and_says_so() -> None:
    assert truncate_result("abcdef", 3) == "abc\n[truncated: 6 characters, showing the first 3]"
    assert truncate_result("abc", 3) == "abc"
    assert truncate_result("", 0) == ""


def test_the_default_cap_is_20000_characters() -> None:
    assert Limits().max_result_chars == 20000


def test_a_large_result_is_cut_for_the_model_and_kept_whole_in_the_event(kind: str) -> None:
    result, model, store = drive(kind, [tool_use_turn(tool_use("toolu_1", "dump", {})), ANSWER])

    assert result.status == "done"
    block = sent_result(model)
    assert block["content"] == BIG[:20000] + NOTE
    assert not block.get("is_error")
    data = finished(store, result.run_id)
    assert data["content"] == BIG[:20000] + NOTE
    assert data["full_content"] == BIG
    assert data["truncated_from"] == 55000


def test_the_rebuilt_history_is_what_the_model_was_sent(kind: str) -> None:
    result, model, store = drive(kind, [tool_use_turn(tool_use("toolu_1", "dump", {})), ANSWER])
    rebuilt = Runner(Agent(model=model, tools=[dump]), store).load(result.run_id)
    assert rebuilt.messages[:3] == model.requests[1].messages


@pytest.mark.parametrize("size", [20000, 100, 0])
def test_results_within_the_cap_are_untouched(kind: str, size: int) -> None:
    result, model, store = drive(kind, [tool_use_turn(tool_use("toolu_1", "dump", {"size": size})), ANSWER])
    assert sent_result(model)["content"] == BIG[:size]
    data = finished(store, result.run_id)
    assert "full_content" not in data
    assert "truncated_from" not in data


def test_the_cap_is_configurable_and_can_be_lifted(kind: str) -> None:
    _, small, _ = drive(
        kind, [tool_use_turn(tool_use("toolu_1", "dump", {"size": 50})), ANSWER], limits=Limits(max_result_chars=10)
    )
    assert sent_result(small)["content"] == BIG[:10] + "\n[truncated: 50 characters, showing the first 10]"
    _, unlimited, _ = drive(
        kind, [tool_use_turn(tool_use("toolu_1", "dump", {})), ANSWER], limits=Limits(max_result_chars=None)
    )
    assert sent_result(unlimited)["content"] == BIG


def test_a_reviewer_note_comes_before_the_capped_result(kind: str) -> None:
    approver = RecordingApprover({"gated_dump": Approve(input={"size": 30000}, actor="alice")})
    result, model, store = drive(
        kind, [tool_use_turn(tool_use("toolu_1", "gated_dump", {"size": 1})), ANSWER], approver=approver
    )
    content = sent_result(model)["content"]
    assert content.startswith("(Note: a reviewer edited the input before running the tool.)\n" + BIG[:100])
    assert content.endswith("\n[truncated: 30000 characters, showing the first 20000]")
    assert finished(store, result.run_id)["full_content"] == BIG[:30000]


def test_the_cache_keeps_the_whole_value_and_a_hit_is_cut_the_same_way(kind: str) -> None:
    store = MemoryStore()
    first, _, _ = drive(kind, [tool_use_turn(tool_use("toolu_1", "cached_dump", {})), ANSWER], store=store)
    second, model, _ = drive(kind, [tool_use_turn(tool_use("toolu_1", "cached_dump", {})), ANSWER], store=store)

    assert "cache_hit" in [e.type for e in store.load_events(second.run_id)]
    assert sent_result(model)["content"] == BIG[:20000] + NOTE
    hit = finished(store, second.run_id)
    assert hit["full_content"] == BIG
    assert hit["cached"] is True
    assert finished(store, first.run_id)["full_content"] == BIG


def test_the_audit_shows_the_whole_result(kind: str) -> None:
    result, _, store = drive(kind, [tool_use_turn(tool_use("toolu_1", "dump", {})), ANSWER])
    (entry,) = entries(result.run_id, store.load_events(result.run_id))
    assert entry.result == BIG
    assert entry.truncated_from == 55000


# tether show --json, in a real process ---------------------------------------------------------
@pytest.mark.slow
def test_show_json_has_the_full_value(tmp_path: Path) -> None:
    (tmp_path / "bigtools.py").write_text(
        textwrap.dedent(
            '''
            from tether import tool


            @tool
            def dump() -> str:
                """Return a large text."""
                return "".join(f"line {i:05d}\\n" for i in range(5000))
            '''
        ),
        encoding="utf-8",
    )
    (tmp_path / "script.json").write_text(
        json.dumps([tool_use_turn(tool_use("toolu_1", "dump", {})), ANSWER]), encoding="utf-8"
    )

    def tether(*args: str) -> dict[str, Any]:
        done = run_tether(tmp_path, *args, "--db", f"sqlite:///{tmp_path / 't.db'}", "--json")
        assert done.returncode == 0, done
        return done.data

    run = tether("run", "go", "--tools", "bigtools:dump", "--model", "scripted:script.json")
    shown = tether("show", run["run_id"])

    event = next(e for e in shown["events"] if e["type"] == "tool_finished")
    assert event["full_content"] == BIG
    assert event["truncated_from"] == 55000
    assert event["content"] == BIG[:20000] + NOTE
    result_block = shown["messages"][2]["content"][0]
    assert result_block["content"] == BIG[:20000] + NOTE  # the history holds what the model saw


# Error results are capped the same way ------------------------------------------------------
@tool
def fails_loudly(kind: str) -> str:
    """Raises an error whose message is as large as a big result."""
    if kind == "model_retry":
        raise ModelRetry(BIG)
    raise ValueError(BIG)


def test_a_huge_exception_message_reaches_the_model_capped(kind: str) -> None:
    result, model, store = drive(
        kind, [tool_use_turn(tool_use("toolu_1", "fails_loudly", {"kind": "value"})), ANSWER], tools=[fails_loudly]
    )
    assert result.status == "done"
    block = sent_result(model)
    prefix = "Error (retryable): tool 'fails_loudly' raised ValueError: "
    assert block["is_error"] is True
    assert block["content"] == prefix + BIG[:20000] + NOTE
    (event,) = [e.data for e in store.load_events(result.run_id) if e.type == "tool_finished"]
    assert event["full_content"] == prefix + BIG
    assert event["truncated_from"] == len(prefix + BIG)
    (entry,) = entries(result.run_id, store.load_events(result.run_id))
    assert entry.error == prefix + BIG  # the audit keeps the whole message


def test_a_huge_model_retry_message_reaches_the_model_capped(kind: str) -> None:
    result, model, store = drive(
        kind,
        [tool_use_turn(tool_use("toolu_1", "fails_loudly", {"kind": "model_retry"})), ANSWER],
        tools=[fails_loudly],
    )
    assert sent_result(model)["content"] == "Error: " + BIG[:20000] + NOTE
    (event,) = [e.data for e in store.load_events(result.run_id) if e.type == "tool_finished"]
    assert event["full_content"] == "Error: " + BIG


def test_invalid_arguments_errors_are_capped_too() -> None:
    result, model, store = drive(
        "sync",
        [tool_use_turn(tool_use("toolu_1", "dump", {"size": "not a number " * 10})), ANSWER],
        limits=Limits(max_result_chars=40),
    )
    content = sent_result(model)["content"]
    assert content.startswith("Error: invalid arguments for tool 'dump': ")
    assert "\n[truncated: " in content
    assert content.endswith("showing the first 40]")
    (event,) = [e.data for e in store.load_events(result.run_id) if e.type == "tool_finished"]
    assert "not a number" in event["full_content"]
