"""Section 5 of scripts/bench, service scale: K concurrent runs in one process, on an awaited store.

Each run makes 10 tool calls; the model answers after a simulated MODEL_DELAY (awaited) and
the tool awaits TOOL_DELAY, so a run spends its time waiting, as a service's runs do. Measured
per K: steps/s against the ideal (every run making one step per simulated latency), step
latency p50/p99, event-loop lag p99 (bench_common.LagProbe), peak RSS per run in flight;
then what a run parked at an approval gate leaves in memory. tether runs on AsyncRunner with
AsyncSQLStore (SQLite on the store's own thread, PostgreSQL through psycopg async); the peers run
the same workload in bench_peers_scale.py. Each store runs in its own worker process.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import (
    MODEL_DELAY,
    PROMPT,
    TOOL_DELAY,
    by_mode,
    describe_error,
    echo,
    gate,
    mode_flag,
    parked_memory,
    reply,
    scale_point,
    unavailable,
)

SYSTEMS = ("tether-sqlite", "tether-postgres")
UNFROZEN = "tether-sqlite-unfrozen"
"""tether-sqlite at K = TARGET_K with ``AsyncRunner(freeze_heap=False)``: what the heap freeze saves."""
PEER_SYSTEMS = ("langgraph-sqlite", "langgraph-postgres", "pydantic-ai")
LABELS = {
    "tether-sqlite": "tether, AsyncRunner + AsyncSQLStore (SQLite, own thread)",
    "tether-postgres": "tether, AsyncRunner + AsyncSQLStore (psycopg async)",
    UNFROZEN: "tether, same (SQLite), freeze_heap=False",
    "langgraph-sqlite": "LangGraph astream + AsyncSqliteSaver",
    "langgraph-postgres": "LangGraph astream + AsyncPostgresSaver",
    "pydantic-ai": "Pydantic AI agent.iter (async, no persistence)",
}
SAME_STORE = {"tether-sqlite": "langgraph-sqlite", "tether-postgres": "langgraph-postgres"}
TARGET_K = 256
"""The throughput target is judged at this K (with --quick or --smoke, the largest K is shown, not judged)."""


def slow_agent(calls: int, *, gate_tool: bool = False) -> Any:
    """An agent whose model answers after MODEL_DELAY and whose tool awaits TOOL_DELAY."""
    import tether
    from tether import Agent, Limits
    from tether.models import ModelRequest, ModelResponse
    from tether.testing import ScriptedModel

    class SlowModel(ScriptedModel):
        """The scripted turns, each after a simulated API call (awaited: it never blocks the loop)."""

        async def acomplete(self, request: ModelRequest) -> ModelResponse:
            await asyncio.sleep(MODEL_DELAY)
            return self.complete(request)

    class _Discard(list):  # type: ignore[type-arg]
        def append(self, item: Any) -> None:  # a real adapter keeps no request log
            pass

    model = SlowModel(lambda request: reply(request.invocation, calls, gate=gate_tool))
    model.requests = _Discard()

    @tether.tool(name="echo")
    async def slow_echo(i: int) -> str:
        """The trivial tool, after awaiting simulated I/O."""
        await asyncio.sleep(TOOL_DELAY)
        return echo(i)

    tools = [slow_echo]
    if gate_tool:
        tools.append(tether.tool(approval=True)(gate))
    return Agent(model=model, tools=tools, limits=Limits(max_steps=calls + 5))


def import_sdks(mode: str) -> None:
    """Both vendor SDKs, imported as a service that calls them has: ~170,000 more objects on the heap.

    Not with --smoke: its figures mean nothing, and the imports take 1.5 s of CPU in each worker.
    """
    if mode == "smoke":
        return
    import anthropic  # noqa: F401, TID251 - the host service imports it, for the objects it leaves
    import openai  # noqa: F401, TID251


async def run_scale(
    system: str, url: str, ks: list[int], *, calls: int, repeats: int, parked: int, mode: str
) -> list[dict[str, Any]]:
    """Every K on one AsyncSQLStore, then the parked-run memory (in this worker process; none if ``parked`` is 0).

    Both SDKs are imported first (not with --smoke); the runner freezes the heap (its default)
    unless ``system`` is UNFROZEN.
    """
    import_sdks(mode)
    from tether import AsyncRunner
    from tether.stores.sql import AsyncSQLStore, SQLStore

    SQLStore(url, connect_timeout=5).close()  # creates the tables, outside the timed runs
    store = AsyncSQLStore(url, connect_timeout=5)
    runner = AsyncRunner(slow_agent(calls), store, freeze_heap=system != UNFROZEN)

    async def one_run(latencies: list[float]) -> None:
        state = await runner.create(PROMPT)
        async with runner.hold(state.id):
            while True:
                started = time.perf_counter()
                if not await runner.step(state):  # nothing left to do: not a step
                    break
                latencies.append(time.perf_counter() - started)
        if state.status != "done":
            raise RuntimeError(f"run ended {state.status}: {state.error}")

    rows = []
    try:
        await asyncio.gather(*(one_run([]) for _ in range(4)))  # warm-up: connections, caches
        for k in ks:
            print(f"[scale] {system} K={k}", file=sys.stderr, flush=True)
            try:
                rows.append(await scale_point(system, k, calls, repeats, one_run))
            except Exception as error:  # noqa: BLE001 - a K that fails (say, the pool's timeout) is a row
                rows.append(unavailable(f"K={k}: {describe_error(error)}", system=system, k=k))
        if parked:
            rows.append(await park_runs(system, store, parked))
    finally:
        await store.close()
    return rows


async def park_runs(system: str, store: Any, parked: int) -> dict[str, Any]:
    """Park ``parked`` runs at an approval gate (64 at a time), keeping nothing of them."""
    from tether import AsyncRunner

    parking = AsyncRunner(slow_agent(0, gate_tool=True), store, freeze_heap=False)  # frozen or not, as measured

    async def park_one() -> None:
        result = await parking.run(PROMPT)
        if result.status != "awaiting_approval":
            raise RuntimeError(f"the run did not park: {result.status} {result.error}")

    async def park(count: int) -> None:
        for start in range(0, count, 64):
            await asyncio.gather(*(park_one() for _ in range(min(64, count - start))))

    await park(min(64, parked))  # warm-up: statement caches, the pool
    print(f"[scale] {system} parking {parked} runs", file=sys.stderr, flush=True)
    return await parked_memory(system, parked, lambda: park(parked))


def worker(
    system: str, url: str, ks: list[int], *, calls: int, repeats: int, parked: int, mode: str
) -> list[dict[str, Any]]:
    return asyncio.run(run_scale(system, url, ks, calls=calls, repeats=repeats, parked=parked, mode=mode))


def section_scale(
    plan: Any, workdir: Path, pg_url: str | None, pg_error: str | None, *, peers: Any, run_worker: Any
) -> list[dict[str, Any]]:
    """tether on both stores (a worker process each), then the peers in the peer venv."""
    rows: list[dict[str, Any]] = []
    urls = {
        "tether-sqlite": f"sqlite:///{workdir / 'tether-scale.db'}",
        UNFROZEN: f"sqlite:///{workdir / 'tether-scale-unfrozen.db'}",
        "tether-postgres": pg_url,
    }
    for system in (*SYSTEMS, UNFROZEN):
        url = urls[system]
        ks, parked = plan.scale_k, plan.scale_parked
        if system == UNFROZEN:  # only where the target is judged: its stalls are what the freeze removes
            ks, parked = [max(k for k in plan.scale_k if k <= TARGET_K)], 0
        if url is None:
            rows.extend(unavailable(pg_error or "no PostgreSQL", system=system, k=k) for k in ks)
            rows.append(unavailable(pg_error or "no PostgreSQL", system=system, parked=parked))
            continue
        command = [
            sys.executable,
            str(Path(__file__).with_name("bench.py")),
            "--worker",
            "scale",
            "--system",
            system,
            "--pg-url",
            url,
            "--sizes",
            ",".join(map(str, ks)),
            "--calls",
            str(plan.scale_calls),
            "--repeats",
            str(plan.scale_repeats),
            "--runs",
            str(parked),
            *mode_flag(plan.mode),
        ]
        found = run_worker(command, timeout=1800, system=system, k=None)
        rows.extend(found if isinstance(found, list) else [found])
    rows.extend(peers.scale(plan, workdir, pg_url, pg_error))
    return rows


# Report and targets ----------------------------------------------------------------------------
def report_scale(rows: list[dict[str, Any]], plan: dict[str, Any], fmt: Any, table: Any) -> list[str]:
    out = [
        f"\n### 5. Service scale (one process; K concurrent runs of {plan['scale_calls']} tool calls; "
        f"model {MODEL_DELAY * 1000:.0f} ms, tool {TOOL_DELAY * 1000:.0f} ms, both awaited; "
        "the anthropic and openai SDKs imported)\n"
    ]
    points = [r for r in rows if "k" in r and r.get("k") is not None]
    body = []
    for row in points:
        name = LABELS.get(row["system"], row["system"])
        if row["status"] != "ok":
            body.append([name, str(row["k"]), "n/a", "-", "-", "-", "-", "-", "-", "-"])
            continue
        body.append(
            [
                name,
                str(row["k"]),
                fmt(row["steps_per_s"], 1),
                f"{fmt(row['ideal_steps_per_s'], 1)} ({row['ratio_to_ideal']:.0%})",
                f"{row['cpu_share']:.0%}",
                f"{fmt(row['step_p50_ms'], 1)} / {fmt(row['step_p99_ms'], 1)}",
                fmt(row["lag_p99_ms"], 2),
                fmt(row["lag_max_ms"], 1),
                fmt(row["peak_rss_kib_per_run"], 1),
                gc_passes(row, fmt),
            ]
        )
    out.append(
        table(
            [
                "system",
                "K",
                "steps/s",
                "ideal (ratio)",
                "CPU",
                "step p50 / p99 ms",
                "loop lag p99 ms",
                "lag max ms",
                "peak RSS KiB/run",
                "full GC passes (longest, wall / CPU ms)",
            ],
            body,
        )
    )
    parked = [r for r in rows if "parked" in r]
    out.append("")
    out.append(
        table(
            ["system", "parked runs", "held per parked run (traced heap)", "RSS growth per parked run"],
            [
                [
                    LABELS.get(r["system"], r["system"]),
                    str(r["parked"]),
                    f"{r['held_bytes_per_run'] / 1024:.2f} KiB" if r["status"] == "ok" else "n/a",
                    f"{r['rss_kib_per_run']:.2f} KiB" if r["status"] == "ok" else "n/a",
                ]
                for r in parked
            ],
        )
    )
    seen: dict[tuple[str, str], None] = {}
    for row in rows:
        if row.get("status") == "unavailable":
            seen.setdefault((row["system"], row["why"]), None)
    out.extend(f"- {system}: n/a: {why}" for system, why in seen)
    return out


def gc_passes(row: dict[str, Any], fmt: Any) -> str:
    """The full-GC column: how many passes, and the longest one's wall and CPU milliseconds."""
    if "gc_full_passes" not in row:
        return "-"
    return f"{row['gc_full_passes']} ({fmt(row['gc_full_longest_ms'], 1)} / {fmt(row['gc_full_longest_cpu_ms'], 1)})"


