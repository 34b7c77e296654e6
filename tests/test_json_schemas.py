"""Every ``--json`` output has a JSON Schema, shipped in the package, and real output matches it.

The schemas (``tether/surfaces/schemas/COMMAND.json``, draft 2020-12) are what the reference
publishes. Here real commands run on a scripted model — a run that parks, is decided, resumed,
shown, listed, audited, forked, cancelled, collected and replayed; a run waiting for a tool retry; a run
whose agent tool starts a child run that waits for a person; a run another process is driving;
the demo; and, on PostgreSQL, a detached run driven by ``tether worker`` — and each output is
validated against its command's schema. The schemas forbid keys they do not describe, so a key
added to an output fails here until the schema (and so the reference) says what it is.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, ValidationError
from referencing import Registry, Resource

from support import DONE, Cli, CliResult, PgSchema, clean_env, tool_use, tool_use_turn
from tether import Agent, Runner
from tether.facts.events import EVENT_TYPES
from tether.facts.status import SHOWN, RunStatus
from tether.models.scripted import ScriptedModel
from tether.stores.sql import SQLStore

SCHEMAS = {
    entry.name.removesuffix(".json"): json.loads(entry.read_text(encoding="utf-8"))
    for entry in (resources.files("tether.surfaces") / "schemas").iterdir()
    if entry.name.endswith(".json")
}
REGISTRY: Registry[Any] = Registry().with_resources(
    (schema["$id"], Resource.from_contents(schema)) for schema in SCHEMAS.values()
)
COMMANDS_WITH_JSON = {
    *("run", "resume", "cancel", "fork", "show", "runs", "gc", "pending", "audit", "demo", "worker"),
    "replay",
}

TOOLS = textwrap.dedent(
    '''
    from tether import Agent, RetryPolicy, tool
    from tether.testing import ScriptedModel


    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b


    @tool(approval=True)
    def wipe(path: str) -> str:
        """Delete a file."""
        return f"wiped {path}"


    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=3600, jitter=0))
    def flaky() -> str:
        """Fails once, then waits an hour to be tried again."""
        raise TimeoutError("the service did not answer")


    WIPE_DRAFT = {"type": "tool_use", "id": "toolu_child_wipe", "name": "wipe", "input": {"path": "draft"}}
    ANSWER = {"content": [{"type": "text", "text": "ok"}]}
    reviewer = Agent(
        ScriptedModel([{"content": [WIPE_DRAFT], "stop_reason": "tool_use"}, ANSWER]),
        tools=[wipe],
        name="reviewer",
    )
    TOOLS = [add, wipe, flaky]
    WITH_REVIEWER = [add, reviewer.as_tool("review", "Have the reviewer look.")]
    '''
)


def validate(command: str, shown: CliResult | dict[str, Any]) -> dict[str, Any]:
    """``shown``'s JSON, after checking it against ``command``'s schema."""
    data = shown if isinstance(shown, dict) else shown.data
    Draft202012Validator(SCHEMAS[command], registry=REGISTRY).validate(data)
    return data


def model(where: Path, *turns: dict[str, Any]) -> str:
    path = where / f"model-{len(list(where.glob('model-*')))}.json"
    path.write_text(json.dumps([*turns, DONE]), encoding="utf-8")
    return f"scripted:{path}"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    (tmp_path / "tools.py").write_text(TOOLS, encoding="utf-8")
    return Cli(tmp_path)


def test_each_schema_is_valid_draft_2020_12_and_every_json_command_has_one() -> None:
    for schema in SCHEMAS.values():
        Draft202012Validator.check_schema(schema)
    assert set(SCHEMAS) == COMMANDS_WITH_JSON


def test_the_schemas_name_every_status_and_event_type_there_is() -> None:
    run = SCHEMAS["run"]["$defs"]
    assert run["status"]["enum"] == list(SHOWN)  # executing_tool, awaiting_approval: the machine's state ids
    transition = SCHEMAS["show"]["$defs"]["event"]["allOf"][0]["then"]["properties"]
    assert set(transition["target"]["enum"]) == {status.value for status in RunStatus}  # one spelling in the log too
    assert set(SCHEMAS["show"]["$defs"]["event"]["properties"]["type"]["enum"]) == EVENT_TYPES


def test_a_run_parked_decided_resumed_shown_listed_audited_forked_cancelled_and_collected(cli: Cli) -> None:
    script = model(
        cli.cwd,
        tool_use_turn(tool_use("toolu_1", "add", {"a": 1, "b": 2})),
        tool_use_turn(tool_use("toolu_2", "wipe", {"path": "x"})),
    )
    parked = cli("run", "add, then wipe", "--tools", "tools:TOOLS", "--model", script, "--json")
    assert parked.returncode == 3, parked
    run_id = validate("run", parked)["run_id"]
    assert parked.data["status"] == "awaiting_approval"
    with pytest.raises(ValidationError, match="surprise"):  # a key the schema does not describe
        validate("run", {**parked.data, "surprise": 1})
    assert validate("pending", cli("pending", "--json"))["pending"][0]["call_id"] == "toolu_2"
    assert validate("show", cli("show", run_id, "--json"))["status"] == "awaiting_approval"
    assert cli("approve", run_id, "toolu_2").returncode == 0
    assert validate("resume", cli("resume", run_id, "--json"))["status"] == "done"
    shown = validate("show", cli("show", run_id, "--json"))
    assert {event["type"] for event in shown["events"]} >= {"run_started", "approval_decided", "run_finished"}
    assert [row["status"] for row in validate("runs", cli("runs", "--json"))["runs"]] == ["done"]
    assert [entry["tool"] for entry in validate("audit", cli("audit", "--json"))["entries"]] == ["add", "wipe"]
    fork = validate("fork", cli("fork", run_id, "--at", "1", "--json"))
    assert fork["forked_from"] == {"run_id": run_id, "step": 1}
    assert validate("cancel", cli("cancel", fork["run_id"], "--json"))["status"] == "cancelled"
    would = validate("gc", cli("gc", "--older-than", "0s", "--dry-run", "--json"))
    assert sorted(row["run_id"] for row in would["runs"]) == sorted([run_id, fork["run_id"]])
    assert validate("gc", cli("gc", "--older-than", "0s", "--yes", "--json"))["deleted"] == 2


def test_a_run_waiting_for_a_tool_retry(cli: Cli) -> None:
    script = model(cli.cwd, tool_use_turn(tool_use("toolu_1", "flaky", {})))
    waiting = cli("run", "try it", "--tools", "tools:TOOLS", "--model", script, "--max-wait", "0", "--json")
    assert waiting.returncode == 4, waiting
    assert validate("run", waiting)["status"] == "waiting_retry"
    assert "next_due_at" in waiting.data
    (row,) = validate("runs", cli("runs", "--json"))["runs"]
    assert row["next_due_at"] == waiting.data["next_due_at"]
    assert validate("show", cli("show", row["run_id"], "--json"))["status"] == "waiting_retry"


def test_a_run_whose_child_run_waits_for_a_person(cli: Cli) -> None:
    script = model(cli.cwd, tool_use_turn(tool_use("toolu_review", "review", {"task": "Look at the draft."})))
    parked = cli("run", "have it reviewed", "--tools", "tools:WITH_REVIEWER", "--model", script, "--json")
    assert parked.returncode == 3, parked
    (child,) = validate("run", parked)["children"]
    (waiting,) = parked.data["pending_approvals"]
    assert (waiting["run_id"], waiting["call_id"]) == (child["run_id"], "toolu_child_wipe")
    assert validate("pending", cli("pending", "--json"))["pending"][0]["chain"] == [
        parked.data["run_id"],
        child["run_id"],
    ]
    (node,) = validate("show", cli("show", parked.data["run_id"], "--json"))["children"]
    assert (node["agent"], node["tool"]) == ("reviewer", "review")
    assert validate("show", cli("show", child["run_id"], "--json"))["parent"]["run_id"] == parked.data["run_id"]
    assert {row["parent"] for row in validate("runs", cli("runs", "--json"))["runs"]} == {None, parked.data["run_id"]}


def test_a_run_another_process_is_driving(cli: Cli) -> None:
    script = model(cli.cwd, tool_use_turn(tool_use("toolu_1", "wipe", {"path": "x"})))
    run_id = cli("run", "wipe it", "--tools", "tools:TOOLS", "--model", script, "--json").data["run_id"]
    store = SQLStore(f"sqlite:///{cli.cwd / 'tether.db'}")
    try:
        with Runner(Agent(ScriptedModel([])), store).hold(run_id):
            busy = cli("resume", run_id, "--json")
    finally:
        store.close()
    assert busy.returncode == 5, busy
    assert set(validate("resume", busy)["busy"]) == {"holder", "expires_at", "lost"}


def test_a_run_replayed_alone_and_among_others(cli: Cli) -> None:
    script = model(cli.cwd, tool_use_turn(tool_use("toolu_1", "add", {"a": 1, "b": 2})))
    run_id = cli("run", "add", "--tools", "tools:TOOLS", "--model", script, "--json").data["run_id"]
    assert cli("run", "more", "--continue", run_id, "--model", script, "--json").returncode == 0

    alone = cli("replay", run_id, "--json")
    changed = cli("replay", run_id, "--system", "Be brief.", "--json")
    many = cli("replay", "--from-runs", "--json")

    assert (alone.returncode, changed.returncode, many.returncode) == (0, 0, 0), many
    assert validate("replay", alone)["replay"]["calls"] == [{"tool": "add", "input": {"a": 1, "b": 2}}]
    assert validate("replay", changed)["let_through"] == ["system prompt changed (model calls #1, #2)"]
    summary = validate("replay", many)
    assert (summary["agree"], summary["differ"], summary["not_replayed"]) == (1, 0, 1)
    assert [run["verdict"] for run in summary["runs"]] == ["not replayed", "agrees"]


def test_the_demo(cli: Cli) -> None:
    shown = cli("demo", "--approve-all", "--workspace", str(cli.cwd / "demo"), "--json")
    assert shown.returncode == 0, shown
    assert validate("demo", shown)["status"] == "done"


@pytest.mark.postgres
@pytest.mark.slow
def test_a_detached_run_and_the_worker_that_drives_it(cli: Cli, pg_schema: PgSchema) -> None:
    queued = validate("run", cli("run", "go", "--detach", "--db", pg_schema.url, "--model", "scripted-demo", "--json"))
    assert queued["status"] == "queued"
    again = validate("resume", cli("resume", queued["run_id"], "--detach", "--db", pg_schema.url, "--json"))
    assert (again["status"], again["already"]) == ("queued", True)
    command = [sys.executable, "-m", "tether", "worker", "--db", pg_schema.url, "--json"]
    worker = subprocess.Popen(command, cwd=cli.cwd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert worker.stdout is not None
    try:
        lines = [validate("worker", json.loads(worker.stdout.readline())) for _ in range(2)]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    assert [(line["run_id"], line["what"]) for line in lines] == [
        (queued["run_id"], "picked_up"),
        (queued["run_id"], "done"),
    ]
