"""Each command starts only what it uses: reading and deciding import no model SDK, the web stack,
the MCP client or the tracer; a queued run imports no model SDK; a run imports its own provider's
SDK only, when its model is first called (each costs start-up time: the docs' start-up table).

What a command imported is only known in a process of its own: one process runs the commands
one after the other and reports every module it holds at the end (so none of them imported it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import PgSchema, clean_env, fake_api_env
from tether.testing import FakeChatCompletionsAPI, FakeMessagesAPI

pytestmark = pytest.mark.slow  # `tether` processes

MODEL_SDKS = ("anthropic", "openai", "httpx2")
"""The providers' SDKs and their HTTP client: imported by a model's first call."""
HEAVY = (*MODEL_SDKS, "starlette", "uvicorn", "mcp", "jinja2", "opentelemetry", "procrastinate")
"""What only running a model, serving the web UI, reaching an MCP server, tracing or queueing needs."""

DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from tether.surfaces.cli import main

    codes, outputs = [], []
    for command in json.loads(sys.argv[1]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            codes.append(main(command))
        outputs.append(out.getvalue())
    modules = sorted({name.split(".")[0] for name in sys.modules})
    print(json.dumps({"codes": codes, "outputs": outputs, "modules": modules}))
    """
)


@dataclass
class Report:
    """What one process running some commands returned, printed and imported."""

    codes: list[int]
    outputs: list[str]
    modules: list[str]

    def heavy(self, names: tuple[str, ...] = HEAVY) -> list[str]:
        return [name for name in names if name in self.modules]


def run_commands(*commands: list[str], **env: str) -> Report:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(commands)],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Report(**json.loads(done.stdout))


def test_importing_tether_imports_no_model_sdk_or_extra() -> None:
    script = "import json, sys, tether; print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))"
    done = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True, check=True)
    modules = json.loads(done.stdout)
    assert "statemachine" in modules  # the report is real: tether's own dependencies are there
    assert [name for name in HEAVY if name in modules] == []


def test_reading_and_deciding_commands_import_no_model_sdk_web_stack_mcp_or_tracer(tmp_path: Path) -> None:
    db = ["--db", f"sqlite:///{tmp_path / 'runs.db'}"]
    parked = run_commands(["demo", "--json", *db], ["demo", "--json", *db])  # two runs parked on run_python
    first, second = (json.loads(output)["run_id"] for output in parked.outputs)
    call = "toolu_demo_run"

    report = run_commands(
        ["runs", *db],
        ["runs", "--json", *db],
        ["show", first, *db],
        ["pending", *db],
        ["audit", *db],
        ["diagram", *db],
        ["approve", first, call, *db],
        ["deny", second, call, "--reason", "not now", *db],
        ["cancel", first, *db],
        ["gc", "--older-than", "1d", "--dry-run", *db],
    )
    assert report.codes == [0] * 10  # they ran and did what they say
    assert "sqlalchemy" in report.modules  # the report is real: the store was opened
    assert report.heavy() == []


def test_queueing_a_run_imports_no_model_sdk_whatever_its_model(pg_schema: PgSchema, tmp_path: Path) -> None:
    db = ["--db", pg_schema.url]
    report = run_commands(
        ["run", "hi", "--detach", "--json", *db],  # Claude, the default
        ["run", "hi", "--detach", "--json", "--model", "openai:gpt-test", *db],
    )
    assert report.codes == [0, 0]
    assert [json.loads(output)["status"] for output in report.outputs] == ["queued", "queued"]
    assert "procrastinate" in report.modules  # the report is real: the runs were queued
    assert report.heavy(MODEL_SDKS) == []


def test_a_claude_run_imports_the_anthropic_sdk_and_never_openai(api: FakeMessagesAPI, tmp_path: Path) -> None:
    api.reply_text("hello")
    report = run_commands(
        ["run", "hi", "--model", "claude-test", "--json", "--db", f"sqlite:///{tmp_path / 'runs.db'}"],
        **fake_api_env(api),
    )
    assert report.codes == [0]
    assert json.loads(report.outputs[0])["output"] == "hello"
    assert "anthropic" in report.modules
    assert "openai" not in report.modules


def test_an_openai_run_imports_the_openai_sdk_and_never_anthropic(
    chat_api: FakeChatCompletionsAPI, tmp_path: Path
) -> None:
    chat_api.reply_text("hello")
    report = run_commands(
        ["run", "hi", "--model", "openai:gpt-test", "--json", "--db", f"sqlite:///{tmp_path / 'runs.db'}"],
        OPENAI_API_KEY="test-key",
        OPENAI_BASE_URL=chat_api.url,
    )
    assert report.codes == [0]
    assert json.loads(report.outputs[0])["output"] == "hello"
    assert "openai" in report.modules
    assert "anthropic" not in report.modules
