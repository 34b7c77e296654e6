"""The offline model ``tether demo`` runs on without an API key: a script, not a model.

It writes ``fib.py`` with the demo's ``write_file`` tool, runs it with ``run_python`` (gated: a
person approves it), then reports what the program really printed. Runs of the demo record the
model ``scripted-demo``, so resuming one (``tether resume``) rebuilds this script.
"""

from __future__ import annotations

import json
from typing import Any

from tether.facts.history import Message
from tether.models import ModelRequest

PROGRAM = (
    "a, b = 0, 1\n"
    "numbers = []\n"
    "for _ in range(10):\n"
    "    numbers.append(a)\n"
    "    a, b = b, a + b\n"
    "print(' '.join(map(str, numbers)))\n"
)


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
