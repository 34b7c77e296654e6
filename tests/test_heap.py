"""The long-lived heap is frozen out of the garbage collector's full passes, once, by default.

Each check runs in a fresh interpreter: a freeze is process-wide and one-way, so it must not
leak into the test process (nor depend on what the tests before it imported).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from support import PgSchema, clean_env
from tether.stores.sql import SQLStore
from tether.surfaces.cli import main

pytestmark = pytest.mark.slow  # fresh interpreters and served processes

FROZEN_AT_EXIT = (
    "import atexit, gc, signal, sys\n"
    "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))"
)
"""Prefix of a ``python -c`` program: at its exit it says how many objects it froze. uvicorn raises
the SIGTERM it caught again once it has shut down: exiting on it lets the atexit hook run."""


def python(program: str) -> dict[str, int]:
    """Run ``program`` in a fresh interpreter; the JSON object it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=clean_env(), timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_helper_collects_then_freezes_what_is_alive() -> None:
    found = python(
        "import gc, json, tether\n"
        "before = gc.get_freeze_count()\n"
        "frozen = tether.freeze_startup_heap()\n"
        "print(json.dumps({'before': before, 'frozen': frozen, 'count': gc.get_freeze_count()}))"
    )
    assert found["before"] == 0
    assert found["frozen"] == found["count"] > 10_000  # tether's own imports, at least


AGENT = (
    "import gc, json\n"
    "from tether import Agent, AsyncRunner\n"
    "from tether.stores.memory import MemoryStore\n"
    "from tether.testing import ScriptedModel\n"
    "agent = Agent(model=ScriptedModel(['hi']))\n"
)


def test_an_async_runner_freezes_the_heap_once_by_default() -> None:
    found = python(
        AGENT + "AsyncRunner(agent, MemoryStore())\n"
        "first = gc.get_freeze_count()\n"
        "AsyncRunner(agent, MemoryStore())\n"
        "print(json.dumps({'first': first, 'second': gc.get_freeze_count()}))"
    )
    assert found["first"] > 10_000
    assert found["second"] == found["first"]  # one freeze per process, however many runners


def test_freeze_heap_false_leaves_the_collector_alone() -> None:
    found = python(
        AGENT
        + "AsyncRunner(agent, MemoryStore(), freeze_heap=False)\nprint(json.dumps({'count': gc.get_freeze_count()}))"
    )
    assert found["count"] == 0


def test_an_sdk_imported_at_the_first_call_joins_a_frozen_heap_only() -> None:
    program = (
        "import gc, json, tether\n"
        "{freeze}"
        "before = gc.get_freeze_count()\n"
        "import tether.models.anthropic_client, tether.models.openai_client\n"
        "print(json.dumps({{'before': before, 'after': gc.get_freeze_count()}}))"
    )
    frozen = python(program.format(freeze="tether.freeze_startup_heap()\n"))
    assert frozen["after"] - frozen["before"] > 50_000  # the SDKs' classes, functions, schemas
    untouched = python(program.format(freeze=""))
    assert untouched == {"before": 0, "after": 0}


def frozen_at_exit(
    tmp_path: Path, argv: list[str], ready: Callable[[str], bool], *, module: str = "tether.surfaces.cli"
) -> int:
    """Start ``main(argv)`` of ``module``, wait until a line of its output is ``ready``, SIGTERM it:
    the number of objects it had frozen when it exited."""
    program = f"{FROZEN_AT_EXIT}\nfrom {module} import main\nsys.exit(main({argv!r}))"
    with subprocess.Popen(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as served:
        assert served.stdout is not None
        seen = []
        for line in served.stdout:
            seen.append(line)
            if ready(line):
                break
        else:
            pytest.fail(f"never ready: {''.join(seen)}")
        served.send_signal(signal.SIGTERM)
        rest, _ = served.communicate(timeout=30)
    said = [line for line in rest.splitlines() if line.startswith("frozen ")]
    assert said, "".join(seen) + rest
    return int(said[-1].split()[1])


def test_tether_ui_freezes_its_heap_before_serving(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    SQLStore(db).list_runs()  # the database exists: the inspector reads one
    assert frozen_at_exit(tmp_path, ["ui", "--db", db, "--port", "0"], lambda line: "tether ui:" in line) > 10_000


def test_the_example_service_freezes_its_heap_before_serving(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"service-token-0123456789": "acme"}))
    argv = ["--tokens", str(tokens), "--port", "0", "--db", f"sqlite:///{tmp_path / 'runs.db'}"]
    ready = lambda line: "Application startup complete" in line  # noqa: E731 - uvicorn's line once it serves
    assert frozen_at_exit(tmp_path, argv, ready, module="tether.examples.service") > 10_000


@pytest.mark.postgres
def test_tether_worker_freezes_its_heap_before_serving(
    pg_schema: PgSchema, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "go", "--detach", "--db", pg_schema.url, "--model", "scripted-demo", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    done = f'"run_id": "{run_id}", "what": "done"'
    assert frozen_at_exit(tmp_path, ["worker", "--db", pg_schema.url, "--json"], lambda line: done in line) > 10_000
