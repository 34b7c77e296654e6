"""``scripts/demo`` on a fresh checkout: it says it installs, installs the runtime only, and runs the demo.

A newcomer's first command: it must not install the test toolchain (dev tools, Node packages, a
browser) nor any extra, and a second run starts the demo at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import FIBONACCI

pytestmark = pytest.mark.slow  # a venv and pip install of tether's runtime (from pip's cache once warm)

ROOT = Path(__file__).resolve().parents[1]
NOT_THE_RUNTIME = (
    *("pytest", "pytest-xdist", "pexpect", "mypy", "ruff", "blockbuster", "playwright", "build", "uv"),  # dev
    *("psycopg", "greenlet", "procrastinate", "starlette", "uvicorn", "jinja2", "openai", "mcp", "jsonschema"),
    "opentelemetry-sdk",  # the extras' own packages
)


def fresh_checkout(where: Path) -> Path:
    """The files a clone of this tree has (tracked, and new ones not ignored), without its .venv or node_modules."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name)
    return where


def newcomer_env() -> dict[str, str]:
    """A shell's environment with nothing of this suite's venv (PATH, VIRTUAL_ENV) or settings in it."""
    suite = str(Path(sys.executable).parent)
    path = [folder for folder in os.environ.get("PATH", "").split(os.pathsep) if folder != suite]
    leaks = ("ANTHROPIC", "OPENAI", "TETHER", "PYTHON", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(leaks)}, "PATH": os.pathsep.join(path)}


def test_the_demo_of_a_fresh_checkout_installs_the_runtime_only(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    checkout = fresh_checkout(tmp_path / "tether")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def demo() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(checkout / "scripts" / "demo"), "--approve-all", "--json"],
            cwd=elsewhere,
            env=newcomer_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    first = demo()
    assert first.returncode == 0, first.stderr
    assert "installing tether and its runtime dependencies into .venv" in first.stderr
    assert FIBONACCI in json.loads(first.stdout)["output"]

    listing = [str(checkout / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format", "json"]
    installed = {row["name"].lower() for row in json.loads(subprocess.check_output(listing, env=newcomer_env()))}
    assert {"tether", "anthropic", "sqlmodel", "rich"} <= installed
    assert sorted(installed & set(NOT_THE_RUNTIME)) == []
    assert not (checkout / "tests" / "mermaid" / "node_modules").exists()

    again = demo()
    assert again.returncode == 0, again.stderr
    assert again.stderr == ""  # installed already: straight to the demo
    assert json.loads(again.stdout)["status"] == "done"
