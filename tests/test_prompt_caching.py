"""Prompt caching across requests: each request reads the prefix the previous one wrote.

The API writes the cache at a request's breakpoints, and a breakpoint finds an earlier entry
only if it lies at most ~20 blocks before it. After a batch of parallel calls the newest block
is far more than 20 blocks past the previous request's, so one breakpoint on the newest block
misses the cache; these tests check, from the requests as sent, that some breakpoint always
lies within that lookback of the previous request's last one, and that no request holds more
breakpoints than the API's 4.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from support import fake_api_model
from tether import Agent, Limits, Runner, tool
from tether.testing import FakeMessagesAPI

LOOKBACK = 20
"""Blocks the API looks back from a breakpoint for an earlier cache entry."""
MAX_BREAKPOINTS = 4


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


def blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's message content blocks in order (a string content is one text block)."""
    flat: list[dict[str, Any]] = []
    for message in body["messages"]:
        content = message["content"]
        flat += [{"type": "text", "text": content}] if isinstance(content, str) else content
    return flat


def breakpoints(body: dict[str, Any]) -> list[int]:
    """Positions (in :func:`blocks`) of the blocks that carry cache_control."""
    return [i for i, block in enumerate(blocks(body)) if "cache_control" in block]


def all_breakpoints(body: dict[str, Any]) -> int:
    """Every cache_control in the request: tools, system, top level and messages."""
    system = body.get("system")
    count = len(breakpoints(body)) + int("cache_control" in body)
    count += sum("cache_control" in t for t in body.get("tools") or [])
    count += sum("cache_control" in b for b in system) if isinstance(system, list) else 0
    return count


def unmarked(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in block.items() if k != "cache_control"} for block in blocks(body)]


def batch(api: FakeMessagesAPI, size: int, turn: int) -> None:
    uses = [
        {"type": "tool_use", "id": f"t{turn}_{i}", "name": "lookup", "input": {"key": f"k{i}"}} for i in range(size)
    ]
    api.reply({"content": [{"type": "text", "text": f"Looking up {size} keys."}, *uses]})


@pytest.mark.parametrize("size", [11, 30, 60])
def test_every_request_reads_the_previous_prefix_after_big_batches(api: FakeMessagesAPI, size: int) -> None:
    batch(api, size, 1)
    batch(api, size, 2)
    api.reply_text("All looked up.")
    model = fake_api_model(api)
    limits = Limits(max_tool_calls=2 * size)
    result = Runner(Agent(model=model, tools=[lookup], system="Be brief.", limits=limits)).run("Look keys up")
    model.close()
    assert result.status == "done", result.error

    requests = api.requests
    assert len(requests) == 3
    for body in requests:
        assert 1 <= all_breakpoints(body) <= MAX_BREAKPOINTS
        assert breakpoints(body)[-1] == len(blocks(body)) - 1  # the newest block is written for the next request
    for previous, current in itertools.pairwise(requests):
        assert unmarked(current)[: len(blocks(previous))] == unmarked(previous)  # the same prefix
        written = breakpoints(previous)[-1]
        reading = [b for b in breakpoints(current) if 0 <= b - written <= LOOKBACK]
        assert reading, f"no breakpoint within {LOOKBACK} blocks after {written}: {breakpoints(current)}"
        assert len(blocks(current)) - 1 - written > LOOKBACK  # the case that missed with one breakpoint


def test_a_first_request_has_one_breakpoint(api: FakeMessagesAPI) -> None:
    api.reply_text("Hi.")
    model = fake_api_model(api)
    Runner(Agent(model=model)).run("Hello")
    model.close()
    assert breakpoints(api.requests[0]) == [0]


def test_a_conversation_continued_after_a_cut_batch_reads_the_earlier_prefix(api: FakeMessagesAPI) -> None:
    batch(api, 25, 1)
    api.reply_text("Sorry, that was too many.")
    model = fake_api_model(api)
    runner = Runner(Agent(model=model, tools=[lookup], limits=Limits(max_tool_calls=1)))
    first = runner.run("Look keys up")
    assert first.status == "failed"  # the batch was cut: its 25 calls get error results in the continuation
    runner.run("Just one, then.", continue_from=first.run_id)
    model.close()
    previous, current = api.requests
    written = breakpoints(previous)[-1]
    assert len(blocks(current)) - 1 - written > LOOKBACK
    assert any(0 <= b - written <= LOOKBACK for b in breakpoints(current))
