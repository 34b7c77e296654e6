"""``tether run --policy FILE`` end to end: scripted models, SQLite.

Each command runs as ``python -m tether ...`` would (support.run_tether), with stdin not a
terminal and no API key, so gated calls park (exit 3) instead of prompting. Tools leave a line
in ``effects.log`` (beside the tools module) when they run, so a test can tell whether a denied
call ever ran.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import CliResult, events_of, run_tether, tool_results

pytestmark = pytest.mark.slow  # whole `tether` commands

TOOLS_MODULE = textwrap.dedent(
    '''
    """Tools for the policy CLI tests; each run is logged to effects.log beside this file."""

    from pathlib import Path

    from tether import tool


    def _effect(line: str) -> None:
        with (Path(__file__).parent / "effects.log").open("a", encoding="utf-8") as log:
            log.write(line + "\\n")


    @tool(tags={"mutates", "money"})
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        _effect(f"refund {invoice} {amount:g}")
        return f"refunded {amount:g} on {invoice}"


    @tool(tags={"network"})
    def send(to: str) -> str:
        """Send a message."""
        _effect(f"send {to}")
        return f"sent to {to}"


    TOOLS = [refund, send]
    '''
)

RULES = """
[[rules]]
name = "deny-large-refunds"
tool = "refund"
when = { amount = { gt = 100 } }
action = "deny"
message = "refunds over 100 need a manager"

