"""``tether run --model openai:NAME``: a real ``tether`` process on the OpenAI adapter, parked and resumed.

The key and base URL come from the environment of each process and are never stored: the
database file is searched for them byte by byte.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from support import Cli
from tether.testing import FakeChatCompletionsAPI

pytestmark = pytest.mark.slow  # whole `tether` commands (in-process: support.run_tether)

KEY = "sk-test-never-stored"
TOOLS = textwrap.dedent(
    '''
    """Tools for the OpenAI CLI tests."""

    from tether import tool


    @tool(approval=True)
    def deploy(env: str) -> str:
        """Deploy (needs approval)."""
        return f"deployed to {env}"


    TOOLS = [deploy]
    '''
)


def env(api: FakeChatCompletionsAPI) -> dict[str, str]:
    return {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": api.url}


def test_a_run_on_the_openai_adapter_keeps_its_model_and_settings_through_a_resume_and_stores_no_key(
    chat_api: FakeChatCompletionsAPI, tmp_path: Path
) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS, encoding="utf-8")
    db = tmp_path / "runs.db"
    cli = Cli(tmp_path)
    (call_id,) = chat_api.reply_tool_calls(("deploy", {"env": "staging"}))
    chat_api.reply_text("Deployed to staging.")

    started = cli(
        "run",
        "Deploy it",
        "--model",
        "openai:gpt-6-sol",
        "--temperature",
        "0.2",
        "--stop",
        "END",
        "--tool-choice",
        "auto",
        "--max-tokens-per-call",
        "500",
        "--tools",
        "mytools:TOOLS",
        "--json",
        "--db",
        f"sqlite:///{db}",
        env=env(chat_api),
    )
    assert started.returncode == 3, started
    approved = cli("approve", started.data["run_id"], call_id, "--db", f"sqlite:///{db}")
    assert approved.returncode == 0, approved
    resumed = cli("resume", started.data["run_id"], "--json", "--db", f"sqlite:///{db}", env=env(chat_api))

    assert resumed.returncode == 0, resumed
    assert resumed.data["output"] == "Deployed to staging."
    assert [body["model"] for body in chat_api.requests] == ["gpt-6-sol", "gpt-6-sol"]
    for body in chat_api.requests:  # the resumed process asked exactly as the run started
        assert (body["temperature"], body["stop"], body["tool_choice"], body["max_completion_tokens"]) == (
            0.2,
            ["END"],
            "auto",
            500,
        )
    assert chat_api.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": call_id,
        "content": "deployed to staging",
    }
    assert all(headers["authorization"] == f"Bearer {KEY}" for headers in chat_api.headers)
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("runs.db*"))
    assert KEY.encode() not in stored
    assert chat_api.url.encode() not in stored
    assert b"openai:gpt-6-sol" in stored


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (
            ["--model", "groq:llama-3.3-70b"],
            "unknown provider 'groq'; known providers are anthropic:, openai:, scripted:",
        ),
        (["--model", "openai:gpt-6-sol", "--temperature", "7"], "temperature must be from 0 to 2"),
        (["--model", "claude-sonnet-5-5", "--temperature", "0.5"], "takes no sampling parameters"),
        (["--model", "openai:gpt-6-sol", "--thinking-budget", "2048"], "thinking_budget is Claude's extended thinking"),
    ],
)
def test_a_bad_model_or_setting_exits_2_saying_why(tmp_path: Path, flags: list[str], problem: str) -> None:
    result = Cli(tmp_path)("run", "Hi", *flags, "--db", f"sqlite:///{tmp_path / 'runs.db'}")

    assert result.returncode == 2, result
    assert problem in result.err
