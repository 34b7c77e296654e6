"""MCP servers as toolsets, against a real server built with the SDK (tests/fixtures/mcp_server.py).

The server runs as a subprocess, over stdio (started by the toolset) or over streamable HTTP
on a loopback port. Its tools log each call to ``calls.log`` in its directory, so what ran
on the server side is counted there, not taken from tether's word.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import DONE, asks, closed_port, parked_with, results_by_call, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, AutoApprover, Policy, Rule, Runner
from tether.core.approvals import DecideLater
from tether.errors import IncompatibleRun, ToolDefinitionError, ToolsetError
from tether.models.scripted import ScriptedModel
from tether.stores.sql import SQLStore
from tether.toolsets import changes, from_record
from tether.toolsets.mcp import MCPToolset

pytestmark = pytest.mark.slow  # MCP servers are subprocesses

SERVER = Path(__file__).parent / "fixtures" / "mcp_server.py"


def stdio(where: Path, **options: Any) -> MCPToolset:
    return MCPToolset(command=[sys.executable, str(SERVER)], cwd=str(where), **options)


def reopened(record: dict[str, Any]) -> MCPToolset:
    """The toolset a run recorded, as resuming makes it (from_record is typed as any Toolset)."""
    toolset = from_record(record)
    assert isinstance(toolset, MCPToolset)
    return toolset


def calls(where: Path) -> list[str]:
    log = where / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def server_dir(tmp_path: Path) -> Path:
    where = tmp_path / "server"
    where.mkdir()
    return where


@pytest.fixture
def toolset(server_dir: Path) -> Iterator[MCPToolset]:
    with stdio(server_dir) as made:
        yield made


# Tools from a server ------------------------------------------------------------------------
def test_the_servers_tools_become_tools_with_their_schemas_and_safe_names(toolset: MCPToolset) -> None:
    tools = {tool.name: tool for tool in toolset.tools()}
    assert sorted(tools) == ["add", "crash", "delete_file", "documents", "fail", "files_stat", "picture", "slow"]
    add = tools["add"]
    assert add.description == "Add two integers."
    assert add.input_schema()["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert add.input_schema()["required"] == ["a", "b"]
    assert add.source == f"MCP server {' '.join([sys.executable, str(SERVER)])!r}"
    assert toolset.tools() == list(tools.values())  # listed once


def test_annotations_set_approval_tags_and_idempotence(toolset: MCPToolset) -> None:
    tools = {tool.name: tool for tool in toolset.tools()}
    seen = {name: (asks(t) is not None, sorted(t.tags), t.idempotent) for name, t in tools.items()}
    assert seen["add"] == (False, ["mcp", "read_only"], True)  # read-only: no approval
    assert seen["delete_file"] == (True, ["destructive", "mcp", "mutates"], False)
    assert seen["crash"] == (False, ["mcp", "mutates"], False)  # says it is not destructive
    assert seen["files_stat"] == (False, ["mcp", "network", "read_only"], True)  # open world unless it says not
    assert seen["fail"] == (True, ["destructive", "mcp", "mutates", "network"], False)  # the spec's defaults
    assert asks(tools["delete_file"]) == f"{toolset.source} says it may change or delete things (MCP destructiveHint)"
    assert asks(tools["fail"]) == (
        f"{toolset.source} does not say it is read-only, so it may change or delete things (MCP destructiveHint)"
    )


def test_a_prefix_an_approval_setting_and_a_choice_of_tools(server_dir: Path) -> None:
    with stdio(server_dir, prefix="fx_", approval=True, include=["add", "files.*"]) as toolset:
        tools = toolset.tools()
    assert [tool.name for tool in tools] == ["fx_add", "fx_files_stat"]  # matched by the server's names
    assert {asks(tool) for tool in tools} == {f"every call to {toolset.source} is asked about (approval=True)"}


def test_two_servers_offering_one_name_are_refused_naming_both(server_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with stdio(server_dir) as first, MCPToolset(command=f"{sys.executable} {SERVER}", cwd=str(other)) as second:
        agent = Agent(model=ScriptedModel([DONE]), toolsets=[first, second])
        with pytest.raises(ToolDefinitionError, match=r"two tools are named 'add': one from MCP server .* one from"):
            agent.tool_index  # noqa: B018 - listing the tools is what is refused


# Calls ---------------------------------------------------------------------------------------
def test_a_run_calls_the_server_and_reads_structured_content_text_images_and_errors(
    toolset: MCPToolset, server_dir: Path
) -> None:
    script = [
        tool_use_turn(
            tool_use("t_add", "add", {"a": 2, "b": 3}),
            tool_use("t_stat", "files_stat", {"path": "a.txt"}),
            tool_use("t_pic", "picture", {}),
            tool_use("t_docs", "documents", {}),
            tool_use("t_fail", "fail", {"reason": "no disk"}),
            tool_use("t_bad", "add", {"a": "two", "b": 3}),
        ),
        DONE,
    ]
    runner = Runner(Agent(model=ScriptedModel(script), toolsets=[toolset]), approver=AutoApprover(approve=True))
    result = runner.run("go")
    assert result.status == "done"
    got = results_by_call(runner, result.run_id)
    assert got["t_add"]["content"] == "5"  # the text, not the SDK's {"result": 5} that repeats it
    assert json.loads(got["t_stat"]["content"]) == {"path": "a.txt", "size": 3}
    assert got["t_pic"]["content"] == "a tiny picture\n[image: image/png, 15 bytes]"
    assert got["t_docs"]["content"] == (
        "[resource link guide <file:///guide.md> (text/markdown): the guide]\n"
        "[resource <file:///a.txt> (text/plain)]\nalpha\n"
        "[resource <file:///b.zip> (application/zip), 7 bytes]"
    )
    assert got["t_fail"]["is_error"] is True
    assert got["t_fail"]["content"] == "Error: Error executing tool fail"
    assert got["t_bad"]["is_error"] is True  # refused by the schema: the server never saw it
    assert "a\n  'two' is not of type 'integer'" in got["t_bad"]["content"]
    assert calls(server_dir) == ["add 2 3", "stat a.txt", "picture", "documents", "fail no disk"]


def test_a_destructive_tool_waits_for_a_person_and_a_rule_can_lift_or_add_the_gate(
    toolset: MCPToolset, server_dir: Path
) -> None:
    script = [tool_use_turn(tool_use("t1", "delete_file", {"path": "x"}), tool_use("t2", "add", {"a": 1, "b": 1}))]
    policy = Policy([Rule(tool="add", action="require_approval")])
    runner = Runner(
        Agent(model=ScriptedModel([*script, DONE]), toolsets=[toolset], policy=policy), approver=DecideLater()
    )
    parked = runner.run("go")
    assert parked.status == "awaiting_approval"
    assert [p["call_id"] for p in parked.pending_approvals] == ["t1", "t2"]
    assert calls(server_dir) == []

    allowing = Policy([Rule(tags={"destructive"}, action="allow")])
    runner = Runner(Agent(model=ScriptedModel([*script, DONE]), toolsets=[toolset], policy=allowing))
    assert runner.run("go").status == "done"
    assert calls(server_dir) == ["delete_file x", "add 1 1"]


def test_the_async_runner_awaits_the_calls(toolset: MCPToolset, server_dir: Path) -> None:
    script = [tool_use_turn(tool_use("t1", "add", {"a": 4, "b": 5})), DONE]
    result = asyncio.run(AsyncRunner(Agent(model=ScriptedModel(script), toolsets=[toolset])).run("go"))
    assert result.status == "done"
    assert calls(server_dir) == ["add 4 5"]


# Durability ----------------------------------------------------------------------------------
def test_the_run_records_the_server_and_resume_in_another_runner_reconnects(server_dir: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with stdio(server_dir) as toolset:
        runner, parked = parked_with(toolset, tool_use("t1", "delete_file", {"path": "report.txt"}), db)
    (record,) = runner.load(parked.run_id).spec["toolsets"]
    assert record["kind"] == "mcp"
    assert record["command"] == [sys.executable, str(SERVER)]
    assert record["cwd"] == str(server_dir)
    assert "delete_file" in record["tools"]
    assert len(record["fingerprint"]) == 16

    with reopened(record) as again:  # as `tether resume` does in another process
        assert changes([record], [again]) == []
        resumed = Runner(Agent(model=runner.agent.model, toolsets=[again]), SQLStore(db))
        resumed.decide(parked.run_id, "t1", Approve(actor="ada"))
        assert resumed.drive(parked.run_id).status == "done"
    assert calls(server_dir) == ["delete_file report.txt"]


def test_a_tool_list_changed_incompatibly_is_refused_on_resume(server_dir: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with stdio(server_dir) as toolset:
        runner, parked = parked_with(toolset, tool_use("t1", "delete_file", {"path": "x"}), db)
    (server_dir / "variant").write_text("v2")  # add takes a third required field; delete_file is gone
    (record,) = runner.load(parked.run_id).spec["toolsets"]
    with reopened(record) as changed:
        assert changes([record], [changed]) == [
            f"{changed.source} offers different tools than when the run started (gone: delete_file)"
        ]
        resumed = Runner(Agent(model=runner.agent.model, toolsets=[changed]), SQLStore(db))
        with pytest.raises(IncompatibleRun) as refused:
            resumed.drive(parked.run_id)
    assert "tool 'add': field 'c' is now required" in str(refused.value)
    assert "tool 'delete_file' is no longer available" in str(refused.value)
    assert calls(server_dir) == []


def test_a_server_that_dies_mid_call_leaves_the_call_in_doubt_and_the_next_call_restarts_it(
    toolset: MCPToolset, server_dir: Path
) -> None:
    script = [tool_use_turn(tool_use("t1", "crash", {})), tool_use_turn(tool_use("t2", "add", {"a": 1, "b": 2})), DONE]
    runner = Runner(Agent(model=ScriptedModel(script), toolsets=[toolset]))
    result = runner.run("go")
    assert result.status == "done"
    got = results_by_call(runner, result.run_id)
    assert got["t1"]["is_error"] is True
    assert "closed the connection during the call" in got["t1"]["content"]
    assert "it may still complete, so it was not run again automatically" in got["t1"]["content"]
    finished = [e.data for e in runner.store.load_events(result.run_id) if e.type == "tool_finished"]
    assert finished[0]["in_doubt"] is True
    assert got["t2"]["content"] == "3"  # a new server process answered
    assert calls(server_dir) == ["crash", "add 1 2"]


def test_a_server_that_hangs_times_out_and_the_call_is_in_doubt(server_dir: Path) -> None:
    script = [tool_use_turn(tool_use("t1", "slow", {"seconds": 30})), DONE]
    with stdio(server_dir, timeout=0.5, approval=False) as toolset:
        toolset.tools()
        runner = Runner(Agent(model=ScriptedModel(script), toolsets=[toolset]))
        result = runner.run("go")
        (server_dir / "release").touch()
    got = results_by_call(runner, result.run_id)
    assert result.status == "done"
    assert got["t1"]["is_error"] is True
    assert "did not answer within 0.5s; the call may still complete there" in got["t1"]["content"]


# Bad servers ---------------------------------------------------------------------------------
def test_a_command_that_does_not_exist_is_an_error_naming_it(tmp_path: Path) -> None:
    with (
        MCPToolset(command="no-such-mcp-server --flag", cwd=str(tmp_path)) as toolset,
        pytest.raises(ToolsetError, match=r"MCP server 'no-such-mcp-server --flag': cannot list its tools: "),
    ):
        toolset.tools()


def test_a_server_that_exits_at_once_is_an_error_quoting_its_stderr(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; sys.exit('config file missing')"]
    with (
        MCPToolset(command=command, cwd=str(tmp_path)) as toolset,
        pytest.raises(ToolsetError, match="its stderr ends: config file missing"),
    ):
        toolset.tools()


def test_a_server_that_never_answers_at_start_times_out(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    with (
        MCPToolset(command=command, cwd=str(tmp_path), connect_timeout=1) as toolset,
        pytest.raises(ToolsetError, match=r"no tool list within 1s \(the server hangs\?\)"),
    ):
        toolset.tools()


def test_a_variable_to_pass_that_is_not_set_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIXTURE_TOKEN", raising=False)
    with (
        MCPToolset(command=[sys.executable, str(SERVER)], env=["FIXTURE_TOKEN"], cwd=str(tmp_path)) as toolset,
        pytest.raises(ToolsetError) as refused,
    ):
        toolset.tools()
    assert str(refused.value) == (
        f"{toolset.source}: environment variable FIXTURE_TOKEN (to pass to the server) is not set"
    )


# Streamable HTTP -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def http_server(server_dir: Path) -> Iterator[str]:
    """The fixture server on a loopback port, requiring ``X-Token: sesame``; yields its URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port), "--require-header", "X-Token=sesame"],
        cwd=server_dir,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "the MCP server exited"
            assert time.monotonic() < deadline, "the MCP server did not start"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def test_a_server_over_http_gets_its_header_from_the_named_variable(
    http_server: str, server_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIXTURE_TOKEN", "sesame")
    with MCPToolset(url=http_server, headers={"X-Token": "FIXTURE_TOKEN"}) as toolset:
        script = [tool_use_turn(tool_use("t1", "add", {"a": 20, "b": 22})), DONE]
        runner = Runner(Agent(model=ScriptedModel(script), toolsets=[toolset]))
        result = runner.run("go")
        record = runner.load(result.run_id).spec["toolsets"][0]
    assert results_by_call(runner, result.run_id)["t1"]["content"] == "42"
    assert calls(server_dir) == ["add 20 22"]
    assert record["url"] == http_server
    assert record["headers"] == {"X-Token": "FIXTURE_TOKEN"}
    assert "sesame" not in json.dumps(runner.load(result.run_id).spec)


def test_a_server_over_http_that_dies_mid_call_leaves_the_call_in_doubt(
    http_server: str, server_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIXTURE_TOKEN", "sesame")
    script = [tool_use_turn(tool_use("t1", "crash", {})), DONE]
    with MCPToolset(url=http_server, headers={"X-Token": "FIXTURE_TOKEN"}, timeout=10) as toolset:
        runner = Runner(Agent(model=ScriptedModel(script), toolsets=[toolset]))
        result = runner.run("go")
    got = results_by_call(runner, result.run_id)["t1"]
    assert got["is_error"] is True
    assert "it may still complete, so it was not run again automatically" in got["content"]
    assert calls(server_dir) == ["crash"]


def test_a_server_over_http_that_refuses_the_credentials_is_an_error(
    http_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIXTURE_TOKEN", "wrong")
    with (
        MCPToolset(url=http_server, headers={"X-Token": "FIXTURE_TOKEN"}) as toolset,
        pytest.raises(ToolsetError, match="401"),
    ):
        toolset.tools()


def test_an_unreachable_url_is_an_error_naming_it() -> None:
    url = f"http://127.0.0.1:{closed_port()}/mcp"
    with (
        MCPToolset(url=url) as toolset,
        pytest.raises(ToolsetError, match=f"MCP server '{url}': cannot list its tools: .*ConnectError"),
    ):
        toolset.tools()


def test_a_url_holding_a_secret_is_refused_before_it_is_stored() -> None:
    with pytest.raises(ToolsetError, match="the URL holds a secret"):
        MCPToolset(url="https://mcp.example.test/mcp?api_key=abc123")
    with pytest.raises(ToolsetError, match="is not the name of an environment variable"):
        MCPToolset(url="https://mcp.example.test/mcp", bearer="sk-live-abc123")
