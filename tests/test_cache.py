"""The tool-result cache: ``@tool(cache_ttl=...)`` reuses a successful result across runs and processes.

In-process scenarios run through Runner AND AsyncRunner on a memory store with a fake
clock; the cross-process ones run ``tether`` twice (support.run_tether) against one SQLite file and
count the tool's executions in a file the tool writes.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from support import run_tether, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Limits, Runner, RunResult, tool
from tether.canonical import canonical_json
from tether.core.cache import cache_key
from tether.errors import ToolDefinitionError
from tether.facts.events import Event
from tether.models.scripted import ScriptedModel
from tether.policy.policies import Budget
from tether.stores.memory import MemoryStore
from tether.testing import RecordingApprover
from tether.tools import Tool


def answer(text: str = "done") -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": {"input_tokens": 1}}


class Clock:
    """A settable clock, so expiry is tested without sleeping."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class World:
    """Tools that count their executions, a shared store, and runners over it."""

    def __init__(self, kind: str, ttl: float = 60.0) -> None:
        self.kind = kind
        self.store = MemoryStore()
        self.clock = Clock()
        self.executions: list[dict[str, Any]] = []
        self.fail_next = False

        @tool(cache_ttl=ttl)
        def lookup(city: str, units: str = "C") -> dict[str, Any]:
            """Look the weather up (pretend it is slow and costs money)."""
            self.executions.append({"city": city, "units": units})
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("upstream down")
            return {"city": city, "temp": 21, "units": units}

        @tool
        def plain(x: int) -> int:
            """Not cached."""
            self.executions.append({"x": x})
            return x

        self.tools: list[Tool] = [lookup, plain]

    def run(
        self, script: list[dict[str, Any]], *, tenant: str | None = None, approver: Any = None, limits: Any = None
    ) -> RunResult:
        agent = Agent(model=ScriptedModel(script), tools=self.tools, **({"limits": limits} if limits else {}))
        if self.kind == "sync":
            return Runner(agent, self.store, clock=self.clock, approver=approver).run("go", tenant=tenant)
        runner = AsyncRunner(agent, self.store, clock=self.clock, approver=approver)
        return asyncio.run(runner.run("go", tenant=tenant))

    def events(self, run_id: str) -> list[Event]:
        return self.store.load_events(run_id)

    def types(self, run_id: str) -> list[str]:
        return [e.type for e in self.events(run_id)]

    def finished(self, run_id: str) -> list[dict[str, Any]]:
        return [e.data for e in self.events(run_id) if e.type == "tool_finished"]


LOOKUP = [tool_use_turn(tool_use("toolu_1", "lookup", {"city": "Oslo"})), answer()]


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# Keys -------------------------------------------------------------------------------------
def test_key_is_the_tool_name_and_a_hash_of_canonical_json() -> None:
    key = cache_key("lookup", {"city": "Oslo", "units": "C"})
    tool_name, _, digest = key.partition(":")
    assert tool_name == "lookup"
    assert len(digest) == 64
    assert int(digest, 16) >= 0
    assert canonical_json({"b": [1, {"d": 2, "c": 3}], "a": "é"}) == '{"a":"é","b":[1,{"c":3,"d":2}]}'


def test_equal_inputs_share_a_key_and_anything_else_does_not() -> None:
    key = cache_key("lookup", {"city": "Oslo", "units": "C"})
    assert cache_key("lookup", {"units": "C", "city": "Oslo"}) == key
    assert cache_key("lookup", {"city": "Oslo", "units": "F"}) != key
    assert cache_key("other", {"city": "Oslo", "units": "C"}) != key
    assert cache_key("lookup", {"city": "Oslo", "units": "C"}, tenant="acme") != key
    assert cache_key("lookup", {"city": "Oslo", "units": "C"}, tenant="acme") != cache_key(
        "lookup", {"city": "Oslo", "units": "C"}, tenant="other"
    )


@pytest.mark.parametrize("ttl", [0, -1.0])
def test_cache_ttl_must_be_positive(ttl: float) -> None:
    with pytest.raises(ToolDefinitionError, match="cache_ttl"):

        @tool(cache_ttl=ttl)
        def f(x: int) -> int:
            """Nothing."""
            return x


def test_cache_ttl_is_kept_on_the_tool() -> None:
    @tool(cache_ttl=2.5)
    def f(x: int) -> int:
        """Nothing."""
        return x

    assert f.cache_ttl == 2.5

    @tool
    def g(x: int) -> int:
        """Nothing."""
        return x

    assert g.cache_ttl is None


