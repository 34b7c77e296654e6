"""A tool cannot end the program: whatever it raises is its own error, Ctrl-C aside.

``sys.exit()``, argparse inside a tool, a stray ``GeneratorExit`` or any other
``BaseException`` a tool raises becomes that call's ``is_error`` result, for sync tools (in the
driver's thread or, with a timeout, in a worker thread) and async ones alike. ``KeyboardInterrupt``
still stops the drive (the user's Ctrl-C), and cancelling an async drive still cancels it.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from support import Cli, tool_results, tool_use, tool_use_turn
from tether import Agent, AsyncRunner, Runner, tool
from tether.execution import attempts
from tether.models.scripted import ScriptedModel
from tether.stores.memory import MemoryStore
from tether.tools import Tool, ToolExit


class Stop(BaseException):
    """A BaseException of the tool's own (as frameworks define for control flow)."""


RAISED: dict[str, Callable[[], BaseException]] = {
    "sys.exit(0)": lambda: SystemExit(0),
    "sys.exit(msg)": lambda: SystemExit("usage: bad flag"),
    "GeneratorExit": GeneratorExit,
    "custom BaseException": lambda: Stop("stop here"),
}


def raising_tools(make: Callable[[], BaseException]) -> dict[str, Tool]:
    """The same failing tool three ways: sync in the caller's thread, sync in a worker thread, async."""

    def sync_body(x: int) -> str:
        """Fail."""
        raise make()

    async def async_body(x: int) -> str:
        """Fail."""
        await asyncio.sleep(0)
        raise make()

    return {
        "sync": tool(name="sync", description="Fail.")(sync_body),
        "sync-timeout": tool(name="sync_timeout", description="Fail.", timeout=5)(sync_body),
        "async": tool(name="async_tool", description="Fail.")(async_body),
    }


def execute(t: Tool) -> str:
    return t.execute(t.validate({"x": 1}), "toolu_1")


def aexecute(t: Tool) -> str:
    return asyncio.run(t.aexecute(t.validate({"x": 1}), "toolu_1"))


@pytest.mark.parametrize("raised", list(RAISED), ids=list(RAISED))
@pytest.mark.parametrize("kind", ["sync", "sync-timeout", "async"])
@pytest.mark.parametrize("run", [execute, aexecute], ids=["execute", "aexecute"])
def test_a_base_exception_from_a_tool_is_raised_as_its_error(
    raised: str, kind: str, run: Callable[[Tool], str]
) -> None:
    failing = raising_tools(RAISED[raised])[kind]
    with pytest.raises(ToolExit) as caught:
        run(failing)
    assert isinstance(caught.value, Exception)
    assert type(caught.value.original) is type(RAISED[raised]())
    assert str(caught.value) == str(caught.value.original)


@pytest.mark.parametrize("kind", ["sync", "sync-timeout", "async"])
@pytest.mark.parametrize("run", [execute, aexecute], ids=["execute", "aexecute"])
def test_keyboard_interrupt_from_a_tool_stays_the_users_ctrl_c(kind: str, run: Callable[[Tool], str]) -> None:
    with pytest.raises(KeyboardInterrupt):
        run(raising_tools(KeyboardInterrupt)[kind])


