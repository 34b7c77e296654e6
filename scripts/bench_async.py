"""Section 1b of scripts/bench: the CPU an async step costs next to a sync one, on SQLite, in one process.

One worker process imports both vendor SDKs (as a service calling them has), then measures,
interleaved so that the machine's load falls on each alike: ``Runner`` on ``SQLStore`` driving
one run at a time; ``AsyncRunner`` on ``AsyncSQLStore`` (SQLite on the store's own thread) driving
one run at a time, with an async tool; and ``AsyncRunner`` driving K runs at once whose model and
tool answer after the service-scale latencies (awaited). CPU is the process's (every thread: the
store's too) over the steps taken, median over the repeats; each async row is a ratio to the sync one.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import PROMPT, by_mode, describe_error, mode_flag, steps_of, unavailable

CALLS = 10
"""Tool calls per run (21 steps)."""
TARGET = 1.3
"""An async step's CPU may be at most this many times a sync step's (K runs at once, the issue's shape)."""
SYSTEMS = {
    "runner-sqlite": "Runner + SQLStore, one run at a time",
    "async-sqlite-k1": "AsyncRunner + AsyncSQLStore, one run at a time",
    "async-sqlite-k": "AsyncRunner + AsyncSQLStore, K runs at once (model 50 ms, tool 5 ms, awaited)",
}


def plan_of(mode: str) -> dict[str, int]:
    """K, the repeats, and the sequential runs per repeat."""
    return {"k": by_mode(mode, 64, 16, 2), "repeats": by_mode(mode, 7, 3, 1), "runs": by_mode(mode, 24, 8, 1)}


def measure(workdir: Path, mode: str) -> list[dict[str, Any]]:
    """Every row of the section (in this process: call it from a worker)."""
    from bench import open_async_sql_store, open_sql_store, tether_agent, tether_run
    from bench_scale import import_sdks, slow_agent

    from tether import AsyncRunner, Runner

    import_sdks(mode)
    plan = plan_of(mode)
    k, steps = plan["k"], steps_of(CALLS)
    store = open_sql_store(f"sqlite:///{workdir / 'sync-cost.db'}")
    runner = Runner(tether_agent(CALLS), store)
    cpu: dict[str, list[float]] = {name: [] for name in SYSTEMS}

    async def drive_async() -> None:
        astore = open_async_sql_store(f"sqlite:///{workdir / 'async-cost.db'}")
        one_at_a_time = AsyncRunner(tether_agent(CALLS, asynchronous=True), astore)  # freezes the heap (default)
        at_once = AsyncRunner(slow_agent(CALLS), astore)

        async def run(on: Any) -> None:
            result = await on.run(PROMPT)
            if result.status != "done":
                raise RuntimeError(f"run ended {result.status}: {result.error}")

        try:
            await asyncio.gather(run(one_at_a_time), *(run(at_once) for _ in range(4)))  # warm-up
            tether_run(runner, CALLS)
            for _ in range(plan["repeats"]):
                cpu["runner-sqlite"].append(per_step(lambda: [tether_run(runner, CALLS) for _ in range(plan["runs"])]))
                gc.collect()
                started = time.process_time()
                for _ in range(plan["runs"]):
                    await run(one_at_a_time)
                cpu["async-sqlite-k1"].append((time.process_time() - started) / plan["runs"])
                gc.collect()
                started = time.process_time()
                await asyncio.gather(*(run(at_once) for _ in range(k)))
                cpu["async-sqlite-k"].append((time.process_time() - started) / k)
        finally:
            await astore.close()

    try:
        asyncio.run(drive_async())
    finally:
        store.close()
    sync_ms = statistics.median(cpu["runner-sqlite"]) * 1000 / steps
    rows = []
    for name, runs in cpu.items():
        ms = statistics.median(runs) * 1000 / steps
        row = {"system": name, "status": "ok", "cpu_ms_per_step": ms, "ratio_to_sync": ms / sync_ms}
        row["k"] = 1 if name in ("runner-sqlite", "async-sqlite-k1") else k
        rows.append(row)
    return rows


def per_step(runs: Any) -> float:
    """CPU seconds per run of ``runs()`` (a list of runs), after a full collection."""
    gc.collect()
    started = time.process_time()
    count = len(runs())
    return (time.process_time() - started) / count


def section_async_cost(mode: str, workdir: Path, run_worker: Any) -> list[dict[str, Any]]:
    """The section, from a worker process of its own."""
    command = [sys.executable, str(Path(__file__).with_name("bench.py")), "--worker", "async-cost"]
    command += ["--dir", str(workdir), *mode_flag(mode)]
    found = run_worker(command, timeout=1200, system="async-sqlite-k")
    return found if isinstance(found, list) else [found]


def worker(workdir: Path, mode: str) -> list[dict[str, Any]]:
    try:
        return measure(workdir, mode)
    except Exception as error:  # noqa: BLE001 - a failure is a row
        return [unavailable(describe_error(error), system=name) for name in SYSTEMS]


def report_async_cost(rows: list[dict[str, Any]], fmt: Any, table: Any) -> list[str]:
    out = [
        f"\n### 1b. An async step's CPU next to a sync one (SQLite; runs of {CALLS} tool calls; both SDKs imported)\n"
    ]
    body = []
    for row in rows:
        label = SYSTEMS.get(row["system"], row["system"]).replace("K runs", f"K={row.get('k')} runs")
        if row["status"] != "ok":
            body.append([label, "n/a", "-"])
            continue
        body.append([label, fmt(row["cpu_ms_per_step"], 3), f"{row['ratio_to_sync']:.2f}x"])
    out.append(table(["driver", "CPU ms per step", "vs Runner"], body))
    out.extend(f"- {r['system']}: n/a: {r['why']}" for r in rows if r["status"] != "ok")
    return out


def async_cost_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    at_once = next((r for r in rows if r["system"] == "async-sqlite-k"), None)
    target = f"an async step's CPU <= {TARGET}x a sync step's (SQLite, K runs at once vs Runner)"
    if at_once is None or at_once["status"] != "ok":
        return [{"target": target, "measured": f"n/a: {at_once['why'] if at_once else 'not measured'}", "met": None}]
    one = next(r for r in rows if r["system"] == "async-sqlite-k1")
    measured = (
        f"{at_once['ratio_to_sync']:.2f}x at K={at_once['k']} ({at_once['cpu_ms_per_step']:.3f} ms); "
        f"{one['ratio_to_sync']:.2f}x one at a time"
    )
    return [{"target": target, "measured": measured, "met": at_once["ratio_to_sync"] <= TARGET}]
