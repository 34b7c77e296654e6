"""End-to-end tests of the ``tether`` command: scripted models, SQLite.

Every command runs as ``python -m tether ...`` would (in this process, see support.run_tether;
in a real one where that is the point) in a temporary directory, with stdin not a terminal,
``TETHER_DB`` unset and no API key, so nothing touches the network and the approval gate
parks instead of prompting. The tools module written into the directory keeps its state in
files, so what a tool did can be checked across commands.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support import Cli, CliResult, Scenario, flat, token_usage, tool_use

pytestmark = pytest.mark.slow  # whole `tether` commands (in-process: support.run_tether)

RESULT_KEYS = {
    "run_id",
    "status",
    "output",
    "result",
    "error",
    "steps",
    "tool_calls",
    "usage",
    "pending_approvals",
}
USAGE_KEYS = {"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"}

TOOLS_MODULE = textwrap.dedent(
    '''
    """Tools for the CLI tests; every side effect lands in a file of the current directory."""

    from pathlib import Path

    from tether import RetryPolicy, tool


    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b


    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05))
    def flaky(x: int) -> str:
        """Fails the first time it is ever called (counted in flaky.count), then works."""
        counter = Path("flaky.count")
        calls = (int(counter.read_text()) if counter.exists() else 0) + 1
        counter.write_text(str(calls))
        if calls == 1:
            raise ConnectionError("transient failure")
        return f"flaky ok {x}"


    @tool(approval=True)
    def danger(path: str) -> str:
        """Something irreversible: appends the path to danger.marker."""
        with Path("danger.marker").open("a", encoding="utf-8") as marker:
            marker.write(path + "\\n")
        return f"danger ran on {path}"


    @tool(final=True)
    def answer(value: int, note: str) -> str:
        """Give the final, structured answer."""
        return "recorded"


    TOOLS = [add, flaky, danger, answer]
    '''
)


# Scripted model replies ------------------------------------------------------------------
def tool_turn(*calls: dict[str, Any], text: str | None = None, tokens: dict[str, int] | None = None) -> dict[str, Any]:
    content = ([{"type": "text", "text": text}] if text else []) + list(calls)
    return {"content": content, "stop_reason": "tool_use", "usage": tokens or token_usage(10, 5)}


def answer_turn(text: str, tokens: dict[str, int] | None = None) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": tokens or token_usage(20, 7),
    }


MAIN_SCRIPT = [
    tool_turn(
        tool_use("toolu_add1", "add", {"a": 2, "b": 3}),
        tool_use("toolu_flaky", "flaky", {"x": 7}),
        text="Let me add and try the flaky one.",
        tokens=token_usage(10, 5, 3, 1),
    ),
    tool_turn(tool_use("toolu_add2", "add", {"a": 5, "b": 10}), tokens=token_usage(20, 6, 0, 4)),
    answer_turn("The answer is 15.", tokens=token_usage(30, 7, 2, 8)),
]
ADD_SCRIPT = [tool_turn(tool_use("toolu_add", "add", {"a": 2, "b": 3})), answer_turn("The sum is 5.")]
GATED_SCRIPT = [tool_turn(tool_use("toolu_danger", "danger", {"path": "a.txt"})), answer_turn("All done.")]
LOOPING_SCRIPT = [tool_turn(tool_use(f"toolu_loop{i}", "add", {"a": i, "b": i})) for i in range(4)]
FINAL_SCRIPT = [
    tool_turn(tool_use("toolu_final", "answer", {"value": "42", "note": "hi"}), text="Here it is."),
    answer_turn("THE MODEL WAS CALLED AGAIN"),
]


def make_workspace(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    for name, script in {
        "main.json": MAIN_SCRIPT,
        "add.json": ADD_SCRIPT,
        "gated.json": GATED_SCRIPT,
        "looping.json": LOOPING_SCRIPT,
        "final.json": FINAL_SCRIPT,
        "mixed.json": [
            tool_turn(
                tool_use("toolu_add", "add", {"a": 2, "b": 3}), tool_use("toolu_danger", "danger", {"path": "x"})
            ),
            answer_turn("ok"),
        ],
        "second.json": [answer_turn("Second answer.")],
    }.items():
        (path / name).write_text(json.dumps(script), encoding="utf-8")
    (path / "broken.json").write_text('[{"content": ', encoding="utf-8")
    (path / "object.json").write_text('{"content": []}', encoding="utf-8")
    return path


def run_args(prompt: str, script: str, *extra: str, tools: str = "mytools:TOOLS") -> list[str]:
    return ["run", prompt, "--tools", tools, "--model", f"scripted:{script}", "--json", *extra]


# The first command of every scenario, started all at once in its own directory ----------
BAD_TOOL_SPECS = {
    "nomodule:X": "cannot import 'nomodule'",
    "mytools:missing": "has no 'missing'",
    "mytools": "MODULE:ATTR",
}
GATED = run_args("Do the dangerous thing.", "gated.json")


def first_commands(root: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Scenario name -> (first command, extra env); each runs in ``root/name``."""
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "main": (run_args("Add things up.", "main.json"), {}),
        "parked": (GATED, {}),
        "approve": (GATED, {}),
        "deny": (GATED, {}),
        "edit": (GATED, {}),
        "approve_all": ([*GATED, "--approve-all"], {}),
        "deny_all": ([*GATED, "--deny-all"], {}),
        "final": (run_args("Answer.", "final.json"), {}),
        "single": (run_args("Add, then try danger.", "mixed.json", tools="mytools:add"), {}),
        # mytools:TOOLS holds `add` too
        "duplicate": (run_args("hi", "add.json", "--tools", "mytools:add"), {}),
        "broken_model": (run_args("hi", "broken.json"), {}),
        "object_model": (run_args("hi", "object.json"), {}),
        "db_flag": (run_args("one", "add.json", "--db", f"sqlite:///{root / 'dbs' / 'flag' / 'runs.db'}"), {}),
        "db_env": (run_args("two", "add.json"), {"TETHER_DB": f"sqlite:///{root / 'dbs' / 'env' / 'env.db'}"}),
    }
    for index, spec in enumerate(BAD_TOOL_SPECS):
        commands[f"bad_tools_{index}"] = (run_args("hi", "add.json", tools=spec), {})
    return commands


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Scenario]:
    root = tmp_path_factory.mktemp("cli")
    (root / "dbs" / "flag").mkdir(parents=True)
    (root / "dbs" / "env").mkdir(parents=True)
    return {
        name: Scenario(Cli(make_workspace(root / name)), command, env)
        for name, (command, env) in first_commands(root).items()
    }


