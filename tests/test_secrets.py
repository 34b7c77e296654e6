"""No secret (API key, auth header) is ever written to the store or the logs."""

from __future__ import annotations

from pathlib import Path

from fake_messages_api import FakeMessagesAPI
from support import fake_api_env, run_tether

SECRET = "sk-ant-api03-DO-NOT-LEAK-4f1c9e"


def test_the_api_key_reaches_the_api_but_never_the_database_or_logs(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(
        "from tether import tool\n\n"
        "@tool\ndef echo(text: str) -> str:\n    '''Echo.'''\n    return text\n\n"
        "TOOLS = [echo]\n"
    )
    with FakeMessagesAPI() as api:
        api.reply_tool_use("echo", {"text": "hi"})
        api.reply_text("done")
        result = run_tether(
            tmp_path,
            "run",
            "say hi",
            "--tools",
            "mytools:TOOLS",
            "--model",
            "claude-test",
            "--db",
            f"sqlite:///{tmp_path / 'runs.db'}",
            "--json",
            env=fake_api_env(api, SECRET, ANTHROPIC_LOG="debug"),
        )
        sent = [h.get("x-api-key", "") + h.get("authorization", "") for h in api.headers]
    assert result.returncode == 0, result.stderr
    assert all(SECRET in header for header in sent)  # it was used...
    assert SECRET not in result.stdout  # ...but never printed,
    assert "HTTP Request" in result.stderr or "Request options" in result.stderr  # the SDK did log
    assert SECRET not in result.stderr  # never logged (the SDK's debug log included),
    for file in tmp_path.glob("runs.db*"):  # and never stored (WAL and shm files too)
        assert SECRET.encode() not in file.read_bytes(), file
