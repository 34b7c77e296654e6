"""The peers of scripts/bench: LangGraph and Pydantic AI, run inside the peer venv (.bench-venv).

The bench starts this file with the peer venv's Python (the same interpreter version as
.venv) and reads ONE JSON document from its stdout. Every system gets the same scripted
Messages API turns (bench_common.reply) and the same trivial tool; a system that cannot be
imported or run becomes an ``unavailable`` row with the reason, never a crash.

  python scripts/bench_peers.py versions
  python scripts/bench_peers.py overhead --sizes 10,100 --repeats 3 --dir DIR
  python scripts/bench_peers.py growth --system langgraph-sqlite --calls 1000 --early 10 --late 1000 --dir DIR
  python scripts/bench_peers.py resume --sizes 100,1000 --repeats 5 --dir DIR
  python scripts/bench_peers.py scale --system langgraph-sqlite --sizes 1,16,64 --calls 10 --repeats 1 --dir DIR
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (
    PROMPT,
    SQLITE_PRAGMAS,
    describe_error,
    echo,
    emit,
    gate,
    growth_summary,
    no_autocheckpoint,
    overhead_row,
    peak_rss_mib,
    reply,
    reset_peak_rss,
    rss_mib,
    steps_of,
    timed,
    traced_peak_mib,
    unavailable,
    wal_bytes,
)

SYSTEMS = {
    "langgraph": "LangGraph, fake chat model + ToolNode, no checkpointer",
    "langgraph-sqlite": "LangGraph + SqliteSaver (durability=async, its default)",
    "langgraph-sqlite-sync": "LangGraph + SqliteSaver (durability=sync)",
    "pydantic-ai": "Pydantic AI, FunctionModel, in memory",
}
PACKAGES = (
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "langgraph-prebuilt",
    "langchain-core",
    "pydantic-ai-slim",
    "pydantic",
)


def log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


# LangGraph ---------------------------------------------------------------------------------
def langgraph_parts() -> Any:
    """Import LangGraph lazily (a missing package makes rows unavailable, not a crash)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import interrupt

    class ScriptedChatModel(BaseChatModel):
        """A fake chat model answering with bench_common.reply, converted to AIMessage."""

        calls: int
        next_index: int = 0
        gate: bool = False

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            index = self.next_index
            self.next_index += 1
            turn = reply(index, self.calls, gate=self.gate)
            tool_calls = [
                {"name": b["name"], "args": b["input"], "id": b["id"], "type": "tool_call"}
                for b in turn["content"]
                if b["type"] == "tool_use"
            ]
            text = "".join(b.get("text", "") for b in turn["content"] if b["type"] == "text")
            message = AIMessage(content=text, tool_calls=tool_calls, id=turn["id"])
            return ChatResult(generations=[ChatGeneration(message=message)])

    echo_tool = lc_tool(echo)

    @lc_tool
    def gate_tool(i: int) -> str:
        """The gated tool of the resume benchmark (runs once a person approved it)."""
        if not interrupt({"approve": i}):
            return "denied"
        return gate(i)

    gate_tool.name = "gate"

    def build(model: Any, checkpointer: Any = None) -> Any:
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", ToolNode([echo_tool, gate_tool]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return graph.compile(checkpointer=checkpointer)

    return ScriptedChatModel, HumanMessage, build