# Hits and misses ----------------------------------------------------------------------------
def test_second_run_is_answered_from_the_cache_without_running_the_tool(kind: str) -> None:
    world = World(kind)
    first = world.run(LOOKUP)
    second = world.run(LOOKUP)

    assert first.status == second.status == "done"
    assert world.executions == [{"city": "Oslo", "units": "C"}]
    # The first run missed: the miss is written with (just before) the tool's start.
    first_types = world.types(first.run_id)
    assert first_types[first_types.index("cache_miss") + 1] == "tool_started"
    # The second run hit: no start, the hit then the result.
    second_types = world.types(second.run_id)
    assert "tool_started" not in second_types
    assert "cache_miss" not in second_types
    assert second_types[second_types.index("cache_hit") + 1] == "tool_finished"
    hit = next(e.data for e in world.events(second.run_id) if e.type == "cache_hit")
    assert hit == {
        "call_id": "toolu_1",
        "tool": "lookup",
        "key": cache_key("lookup", {"city": "Oslo", "units": "C"}),
        "allowed": {"by": None, "reason": "no approval needed"},  # for the audit: it passed the gate unasked
    }
    # The model gets the same result either way; the hit is marked and not counted as an execution.
    fresh, cached = world.finished(first.run_id)[0], world.finished(second.run_id)[0]
    assert cached["content"] == fresh["content"] == '{"city": "Oslo", "temp": 21, "units": "C"}'
    assert cached["cached"] is True
    assert cached["is_error"] is False
    assert "cached" not in fresh
    assert (first.tool_calls, second.tool_calls) == (1, 0)


@pytest.mark.parametrize(
    "limits", [Limits(max_tool_calls=1), Limits(budget=Budget(max_tool_calls=1))], ids=["hard cap", "budget"]
)
def test_a_cache_hit_is_not_a_tool_execution_for_the_limit_warnings(kind: str, limits: Limits) -> None:
    world = World(kind)
    world.run(LOOKUP)  # warms the cache
    second = world.run(LOOKUP, limits=limits)
    assert second.status == "done"
    assert second.tool_calls == 0
    assert [e.data for e in world.events(second.run_id) if e.type == "warning"] == []  # not "1 of 1"


def test_the_key_is_the_validated_input_so_defaults_and_order_do_not_matter(kind: str) -> None:
    world = World(kind)
    world.run(LOOKUP)
    spelled_out = [tool_use_turn(tool_use("toolu_2", "lookup", {"units": "C", "city": "Oslo"})), answer()]
    assert "cache_hit" in world.types(world.run(spelled_out).run_id)
    assert len(world.executions) == 1


def test_a_different_input_misses(kind: str) -> None:
    world = World(kind)
    world.run(LOOKUP)
    other = world.run([tool_use_turn(tool_use("toolu_2", "lookup", {"city": "Bergen"})), answer()])
    assert "cache_miss" in world.types(other.run_id)
    assert [e["city"] for e in world.executions] == ["Oslo", "Bergen"]


def test_repeated_calls_in_one_batch_hit_the_value_stored_by_the_first(kind: str) -> None:
    world = World(kind)
    result = world.run(
        [
            tool_use_turn(
                tool_use("toolu_1", "lookup", {"city": "Oslo"}), tool_use("toolu_2", "lookup", {"city": "Oslo"})
            ),
            answer(),
        ]
    )
    assert len(world.executions) == 1
    types = world.types(result.run_id)
    assert types.count("cache_miss") == 1
    assert types.count("cache_hit") == 1


def test_errors_are_never_cached(kind: str) -> None:
    world = World(kind)
    world.fail_next = True
    failed = world.run(LOOKUP)
    assert world.finished(failed.run_id)[0]["is_error"] is True

    retried = world.run(LOOKUP)
    assert "cache_miss" in world.types(retried.run_id)
    assert world.finished(retried.run_id)[0]["is_error"] is False
    assert len(world.executions) == 2
    assert "cache_hit" in world.types(world.run(LOOKUP).run_id)  # the success was stored
    assert len(world.executions) == 2


def test_an_elapsed_ttl_is_a_miss_and_the_new_value_is_stored(kind: str) -> None:
    world = World(kind, ttl=30.0)
    world.run(LOOKUP)
    world.clock.now += 29.0
    assert "cache_hit" in world.types(world.run(LOOKUP).run_id)
    world.clock.now += 1.0  # 30 s after the value was stored: expired
    expired = world.run(LOOKUP)
    assert "cache_miss" in world.types(expired.run_id)
    assert len(world.executions) == 2
    world.clock.now += 29.0  # the second execution stored a fresh entry
    assert "cache_hit" in world.types(world.run(LOOKUP).run_id)
    assert len(world.executions) == 2


def test_tools_without_cache_ttl_write_no_cache_events(kind: str) -> None:
    world = World(kind)
    script = [tool_use_turn(tool_use("toolu_1", "plain", {"x": 1})), answer()]
    first, second = world.run(script), world.run(script)
    for run_id in (first.run_id, second.run_id):
        assert not {"cache_hit", "cache_miss"} & set(world.types(run_id))
    assert world.executions == [{"x": 1}, {"x": 1}]


