"""Reading runs starts quickly: the commands that only read never import a model SDK, the web
stack or the MCP client (each costs start-up time on every ``tether runs``).

What a command imported is only known in a process of its own: one process runs the reading
commands one after the other and reports every module it holds at the end.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from support import run_python
from tether.stores.sql import SQLStore

pytestmark = pytest.mark.slow  # one `tether` process

HEAVY = ("anthropic", "openai", "httpx2", "starlette", "uvicorn", "mcp", "jinja2")
"""What only running a model, serving the web UI or reaching an MCP server needs."""
READING = (["runs"], ["runs", "--json"], ["show", "run_nope"], ["pending"], ["audit"], ["diagram"])

DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from tether.surfaces.cli import main

    db, commands = sys.argv[1], json.loads(sys.argv[2])
    codes = []
    for command in commands:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            codes.append(main([*command, "--db", db]))
    print(json.dumps({"codes": codes, "modules": sorted({name.split(".")[0] for name in sys.modules})}))
    """
)


def test_reading_commands_import_no_model_sdk_web_stack_or_mcp(tmp_path: Path) -> None:
    SQLStore(f"sqlite:///{tmp_path / 'runs.db'}").list_runs()  # reading commands refuse a database not there
    done = run_python("-c", DRIVER, f"sqlite:///{tmp_path / 'runs.db'}", json.dumps(READING))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["codes"] == [0, 0, 2, 0, 0, 0]  # they ran (show: no such run)
    assert "sqlalchemy" in report["modules"]  # the report is real: the store was opened
    assert [name for name in HEAVY if name in report["modules"]] == []
