"""The demo agent: real tools in a scratch directory, one of them behind an approval gate.

Offline, :class:`tether.models.demo.DemoScript` plays the model: fixed tool requests, and a final
answer that quotes what the tools really returned. With ``ANTHROPIC_API_KEY`` set, Claude drives the
same tools.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tether.errors import ConfigError
from tether.tools import tool

WORKSPACE_ENV = "TETHER_DEMO_WORKSPACE"
PROMPT = (
    "In the workspace, write a small Python program fib.py that prints the first 10 "
    "Fibonacci numbers, run it, and tell me what it printed."
)
SYSTEM = (
    "You are a careful coding agent. Use the tools to work in the workspace directory; "
    "running code needs a person's approval. Answer briefly."
)


def workspace() -> Path:
    """The scratch directory the tools may touch (``$TETHER_DEMO_WORKSPACE``)."""
    path = Path(os.environ.get(WORKSPACE_ENV, "tether-demo")).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file of that name, no permission: a usage error, not a traceback
        raise ConfigError(f"cannot use the demo workspace {path}: {error.strerror or error}") from None
    return path


def _inside(name: str) -> Path:
    root = workspace()
    target = (root / name).resolve()
    if root != target and root not in target.parents:
        raise PermissionError(f"{name!r} is outside the workspace {root}")
    return target


@tool
def write_file(path: str, content: str) -> str:
    """Write a text file in the workspace (creating or replacing it)."""
    target = _inside(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    return f"wrote {len(content.encode())} bytes to {path}"


@tool
def read_file(path: str) -> str:
    """Read a text file from the workspace."""
    return _inside(path).read_text(encoding="utf-8")


@tool
def list_files() -> list[str]:
    """List the files in the workspace."""
    root = workspace()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@tool(approval=True, timeout=30.0)
def run_python(path: str) -> dict[str, Any]:
    """Run a Python file from the workspace and return its exit code and output."""
    target = _inside(path)
    completed = subprocess.run(
        [sys.executable, str(target)],
        cwd=workspace(),
        capture_output=True,
        text=True,
        timeout=25,
        check=False,
    )
    return {"exit_code": completed.returncode, "stdout": completed.stdout, "stderr": completed.stderr}


TOOLS = [write_file, read_file, list_files, run_python]