def scale_targets(rows: list[dict[str, Any]], plan: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """The section's targets, as ratios from this run (never timed assertions)."""
    found: list[dict[str, Any]] = []
    ok = {(r["system"], r.get("k")): r for r in rows if r["status"] == "ok" and r.get("k") is not None}
    judged_k = TARGET_K if TARGET_K in plan["scale_k"] else max(plan["scale_k"])
    not_judged = None if mode == "full" else mode  # too few K and repeats to judge

    def add(target: str, measured: str, met: bool | None) -> None:
        row: dict[str, Any] = {"target": target, "measured": measured, "met": met}
        if not_judged and met is not None:
            row.update(met=None, not_judged=not_judged)
        found.append(row)

    for system in SYSTEMS:
        point = ok.get((system, judged_k))
        target = f"{system} throughput at K={TARGET_K} >= 80% of ideal (K runs, a step per latency)"
        if point is None:
            add(target, f"n/a: {why_not(rows, system, judged_k)}"[:160], None)
        else:
            add(
                target,
                f"{point['steps_per_s']:,.0f} of {point['ideal_steps_per_s']:,.0f} steps/s = "
                f"{point['ratio_to_ideal']:.0%} at K={judged_k} (CPU {point['cpu_share']:.0%} of a core)",
                point["ratio_to_ideal"] >= 0.8,
            )
        peer = ok.get((SAME_STORE[system], judged_k))
        target = f"{system} >= 2x LangGraph's async throughput on the same store, K={TARGET_K}"
        if point is None or peer is None:
            add(target, f"n/a: {why_not(rows, system if point is None else SAME_STORE[system], judged_k)}"[:160], None)
        else:
            ratio = point["steps_per_s"] / peer["steps_per_s"]
            add(target, f"{ratio:.2f}x ({peer['steps_per_s']:,.0f} steps/s at K={judged_k})", ratio >= 2)
    frozen, unfrozen = ok.get(("tether-sqlite", judged_k)), ok.get((UNFROZEN, judged_k))
    target = f"tether-sqlite loop lag at K={TARGET_K}, both SDKs imported: p99 <= 10 ms and max <= 50 ms"
    if frozen is None:
        add(target, f"n/a: {why_not(rows, 'tether-sqlite', judged_k)}"[:160], None)
    else:
        without = (
            f"; freeze_heap=False: {unfrozen['lag_p99_ms']:.1f} / {unfrozen['lag_max_ms']:.0f} ms, "
            f"{unfrozen['gc_full_passes']} full GC passes of up to {unfrozen['gc_full_longest_cpu_ms']:.0f} ms CPU "
            f"(frozen: {frozen['gc_full_passes']}, up to {frozen['gc_full_longest_cpu_ms']:.0f} ms CPU)"
            if unfrozen
            else ""
        )
        add(
            target,
            f"p99 {frozen['lag_p99_ms']:.1f} ms, max {frozen['lag_max_ms']:.0f} ms at K={judged_k}{without}",
            frozen["lag_p99_ms"] <= 10 and frozen["lag_max_ms"] <= 50,
        )
    for system in SYSTEMS:
        lags = [r for (s, _), r in ok.items() if s == system]
        if lags:
            worst = max(lags, key=lambda r: r["lag_p99_ms"])
            add(
                f"{system} event-loop lag p99 <= 10 ms at every K",
                f"worst {worst['lag_p99_ms']:.1f} ms (K={worst['k']})",
                worst["lag_p99_ms"] <= 10,
            )
        parked = next((r for r in rows if r["system"] == system and "parked" in r and r["status"] == "ok"), None)
        if parked:
            add(
                f"{system} memory per parked run <= 50 KB",
                f"{parked['held_bytes_per_run'] / 1000:.1f} KB held (RSS "
                f"{parked['rss_kib_per_run'] * 1.024:.1f} KB) over {parked['parked']} runs",
                parked["held_bytes_per_run"] <= 50_000,
            )
    return found


def why_not(rows: list[dict[str, Any]], system: str, k: int) -> str:
    """Why ``system`` has no figure at ``k`` (the row's reason, else any of its reasons)."""
    reasons = [r for r in rows if r["system"] == system and r["status"] != "ok"]
    return next((r["why"] for r in reasons if r.get("k") == k), reasons[0]["why"] if reasons else "not measured")


def scale_ks(mode: str) -> list[int]:
    return by_mode(mode, [1, 16, 64, 256, 1024], [1, 16, 64], [2])
