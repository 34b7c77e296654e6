"""Where a step's CPU goes, sync next to async: both drivers on SQLite, profiled per thread.

  .venv/bin/python scripts/bench_cost.py [--calls 10] [--runs 30] [--top 0]

Drives the bench's runs (scripts/bench.py: same scripted model, same tool, same store settings)
with ``Runner`` on ``SQLStore`` and with ``AsyncRunner`` on ``AsyncSQLStore`` (one run at a time,
an async tool), under cProfile with each thread's CPU clock (``time.thread_time``): the loop's
thread and the SQLite store's thread are profiled apart and added up. Prints CPU ms per step by
the part of the code each function belongs to (its own time, so the parts add up to the whole),
and with ``--top N`` the N functions that differ most. The profiler slows every call down:
read the shares and the differences, not the milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # scripts/bench.py, importable through the path above

PARTS = (
    ("python-statemachine", ("statemachine/",)),
    ("tether: flow, engine, state", ("tether/core/",)),
    ("tether: runners", ("tether/drivers/",)),
    ("tether: store (statements, JSON)", ("tether/stores/",)),
    ("tether: facts, tools, policy, models", ("tether/",)),
    ("SQLAlchemy", ("sqlalchemy/",)),
    ("sqlite3 (execute, commit)", ("sqlite3.",)),
    (
        "the hop: asyncio, threads, queues, sockets",
        ("asyncio/", "selectors", "concurrent/", "threading", "queue", "socket", "select."),
    ),
    ("pydantic, json", ("pydantic", "json/", "json.")),
)
"""Label -> substrings of a function's file (or built-in's name); the first that matches wins."""


def part_of(key: tuple[str, int, str]) -> str:
    where = f"{key[0]} {key[2]}"
    for label, needles in PARTS:
        if any(needle in where for needle in needles):
            return label
    return "other (builtins, contextlib, logging...)"


def cpu_by_part(stats: pstats.Stats, steps: int) -> Counter[str]:
    found: Counter[str] = Counter()
    for key, (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        found[part_of(key)] += own * 1000 / steps
    return found


def by_function(stats: pstats.Stats, steps: int) -> Counter[str]:
    found: Counter[str] = Counter()
    for (path, line, name), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        found[f"{path.split('site-packages/')[-1].split('/src/')[-1]}:{line}({name})"] += own * 1000 / steps
    return found


def profile_sync(workdir: str, calls: int, runs: int) -> pstats.Stats:
    from tether import Runner

    store = bench.open_sql_store(f"sqlite:///{workdir}/sync.db")
    runner = Runner(bench.tether_agent(calls), store)
    bench.tether_run(runner, calls)  # warm-up
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    for _ in range(runs):
        bench.tether_run(runner, calls)
    profiler.disable()
    store.close()
    return pstats.Stats(profiler)


def profile_async(workdir: str, calls: int, runs: int) -> pstats.Stats:
    from tether import AsyncRunner

    async def main() -> pstats.Stats:
        store = bench.open_async_sql_store(f"sqlite:///{workdir}/async.db")
        runner = AsyncRunner(bench.tether_agent(calls, asynchronous=True), store)

        async def one() -> None:
            result = await runner.run(bench.PROMPT)
            assert result.status == "done", result.error

        await one()  # warm-up; the store's thread exists from here on
        loop, on_loop, on_store = (
            asyncio.get_running_loop(),
            cProfile.Profile(time.thread_time),
            cProfile.Profile(time.thread_time),
        )
        await loop.run_in_executor(store._sqlite_thread, on_store.enable)
        on_loop.enable()
        for _ in range(runs):
            await one()
        on_loop.disable()
        await loop.run_in_executor(store._sqlite_thread, on_store.disable)
        await store.close()
        return pstats.Stats(on_loop, on_store)

    return asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10, help="tool calls per run (2N+1 steps)")
    parser.add_argument("--runs", type=int, default=30, help="runs profiled per driver")
    parser.add_argument("--top", type=int, default=0, help="also list the N functions whose CPU differs most")
    args = parser.parse_args()
    steps = bench.steps_of(args.calls) * args.runs
    with tempfile.TemporaryDirectory() as workdir:
        sync, asynchronous = profile_sync(workdir, args.calls, args.runs), profile_async(workdir, args.calls, args.runs)
    parts = {"Runner": cpu_by_part(sync, steps), "AsyncRunner": cpu_by_part(asynchronous, steps)}
    print(f"CPU ms per step under cProfile (thread clocks), runs of {args.calls} tool calls, {args.runs} runs each")
    print("| part | Runner + SQLStore | AsyncRunner + AsyncSQLStore |\n|---|---|---|")
    for label in [*(label for label, _ in PARTS), "other (builtins, contextlib, logging...)"]:
        print(f"| {label} | {parts['Runner'][label]:.3f} | {parts['AsyncRunner'][label]:.3f} |")
    totals = {name: sum(found.values()) for name, found in parts.items()}
    ratio = totals["AsyncRunner"] / totals["Runner"]
    print(f"| **total** | **{totals['Runner']:.3f}** | **{totals['AsyncRunner']:.3f}** ({ratio:.2f}x) |")
    calls = {name: stats.total_calls / steps for name, stats in (("sync", sync), ("async", asynchronous))}  # type: ignore[attr-defined]
    print(f"function calls per step: Runner {calls['sync']:.0f}, AsyncRunner {calls['async']:.0f}")
    if args.top:
        one, other = by_function(sync, steps), by_function(asynchronous, steps)
        keys = sorted(set(one) | set(other), key=lambda k: -abs(other[k] - one[k]))[: args.top]
        for key in keys:
            print(f"{other[key] - one[key]:+.4f} ms  (sync {one[key]:.4f}, async {other[key]:.4f})  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
