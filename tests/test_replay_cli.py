"""`tether export RUN --as-test PATH` and `tether replay RUN`: stored runs as regression tests.

End to end, as a user does it: a run made by `tether run` in a project directory is exported, the
test passes in its own pytest process, and a changed tool schema or system prompt makes it fail
with a readable diff; secrets are scrubbed from both files. `tether replay` asks the run's prompt
again with a changed agent and shows both trajectories side by side (exit 0 agree, 1 differ), or
sums up many runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import Cli, clean_env, flat, runs_made
from tether.redact import MASK
from tether.surfaces import replaying
from tether.testing.replay_tools import UNMATCHED

SHOP = '''\
from tether import tool


@tool
def lookup(order_id: str) -> dict:
    """Find an order by its id."""
    return {"order_id": order_id, "price": 30.0, "status": "delivered"}


@tool(approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order, in full or in part."""
    return f"refunded {amount} for order {order_id}"


TOOLS = [lookup, refund]
'''
SCRIPT: list[dict[str, Any]] = [
    {"content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"order_id": "42"}}]},
    {"content": [{"type": "tool_use", "id": "toolu_2", "name": "refund", "input": {"order_id": "42", "amount": 30.0}}]},
    {"content": [{"type": "text", "text": "Order 42 is refunded."}], "stop_reason": "end_turn"},
]
SYSTEM = "You help customers with their orders."
SECRET = "sk-ant-secret-0123456789"


def project(tmp_path: Path, *options: str) -> Cli:
    """A project directory with a tools module and a scripted model, and one run made there (with ``options``)."""
    (tmp_path / "shop.py").write_text(SHOP)
    replies = [{**reply, "stop_reason": reply.get("stop_reason", "tool_use")} for reply in SCRIPT]
    (tmp_path / "script.json").write_text(json.dumps(replies))
    cli = Cli(tmp_path)
    ran = cli(
        "run", "--tools", "shop:TOOLS", "--model", "scripted:script.json", "--system", SYSTEM, "--approve-all",
        *options, f"Refund order 42, my key is {SECRET}",
    )  # fmt: skip
    assert ran.returncode == 0, ran
    return cli


def pytest_in(where: Path, test: str) -> subprocess.CompletedProcess[str]:
    """``pytest TEST`` in a process of its own, as a user (or CI) runs the exported test."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", test],
        cwd=where,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_an_exported_run_passes_offline_and_fails_with_a_diff_after_a_breaking_change(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]

    exported = cli("export", run_id, "--as-test", "tests/test_refund.py", env={"SHOP_API_KEY": SECRET})

    assert exported.returncode == 0, exported
    assert "wrote tests/test_refund.py and tests/test_refund.json" in exported.stdout
    test, recording = tmp_path / "tests/test_refund.py", (tmp_path / "tests/test_refund.json").read_text()
    assert SECRET not in recording
    assert SECRET not in test.read_text()
    assert f"my key is {MASK}" in recording
    passed = pytest_in(tmp_path, "tests/test_refund.py")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "1 passed" in passed.stdout
    formatted = subprocess.run(  # born formatted: committed as it is
        [sys.executable, "-m", "ruff", "format", "--isolated", "--check", str(test)], capture_output=True, check=False
    )
    assert formatted.returncode == 0, formatted.stdout

    (tmp_path / "shop.py").write_text(SHOP.replace("def lookup(order_id: str)", "def lookup(order_id: int)"))
    broken = pytest_in(tmp_path, "tests/test_refund.py")

    assert broken.returncode == 1, broken.stdout
    failure = broken.stdout
    assert "model call #1: the request differs from the recorded one" in failure
    assert "tool 'lookup': input schema changed" in failure
    assert '-      "type": "string"' in failure
    assert '+      "type": "integer"' in failure
    assert 'call 1: expected lookup {"order_id":"42"}, got (no call)' in failure


@pytest.mark.slow
def test_an_exported_test_fails_when_the_system_prompt_changes(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]
    assert cli("export", run_id, "--as-test", "regressions/test_refund.py").returncode == 0
    test = tmp_path / "regressions/test_refund.py"
    test.write_text(test.read_text().replace(json.dumps(SYSTEM), json.dumps("You help customers. Never refund.")))

    broken = pytest_in(tmp_path / "regressions", "test_refund.py")  # from another directory too

    assert broken.returncode == 1, broken.stdout
    assert "system prompt changed" in broken.stdout
    assert "-You help customers with their orders." in broken.stdout
    assert "+You help customers. Never refund." in broken.stdout


def test_an_agent_of_the_users_program_can_be_named(tmp_path: Path) -> None:
    cli = project(tmp_path)
    (tmp_path / "agents.py").write_text(
        textwrap.dedent(f"""\
            from tether import Agent
            from tether.models.scripted import ScriptedModel
            from shop import TOOLS

            def support():
                return Agent(model=ScriptedModel([]), tools=TOOLS, system={SYSTEM!r},
                             model_name="scripted:{tmp_path / "script.json"}")
        """)
    )
    run_id = runs_made(cli)[0]["run_id"]

    assert cli("export", run_id, "--as-test", "test_support.py", "--agent", "agents:support").returncode == 0

    assert 'AGENT = "agents:support"' in (tmp_path / "test_support.py").read_text()
    run_exported(tmp_path / "test_support.py", run_id)


def test_a_run_on_either_database_exports_to_a_test_that_passes(tmp_path: Path, db_url: str) -> None:
    cli = project(tmp_path, "--db", db_url)
    run_id = cli("runs", "--json", "--db", db_url).data["runs"][0]["run_id"]

    assert cli("export", run_id, "--db", db_url, "--as-test", "test_refund.py").returncode == 0

    run_exported(tmp_path / "test_refund.py", run_id)


def test_an_exported_test_keeps_the_runs_policy_and_runs_from_a_moved_checkout(tmp_path: Path) -> None:
    (tmp_path / "app/config").mkdir(parents=True)
    (tmp_path / "app/config/rules.toml").write_text(
        '[[rules]]\ntool = "refund"\nwhen = { amount = { gt = 10 } }\naction = "deny"\nmessage = "over 10"\n'
    )
    cli = project(tmp_path / "app", "--policy", "config/rules.toml")
    run_id = runs_made(cli)[0]["run_id"]
    assert "denied" in cli("audit", "--run", run_id).stdout  # the rule refused the refund: no one was asked

    assert cli("export", run_id, "--as-test", "tests/test_refund.py").returncode == 0
    assert 'POLICY = HERE / "../config/rules.toml"' in (tmp_path / "app/tests/test_refund.py").read_text()
    (tmp_path / "app").rename(tmp_path / "moved")

    run_exported(tmp_path / "moved/tests/test_refund.py", run_id)  # without the rule, the refund would park


def run_exported(test: Path, run_id: str) -> None:
    """Run an exported test module's test here, as pytest would (its directory importable, as rootdir)."""
    namespace: dict[str, object] = {"__file__": str(test)}
    sys.path.insert(0, str(test.parent))
    try:
        exec(compile(test.read_text(), test.name, "exec"), namespace)
        replays = namespace[f"test_{run_id}_replays_the_same"]
        assert callable(replays)
        replays()
    finally:
        sys.path.remove(str(test.parent))
        sys.modules.pop("shop", None)


def test_bad_exports_are_refused_in_one_line_and_write_nothing(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]

    not_python = cli("export", run_id, "--as-test", "test_refund.txt")
    missing = cli("export", "run_nope", "--as-test", "test_nope.py")
    assert cli("export", run_id, "--as-test", "test_refund.py").returncode == 0
    again = cli("export", run_id, "--as-test", "test_refund.py")

    assert (not_python.returncode, missing.returncode, again.returncode) == (2, 2, 2)
    assert "a test module's name ends with .py" in not_python.err
    assert "run_nope" in missing.err
    assert "already exist: pass --force" in again.err
    assert not (tmp_path / "test_refund.txt").exists()
    assert not (tmp_path / "test_nope.py").exists()
    assert cli("export", run_id, "--as-test", "test_refund.py", "--force").returncode == 0


OTHER_MODEL: list[dict[str, Any]] = [
    {"content": [{"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {"order_id": "42"}}]},
    {
        "content": [
            {"type": "tool_use", "id": "toolu_b", "name": "refund", "input": {"order_id": "42", "amount": 300.0}}
        ]
    },
    {"content": [{"type": "text", "text": "I could not refund 300."}], "stop_reason": "end_turn"},
]


def test_replaying_an_unchanged_agent_shows_both_trajectories_agreeing(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]

    same = cli("replay", run_id)

    assert same.returncode == 0, same
    rows = [line for line in same.stdout.splitlines() if line.startswith("│ ")]
    assert [row.split("│")[1].strip() for row in rows] == ["call 1", "call 2", "status", "answer"]
    assert all(row.rstrip().endswith("│ = │") for row in rows)
    assert 'lookup {"order_id":"42"}' in same.stdout
    assert "the replay agrees: the same calls, the same end" in same.stdout


def test_a_changed_system_prompt_alone_is_answered_by_the_recording_and_said_so(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]

    changed = cli("replay", run_id, "--system", "Never refund.")

    assert changed.returncode == 0, changed
    assert "note: the recorded model answered although the system prompt changed (model calls #1, #2, #3)" in flat(
        changed.stdout
    )
    assert "give --model to have a model answer the changed agent" in changed.stdout


def test_another_model_asking_otherwise_differs_and_its_unrecorded_call_never_runs(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]
    replies = [{**reply, "stop_reason": reply.get("stop_reason", "tool_use")} for reply in OTHER_MODEL]
    (tmp_path / "other.json").write_text(json.dumps(replies))

    parked = cli("replay", run_id, "--model", "scripted:other.json")
    refused = cli("replay", run_id, "--model", "scripted:other.json", "--unmatched", "deny")

    assert (parked.returncode, refused.returncode) == (1, 1)
    said = flat(parked.stdout)
    assert "answered by scripted:" in said
    assert "awaiting_approval" in said
    assert (
        'the replay waits at refund {"amount": 300.0, "order_id": "42"}: the recorded run never made this call, '
        "and a replay runs no tool" in said
    )
    assert "I could not refund 300." in refused.stdout
    assert "the replay differs: 2 difference(s)" in refused.stdout


def test_changed_tools_that_answer_otherwise_differ_with_the_message_diff(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]
    (tmp_path / "shop2.py").write_text(SHOP.replace('"price": 30.0', '"price": 35.0'))

    changed = cli("replay", run_id, "--tools", "shop2:TOOLS")

    # no tool runs in a replay: the recording answers every call it holds, whichever module
    assert changed.returncode == 0, changed
    (tmp_path / "shop3.py").write_text(SHOP.replace("def lookup(order_id: str)", "def lookup(order_ref: str)"))
    broken = cli("replay", run_id, "--tools", "shop3:TOOLS")
    assert broken.returncode == 1, broken
    assert "model call #2: the messages differ from the recorded ones" in broken.stdout
    assert "order_ref" in broken.stdout


def test_many_runs_are_summed_up_and_only_a_difference_fails(tmp_path: Path) -> None:
    cli = project(tmp_path)
    first = runs_made(cli)[0]["run_id"]
    continued = cli("run", "--continue", first, "--model", "scripted:script.json", "--approve-all", "Thanks")
    assert continued.returncode == 0, continued

    summary = cli("replay", "--from-runs", "--status", "done")
    only_refunds = cli("replay", "--from-runs", "--tool", "refund", "--system", "Never refund.")

    assert summary.returncode == 0, summary
    said = flat(summary.stdout)
    assert "1 agree, 0 differ, 1 not replayed" in said
    assert "opens with 7 messages: it continues a conversation or is a fork" in said
    assert only_refunds.returncode == 0, only_refunds
    (tmp_path / "shop3.py").write_text(SHOP.replace("def lookup(order_id: str)", "def lookup(order_ref: str)"))
    differing = cli("replay", "--from-runs", "--tools", "shop3:TOOLS")
    assert differing.returncode == 1, differing
    assert "0 agree, 1 differ, 1 not replayed" in flat(differing.stdout)
    assert (
        'call 2: expected refund {"amount":30.0,"order_id":"42"}, got (no call); '
        "model call #2: the messages differ from the recorded ones" in flat(differing.stdout)
    )


def test_replay_usage_errors_exit_2(tmp_path: Path) -> None:
    cli = project(tmp_path)
    run_id = runs_made(cli)[0]["run_id"]

    both = cli("replay", run_id, "--from-runs")
    neither = cli("replay")
    filters = cli("replay", run_id, "--tool", "refund")
    missing = cli("replay", "run_nope")

    assert [r.returncode for r in (both, neither, filters, missing)] == [2, 2, 2, 2]
    assert "give a run id, or --from-runs with filters" in both.err
    assert "give a run id, or --from-runs with filters" in neither.err
    assert "--status, --agent and --tool choose runs for --from-runs" in filters.err
    assert "run_nope" in missing.err


def test_the_cli_spells_the_unmatched_choices_as_the_replay_does_and_starts_without_tether_testing() -> None:
    assert replaying.UNMATCHED == UNMATCHED
    imported = "import sys, tether.surfaces.cli; print(any('tether.testing' in m for m in sys.modules))"
    started = subprocess.run(
        [sys.executable, "-c", imported],
        capture_output=True,
        text=True,
        check=True,
    )
    assert started.stdout.strip() == "False"