@dataclass
class Base:
    """The main scenario: a finished run, plus a failed one and ``show --json`` in the same database."""

    cli: Cli
    done: CliResult
    failed: CliResult
    shown: CliResult


@pytest.fixture(scope="module")
def base(scenarios: dict[str, Scenario]) -> Base:
    main = scenarios["main"]
    cli, done = main.cli, main.first
    assert done.returncode == 0, done
    failed = cli(*run_args("Loop.", "looping.json", "--max-steps", "1"))
    shown = cli("show", done.data["run_id"], "--json")
    return Base(cli, done, failed, shown)


def assert_result_shape(data: Mapping[str, Any]) -> None:
    assert set(data) == RESULT_KEYS, data
    assert set(data["usage"]) == USAGE_KEYS, data
    assert isinstance(data["run_id"], str)
    assert data["run_id"]
    assert isinstance(data["steps"], int)
    assert isinstance(data["tool_calls"], int)
    assert isinstance(data["pending_approvals"], list)


def tool_results(messages: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every tool_result block of the history, by tool_use_id."""
    found: dict[str, dict[str, Any]] = {}
    for message in messages:
        if message["role"] != "user" or not isinstance(message["content"], list):
            continue
        for block in message["content"]:
            if block.get("type") == "tool_result":
                assert block["tool_use_id"] not in found, "a tool_use answered twice"
                found[block["tool_use_id"]] = block
    return found


def result_text(block: Mapping[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content)
    return str(content)


def events_of(shown: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [event for event in shown["events"] if event["type"] == kind]


def marker_lines(cli: Cli) -> list[str] | None:
    marker = cli.cwd / "danger.marker"
    return marker.read_text(encoding="utf-8").splitlines() if marker.exists() else None


def parked_run(scenario: Scenario) -> str:
    """The run id of a scenario whose first command parked on the gated call."""
    parked = scenario.first
    assert parked.returncode == 3, parked
    assert parked.data["status"] == "awaiting_approval"
    assert marker_lines(scenario.cli) is None
    return str(parked.data["run_id"])


# The tests -------------------------------------------------------------------------------
def test_python_m_tether_help(tmp_path: Path) -> None:
    done = Cli(tmp_path).process("--help")  # the real entry point, in a process of its own
    assert done.returncode == 0, done
    assert "usage: tether" in done.stdout
    for command in ("run", "resume", "approve", "deny", "show", "runs", "demo"):
        assert command in done.stdout


def test_run_json_prints_exactly_one_result_object(base: Base) -> None:
    done = base.done
    assert done.returncode == 0, done
    data = done.data
    assert_result_shape(data)
    assert data["status"] == "done"
    assert data["output"] == "The answer is 15."
    assert data["result"] is None
    assert data["error"] is None
    assert data["pending_approvals"] == []
    assert data["steps"] == 3  # one per model invocation
    # add, flaky (failed once, then worked: two attempts), add
    assert data["tool_calls"] == 4
    assert (base.cli.cwd / "flaky.count").read_text() == "2"
    expected = {key: sum(reply["usage"][key] for reply in MAIN_SCRIPT) for key in USAGE_KEYS}
    assert data["usage"] == expected
    assert expected == {
        "input_tokens": 60,
        "output_tokens": 18,
        "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 13,
    }


def test_show_json_has_history_and_events_oldest_first(base: Base) -> None:
    shown = base.shown
    assert shown.returncode == 0, shown
    data = shown.data
    assert set(data) >= RESULT_KEYS
    assert {key: data[key] for key in RESULT_KEYS} == base.done.data

    messages = data["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == [{"type": "text", "text": "Add things up."}]
    for index, reply in zip((1, 3, 5), MAIN_SCRIPT, strict=True):
        assert messages[index]["content"] == reply["content"]
    results = tool_results(messages)
    assert set(results) == {"toolu_add1", "toolu_flaky", "toolu_add2"}
    assert [b["tool_use_id"] for b in messages[2]["content"] if b["type"] == "tool_result"] == [
        "toolu_add1",
        "toolu_flaky",
    ]
    assert result_text(results["toolu_add1"]) == "5"
    assert result_text(results["toolu_flaky"]) == "flaky ok 7"
    assert result_text(results["toolu_add2"]) == "15"
    assert not any(block.get("is_error") for block in results.values())

    events = data["events"]
    assert all(isinstance(event.get("type"), str) for event in events)
    assert [event["seq"] for event in events] == list(range(len(events)))
    times = [event["at"] for event in events]
    assert times == sorted(times)
    assert events[0]["type"] == "run_started"
    assert events[-1]["type"] == "run_finished"
    assert events[-1]["status"] == "done"
    assert len(events_of(data, "model_responded")) == 3
    # the scripted replies name no model: each answer records the model the run used
    [model] = {event["model"] for event in events_of(data, "model_responded")}
    assert re.fullmatch(r"scripted:\S*main\.json", model), model
    assert len(events_of(data, "retry_scheduled")) == 1
    assert [e["call_id"] for e in events_of(data, "tool_started")].count("toolu_flaky") == 2


def test_show_human(base: Base) -> None:
    run_id = base.done.data["run_id"]
    shown = base.cli("show", run_id)
    assert shown.returncode == 0, shown
    text = flat(shown.stdout)
    assert "status: done" in text
    assert run_id in text
    assert "step 3" in text  # the conversation
    logged = base.cli("show", run_id, "--events")
    assert "run_finished" in flat(logged.stdout)  # the event log
    assert re.search(r"model\W+scripted:", flat(logged.stdout)), logged  # the model that answered, not null


def test_max_steps_fails_the_run(base: Base) -> None:
    failed = base.failed
    assert failed.returncode == 1, failed
    data = failed.data
    assert_result_shape(data)
    assert data["status"] == "failed"
    assert "max_steps" in data["error"]
    assert data["steps"] == 1
    assert data["output"] is None


def test_runs_lists_and_filters(base: Base) -> None:
    done_id, failed_id = base.done.data["run_id"], base.failed.data["run_id"]
    all_runs, only_done, human = base.cli.parallel(["runs", "--json"], ["runs", "--status", "done", "--json"], ["runs"])
    for listing in (all_runs, only_done):
        assert listing.returncode == 0, listing
    statuses = {row["run_id"]: row["status"] for row in all_runs.data["runs"]}
    assert statuses[done_id] == "done"
    assert statuses[failed_id] == "failed"
    row = next(r for r in all_runs.data["runs"] if r["run_id"] == done_id)
    assert row["steps"] == 3
    assert row["tool_calls"] == 4
    filtered = only_done.data["runs"]
    assert done_id in {r["run_id"] for r in filtered}
    assert failed_id not in {r["run_id"] for r in filtered}
    assert {r["status"] for r in filtered} == {"done"}

    assert human.returncode == 0, human
    assert "done" in human.stdout
    assert "failed" in human.stdout
    assert done_id[:12] in human.stdout


def test_runs_human_shows_full_run_ids_at_80_columns(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["parked"]
    run_id = parked_run(scenario)
    done = scenario.cli("runs", env={"COLUMNS": "80"})
    assert done.returncode == 0, done
    assert "awaiting_approval" in done.stdout
    assert run_id in done.stdout


def test_unknown_run_id_is_a_usage_error(base: Base) -> None:
    for done in base.cli.parallel(["show", "run_nope", "--json"], ["resume", "run_nope", "--json"]):
        assert done.returncode == 2, done
        assert "not found" in done.err
        assert done.stdout == ""


def test_continue_starts_from_the_earlier_history(base: Base) -> None:
    first = base.shown.data
    second = base.cli(*run_args("And now?", "second.json", "--continue", first["run_id"]))
    assert second.returncode == 0, second
    assert second.data["status"] == "done"
    assert second.data["output"] == "Second answer."
    assert second.data["steps"] == 1
    assert second.data["run_id"] != first["run_id"]

    shown = base.cli("show", second.data["run_id"], "--json").data
    previous = first["messages"]
    messages = shown["messages"]
    assert messages[: len(previous)] == previous
    assert messages[len(previous)] == {"role": "user", "content": [{"type": "text", "text": "And now?"}]}
    assert messages[len(previous) + 1] == {"role": "assistant", "content": [{"type": "text", "text": "Second answer."}]}
    assert len(messages) == len(previous) + 2


def test_tools_given_as_a_single_tool(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["single"]
    done = scenario.first
    assert done.returncode == 0, done
    assert done.data["status"] == "done"
    assert done.data["tool_calls"] == 1
    shown = scenario.cli("show", done.data["run_id"], "--json").data
    results = tool_results(shown["messages"])
    assert result_text(results["toolu_add"]) == "5"
    # only `add` was loaded: the model's call of `danger` is answered as an unknown tool
    assert results["toolu_danger"].get("is_error") is True
    assert "unknown tool" in result_text(results["toolu_danger"])
    assert marker_lines(scenario.cli) is None


@pytest.mark.parametrize("index", range(len(BAD_TOOL_SPECS)), ids=list(BAD_TOOL_SPECS))
def test_bad_tools_spec_is_a_usage_error(scenarios: dict[str, Scenario], index: int) -> None:
    spec, message = list(BAD_TOOL_SPECS.items())[index]
    done = scenarios[f"bad_tools_{index}"].first
    assert done.returncode == 2, done
    assert done.stdout == "", done
    assert "error" in done.err
    assert spec in done.err, done
    assert message in done.err, done


def test_duplicate_tool_names_are_a_usage_error(scenarios: dict[str, Scenario]) -> None:
    done = scenarios["duplicate"].first
    assert done.returncode == 2, done
    assert "add" in done.err


def test_scripted_model_file_must_be_a_json_list(scenarios: dict[str, Scenario]) -> None:
    broken, not_list = scenarios["broken_model"].first, scenarios["object_model"].first
    assert broken.returncode == 2, broken
    assert broken.stdout == ""
    assert "broken.json" in broken.err
    assert "cannot read scripted model file" in broken.err
    assert not_list.returncode == 2, not_list
    assert "expected a JSON list" in not_list.err


def test_gated_call_parks_then_approve_and_resume_in_new_processes(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["approve"]
    cli = scenario.cli
    run_id = parked_run(scenario)
    data = scenario.first.data
    assert_result_shape(data)
    assert data["steps"] == 1
    assert data["tool_calls"] == 0
    [pending] = data["pending_approvals"]
    assert pending["call_id"] == "toolu_danger"
    assert pending["tool"] == "danger"
    assert pending["input"] == {"path": "a.txt"}

    approved = cli("approve", run_id, "toolu_danger", "--by", "alice")
    assert approved.returncode == 0, approved
    assert marker_lines(cli) is None  # approving records the decision; it does not run the tool

    resumed = cli("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed
    assert_result_shape(resumed.data)
    assert resumed.data["status"] == "done"
    assert resumed.data["output"] == "All done."
    assert resumed.data["steps"] == 2
    assert resumed.data["tool_calls"] == 1
    assert resumed.data["pending_approvals"] == []
    assert marker_lines(cli) == ["a.txt"]

    again, show = cli.parallel(["approve", run_id, "toolu_danger", "--by", "bob"], ["show", run_id, "--json"])
    assert again.returncode != 0, again
    assert re.search(r"not awaiting approval|already decided|not pending", again.err), again
    assert marker_lines(cli) == ["a.txt"]

    shown = show.data
    [decided] = events_of(shown, "approval_decided")
    assert decided["actor"] == "alice"
    assert decided["approved"] is True
    assert decided["call_id"] == "toolu_danger"
    result = tool_results(shown["messages"])["toolu_danger"]
    assert not result.get("is_error")
    assert "danger ran on a.txt" in result_text(result)
    assert len(events_of(shown, "tool_started")) == 1


def test_deny_then_resume_tells_the_model_why(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["deny"]
    cli = scenario.cli
    run_id = parked_run(scenario)

    denied = cli("deny", run_id, "toolu_danger", "--reason", "too risky", "--by", "bob")
    assert denied.returncode == 0, denied
    resumed = cli("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert resumed.data["tool_calls"] == 0
    assert marker_lines(cli) is None

    shown = cli("show", run_id, "--json").data
    result = tool_results(shown["messages"])["toolu_danger"]
    assert result.get("is_error") is True
    assert "too risky" in result_text(result)
    [decided] = events_of(shown, "approval_decided")
    assert decided["approved"] is False
    assert decided["actor"] == "bob"


def test_approve_with_edited_input(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["edit"]
    cli = scenario.cli
    run_id = parked_run(scenario)

    wrong_type, not_json, too_deep, deep = cli.parallel(
        ["approve", run_id, "toolu_danger", "--input", '{"path": 5}'],
        ["approve", run_id, "toolu_danger", "--input", "{not json"],
        ["approve", run_id, "toolu_danger", "--input", '{"path": ' + "[" * 30_000 + "]" * 30_000 + "}"],
        ["approve", run_id, "toolu_danger", "--input", '{"path": ' + '{"a": ' * 300 + "1" + "}" * 301],
    )
    for nested in (too_deep, deep):  # past the JSON parser's recursion, or pydantic's serialization depth
        assert nested.returncode == 2, nested
        assert "--input is nested too deeply (more than 100 levels)" in nested.err
        assert "Traceback" not in nested.stderr
    assert wrong_type.returncode != 0, wrong_type
    assert "path" in wrong_type.err
    assert "invalid" in wrong_type.err
    assert not_json.returncode != 0, not_json
    assert "JSON" in not_json.err

    # still pending: nothing was recorded, so the call can be approved now
    approved = cli("approve", run_id, "toolu_danger", "--input", '{"path": "edited.txt"}', "--by", "alice")
    assert approved.returncode == 0, approved
    resumed = cli("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert resumed.data["tool_calls"] == 1
    assert marker_lines(cli) == ["edited.txt"]


def test_run_with_approve_all(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["approve_all"]
    done = scenario.first
    assert done.returncode == 0, done
    assert done.data["status"] == "done"
    assert done.data["tool_calls"] == 1
    assert marker_lines(scenario.cli) == ["a.txt"]


def test_run_with_deny_all(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["deny_all"]
    done = scenario.first
    assert done.returncode == 0, done
    assert done.data["status"] == "done"
    assert done.data["tool_calls"] == 0
    assert done.data["pending_approvals"] == []
    assert marker_lines(scenario.cli) is None


def test_final_tool_result_is_the_validated_input(scenarios: dict[str, Scenario]) -> None:
    done = scenarios["final"].first
    assert done.returncode == 0, done
    data = done.data
    assert_result_shape(data)
    assert data["status"] == "done"
    assert data["result"] == {"value": 42, "note": "hi"}  # "42" validated to an int
    assert data["steps"] == 1  # the model was not called after the final tool
    assert "CALLED AGAIN" not in json.dumps(data)


def test_db_flag_and_tether_db_env(scenarios: dict[str, Scenario]) -> None:
    by_flag, by_env = scenarios["db_flag"], scenarios["db_env"]
    root = by_flag.cli.cwd.parent
    flag_url = f"sqlite:///{root / 'dbs' / 'flag' / 'runs.db'}"
    env_url = f"sqlite:///{root / 'dbs' / 'env' / 'env.db'}"
    for scenario in (by_flag, by_env):
        assert scenario.first.returncode == 0, scenario.first
        assert not (scenario.cli.cwd / "tether.db").exists()
    assert (root / "dbs" / "flag" / "runs.db").exists()
    assert (root / "dbs" / "env" / "env.db").exists()

    flag_id, env_id = by_flag.first.data["run_id"], by_env.first.data["run_id"]
    cli = by_flag.cli
    shown = cli("show", flag_id, "--json", "--db", flag_url)
    listed = cli("runs", "--json", env={"TETHER_DB": env_url})
    assert shown.returncode == 0, shown
    assert shown.data["status"] == "done"
    assert listed.returncode == 0, listed
    assert [r["run_id"] for r in listed.data["runs"]] == [env_id]  # the --db run is not in it


def test_continue_from_a_parked_run_answers_its_open_calls(scenarios: dict[str, Scenario]) -> None:
    scenario = scenarios["parked"]
    run_id = parked_run(scenario)
    again = scenario.cli(*run_args("And now?", "second.json", "--continue", run_id))
    assert again.returncode == 0, again
    assert again.data["status"] == "done"
    assert again.data["output"] == "Second answer."
    messages = scenario.cli("show", again.data["run_id"], "--json").data["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    closing = messages[2]["content"]
    assert closing[0]["type"] == "tool_result"
    assert closing[0]["tool_use_id"] == "toolu_danger"
    assert closing[0].get("is_error") is True
    assert closing[-1] == {"type": "text", "text": "And now?"}
    assert marker_lines(scenario.cli) is None
