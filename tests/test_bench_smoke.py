"""`scripts/bench --quick` runs end to end and writes the expected rows (timings are not judged)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TETHER_ROWS = ("floor-loop", "floor-sqlite", "tether-memory", "tether-sqlite", "tether-postgres")
PEER_ROWS = ("langgraph", "langgraph-sqlite", "langgraph-sqlite-sync", "pydantic-ai")


@pytest.mark.timeout(600)
def test_quick_bench_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    pg = os.environ.get("TETHER_TEST_PG_URL")
    if pg:
        env["TETHER_BENCH_PG_URL"] = pg
    done = subprocess.run(
        [str(ROOT / "scripts" / "bench"), "--quick", "--no-peers", "--json-out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=540, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())

    assert results["meta"]["mode"] == "quick"
    assert results["meta"]["machine"]["cores"] >= 1
    sizes = results["meta"]["plan"]["sizes"]
    assert sizes == [10, 100]

    overhead = {(row["system"], row["n"]): row for row in results["overhead"]}
    for system in TETHER_ROWS + PEER_ROWS:
        for n in sizes:
            assert (system, n) in overhead, (system, n)
    for system in ("floor-loop", "floor-sqlite", "tether-memory", "tether-sqlite"):
        for n in sizes:
            row = overhead[(system, n)]
            assert row["status"] == "ok", row
            assert row["ms_per_step"] > 0
            assert row["steps"] == 2 * n + 1
            assert row["ratio_a"] > 0
            assert row["ratio_b"] > 0
    for system in PEER_ROWS:
        assert overhead[(system, 10)]["status"] == "unavailable"
        assert overhead[(system, 10)]["why"]

    growth = {row["system"]: row for row in results["growth"]}
    assert growth["tether-sqlite"]["status"] == "ok", growth["tether-sqlite"]
    assert growth["tether-sqlite"]["wal_bytes_per_step_early"] > 0
    assert growth["tether-sqlite"]["wal_bytes_per_step_late"] > 0
    assert growth["tether-sqlite"]["db_bytes"] > 0
    assert growth["tether-memory"]["status"] == "ok"
    assert "langgraph-sqlite" in growth

    resume = {(row["system"], row["history_steps"]) for row in results["resume"]}
    assert ("tether-sqlite", 101) in resume
    assert ("tether-postgres", 101) in resume
    assert all(row["status"] == "ok" for row in results["resume"] if row["system"] == "tether-sqlite")

    concurrency = results["concurrency"]
    assert {(row["system"], row["k"]) for row in concurrency["async"]} >= {
        ("tether-memory", 1), ("tether-memory", 4), ("tether-sqlite", 1), ("tether-sqlite", 4)}
    assert {row["p"] for row in concurrency["processes"]} == {1, 2}

    assert {target["target"].split(" ")[0] for target in results["targets"]} >= {"tether-on-SQLite", "tether"}
    assert "### 1. Per-step overhead" in done.stdout
    assert "unavailable: skipped (--no-peers)" in done.stdout