def sqlite_saver(path: str, *, keep_wal: bool = False) -> tuple[Any, sqlite3.Connection]:
    """LangGraph's SqliteSaver on a connection with tether's pragmas (WAL, synchronous=NORMAL)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(path, check_same_thread=False)
    for pragma in SQLITE_PRAGMAS:
        connection.execute(pragma)
    if keep_wal:
        no_autocheckpoint(connection)
    saver = SqliteSaver(connection)
    saver.setup()
    return saver, connection


class LangGraphRunner:
    """Runs one LangGraph configuration repeatedly, a new thread per run."""

    def __init__(self, system: str, workdir: Path) -> None:
        self.model_class, self.human, self.build = langgraph_parts()
        self.saver = None
        self.connection: sqlite3.Connection | None = None
        self.durability = "sync" if system == "langgraph-sqlite-sync" else None
        if system != "langgraph":
            self.saver, self.connection = sqlite_saver(str(workdir / f"{system}.db"))
        self.threads = 0
        self.apps: dict[int, tuple[Any, Any]] = {}

    def run(self, calls: int) -> None:
        if calls not in self.apps:  # compiled once per size, as an application would
            model = self.model_class(calls=calls)
            self.apps[calls] = (model, self.build(model, self.saver))
        model, app = self.apps[calls]
        model.next_index = 0
        self.threads += 1
        thread = f"{os.getpid()}-{self.threads}"  # unique across the bench's peer processes sharing the file
        config = {"recursion_limit": 2 * calls + 10, "configurable": {"thread_id": thread}}
        extra = {"durability": self.durability} if self.durability else {}
        out = app.invoke({"messages": [self.human(PROMPT)]}, config, **extra)
        if out["messages"][-1].content != f"Done after {calls} calls.":
            raise RuntimeError(f"unexpected last message {out['messages'][-1]!r}")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


# Pydantic AI -----------------------------------------------------------------------------------
class PydanticAIRunner:
    """Runs Pydantic AI's Agent on a FunctionModel answering with bench_common.reply."""

    def __init__(self) -> None:
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel
        from pydantic_ai.usage import UsageLimits

        self.parts = (Agent, ModelResponse, TextPart, ToolCallPart, FunctionModel)
        self.limits = UsageLimits(request_limit=None)
        self.agents: dict[int, tuple[list[int], Any]] = {}

    def agent(self, calls: int) -> tuple[list[int], Any]:
        """One agent per size (built once, as an application would), with its turn counter."""
        agent_class, response_class, text_part, call_part, function_model = self.parts
        counter = [0]

        def respond(messages: Any, info: Any) -> Any:
            turn = reply(counter[0], calls)
            counter[0] += 1
            parts = [
                call_part(tool_name=b["name"], args=b["input"], tool_call_id=b["id"])
                if b["type"] == "tool_use"
                else text_part(b["text"])
                for b in turn["content"]
            ]
            return response_class(parts=parts)

        agent = agent_class(function_model(respond))
        agent.tool_plain(echo)
        return counter, agent

    def run(self, calls: int) -> None:
        if calls not in self.agents:
            self.agents[calls] = self.agent(calls)
        counter, agent = self.agents[calls]
        counter[0] = 0
        result = agent.run_sync(PROMPT, usage_limits=self.limits)
        if result.output != f"Done after {calls} calls.":
            raise RuntimeError(f"unexpected output {result.output!r}")

    def close(self) -> None:
        pass


def make_runner(system: str, workdir: Path) -> Any:
    return PydanticAIRunner() if system == "pydantic-ai" else LangGraphRunner(system, workdir)


# Sections ----------------------------------------------------------------------------------------
def overhead(sizes: list[int], repeats: int, workdir: Path, systems: list[str]) -> list[dict[str, Any]]:
    rows = []
    for system in systems:
        try:
            runner = make_runner(system, workdir)
        except Exception as error:  # noqa: BLE001 - a peer that cannot start is a row, not a crash
            rows += [unavailable(describe_error(error), system=system, n=n) for n in sizes]
            continue
        for calls in sizes:
            log(f"overhead {system} N={calls}")
            try:
                rows.append(overhead_row(system, calls, lambda c=calls, r=runner: r.run(c), repeats))
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                rows.append(unavailable(describe_error(error), system=system, n=calls))
        runner.close()
    return rows


