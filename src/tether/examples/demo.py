"""The demo agent: real tools in a scratch directory, one of them behind an approval gate.

Offline, :class:`DemoScript` plays the model: fixed tool requests, and a final answer that
quotes what the tools really returned. With ``ANTHROPIC_API_KEY`` set, Claude drives the
same tools.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tether.core.history import Message
from tether.errors import ConfigError
from tether.models import ModelRequest
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
PROGRAM = (
    "a, b = 0, 1\n"
    "numbers = []\n"
    "for _ in range(10):\n"
    "    numbers.append(a)\n"
    "    a, b = b, a + b\n"
    "print(' '.join(map(str, numbers)))\n"
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


def _tool_use(call_id: str, name: str, arguments: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "content": [
            {"type": "text", "text": text},
            {"type": "tool_use", "id": call_id, "name": name, "input": arguments},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 400, "output_tokens": 60},
    }


def _answer(text: str) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 500, "output_tokens": 40},
    }


def _last_result(messages: list[Message]) -> tuple[str, bool]:
    last = messages[-1]
    for block in last["content"] if isinstance(last["content"], list) else []:
        if block.get("type") == "tool_result":
            return str(block.get("content", "")), bool(block.get("is_error"))
    return "", False


DEMO_CALLS = {"write_file", "run_python"}
"""The tools the scripted demo calls."""


class DemoScript:
    """Plays the model offline: write fib.py, run it (gated), then report its output."""

    def __call__(self, request: ModelRequest) -> dict[str, Any]:
        """One reply, chosen by how far the conversation has got."""
        turns = sum(1 for m in request.messages if m["role"] == "assistant")
        missing = sorted(DEMO_CALLS - {t["name"] for t in request.tools})
        if turns == 0 and missing:  # another agent's tools: say so rather than call a tool it lacks
            return _answer(
                f"I am tether's offline demo model: I can only write and run fib.py with the demo's "
                f"tools, and this run lacks {', '.join(missing)}. For your own tools, use a real "
                f"model (set ANTHROPIC_API_KEY, or pass --model openai:gpt-4o with OPENAI_API_KEY)."
            )
        if turns == 0:
            return _tool_use(
                "toolu_demo_write",
                "write_file",
                {"path": "fib.py", "content": PROGRAM},
                "I'll write the program first.",
            )
        result, is_error = _last_result(request.messages)
        if turns == 1:
            if is_error:
                return _answer(f"I could not write the program: {result}")
            return _tool_use(
                "toolu_demo_run", "run_python", {"path": "fib.py"}, "Now I'll run it (this needs your approval)."
            )
        if is_error:
            return _answer(f"I did not get to run the program: {result}")
        try:
            ran = json.loads(result[result.index("{") :])  # past any reviewer's note
            printed = str(ran["stdout"]).strip()
            code = ran["exit_code"]
        except (ValueError, KeyError, TypeError):
            return _answer(f"The program ran; the tool said: {result}")
        return _answer(f"fib.py ran (exit code {code}) and printed: {printed}")
