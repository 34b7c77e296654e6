"""Section 6 of scripts/bench, scale-out: P ``tether worker`` processes on one PostgreSQL.

R runs of CALLS tool calls each are submitted (Runner.submit: run and job in one transaction)
once P worker processes (tether.drivers.worker.Worker, CONCURRENCY runs each) are ready; the
model answers after MODEL_DELAY (awaited). Measured per P, each in a database of its own:
runs/s and steps/s from the first submit to the last run done, database transactions per
step (pg_stat_database; every autocommit statement is one, so for tether's one-statement
steps it counts statements; procrastinate's fetches, heartbeats and polls are included), and
wasted model calls (calls the workers made minus answers committed). Reported as ratios to P=1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench_common import MODEL_DELAY, by_mode, describe_error, reply, unavailable

CALLS, CONCURRENCY = 3, 16
HERE = Path(__file__).resolve()


def scaleout_plan(mode: str) -> dict[str, Any]:
    return {"p": by_mode(mode, [1, 2, 4], [1, 2], [1, 2]), "runs": by_mode(mode, 200, 20, 4), "calls": CALLS}


def bench_agent() -> Any:
    """The agent every run and worker uses: a model answering after MODEL_DELAY, a tool that returns at once."""
    from tether import Agent, tool
    from tether.models import ModelRequest, ModelResponse
    from tether.testing import ScriptedModel

    class SlowModel(ScriptedModel):
        made = 0

        async def acomplete(self, request: ModelRequest) -> ModelResponse:
            SlowModel.made += 1  # a call is paid for once made, whether or not its answer is kept
            await asyncio.sleep(MODEL_DELAY)
            return self.complete(request)

    @tool
    def echo(i: int) -> str:
        """Echo."""
        return f"echo {i}"

    return Agent(model=SlowModel([reply(i, CALLS) for i in range(CALLS + 1)]), tools=[echo])


def worker_main(url: str) -> None:
    """A worker process: drive runs until SIGTERM, then print the model calls it made."""
    from tether.drivers.worker import Worker

    agent = bench_agent()
    worker = Worker(url, agent=agent, concurrency=CONCURRENCY, stalled_after=30)

    async def serve() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()

    started = time.process_time()  # after the imports: the CPU of driving runs, not of starting Python
    asyncio.run(serve())
    print(json.dumps({"model_calls": type(agent.model).made, "cpu_s": time.process_time() - started}))


def _database_url(base_url: str, name: str) -> str:
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _libpq(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(scheme="postgresql"))


def _scalar(url: str, query: str) -> Any:
    import psycopg

    with psycopg.connect(_libpq(url)) as connection:
        row = connection.execute(query).fetchone()
        return None if row is None else row[0]


def measure(base_url: str, p: int, runs: int) -> dict[str, Any]:
    """One point: P worker processes drive ``runs`` submitted runs in a fresh database."""
    import psycopg

    from tether import Runner
    from tether.drivers.queue import ensure_schema
    from tether.stores.sql import SQLStore

    name = f"tether_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(base_url), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _database_url(base_url, name)
    workers: list[subprocess.Popen[str]] = []
    try:
        store = SQLStore(url)
        runner = Runner(bench_agent(), store)
        ensure_schema(url)
        store.list_runs(limit=1)  # tether's tables too, before the clock starts
        workers = [
            subprocess.Popen(
                [sys.executable, str(HERE), "worker", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(p)
        ]
        deadline = time.monotonic() + 60
        while _scalar(url, "SELECT count(*) FROM procrastinate_workers") < p:
            exited = [w for w in workers if w.poll() is not None]
            if exited:
                raise RuntimeError(f"a worker exited: {exited[0].communicate()[1][-300:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start within 60 s")
            time.sleep(0.05)
        stats = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        before = _scalar(url, stats)
        started = time.perf_counter()
        for i in range(runs):
            runner.submit(f"task {i}")
        while _scalar(url, "SELECT count(*) FROM tether_run WHERE status = 'done'") < runs:
            if time.perf_counter() - started > 300 or any(w.poll() is not None for w in workers):
                raise RuntimeError("runs did not finish")
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        time.sleep(0.6)  # pg_stat_database is updated by each backend at most every 500 ms
        transactions = _scalar(url, stats) - before
        committed = _scalar(url, "SELECT count(*) FROM tether_event WHERE type = 'model_responded'")
        steps = committed + _scalar(url, "SELECT count(*) FROM tether_event WHERE type = 'tool_finished'")
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        ends = [json.loads(w.communicate(timeout=60)[0].strip().splitlines()[-1]) for w in workers]
        made = sum(end["model_calls"] for end in ends)
        store.close()
        return {
            "system": "tether-workers",
            "p": p,
            "status": "ok",
            "runs": runs,
            "seconds": round(seconds, 3),
            "runs_per_s": round(runs / seconds, 2),
            "steps_per_s": round(steps / seconds, 1),
            "transactions_per_step": round(transactions / steps, 2),
            "worker_cpu_ms_per_step": round(sum(end["cpu_s"] for end in ends) * 1000 / steps, 2),
            "load_average": round(os.getloadavg()[0], 1),
            "model_calls": made,
            "wasted_model_calls": made - committed,
        }
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        with psycopg.connect(_libpq(base_url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def section_scaleout(mode: str, base_url: str, pg_error: str | None, log: Any) -> list[dict[str, Any]]:
    plan = scaleout_plan(mode)
    rows = []
    for p in plan["p"]:
        if pg_error:
            rows.append(unavailable(pg_error, system="tether-workers", p=p))
            continue
        log(f"scale-out: {p} worker process(es), {plan['runs']} runs")
        try:
            rows.append(measure(base_url, p, plan["runs"]))
        except Exception as error:  # noqa: BLE001 - a failed point is a row saying why
            rows.append(unavailable(describe_error(error), system="tether-workers", p=p))
    base = next((r for r in rows if r["status"] == "ok" and r["p"] == 1), None)
    for row in rows:
        if base is not None and row["status"] == "ok":
            row["runs_ratio"] = round(row["runs_per_s"] / base["runs_per_s"], 2)
            row["steps_ratio"] = round(row["steps_per_s"] / base["steps_per_s"], 2)
    return rows


def report_scaleout(rows: list[dict[str, Any]], mode: str, fmt: Any, table: Any) -> list[str]:
    plan = scaleout_plan(mode)
    out = [
        f"\n### 6. Scale-out (P `tether worker` processes, {CONCURRENCY} runs each, one PostgreSQL; "
        f"{plan['runs']} runs of {CALLS} tool calls; model {MODEL_DELAY * 1000:.0f} ms)\n"
    ]
    body = []
    for row in rows:
        if row["status"] != "ok":
            body.append([str(row["p"]), "n/a", "-", "-", "-", "-", "-", row.get("why", "")[:60]])
            continue
        body.append(
            [
                str(row["p"]),
                f"{fmt(row['runs_per_s'], 1)} ({row.get('runs_ratio', 0):.2f}x)",
                f"{fmt(row['steps_per_s'], 1)} ({row.get('steps_ratio', 0):.2f}x)",
                fmt(row["transactions_per_step"], 2),
                fmt(row["worker_cpu_ms_per_step"], 2),
                str(row["model_calls"]),
                str(row["wasted_model_calls"]),
                f"load {row['load_average']}",
            ]
        )
    out.append(
        table(
            [
                "P",
                "runs/s (vs P=1)",
                "steps/s (vs P=1)",
                "DB transactions/step",
                "worker CPU ms/step",
                "model calls",
                "wasted",
                "",
            ],
            body,
        )
    )
    return out


def scaleout_targets(rows: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    ok = [r for r in rows if r["status"] == "ok"]
    found: list[dict[str, Any]] = []
    if not ok:
        return [{"target": "scale-out: 0 wasted model calls", "measured": "n/a", "met": None}]
    wasted = sum(r["wasted_model_calls"] for r in ok)
    found.append({"target": "scale-out: 0 wasted model calls", "measured": str(wasted), "met": wasted == 0})
    two = next((r for r in ok if r["p"] == 2 and "runs_ratio" in r), None)  # no ratio when P=1 failed
    if two is not None:
        row = {
            "target": "scale-out: 2 workers >= 1.6x the runs/s of 1 (near-linear until the 2 cores saturate)",
            "measured": f"{two['runs_ratio']:.2f}x",
            "met": two["runs_ratio"] >= 1.6,
        }
        if mode != "full":
            row.update(met=None, not_judged=mode)
        found.append(row)
    return found


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        sys.path.insert(0, str(HERE.parent))
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        worker_main(sys.argv[2])
