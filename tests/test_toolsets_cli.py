"""``tether run --mcp/--mcp-url/--openapi`` end to end: whole ``tether`` commands, real servers.

The MCP server (tests/fixtures/mcp_server.py) is started by tether itself, in the test's
directory, and logs its calls to ``calls.log`` there; the OpenAPI service runs on uvicorn in
this process, on a loopback port. The model is scripted (``--model scripted:FILE``).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.pets_api import TOKEN, make_app
from support import DONE, Cli, closed_port, flat, runs_made, serving_app, tool_use, tool_use_turn
from tether.stores.sql import SQLStore

pytestmark = pytest.mark.slow  # whole `tether` commands and real MCP servers

SERVER = Path(__file__).parent / "fixtures" / "mcp_server.py"
MCP = f"{sys.executable} {SERVER}"


def script(where: Path, *turns: dict[str, Any]) -> str:
    """A scripted model file: these turns, then done."""
    path = where / "script.json"
    path.write_text(json.dumps([*turns, DONE]), encoding="utf-8")
    return f"scripted:{path}"


def calls(where: Path) -> list[str]:
    log = where / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def spec_of(where: Path, run_id: str) -> dict[str, Any]:
    return SQLStore(f"sqlite:///{where / 'tether.db'}").load_run(run_id).spec


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def test_an_mcp_server_given_on_the_command_line_is_remembered_for_approve_and_resume(cli: Cli) -> None:
    model = script(cli.cwd, tool_use_turn(tool_use("t1", "delete_file", {"path": "old.txt"})))
    parked = cli("run", "tidy up", "--mcp", MCP, "--model", model, "--json")
    assert parked.returncode == 3, parked
    run_id = parked.data["run_id"]
    assert [p["tool"] for p in parked.data["pending_approvals"]] == ["delete_file"]
    (record,) = spec_of(cli.cwd, run_id)["toolsets"]
    assert (record["kind"], record["command"], record["cwd"]) == ("mcp", [sys.executable, str(SERVER)], str(cli.cwd))

    approved = cli("approve", run_id, "t1")  # reconnects: the edit check needs the tool's schema
    assert approved.returncode == 0, approved
    resumed = cli("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert calls(cli.cwd) == ["delete_file old.txt"]


def test_a_run_continuing_another_keeps_its_toolsets(cli: Cli) -> None:
    model = script(cli.cwd, tool_use_turn(tool_use("t1", "fx_add", {"a": 1, "b": 2})))
    first = cli("run", "add", "--mcp", MCP, "--prefix", "fx_", "--model", model, "--json")
    assert first.returncode == 0, first
    later = cli("run", "again", "--continue", first.data["run_id"], "--json")
    assert later.returncode == 0, later
    assert calls(cli.cwd) == ["add 1 2", "add 1 2"]  # the continued run reached the same server
    (record,) = spec_of(cli.cwd, later.data["run_id"])["toolsets"]
    assert (record["command"], record["prefix"]) == ([sys.executable, str(SERVER)], "fx_")


def test_a_tool_list_that_changed_is_refused_or_warned_about_on_resume(cli: Cli) -> None:
    model = script(cli.cwd, tool_use_turn(tool_use("t1", "delete_file", {"path": "a"})))
    first = cli("run", "go", "--mcp", MCP, "--model", model, "--json")
    second = cli("run", "go", "--mcp", MCP, "--model", model, "--json")
    assert (first.returncode, second.returncode) == (3, 3)

    (cli.cwd / "variant").write_text("v1+echo")  # one more tool: the run goes on, with a warning
    warned = cli("resume", first.data["run_id"], "--deny-all", "--json")
    assert warned.returncode == 0, warned
    assert f"warning: MCP server '{MCP}' offers different tools than when the run started (new: echo)" in warned.err

    (cli.cwd / "variant").write_text("v2")  # delete_file gone, add needs a third field: refused
    refused = cli("resume", second.data["run_id"], "--approve-all")
    assert refused.returncode == 1, refused
    assert "cannot be resumed with the current tools" in refused.err
    assert "tool 'delete_file' is no longer available" in refused.err
    assert calls(cli.cwd) == []


@pytest.fixture
def pets_api() -> Iterator[str]:
    with serving_app(make_app()) as url:
        yield url


def test_an_openapi_spec_with_a_bearer_token_from_a_variable(cli: Cli, pets_api: str) -> None:
    model = script(
        cli.cwd,
        tool_use_turn(tool_use("t1", "readSecret", {})),
        tool_use_turn(tool_use("t2", "createPet", {"body": {"name": "Rex"}})),
    )
    run = cli(
        "run",
        "go",
        "--openapi",
        f"{pets_api}/openapi.json",
        "--bearer",
        "PETS_TOKEN",
        "--model",
        model,
        "--json",
        env={"PETS_TOKEN": TOKEN},
    )
    assert run.returncode == 3, run  # createPet is a POST: it waits for a person
    run_id = run.data["run_id"]
    (record,) = spec_of(cli.cwd, run_id)["toolsets"]
    assert (record["spec"], record["bearer"]) == (f"{pets_api}/openapi.json", "PETS_TOKEN")
    assert TOKEN not in json.dumps(spec_of(cli.cwd, run_id))

    missing = cli("resume", run_id, "--approve-all")  # the variable is not set in this process
    assert missing.returncode == 2, missing
    assert "environment variable PETS_TOKEN (for its bearer token) is not set" in missing.err
    resumed = cli("resume", run_id, "--approve-all", "--json", env={"PETS_TOKEN": TOKEN})
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"


def test_a_base_url_a_prefix_and_an_include_shape_the_toolset_before_them(
    cli: Cli, pets_api: str, tmp_path: Path
) -> None:
    spec = tmp_path / "pets.json"
    spec.write_text(json.dumps(make_app().state.spec), encoding="utf-8")  # a file: its server URL is relative
    model = script(cli.cwd, tool_use_turn(tool_use("t1", "pets_listPets", {"limit": 1})))
    args = ["--openapi", str(spec), "--base-url", f"{pets_api}/v1", "--prefix", "pets_", "--include", "list*"]
    done = cli("run", "list", *args, "--model", model, "--json")
    assert done.returncode == 0, done
    assert done.data["status"] == "done"
    (record,) = spec_of(cli.cwd, done.data["run_id"])["toolsets"]
    assert (record["base_url"], record["prefix"], record["include"]) == (f"{pets_api}/v1", "pets_", ["list*"])
    assert record["tools"] == ["pets_listPets"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base-url", "http://x.test"], "--base-url applies to the --mcp, --mcp-url or --openapi given before it"),
        (["--openapi", "a.yaml", "--env", "HOME"], "--env does not apply to --openapi (only to --mcp)"),
        (["--mcp-url", "http://x.test/mcp", "--header", "X-Key"], "expected NAME=VARIABLE"),
    ],
)
def test_toolset_options_in_the_wrong_place_are_usage_errors(cli: Cli, args: list[str], message: str) -> None:
    refused = cli("run", "go", *args)
    assert refused.returncode == 2, refused
    assert message in refused.err


def test_an_unreachable_server_is_an_error_and_no_run_is_made(cli: Cli) -> None:
    url = f"http://127.0.0.1:{closed_port()}/mcp"
    refused = cli("run", "go", "--mcp-url", url, "--model", script(cli.cwd))
    assert refused.returncode == 2, refused
    assert flat(f"error: MCP server '{url}': cannot list its tools:") in refused.err
    assert runs_made(cli) == []


def test_the_guide_mcp_example_runs_as_it_says(cli: Cli) -> None:
    """The toolsets guide's notes server, and its ``tether run --mcp`` command, with a scripted model."""
    readme = (Path(__file__).parent.parent / "docs" / "guides" / "toolsets.md").read_text()
    fence = '```python title="notes_server.py"\n'
    start = readme.index(fence) + len(fence)
    (cli.cwd / "notes_server.py").write_text(readme[start : readme.index("```\n", start)])
    command = readme[readme.index("tether run ", start) : readme.index("\n", readme.index("tether run ", start))]
    (cli.cwd / "notes").mkdir()
    (cli.cwd / "notes" / "old.txt").write_text("stale")
    model = script(
        cli.cwd,
        tool_use_turn(tool_use("t1", "list_notes", {})),
        tool_use_turn(tool_use("t2", "delete_note", {"name": "old"})),
    )
    args = shlex.split(command)[1:]
    assert args[2:] == ["--mcp", "python notes_server.py"]
    parked = cli(*args, "--model", model, "--json")  # `python` is the venv's: it is first on PATH
    assert parked.returncode == 3, parked
    (pending,) = parked.data["pending_approvals"]
    assert pending["reason"] == (
        "MCP server 'python notes_server.py' says it may change or delete things (MCP destructiveHint)"
    )
    assert (cli.cwd / "notes" / "old.txt").exists()
    assert cli("approve", parked.data["run_id"], "t2").returncode == 0
    assert cli("resume", parked.data["run_id"]).returncode == 0
    assert not (cli.cwd / "notes" / "old.txt").exists()
