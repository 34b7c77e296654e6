"""Where a tether step on SQLite spends its time: one bench run profiled with pyinstrument.

  .venv/bin/python -m pip install pyinstrument     (a tool for this script, not a dependency)
  .venv/bin/python scripts/bench_profile.py [--calls 1000] [--tree]

Drives the bench's tether-on-SQLite run (scripts/bench.py: same scripted model, same tool,
same store settings) once to warm up, then once under pyinstrument, and prints the share of
the run's wall time spent in each part of a step. ``--tree`` also prints pyinstrument's call
tree. The profiler slows every call down, so read the shares, not the milliseconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # scripts/bench.py, importable through the path above

PARTS = {
    "SQLStore.append: the step's whole write": ("append", "tether/stores/sql.py"),
    "  pool checkout": ("connect", "sqlalchemy/engine/base.py"),
    "  COMMIT": ("__exit__", "sqlalchemy/engine/util.py"),
    "  the step's UPDATE and INSERT": ("_sqlite_step", "tether/stores/sql.py"),
    "    JSON encoding of the row and events": ("_dump_json", "tether/stores/sql.py"),
    "snapshots: taking one": ("take", "tether/core/snapshots.py"),
    "snapshots: writing one": ("save_snapshot", "tether/stores/sql.py"),
    "python-statemachine send()": ("send", "statemachine/statemachine.py"),
    "engine: next action": ("next_action", "tether/core/engine.py"),
    "engine: recording a step": ("record", "tether/core/engine.py"),
    "the tool": ("execute", "tether/tools/__init__.py"),
    "the scripted model": ("complete", "tether/models/scripted.py"),
}
"""Label → (function, path suffix) of the frames counted; nested labels are parts of the one above."""


def inclusive_time(frame: Any, function: str, path: str, *, inside: bool = False) -> float:
    """Wall time in calls of ``function`` (defined in ``path``), counting recursive calls once."""
    hit = frame.function == function and (frame.file_path or "").endswith(path)
    own = frame.time if hit and not inside else 0.0
    return own + sum(inclusive_time(child, function, path, inside=inside or hit) for child in frame.children)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="tool calls in the run (2N+1 steps)")
    parser.add_argument("--tree", action="store_true", help="also print pyinstrument's call tree")
    args = parser.parse_args()
    try:
        import pyinstrument
    except ImportError:
        print("needs pyinstrument: .venv/bin/python -m pip install pyinstrument", file=sys.stderr)
        return 2
    from tether import Runner

    with tempfile.TemporaryDirectory() as scratch:
        store = bench.open_sql_store(f"sqlite:///{scratch}/profile.db")
        bench.tether_run(Runner(bench.tether_agent(args.calls), store), args.calls)  # warm-up
        runner = Runner(bench.tether_agent(args.calls), store)
        profiler = pyinstrument.Profiler(interval=0.0005)
        profiler.start()
        bench.tether_run(runner, args.calls)
        profiler.stop()
        store.close()
    if args.tree:
        print(profiler.output_text(unicode=False, color=False))
    root = profiler.last_session.root_frame()
    steps = bench.steps_of(args.calls)
    print(
        f"pyinstrument {pyinstrument.__version__}: tether on SQLite, one run of {args.calls} tool calls "
        f"({steps} steps), {root.time / steps * 1000:.3f} ms per step under the profiler"
    )
    for label, (function, path) in PARTS.items():
        print(f"{label:42} {100 * inclusive_time(root, function, path) / root.time:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
