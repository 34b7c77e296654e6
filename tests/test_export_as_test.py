"""`tether export RUN --as-test PATH` writes a pytest module that replays the run offline.

End to end, as a user does it: a run made by `tether run` in a project directory is exported, the
test passes in its own pytest process, and a changed tool schema or system prompt makes it fail
with a readable diff. Secrets are scrubbed from both files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import Cli, clean_env, runs_made
from tether.redact import MASK

SHOP = '''\
from tether import tool


@tool
def lookup(order_id: str) -> dict:
    """Find an order by its id."""
    return {"order_id": order_id, "price": 30.0, "status": "delivered"}


@tool(approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order, in full or in part."""
    return f"refunded {amount} for order {order_id}"


TOOLS = [lookup, refund]
'''
SCRIPT: list[dict[str, Any]] = [
    {"content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"order_id": "42"}}]},
    {"content": [{"type": "tool_use", "id": "toolu_2", "name": "refund", "input": {"order_id": "42", "amount": 30.0}}]},
    {"content": [{"type": "text", "text": "Order 42 is refunded."}], "stop_reason": "end_turn"},
]
SYSTEM = "You help customers with their orders."
SECRET = "sk-ant-secret-0123456789"


def project(tmp_path: Path) -> Cli:
    """A project directory with a tools module and a scripted model, and one run made there."""
    (tmp_path / "shop.py").write_text(SHOP)
    replies = [{**reply, "stop_reason": reply.get("stop_reason", "tool_use")} for reply in SCRIPT]
    (tmp_path / "script.json").write_text(json.dumps(replies))
    cli = Cli(tmp_path)
    ran = cli(
        "run", "--tools", "shop:TOOLS", "--model", "scripted:script.json", "--system", SYSTEM, "--approve-all",
        f"Refund order 42, my key is {SECRET}",
    )  # fmt: skip
    assert ran.returncode == 0, ran
    return cli


def pytest_in(where: Path, test: str) -> subprocess.CompletedProcess[str]:
    """``pytest TEST`` in a process of its own, as a user (or CI) runs the exported test."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", test],
        cwd=where,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_an_exported_run_passes_offline_and_fails_with_a_diff_after_a_breaking_change(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]

    exported = cli("export", run_id, "--as-test", "tests/test_refund.py", env={"SHOP_API_KEY": SECRET})

    assert exported.returncode == 0, exported
    assert "wrote tests/test_refund.py and tests/test_refund.json" in exported.stdout
    test, recording = tmp_path / "tests/test_refund.py", (tmp_path / "tests/test_refund.json").read_text()
    assert SECRET not in recording
    assert SECRET not in test.read_text()
    assert f"my key is {MASK}" in recording
    passed = pytest_in(tmp_path, "tests/test_refund.py")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "1 passed" in passed.stdout

    (tmp_path / "shop.py").write_text(SHOP.replace("def lookup(order_id: str)", "def lookup(order_id: int)"))
    broken = pytest_in(tmp_path, "tests/test_refund.py")

    assert broken.returncode == 1, broken.stdout
    failure = broken.stdout
    assert "model call #1: the request differs from the recorded one" in failure
    assert "tool 'lookup': input schema changed" in failure
    assert '-      "type": "string"' in failure
    assert '+      "type": "integer"' in failure
    assert 'call 1: expected lookup {"order_id":"42"}, got (no call)' in failure


@pytest.mark.slow
def test_an_exported_test_fails_when_the_system_prompt_changes(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]
    assert cli("export", run_id, "--as-test", "regressions/test_refund.py").returncode == 0
    test = tmp_path / "regressions/test_refund.py"
    test.write_text(test.read_text().replace(repr(SYSTEM), repr("You help customers. Never refund.")))

    broken = pytest_in(tmp_path / "regressions", "test_refund.py")  # from another directory too

    assert broken.returncode == 1, broken.stdout
    assert "system prompt changed" in broken.stdout
    assert "-You help customers with their orders." in broken.stdout
    assert "+You help customers. Never refund." in broken.stdout


def test_an_agent_of_the_users_program_can_be_named(tmp_path: Path) -> None:
    cli = project(tmp_path)
    (tmp_path / "agents.py").write_text(
        textwrap.dedent(f"""\
            from tether import Agent
            from tether.models.scripted import ScriptedModel
            from shop import TOOLS

            def support():
                return Agent(model=ScriptedModel([]), tools=TOOLS, system={SYSTEM!r},
                             model_name="scripted:{tmp_path / "script.json"}")
        """)
    )
    run_id = runs_made(cli)[0]["run_id"]

    assert cli("export", run_id, "--as-test", "test_support.py", "--agent", "agents:support").returncode == 0

    written = (tmp_path / "test_support.py").read_text()
    assert "AGENT = 'agents:support'" in written
    namespace: dict[str, object] = {"__file__": str(tmp_path / "test_support.py")}
    sys.path.insert(0, str(tmp_path))
    try:
        exec(compile(written, "test_support.py", "exec"), namespace)  # the test module, as pytest runs it
        test = namespace[f"test_run_{run_id}_replays_the_same"]
        assert callable(test)
        test()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("shop", None)


def test_bad_exports_are_refused_in_one_line_and_write_nothing(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]

    not_python = cli("export", run_id, "--as-test", "test_refund.txt")
    missing = cli("export", "run_nope", "--as-test", "test_nope.py")
    assert cli("export", run_id, "--as-test", "test_refund.py").returncode == 0
    again = cli("export", run_id, "--as-test", "test_refund.py")

    assert (not_python.returncode, missing.returncode, again.returncode) == (2, 2, 2)
    assert "a test module's name ends with .py" in not_python.err
    assert "run_nope" in missing.err
    assert "already exist: pass --force" in again.err
    assert not (tmp_path / "test_refund.txt").exists()
    assert not (tmp_path / "test_nope.py").exists()
    assert cli("export", run_id, "--as-test", "test_refund.py", "--force").returncode == 0
