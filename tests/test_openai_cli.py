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

pytestmark = pytest.mark.slow  # real `tether` processes

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


def test_a_run_on_the_openai_adapter_parks_resumes_and_stores_no_credential(
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


def test_an_unknown_provider_exits_2_naming_the_known_ones(tmp_path: Path) -> None:
    result = Cli(tmp_path)("run", "Hi", "--model", "groq:llama-3.3-70b", "--db", f"sqlite:///{tmp_path / 'runs.db'}")

    assert result.returncode == 2, result
    assert "unknown provider 'groq'" in result.err
    assert "anthropic:, openai:, scripted:" in result.err