[[rules]]
name = "ask-before-sending"
tags = ["network"]
action = "require_approval"
message = "messages leave the company"
"""


def usage() -> dict[str, int]:
    return {"input_tokens": 1, "output_tokens": 1}


def turn(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    content = [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
    return {"content": content, "stop_reason": "tool_use", "usage": usage()}


def answer(text: str = "Done.") -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": usage()}


class Cli:
    """``tether`` in a workspace (see support.run_tether), against one SQLite file, stdin not a terminal."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = f"sqlite:///{root / 'runs.db'}"

    def __call__(self, *args: str, cwd: Path | None = None) -> CliResult:
        return run_tether(cwd or self.root, *args, "--db", self.db)

    def run(self, script: list[dict[str, Any]], *extra: str, policy: str = "rules.toml") -> CliResult:
        (self.root / "script.json").write_text(json.dumps(script), encoding="utf-8")
        return self(
            "run",
            "Go.",
            "--tools",
            "mytools:TOOLS",
            "--model",
            "scripted:script.json",
            "--json",
            *(["--policy", policy] if policy else []),
            *extra,
        )

    def effects(self) -> list[str]:
        log = self.root / "effects.log"
        return log.read_text(encoding="utf-8").splitlines() if log.exists() else []

    def show(self, run_id: str) -> dict[str, Any]:
        shown = self("show", run_id, "--json")
        assert shown.returncode == 0, shown
        return shown.data


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    (tmp_path / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    (tmp_path / "rules.toml").write_text(RULES, encoding="utf-8")
    return Cli(tmp_path)


def test_a_deny_rule_gives_the_model_an_error_and_the_tool_never_runs(cli: Cli) -> None:
    done = cli.run([turn(("toolu_1", "refund", {"invoice": "I-1", "amount": 500})), answer()])
    assert done.returncode == 0, done
    assert done.data["status"] == "done"
    assert cli.effects() == []
    result = tool_results(cli.show(done.data["run_id"]))["toolu_1"]
    assert result["is_error"] is True
    assert "rule 1 (deny-large-refunds): refunds over 100 need a manager" in str(result["content"])


def test_a_require_approval_rule_parks_with_exit_3_naming_the_rule(cli: Cli) -> None:
    done = cli.run([turn(("toolu_1", "send", {"to": "bob"})), answer()])
    assert done.returncode == 3, done
    [pending] = done.data["pending_approvals"]
    assert pending["reason"] == "rule 2 (ask-before-sending): messages leave the company"
    assert cli.effects() == []


def test_the_run_keeps_its_policy_for_approve_and_resume_from_elsewhere(cli: Cli, tmp_path: Path) -> None:
    script = [
        turn(("toolu_1", "send", {"to": "bob"})),
        turn(("toolu_2", "refund", {"invoice": "I-2", "amount": 900})),
        answer(),
    ]
    parked = cli.run(script)
    assert parked.returncode == 3, parked
    run_id = parked.data["run_id"]
    [started] = events_of(cli.show(run_id), "run_started")
    assert started["spec"]["policy"] == str((tmp_path / "rules.toml").resolve())

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    approved = cli("approve", run_id, "toolu_1", "--by", "alice", cwd=elsewhere)
    assert approved.returncode == 0, approved
    resumed = cli("resume", run_id, "--json", cwd=elsewhere)
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert cli.effects() == ["send bob"]  # the refund was denied by the remembered policy
    assert "deny-large-refunds" in str(tool_results(cli.show(run_id))["toolu_2"]["content"])


def test_approve_for_run_in_another_process_skips_later_gates(cli: Cli) -> None:
    script = [turn(("toolu_1", "send", {"to": "a"})), turn(("toolu_2", "send", {"to": "b"})), answer()]
    parked = cli.run(script)
    assert parked.returncode == 3, parked
    run_id = parked.data["run_id"]
    approved = cli("approve", run_id, "toolu_1", "--for-run", "--by", "alice")
    assert approved.returncode == 0, approved
    resumed = cli("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert cli.effects() == ["send a", "send b"]
    shown = cli.show(run_id)
    [decided] = events_of(shown, "approval_decided")
    assert decided["remember_for_run"] is True
    assert len(events_of(shown, "approval_requested")) == 1
    audited = cli("audit", "--run", run_id, "--json")
    assert audited.returncode == 0, audited
    later = audited.data["entries"][1]["decision"]
    assert (later["verdict"], later["by"], later["for_run_call"]) == ("approved", "alice", "toolu_1")
    table = " ".join(cli("audit", "--run", run_id).stdout.split())
    assert "approved by alice, for the run with toolu_1: send was approved for the rest of the run" in table


def test_an_invalid_policy_file_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[[rules]]\ntool = "send"\naction = "block"\n', encoding="utf-8")
    done = cli.run([answer()], policy="bad.toml")
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert str(tmp_path / "bad.toml") in done.err
    assert "rule 1: unknown action 'block'" in done.err
    missing = cli.run([answer()], policy="nope.toml")
    assert missing.returncode == 2, missing
    assert "cannot read policy file" in missing.err
    assert not (cli.root / "runs.db").exists()  # neither run was created (nor its database)


def test_a_policy_file_that_is_not_utf8_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    rules = '[[rules]]\ntool = "send"\naction = "deny"\nmessage = "nein, tschüß"\n'
    (tmp_path / "latin1.toml").write_bytes(rules.encode("latin-1"))
    done = cli.run([answer()], policy="latin1.toml")
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert f"policy file {tmp_path / 'latin1.toml'} is not UTF-8 text" in done.err
    assert not (cli.root / "runs.db").exists()


def test_resume_without_its_policy_file_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    parked = cli.run([turn(("toolu_1", "send", {"to": "bob"})), answer()])
    assert parked.returncode == 3, parked
    (tmp_path / "rules.toml").unlink()
    resumed = cli("resume", parked.data["run_id"], "--approve-all", "--json")
    assert resumed.returncode == 2, resumed
    assert "rules.toml" in resumed.err
    assert cli.effects() == []  # never driven without its rules


def test_a_rule_file_changed_since_the_run_started_is_warned_about_and_its_rules_apply(
    cli: Cli, tmp_path: Path
) -> None:
    script = [
        turn(("toolu_1", "send", {"to": "bob"})),
        turn(("toolu_2", "refund", {"invoice": "I", "amount": 50})),
        answer(),
    ]
    parked = cli.run(script)
    assert parked.returncode == 3, parked
    run_id = parked.data["run_id"]
    [started] = events_of(cli.show(run_id), "run_started")
    assert len(started["spec"]["policy_digest"]) == 64

    rules = tmp_path / "rules.toml"
    rules.write_text("# reviewed by legal\n" + RULES.replace(" = ", "   =   "), encoding="utf-8")  # same rules
    same = cli("approve", run_id, "toolu_1")
    assert same.returncode == 0, same
    assert "warning" not in same.err

    rules.write_text(RULES.replace("gt = 100", "gt = 10"), encoding="utf-8")  # a stricter refund rule
    resumed = cli("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed
    assert f"warning: policy file {rules.resolve()} changed since run {run_id} started: its current rules apply" in (
        resumed.err
    )
    assert resumed.data["status"] == "done"
    assert cli.effects() == ["send bob"]  # the refund of 50 fell under the new rule
    assert "deny-large-refunds" in str(tool_results(cli.show(run_id))["toolu_2"]["content"])


@pytest.mark.parametrize("for_run", [False, True], ids=["plain", "for-run"])
def test_a_deny_rule_added_after_a_call_was_approved_stops_it_on_resume(
    cli: Cli, tmp_path: Path, for_run: bool
) -> None:
    parked = cli.run([turn(("toolu_1", "send", {"to": "bob"})), answer()])
    assert parked.returncode == 3, parked
    run_id = parked.data["run_id"]
    rules = tmp_path / "rules.toml"
    deny_bob = '[[rules]]\nname = "not-bob"\ntool = "send"\nwhen = { to = { equals = "bob" } }\n'
    rules.write_text(deny_bob + 'action = "deny"\nmessage = "bob left the company"\n' + RULES, encoding="utf-8")
    approved = cli("approve", run_id, "toolu_1", *(["--for-run"] if for_run else []))
    assert approved.returncode == 0, approved
    resumed = cli("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed
    assert "its current rules apply" in resumed.err
    assert resumed.data["status"] == "done"
    assert cli.effects() == []  # approved before the rule arrived, and still never run
    result = tool_results(cli.show(run_id))["toolu_1"]
    assert result["is_error"] is True
    assert "denied by policy: rule 1 (not-bob): bob left the company" in str(result["content"])
