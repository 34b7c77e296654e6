"""What ``tether.testing`` gives a user testing their own agent: the strict fake Messages API.

Written as a user would: no fixture of ours, the server started from the package, the real
Claude adapter pointed at it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tether import Agent, Runner, tool
from tether.models.anthropic import AnthropicModel
from tether.testing import FakeMessagesAPI, validate_messages_request


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def test_a_user_runs_their_agent_against_the_fake_api() -> None:
    with FakeMessagesAPI() as api:
        api.reply_tool_use("add", {"a": 2, "b": 3})
        api.reply_text("2 + 3 = 5")
        model = AnthropicModel("claude-test", api_key="test-key", base_url=api.url, max_retries=0)
        result = Runner(Agent(model=model, tools=[add])).run("What is 2 + 3?")
        model.close()

    assert result.status == "done"
    assert result.output == "2 + 3 = 5"
    assert len(api.requests) == 2
    second = api.requests[1]["messages"]
    assert second[-1]["content"][0]["type"] == "tool_result"
    assert second[-1]["content"][0]["content"] == "5"
    assert all(validate_messages_request(body) is None for body in api.requests)


def test_the_fake_api_refuses_what_the_real_api_refuses() -> None:
    unanswered = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]},
            {"role": "user", "content": "and?"},
        ],
    }
    error = validate_messages_request(unanswered)
    assert error is not None
    assert "tool_use` ids were found without `tool_result` blocks" in error


@pytest.mark.slow  # a fresh interpreter
def test_importing_tether_testing_needs_no_test_framework() -> None:
    code = "import sys, tether.testing; sys.exit('pytest' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
