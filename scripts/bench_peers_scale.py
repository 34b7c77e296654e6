"""Section 5 of scripts/bench (service scale) for the peers, inside the peer venv.

The same workload as bench_scale.py: K concurrent runs of ``calls`` tool calls in one event
loop, the model answering after MODEL_DELAY (awaited), the tool awaiting TOOL_DELAY. LangGraph
runs ``astream`` on a compiled graph with its async SQLite or PostgreSQL checkpointer (the
default durability); Pydantic AI runs ``agent.iter`` with no persistence (it has none). A
step's latency is the time between the graph's updates (one per node) or the agent's nodes.
Started by bench_peers.py; prints nothing itself (its rows go back in bench_peers' JSON).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bench_common import MODEL_DELAY, PROMPT, SQLITE_PRAGMAS, TOOL_DELAY, echo, reply, scale_point


async def slow_echo(i: int) -> str:
    """Echo the number back, after awaiting simulated I/O."""
    await asyncio.sleep(TOOL_DELAY)
    return echo(i)


# LangGraph ------------------------------------------------------------------------------------------
@asynccontextmanager
async def langgraph_saver(system: str, workdir: Path, pg_url: str) -> AsyncIterator[Any]:
    """AsyncSqliteSaver on tether's pragmas, or AsyncPostgresSaver on a pool (as its docs advise for concurrency)."""
    if system == "langgraph-sqlite":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        connection = await aiosqlite.connect(str(workdir / "langgraph-scale.db"))
        for pragma in SQLITE_PRAGMAS:
            await connection.execute(pragma)
        try:
            saver = AsyncSqliteSaver(connection)
            await saver.setup()
            yield saver
        finally:
            await connection.close()
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    pool = AsyncConnectionPool(pg_url, max_size=15, kwargs=kwargs, open=False)  # tether's pool: 5 + 10 overflow
    await pool.open()
    try:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        yield saver
    finally:
        await pool.close()


def langgraph_app(calls: int, saver: Any) -> Any:
    """The bench's graph (agent node + ToolNode), with a chat model that awaits MODEL_DELAY."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    class SlowChatModel(BaseChatModel):
        """bench_common.reply's turns; the turn is counted from the history, so runs can interleave."""

        @property
        def _llm_type(self) -> str:
            return "scripted-slow"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            turn = reply(sum(isinstance(m, AIMessage) for m in messages), calls)
            tool_calls = [
                {"name": b["name"], "args": b["input"], "id": b["id"], "type": "tool_call"}
                for b in turn["content"]
                if b["type"] == "tool_use"
            ]
            text = "".join(b.get("text", "") for b in turn["content"] if b["type"] == "text")
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text, tool_calls=tool_calls))])

        async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            await asyncio.sleep(MODEL_DELAY)
            return self._generate(messages)

    model = SlowChatModel()

    async def agent(state: Any) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lc_tool("echo")(slow_echo)]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def langgraph_one_run(app: Any, calls: int) -> Callable[[list[float]], Any]:
    from langchain_core.messages import HumanMessage

    threads = itertools.count()

    async def one_run(latencies: list[float]) -> None:
        config = {"recursion_limit": 2 * calls + 10, "configurable": {"thread_id": f"scale-{next(threads)}"}}
        last = time.perf_counter()
        async for _update in app.astream({"messages": [HumanMessage(PROMPT)]}, config, stream_mode="updates"):
            now = time.perf_counter()
            latencies.append(now - last)
            last = now

    return one_run


# Pydantic AI ----------------------------------------------------------------------------------------
def pydantic_ai_one_run(calls: int) -> Callable[[list[float]], Any]:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import UsageLimits

    async def respond(messages: Any, info: Any) -> Any:
        await asyncio.sleep(MODEL_DELAY)
        turn = reply(sum(isinstance(m, ModelResponse) for m in messages), calls)
        return ModelResponse(
            parts=[
                ToolCallPart(tool_name=b["name"], args=b["input"], tool_call_id=b["id"])
                if b["type"] == "tool_use"
                else TextPart(b["text"])
                for b in turn["content"]
            ]
        )

    agent = Agent(FunctionModel(respond), tools=[Tool(slow_echo, name="echo", takes_ctx=False)])
    limits = UsageLimits(request_limit=None)

    async def one_run(latencies: list[float]) -> None:
        """A step ends when a model request's node hands over, or a tool call's node leads to the next request."""
        async with agent.iter(PROMPT, usage_limits=limits) as run:
            last, previous = time.perf_counter(), None
            async for node in run:
                now = time.perf_counter()
                if Agent.is_model_request_node(previous) or (
                    Agent.is_call_tools_node(previous) and Agent.is_model_request_node(node)
                ):
                    latencies.append(now - last)
                last, previous = now, node
        if run.result is None or run.result.output != f"Done after {calls} calls.":
            raise RuntimeError(f"unexpected result {run.result!r}")

    return one_run


# Driver ---------------------------------------------------------------------------------------------
async def measure(
    system: str, ks: list[int], *, calls: int, repeats: int, workdir: Path, pg_url: str
) -> list[dict[str, Any]]:
    async def points(one_run: Callable[[list[float]], Any]) -> list[dict[str, Any]]:
        await asyncio.gather(*(one_run([]) for _ in range(4)))  # warm-up
        return [await scale_point(system, k, calls, repeats, one_run) for k in ks]

    if system == "pydantic-ai":
        return await points(pydantic_ai_one_run(calls))
    async with langgraph_saver(system, workdir, pg_url) as saver:
        return await points(langgraph_one_run(langgraph_app(calls, saver), calls))


def scale(system: str, ks: list[int], *, calls: int, repeats: int, workdir: Path, pg_url: str) -> list[dict[str, Any]]:
    return asyncio.run(measure(system, ks, calls=calls, repeats=repeats, workdir=workdir, pg_url=pg_url))