def test_a_cancelled_error_the_tool_raised_itself_is_its_error() -> None:
    @tool
    async def waits(x: int) -> str:
        """Await a future some library cancelled."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    with pytest.raises(ToolExit) as caught:
        aexecute(waits)
    assert isinstance(caught.value.original, asyncio.CancelledError)


def test_cancelling_the_drive_still_cancels_an_async_tool() -> None:
    started = asyncio.Event()

    @tool
    async def slow(x: int) -> str:
        """Wait for ever."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    async def main() -> None:
        task = asyncio.create_task(slow.aexecute(slow.validate({"x": 1}), "toolu_1"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_an_attempt_discarded_while_suspended_closes_cleanly() -> None:
    @types.coroutine
    def suspend() -> Generator[None, None, None]:
        yield

    async def waits() -> str:
        await suspend()
        return "never"

    async def main() -> None:
        attempt = attempts.run_async(waits(), None, cancel=threading.Event())
        attempt.send(None)  # driven by hand: suspended inside the tool, as an event loop leaves it
        attempt.close()  # what discarding it does: GeneratorExit thrown in, which must not become a ToolExit
        assert inspect.getcoroutinestate(attempt) == inspect.CORO_CLOSED

    asyncio.run(main())


# Whole runs -----------------------------------------------------------------------------
@tool
def parse(flags: list[str]) -> str:
    """Parse command-line flags (argparse exits on a bad one)."""
    parser = argparse.ArgumentParser(prog="parse")
    parser.add_argument("--name")
    return str(parser.parse_args(flags).name)


@tool
async def quit_now(code: int) -> str:
    """Exit."""
    sys.exit(code)


SCRIPT = [
    tool_use_turn(tool_use("toolu_p", "parse", {"flags": ["--nope"]}), tool_use("toolu_q", "quit_now", {"code": 0})),
    {"content": [{"type": "text", "text": "Both failed."}], "stop_reason": "end_turn", "usage": {}},
]


def check_results(messages: list[dict[str, Any]]) -> None:
    results = {
        block["tool_use_id"]: block
        for message in messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    }
    assert results["toolu_p"]["is_error"] is True
    assert "Error (fatal): tool 'parse' raised SystemExit: 2" in results["toolu_p"]["content"]
    assert results["toolu_q"]["is_error"] is True
    assert "Error (fatal): tool 'quit_now' raised SystemExit: 0" in results["toolu_q"]["content"]


def test_a_run_whose_tools_exit_goes_on_with_their_errors(capsys: pytest.CaptureFixture[str]) -> None:
    runner = Runner(Agent(model=ScriptedModel(SCRIPT), tools=[parse, quit_now]), MemoryStore())
    result = runner.run("Go.")
    assert result.status == "done"
    assert result.tool_calls == 2
    check_results(runner.load(result.run_id).messages)
    finished = [e.data for e in runner.store.load_events(result.run_id) if e.type == "tool_finished"]
    assert [(f["error_type"], f["error_class"]) for f in finished] == [("SystemExit", "fatal")] * 2
    assert "unrecognized arguments: --nope" in capsys.readouterr().err  # argparse said why before exiting


def test_an_async_run_whose_tools_exit_goes_on_with_their_errors() -> None:
    runner = AsyncRunner(Agent(model=ScriptedModel(SCRIPT), tools=[parse, quit_now]), MemoryStore())
    result = asyncio.run(runner.run("Go."))
    assert result.status == "done"
    check_results(asyncio.run(runner.load(result.run_id)).messages)


TOOLS_MODULE = textwrap.dedent(
    '''
    """A tool that parses flags with argparse, which exits on a bad one."""

    import argparse

    from tether import tool


    @tool
    def parse(flags: list[str]) -> str:
        """Parse command-line flags."""
        parser = argparse.ArgumentParser(prog="parse")
        parser.add_argument("--name")
        return str(parser.parse_args(flags).name)
    '''
)


def test_the_cli_prints_its_json_when_a_tool_exits(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    script = [tool_use_turn(tool_use("toolu_p", "parse", {"flags": ["--nope"]})), SCRIPT[1]]
    (tmp_path / "script.json").write_text(json.dumps(script), encoding="utf-8")
    cli = Cli(tmp_path)
    done = cli("run", "Go.", "--tools", "mytools:parse", "--model", "scripted:script.json", "--json")
    assert done.returncode == 0, done
    assert done.data["status"] == "done"
    assert done.data["tool_calls"] == 1
    shown = cli("show", done.data["run_id"], "--json")
    result = tool_results(shown.data)["toolu_p"]
    assert result["is_error"] is True
    assert "raised SystemExit: 2" in str(result["content"])
