"""No secret (API key, auth header) is ever written to the store or the logs."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from support import (
    TETHER,
    Cli,
    PgSchema,
    closed_port,
    fake_api_env,
    libpq_dsn,
    run_tether,
    run_tether_process,
    tool_use,
    tool_use_turn,
)
from tether.stores import shown_url
from tether.testing import FakeMessagesAPI

pytestmark = pytest.mark.slow  # real `tether` processes

SECRET = "sk-ant-api03-DO-NOT-LEAK-4f1c9e"
DB_PASSWORD = "pg-pw-DO-NOT-PRINT-77a1"
QUERY_SECRET = "qs-DO-NOT-PRINT-5b2e"


def test_the_api_key_reaches_the_api_but_never_the_database_or_logs(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(
        "from tether import tool\n\n"
        "@tool\ndef echo(text: str) -> str:\n    '''Echo.'''\n    return text\n\n"
        "TOOLS = [echo]\n"
    )
    with FakeMessagesAPI() as api:
        api.reply_tool_use("echo", {"text": "hi"})
        api.reply_text("done")
        result = run_tether_process(  # the SDK reads ANTHROPIC_LOG when it is first imported
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


def with_password(url: str, password: str = DB_PASSWORD) -> str:
    """``url`` with ``password`` for its user (PostgreSQL here trusts local users: it is ignored)."""
    parts = urlsplit(url)
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


GATED_TOOLS = '''
from tether import tool


@tool(approval=True)
def publish(text: str) -> str:
    """Publish."""
    return text


TOOLS = [publish]
'''


@pytest.mark.postgres
def test_a_database_password_is_never_printed_nor_stored(pg_schema: PgSchema, tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(GATED_TOOLS)
    script = [
        tool_use_turn(tool_use("toolu_a", "publish", {"text": "a"}), tool_use("toolu_b", "publish", {"text": "b"})),
        {"content": [{"type": "text", "text": "Published a."}], "stop_reason": "end_turn"},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    db = ["--db", with_password(pg_schema.url) + f"&sslpassword={QUERY_SECRET}"]  # libpq takes it (unused here)

    def tether(*args: str) -> str:
        result = run_tether(tmp_path, *args, *db)
        assert result.returncode in (0, 3), result
        return result.stdout + result.stderr

    outputs = [tether("run", "publish a and b", "--tools", "mytools:TOOLS", "--model", "scripted:script.json")]
    assert "--db 'postgresql+psycopg://postgres:***@" in outputs[0]  # the hint to resume, masked
    run_id = json.loads(run_tether(tmp_path, "runs", "--json", *db).stdout)["runs"][0]["run_id"]
    outputs.append(tether("approve", run_id, "toolu_a"))
    outputs.append(tether("deny", run_id, "toolu_b", "--reason", "not b"))
    assert f"continue with:\n  {TETHER} resume" in outputs[-1]
    assert "postgres:***@" in outputs[-1]
    outputs.append(tether("resume", run_id))
    assert "Published a." in outputs[-1]
    reads = [["show", run_id], ["show", run_id, "--json"], ["runs"], ["audit"], ["pending"]]
    demo = ["demo", "--deny-all", "--workspace", str(tmp_path / "demo")]
    for read in Cli(tmp_path).parallel(*([*command, *db] for command in [*reads, demo])):
        assert read.returncode == 0, read
        outputs.append(read.stdout + read.stderr)
    assert "database postgresql+psycopg://postgres:***@" in outputs[-1]
    for output in outputs:
        assert DB_PASSWORD not in output
        assert QUERY_SECRET not in output

    unreachable = with_password(f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/test")
    failed = run_tether(tmp_path, "runs", "--db", f"{unreachable}?password={QUERY_SECRET}")
    assert failed.returncode == 1
    assert "postgres:***@127.0.0.1" in failed.err
    assert "password=***" in failed.err
    assert DB_PASSWORD not in failed.stdout + failed.stderr
    assert QUERY_SECRET not in failed.stdout + failed.stderr

    import psycopg

    with psycopg.connect(libpq_dsn(pg_schema.url)) as connection:
        query = "SELECT tablename FROM pg_tables WHERE schemaname = %s"
        tables = [row[0] for row in connection.execute(query, (pg_schema.name,))]
        assert "tether_event" in tables
        for table in tables:
            for row in connection.execute(f'SELECT * FROM "{pg_schema.name}"."{table}"'):
                assert DB_PASSWORD not in repr(row), table


def test_an_unreadable_url_is_masked_too(tmp_path: Path) -> None:
    result = run_tether(tmp_path, "runs", "--db", f"not a url://user:{DB_PASSWORD}@host/db")
    assert result.returncode == 2
    assert "invalid database URL" in result.err
    assert DB_PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://app@db.example/prod?password={QUERY_SECRET}",
        f"postgresql+psycopg://app@db.example/prod?sslmode=require&sslpassword={QUERY_SECRET}",
        f"postgresql+psycopg://app:{DB_PASSWORD}@db.example/prod?token={QUERY_SECRET}",
        f"mysql+pymysql://app@db.example/prod?api_key={QUERY_SECRET}&charset=utf8mb4",
        f"postgresql+psycopg://app@db.example/prod?client_secret={QUERY_SECRET}",
        f"postgresql+psycopg://app@db.example/prod?Auth_Token={QUERY_SECRET}",
        f"postgresql+psycopg://app:{DB_PASSWORD}@db.example:port/prod?password={QUERY_SECRET}",  # unreadable port
        f"not a url://app:{DB_PASSWORD}@db.example/prod?sslmode=require&passwd={QUERY_SECRET}#x",  # not a URL at all
    ],
)
def test_every_secret_bearing_part_of_a_url_is_masked(url: str) -> None:
    shown = shown_url(url)
    assert QUERY_SECRET not in shown
    assert DB_PASSWORD not in shown
    assert "***" in shown
    assert "db.example" in shown  # the rest stays readable
    assert ("charset=utf8mb4" in shown) == ("charset" in url)
    assert ("sslmode=require" in shown) == ("sslmode" in url)


def test_a_url_with_an_unreadable_port_is_a_clear_error_without_its_secrets(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://app:{DB_PASSWORD}@db.example:port/prod?password={QUERY_SECRET}"
    result = run_tether(tmp_path, "runs", "--db", url)
    assert result.returncode == 2, result
    assert "invalid database URL" in result.err
    assert "Traceback" not in result.stderr
    assert DB_PASSWORD not in result.stdout + result.stderr
    assert QUERY_SECRET not in result.stdout + result.stderr


def test_a_query_string_secret_is_masked_in_every_hint(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(GATED_TOOLS)
    script = [tool_use_turn(tool_use("toolu_a", "publish", {"text": "a"}))]
    (tmp_path / "script.json").write_text(json.dumps(script))
    db = ["--db", f"sqlite:///{tmp_path / 'runs.db'}?token={QUERY_SECRET}"]  # SQLite ignores it
    tools, model = ["--tools", "mytools:TOOLS"], ["--model", "scripted:script.json"]
    parked = run_tether(tmp_path, "run", "publish a", *tools, *model, *db)
    assert parked.returncode == 3, parked
    assert "token=***" in parked.stdout
    run_id = json.loads(run_tether(tmp_path, "runs", "--json", *db).stdout)["runs"][0]["run_id"]
    denied = run_tether(tmp_path, "deny", run_id, "toolu_a", *db)
    assert "continue with:" in denied.stdout, denied
    assert "token=***" in denied.stdout
    for result in (parked, denied):
        assert QUERY_SECRET not in result.stdout + result.stderr


def test_an_api_key_echoed_in_an_error_body_is_neither_stored_nor_shown(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with FakeMessagesAPI() as api:
        api.fail(401, f"invalid x-api-key: {SECRET}")
        result = run_tether(
            tmp_path, "run", "hi", "--model", "claude-test", "--db", db, "--json", env=fake_api_env(api, SECRET)
        )
    assert result.returncode == 1, result
    assert "Anthropic API error 401: invalid x-api-key: ***" in result.data["error"]
    shown = run_tether(tmp_path, "show", result.data["run_id"], "--db", db)
    assert "invalid x-api-key: ***" in shown.stdout
    for output in (result.stdout, result.stderr, shown.stdout, shown.stderr):
        assert SECRET not in output
    for file in tmp_path.glob("runs.db*"):
        assert SECRET.encode() not in file.read_bytes(), file
