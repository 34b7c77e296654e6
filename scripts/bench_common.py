"""What every benchmark process shares: the scripted model, the tool, timing and memory helpers.

Imported by scripts/bench.py (in .venv, with tether) and by scripts/bench_peers.py (in the
peer venv, without tether), so it depends on the standard library only. Every system under
test gets its model replies from :func:`reply`, so they all see the same Messages API turns.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

PROMPT = "Call the echo tool until you are done."
SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL")
"""tether's SQLite settings (stores/sql.py); every SQLite row of the bench uses them."""


def by_mode(mode: str, full: T, quick: T, smoke: T) -> T:
    """A plan's value for the run's mode: ``full``, ``quick`` (small; CI) or ``smoke``.

    ``smoke`` is the least that still runs every section's code and writes every row and
    target (tests/test_bench_smoke.py): its figures mean nothing.
    """
    return {"full": full, "quick": quick, "smoke": smoke}[mode]


def mode_flag(mode: str) -> list[str]:
    """The option that gives a worker process the run's mode (none for a full run)."""
    return [] if mode == "full" else [f"--{mode}"]


def reply(index: int, calls: int, *, gate: bool = False) -> dict[str, Any]:
    """The model's answer number ``index`` (0-based) in a run that makes ``calls`` tool calls.

    A Messages API response object: one ``tool_use`` of ``echo`` per turn until ``calls``
    turns asked for one, then a final text answer. No network, no sleep, O(1) per call.
    With ``gate``, turn ``calls`` asks for the ``gate`` tool (which needs a person's
    approval, so the run parks there) before the final answer.
    """
    if index < calls or (gate and index == calls):
        name = "echo" if index < calls else "gate"
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{index:06d}", "name": name, "input": {"i": index}}
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": f"Done after {calls} calls."}]
        stop = "end_turn"
    return {
        "id": f"msg_{index:06d}",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def echo(i: int) -> str:
    """The trivial tool: echo the number back."""
    return f"echo {i}"


def gate(i: int) -> str:
    """The gated tool of the resume benchmark (runs once a person approved it)."""
    return f"gate {i} passed"


def steps_of(calls: int) -> int:
    """Steps in a run with ``calls`` sequential tool calls: calls model turns + calls tool runs + the answer."""
    return 2 * calls + 1


# Timing -------------------------------------------------------------------------------------
def timed(function: Callable[[], Any]) -> tuple[float, float]:
    """Wall and CPU seconds of one call (after a full collection, so garbage is not billed late)."""
    gc.collect()
    cpu = time.process_time()
    wall = time.perf_counter()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def overhead_row(system: str, calls: int, run: Callable[[], Any], repeats: int) -> dict[str, Any]:
    """Median ms per step over ``repeats`` timed runs, after one untimed warm-up run."""
    run()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = timed(run)
        walls.append(wall)
        cpus.append(cpu)
    steps = steps_of(calls)
    return {
        "system": system,
        "n": calls,
        "steps": steps,
        "status": "ok",
        "ms_per_step": statistics.median(walls) * 1000 / steps,
        "ms_per_step_cpu": statistics.median(cpus) * 1000 / steps,
        "ms_per_step_min": min(walls) * 1000 / steps,
        "run_ms": [round(w * 1000, 3) for w in walls],
    }


def unavailable(why: str, **fields: Any) -> dict[str, Any]:
    """A row that could not be measured, and why (the bench goes on)."""
    return {**fields, "status": "unavailable", "why": why}


def describe_error(error: BaseException) -> str:
    """One line for an ``unavailable`` row."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}"[:300]


# Memory --------------------------------------------------------------------------------------
def rss_mib() -> float:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return peak_rss_mib()


def reset_peak_rss() -> None:
    """Restart the high-water mark here, so :func:`peak_rss_mib` covers only what follows (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def peak_rss_mib() -> float:
    """This process's high-water resident set size (VmHWM: ru_maxrss survives exec, so a child
    started by a big parent would report the parent's size)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def traced_peak_mib(function: Callable[[], Any]) -> float:
    """Peak Python heap allocated while ``function`` ran (tracemalloc), in MiB."""
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        function()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - base) / 2**20


# SQLite growth ---------------------------------------------------------------------------------
def no_autocheckpoint(connection: Any) -> None:
    """Keep every commit in the WAL, so its growth is exactly the bytes each commit wrote."""
    connection.execute("PRAGMA wal_autocheckpoint=0")


def wal_bytes(path: str) -> int:
    """Size of a SQLite database's write-ahead log."""
    try:
        return os.path.getsize(path + "-wal")
    except OSError:
        return 0


def db_size_after_checkpoint(path: str) -> int:
    """The database file's size once its WAL is folded in (what the data takes at rest)."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    return os.path.getsize(path) + wal_bytes(path)


def window_mean(per_step: list[int], at: int, width: int = 10) -> float | None:
    """Mean of the ``width`` per-step values from step ``at`` on (1-based; half model, half tool steps)."""
    chunk = per_step[at - 1 : at - 1 + width]
    if at < 1 or len(chunk) < width:
        return None
    return sum(chunk) / len(chunk)


def growth_summary(
    system: str,
    wal_per_step: list[int],
    payload_per_step: list[int],
    *,
    db_path: str,
    early: int,
    late: int,
    calls: int,
    rss_before: float,
    seconds: float,
) -> dict[str, Any]:
    """Bytes per step near ``early`` and ``late`` (10-step windows), DB size and memory."""
    wal_early, wal_late = window_mean(wal_per_step, early), window_mean(wal_per_step, late)
    pay_early, pay_late = window_mean(payload_per_step, early), window_mean(payload_per_step, late)
    return {
        "system": system,
        "status": "ok",
        "n": calls,
        "steps": len(wal_per_step),
        "early_step": early,
        "late_step": late,
        "wal_bytes_per_step_early": wal_early,
        "wal_bytes_per_step_late": wal_late,
        "wal_growth_ratio": (wal_late / wal_early) if wal_early and wal_late is not None else None,
        "payload_bytes_per_step_early": pay_early,
        "payload_bytes_per_step_late": pay_late,
        "payload_growth_ratio": (pay_late / pay_early) if pay_early and pay_late is not None else None,
        "wal_bytes_total": sum(wal_per_step),
        "db_bytes": db_size_after_checkpoint(db_path),
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak_rss_mib(),
        "seconds": seconds,
    }


def emit(data: Any) -> None:
    """The one JSON document a worker process prints on stdout."""
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


# Service scale (section 5) ---------------------------------------------------------------------
MODEL_DELAY = 0.05
"""Seconds the scale section's model takes to answer (a simulated API call, awaited)."""
TOOL_DELAY = 0.005
"""Seconds the scale section's tool awaits (simulated I/O)."""
LAG_INTERVAL = 0.005
"""How often the loop-lag probe asks to wake up."""


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, nearest rank) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def ideal_steps_per_s(k: int, calls: int) -> float:
    """K runs each taking one step per simulated latency: what waiting alone allows."""
    return k * steps_of(calls) / ((calls + 1) * MODEL_DELAY + calls * TOOL_DELAY)


class LagProbe:
    """Measures event-loop lag: how late a task asking to sleep LAG_INTERVAL wakes up.

    Anything that blocks the loop (a sync call, a long callback) shows up as oversleep.
    """

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: Any = None

    async def _watch(self) -> None:
        import asyncio

        while True:
            asked = time.perf_counter()
            await asyncio.sleep(LAG_INTERVAL)
            self.lags.append(time.perf_counter() - asked - LAG_INTERVAL)

    def start(self) -> None:
        import asyncio

        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        import asyncio

        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class GcWatch:
    """Counts the garbage collector's full passes (generation 2) while it watches, and times the longest.

    A full pass traverses every tracked object not frozen (:func:`gc.freeze`): with both vendor
    SDKs imported and nothing frozen, 150-400 ms on the loop each.
    """

    def __init__(self) -> None:
        self.passes = 0
        self.longest = 0.0
        """Wall seconds of the longest pass (what the loop waited)."""
        self.longest_cpu = 0.0
        """CPU seconds of the longest pass (its thread's clock: what a busy machine does not inflate)."""
        self._started = (0.0, 0.0)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = (time.perf_counter(), time.thread_time())
        else:
            self.passes += 1
            self.longest = max(self.longest, time.perf_counter() - self._started[0])
            self.longest_cpu = max(self.longest_cpu, time.thread_time() - self._started[1])

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


async def all_or_none(runs: Any) -> None:
    """Await every coroutine at once; the first failure cancels the rest and is raised as itself."""
    import asyncio

    try:
        async with asyncio.TaskGroup() as group:
            for run in runs:
                group.create_task(run)
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None


async def scale_point(
    system: str, k: int, calls: int, repeats: int, one_run: Callable[[list[float]], Any]
) -> dict[str, Any]:
    """K concurrent runs of ``calls`` tool calls, ``repeats`` times (once from K=256: they take long).

    The caller warmed up first.
    ``one_run(latencies)`` drives one run to its end, appending each step's latency in seconds.
    Throughput is the median over repeats; latencies and loop lags are pooled across them.
    """

    repeats = repeats if k < 256 else 1
    rates, latencies, lags, cpu_shares, rss_per_run = [], [], [], [], []
    watch = GcWatch()
    for _ in range(repeats):
        gc.collect()
        probe = LagProbe()
        before = rss_mib()
        reset_peak_rss()
        probe.start()
        cpu, wall = time.process_time(), time.perf_counter()
        with watch:
            await all_or_none(one_run(latencies) for _ in range(k))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        await probe.stop()
        lags.extend(probe.lags)
        rates.append(k * steps_of(calls) / wall)
        cpu_shares.append(cpu / wall)
        rss_per_run.append((peak_rss_mib() - before) * 1024 / k)
    if len(latencies) != repeats * k * steps_of(calls):
        raise RuntimeError(f"{len(latencies)} steps timed, expected {repeats * k * steps_of(calls)}")
    rate = statistics.median(rates)
    ideal = ideal_steps_per_s(k, calls)
    return {
        "system": system,
        "status": "ok",
        "k": k,
        "calls_per_run": calls,
        "steps_per_s": rate,
        "ideal_steps_per_s": ideal,
        "ratio_to_ideal": rate / ideal,
        "cpu_share": statistics.median(cpu_shares),
        "step_p50_ms": percentile(latencies, 50) * 1000,  # type: ignore[operator]
        "step_p99_ms": percentile(latencies, 99) * 1000,  # type: ignore[operator]
        "lag_p99_ms": (percentile(lags, 99) or 0.0) * 1000,
        "lag_max_ms": max(lags, default=0.0) * 1000,
        "peak_rss_kib_per_run": max(rss_per_run),
        "gc_full_passes": watch.passes,
        "gc_full_longest_ms": watch.longest * 1000,
        "gc_full_longest_cpu_ms": watch.longest_cpu * 1000,
        "gc_frozen_objects": gc.get_freeze_count(),
        "repeats": repeats,
        "rates": [round(r, 1) for r in rates],
    }


async def parked_memory(system: str, parked: int, park_all: Callable[[], Any]) -> dict[str, Any]:
    """What ``parked`` runs awaiting approval leave held in this process once parked.

    ``await park_all()`` parks ``parked`` runs and keeps nothing (not even their results). First
    the RSS growth (it also counts the database driver's page cache and the allocator's free
    lists), then, parking as many again under tracemalloc, the Python heap still held after a
    full collection (the target's measure).
    """
    import tracemalloc

    gc.collect()
    rss_before = rss_mib()
    await park_all()
    gc.collect()
    rss_growth = rss_mib() - rss_before
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        await park_all()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    return {
        "system": system,
        "status": "ok",
        "parked": parked,
        "held_bytes_per_run": held / parked,
        "rss_kib_per_run": rss_growth * 1024 / parked,
    }