def growth(system: str, calls: int, early: int, late: int, workdir: Path) -> dict[str, Any]:
    """Per-step WAL and payload bytes, DB size and memory for one run of ``calls`` tool calls."""
    try:
        if system == "pydantic-ai":
            return memory_only(system, calls, PydanticAIRunner())
        if system == "langgraph":
            return memory_only(system, calls, LangGraphRunner(system, workdir))
        return langgraph_growth(calls, early, late, workdir)
    except Exception as error:  # noqa: BLE001
        traceback.print_exc()
        return unavailable(describe_error(error), system=system, n=calls)


def memory_only(system: str, calls: int, runner: Any) -> dict[str, Any]:
    runner.run(5)
    before = rss_mib()
    reset_peak_rss()
    seconds, _ = timed(lambda: runner.run(calls))
    row = {
        "system": system,
        "status": "ok",
        "n": calls,
        "steps": steps_of(calls),
        "rss_before_mib": before,
        "peak_rss_mib": peak_rss_mib(),
        "seconds": seconds,
    }
    row["traced_peak_mib"] = traced_peak_mib(lambda: runner.run(calls))
    runner.close()
    return row


def langgraph_growth(calls: int, early: int, late: int, workdir: Path) -> dict[str, Any]:
    model_class, human, build = langgraph_parts()
    path = str(workdir / "langgraph-growth.db")
    saver, connection = sqlite_saver(path, keep_wal=True)
    reader = sqlite3.connect(path)
    marks = {"checkpoints": 0, "writes": 0}

    def payload() -> int:
        total = 0
        for table, columns in (
            ("checkpoints", "LENGTH(checkpoint) + LENGTH(metadata)"),
            ("writes", "LENGTH(channel) + LENGTH(value)"),
        ):
            size, top = reader.execute(
                f"SELECT COALESCE(SUM({columns}), 0), MAX(rowid) FROM {table} WHERE rowid > ?",
                (marks[table],),
            ).fetchone()
            total += size
            marks[table] = top or marks[table]
        return total

    app = build(model_class(calls=calls), saver)
    config = {"recursion_limit": 2 * calls + 10, "configurable": {"thread_id": "growth"}}
    wal, pay = [], []
    before_wal, before_rss = wal_bytes(path), rss_mib()
    reset_peak_rss()
    payload()
    started = time.perf_counter()
    for _chunk in app.stream({"messages": [human(PROMPT)]}, config, stream_mode="updates", durability="sync"):
        now_wal = wal_bytes(path)
        wal.append(now_wal - before_wal)
        before_wal = now_wal
        pay.append(payload())
    seconds = time.perf_counter() - started
    reader.close()
    connection.close()
    row = growth_summary(
        "langgraph-sqlite",
        wal,
        pay,
        db_path=path,
        early=early,
        late=late,
        calls=calls,
        rss_before=before_rss,
        seconds=seconds,
    )
    saver2, connection2 = sqlite_saver(str(workdir / "langgraph-traced.db"))
    traced_app = build(model_class(calls=calls), saver2)
    traced_cfg = {"recursion_limit": 2 * calls + 10, "configurable": {"thread_id": "traced"}}
    row["traced_peak_mib"] = traced_peak_mib(
        lambda: traced_app.invoke({"messages": [human(PROMPT)]}, traced_cfg, durability="sync")
    )
    connection2.close()
    return row


