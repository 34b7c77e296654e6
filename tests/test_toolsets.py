"""Toolsets as the agent and a run see them, with a toolset in memory (no server to start).

The real clients (MCP, OpenAPI) are tested against real servers in their own modules; here
is what every toolset shares: its tools join the agent's, the run records it with a
fingerprint, what changed since is said, and credentials are only ever named.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest

from support import DONE, tool_use, tool_use_turn
from tether import Agent, ConfigError, Runner, tool
from tether.errors import MissingExtra, ToolsetError
from tether.models.scripted import ScriptedModel
from tether.tools import Tool
from tether.tools.schema import schema_tool
from tether.toolsets import changes, fingerprint, from_record, recorded
from tether.toolsets.credentials import check_names, check_url

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


class InMemory:
    """A toolset whose tools are functions here: what a server would offer, without one."""

    def __init__(self, *names: str, description: str = "Echo.") -> None:
        self.made = [schema_tool(self.echo, SCHEMA, name=name, description=description) for name in names]
        self.closed = False

    @staticmethod
    def echo(arguments: dict[str, Any]) -> str:
        return str(arguments["text"])

    def tools(self) -> list[Tool]:
        return list(self.made)

    def options(self) -> dict[str, Any]:
        return {"command": ["memory"]}

    def record(self) -> dict[str, Any]:
        return recorded("mcp", self.options(), self.made)

    def close(self) -> None:
        self.closed = True


@tool
def local(n: int) -> int:
    """A tool of the program's own."""
    return n


def test_a_toolsets_tools_join_the_agents_own_and_the_run_records_it() -> None:
    toolset = InMemory("echo")
    script = [tool_use_turn(tool_use("t1", "echo", {"text": "hi"})), DONE]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[local], toolsets=[toolset]))
    result = runner.run("go")
    assert result.status == "done"
    assert [t["name"] for t in runner.agent.tool_definitions] == ["local", "echo"]
    spec = runner.load(result.run_id).spec
    assert spec["toolsets"] == [
        {"kind": "mcp", "command": ["memory"], "fingerprint": fingerprint(toolset.made), "tools": ["echo"]}
    ]
    assert set(spec["tool_schemas"]) == {"local", "echo"}  # so a changed schema is refused on resume


def test_what_changed_since_a_run_started_is_said() -> None:
    before = InMemory("echo", "shout").record()
    assert changes([before], [InMemory("echo", "shout")]) == []
    assert changes([before], [InMemory("echo", "whisper")]) == [
        "MCP server 'memory' offers different tools than when the run started (new: whisper; gone: shout)"
    ]
    assert changes([before], [InMemory("echo", "shout", description="Say it back.")]) == [
        "MCP server 'memory' offers different tools than when the run started (descriptions, schemas or annotations)"
    ]


def test_the_fingerprint_follows_what_the_model_and_the_gates_see() -> None:
    plain = fingerprint(InMemory("echo").made)
    assert fingerprint(InMemory("echo").made) == plain
    assert fingerprint(InMemory("echo", description="Other.").made) != plain
    gated = schema_tool(InMemory.echo, SCHEMA, name="echo", description="Echo.", approval=True)
    assert fingerprint([gated]) != plain


def test_an_agent_refuses_what_is_not_a_toolset() -> None:
    with pytest.raises(ConfigError, match="is not a toolset"):
        Agent(model=ScriptedModel([DONE]), toolsets=[local])  # type: ignore[list-item]


def test_a_record_of_an_unknown_kind_or_missing_its_server_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown toolset kind 'soap'"):
        from_record({"kind": "soap"})
    with pytest.raises(ConfigError, match="needs the server's command or its URL"):
        from_record({"kind": "mcp"})


@pytest.mark.parametrize(
    "url",
    [
        "https://user:hunter2@mcp.example.test/mcp",
        "https://mcp.example.test/mcp?api_key=abc",
        "https://mcp.example.test/mcp?access_token=abc",
    ],
)
def test_a_url_holding_a_secret_is_refused(url: str) -> None:
    with pytest.raises(ToolsetError, match="the URL holds a secret"):
        check_url(url, "MCP server")


def test_a_url_that_is_not_http_is_refused_and_a_plain_one_passes() -> None:
    with pytest.raises(ToolsetError, match="is not an http"):
        check_url("ftp://files.example.test/", "MCP server")
    assert check_url("https://mcp.example.test/mcp?page=2", "MCP server") == "https://mcp.example.test/mcp?page=2"


def test_credentials_are_named_never_given() -> None:
    assert check_names(["GITHUB_TOKEN", "_X1"], "MCP server") == ["GITHUB_TOKEN", "_X1"]
    with pytest.raises(ToolsetError, match="'ghp_abc-123' is not the name of an environment variable"):
        check_names(["ghp_abc-123"], "MCP server")


@pytest.mark.parametrize(("kind", "module", "extra"), [("mcp", "mcp", "mcp"), ("openapi", "httpx", "openapi")])
def test_a_missing_client_is_an_import_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, kind: str, module: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what `import` finds when the package is not installed
    monkeypatch.delitem(sys.modules, f"tether.toolsets.{kind}", raising=False)
    with pytest.raises(MissingExtra, match=re.escape(f"pip install 'tether[{extra}]' ({module} is not installed)")):
        from_record({"kind": kind, "command": ["server"], "spec": "api.yaml"})