def test_tenants_do_not_share_entries(kind: str) -> None:
    world = World(kind)
    world.run(LOOKUP, tenant="acme")
    other = world.run(LOOKUP, tenant="globex")
    assert "cache_miss" in world.types(other.run_id)
    assert "cache_hit" in world.types(world.run(LOOKUP, tenant="acme").run_id)
    assert len(world.executions) == 2


def test_an_edited_input_is_looked_up_as_edited(kind: str) -> None:
    world = World(kind)
    world.run([tool_use_turn(tool_use("toolu_1", "lookup", {"city": "Bergen"})), answer()])

    @tool(approval=True, cache_ttl=60)
    def gated_lookup(city: str, units: str = "C") -> str:
        """Needs a person."""
        world.executions.append({"gated": city})
        return city

    world.tools = [gated_lookup]
    approver = RecordingApprover({"gated_lookup": Approve(input={"city": "Paris"}, actor="alice")})
    first = world.run(
        [tool_use_turn(tool_use("toolu_2", "gated_lookup", {"city": "Rome"})), answer()], approver=approver
    )
    assert world.executions[-1] == {"gated": "Paris"}
    miss = next(e.data for e in world.events(first.run_id) if e.type == "cache_miss")
    assert miss["key"] == cache_key("gated_lookup", {"city": "Paris", "units": "C"})
    second = world.run(
        [tool_use_turn(tool_use("toolu_3", "gated_lookup", {"city": "Rome"})), answer()], approver=approver
    )
    assert "cache_hit" in world.types(second.run_id)
    assert world.finished(second.run_id)[0]["content"].startswith("(Note: a reviewer edited the input")
    assert len(world.executions) == 2


def test_a_rebuilt_run_equals_the_live_one_after_a_hit(kind: str) -> None:
    world = World(kind)
    world.run(LOOKUP)
    result = world.run(LOOKUP)
    runner = Runner(Agent(model=ScriptedModel([]), tools=world.tools), world.store)
    rebuilt = runner.load(result.run_id)
    assert rebuilt.tool_calls == 0
    assert rebuilt.messages[2]["content"][0]["content"] == '{"city": "Oslo", "temp": 21, "units": "C"}'


# Across processes ---------------------------------------------------------------------------
TOOLS_MODULE = textwrap.dedent(
    '''
    """Cached tools whose executions are counted in files of the current directory."""

    from pathlib import Path

    from tether import tool


    def _count(name: str) -> None:
        counter = Path(name)
        counter.write_text(str((int(counter.read_text()) if counter.exists() else 0) + 1))


    @tool(cache_ttl=3600)
    def slow_square(n: int) -> int:
        """Square a number, slowly."""
        _count("slow_square.count")
        return n * n


    @tool(cache_ttl=0.5)
    def brief(n: int) -> int:
        """A result worth half a second."""
        _count("brief.count")
        return n + 1


    TOOLS = [slow_square, brief]
    '''
)


def script_for(name: str) -> list[dict[str, Any]]:
    return [tool_use_turn(tool_use("toolu_1", name, {"n": 7})), answer("ok")]


def tether(cwd: Path, *args: str) -> dict[str, Any]:
    """Run the command, which must succeed; its JSON output."""
    done = run_tether(cwd, *args)
    assert done.returncode == 0, done
    return done.data


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "cachetools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    for name in ("slow_square", "brief"):
        (tmp_path / f"{name}.json").write_text(json.dumps(script_for(name)), encoding="utf-8")
    return tmp_path


def run_in_process(cwd: Path, tool_name: str) -> tuple[dict[str, Any], list[str]]:
    db = f"sqlite:///{cwd / 'shared.db'}"
    result = tether(
        cwd, "run", "go", "--tools", "cachetools:TOOLS", "--model", f"scripted:{tool_name}.json", "--db", db, "--json"
    )
    shown = tether(cwd, "show", result["run_id"], "--db", db, "--json")
    return result, [e["type"] for e in shown["events"]]


@pytest.mark.slow
def test_a_second_process_hits_the_cache_in_the_shared_database(workspace: Path) -> None:
    first, first_types = run_in_process(workspace, "slow_square")
    second, second_types = run_in_process(workspace, "slow_square")

    assert first["status"] == second["status"] == "done"
    assert (workspace / "slow_square.count").read_text() == "1"
    assert "cache_miss" in first_types
    assert "tool_started" in first_types
    assert "cache_hit" in second_types
    assert "tool_started" not in second_types
    assert (first["tool_calls"], second["tool_calls"]) == (1, 0)


@pytest.mark.slow
def test_a_second_process_misses_once_the_ttl_elapsed(workspace: Path) -> None:
    _, first_types = run_in_process(workspace, "brief")
    time.sleep(0.6)
    _, second_types = run_in_process(workspace, "brief")

    assert "cache_miss" in first_types
    assert "cache_miss" in second_types
    assert "cache_hit" not in second_types
    assert (workspace / "brief.count").read_text() == "2"