def resume(sizes: list[int], repeats: int, workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for history in sizes:
        log(f"resume langgraph-sqlite history={history}")
        try:
            rows.append(langgraph_resume(history, repeats, workdir))
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            rows.append(unavailable(describe_error(error), system="langgraph-sqlite", history_steps=history))
    return rows


def langgraph_resume(history: int, repeats: int, workdir: Path) -> dict[str, Any]:
    """Park a thread at an interrupt() after ``history`` steps, then time resuming it to the end."""
    from langgraph.types import Command

    model_class, human, build = langgraph_parts()
    calls = history // 2
    path = str(workdir / f"langgraph-resume-{history}.db")
    saver, connection = sqlite_saver(path)
    template = "parked"
    config = {"recursion_limit": 2 * calls + 20, "configurable": {"thread_id": template}}
    build(model_class(calls=calls, gate=True), saver).invoke({"messages": [human(PROMPT)]}, config)
    if not saver.get_tuple(config):
        raise RuntimeError("the thread did not park")
    threads = []
    for copy in range(2 * repeats + 2):  # identical parked threads, cloned row by row
        thread = f"copy{copy}"
        for table in ("checkpoints", "writes"):
            columns = [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
            rest = ", ".join(c for c in columns if c != "thread_id")
            connection.execute(
                f"INSERT INTO {table} (thread_id, {rest}) SELECT ?, {rest} FROM {table} WHERE thread_id = ?",
                (thread, template),
            )
        threads.append(thread)
    connection.commit()

    def resume_one(app: Any, thread: str) -> None:
        cfg = {"recursion_limit": 2 * calls + 20, "configurable": {"thread_id": thread}}
        out = app.invoke(Command(resume=True), cfg)
        if out["messages"][-1].content != f"Done after {calls} calls.":
            raise RuntimeError(f"resume ended with {out['messages'][-1]!r}")

    warm_app = build(model_class(calls=calls, gate=True, next_index=calls + 1), saver)
    resume_one(warm_app, threads.pop())  # warm-up
    warm = [timed(lambda t=t: resume_one(warm_app, t))[0] for t in threads[:repeats]]
    cold = []
    for thread in threads[repeats : 2 * repeats]:

        def cold_resume(t: str = thread) -> None:
            fresh_saver, fresh_connection = sqlite_saver(path)
            resume_one(build(model_class(calls=calls, gate=True, next_index=calls + 1), fresh_saver), t)
            fresh_connection.close()

        cold.append(timed(cold_resume)[0])
    load = []
    for thread in threads[2 * repeats : 2 * repeats + 1] * repeats:
        load.append(timed(lambda t=thread: saver.get_tuple({"configurable": {"thread_id": t}}))[0])
    connection.close()
    return {
        "system": "langgraph-sqlite",
        "status": "ok",
        "history_steps": steps_of(calls),
        "load_ms": statistics.median(load) * 1000,
        "resume_ms": statistics.median(warm) * 1000,
        "resume_cold_ms": statistics.median(cold) * 1000,
        "resume_runs_ms": [round(w * 1000, 3) for w in warm],
    }


def scale_section(
    system: str, ks: list[int], *, calls: int, repeats: int, workdir: Path, pg_url: str
) -> list[dict[str, Any]]:
    """Section 5 (bench_peers_scale.py); a peer that cannot run gives a row per K saying why."""
    try:
        from bench_peers_scale import scale

        return scale(system, ks, calls=calls, repeats=repeats, workdir=workdir, pg_url=pg_url)
    except Exception as error:  # noqa: BLE001
        traceback.print_exc()
        return [unavailable(describe_error(error), system=system, k=k) for k in ks]


def versions() -> dict[str, Any]:
    found = {}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version, "packages": found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("section", choices=["versions", "overhead", "growth", "resume", "scale"])
    parser.add_argument("--sizes", default="10,100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    parser.add_argument("--system", default="langgraph-sqlite")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--early", type=int, default=10)
    parser.add_argument("--late", type=int, default=100)
    parser.add_argument("--pg-url", default="")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    os.makedirs(args.dir, exist_ok=True)
    if args.section == "versions":
        emit(versions())
    elif args.section == "overhead":
        emit(overhead(sizes, args.repeats, args.dir, [s for s in args.systems.split(",") if s]))
    elif args.section == "growth":
        emit(growth(args.system, args.calls, args.early, args.late, args.dir))
    elif args.section == "scale":
        emit(
            scale_section(
                args.system, sizes, calls=args.calls, repeats=args.repeats, workdir=args.dir, pg_url=args.pg_url
            )
        )
    else:
        emit(resume(sizes, args.repeats, args.dir))


if __name__ == "__main__":
    main()
