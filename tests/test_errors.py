"""The error tree: callers choose what to do by an exception's type, never by its text.

Each way a decision can be refused is its own ApprovalError kind, carrying its facts (the
CLI, the example service and a host's own code tell them apart by type, not by the text or
the ``__cause__``). Bad values given to the public API are TetherErrors, not bare ValueErrors.
"""

from __future__ import annotations

import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import (
    AlreadyDecided,
    ApprovalError,
    Approve,
    DeniedByPolicy,
    Deny,
    InvalidEditedInput,
    ModelError,
    NotAwaitingApproval,
    Policy,
    Rule,
    Runner,
    RunResult,
    StaleFingerprint,
    UnknownCall,
    tool,
)
from tether.agent import Agent
from tether.core.approvals import fingerprint
from tether.models import ModelResponse
from tether.models.scripted import ScriptedModel


@tool(approval=True)
def delete(path: str, recursive: bool = False) -> str:
    """Delete a path."""
    return f"deleted {path}"


@tool
def echo(value: str) -> str:
    """Echo a value."""
    return value


@pytest.fixture
def parked() -> tuple[Runner, RunResult]:
    """A run parked on ``toolu_1`` (delete /tmp/x) after ``toolu_0`` (echo) ran unasked."""
    script = [
        tool_use_turn(tool_use("toolu_0", "echo", {"value": "hi"})),
        tool_use_turn(tool_use("toolu_1", "delete", {"path": "/tmp/x"})),
        model_reply([{"type": "text", "text": "Finished."}], "end_turn"),
    ]
    no_root = Rule(action="deny", tool="delete", when={"path": {"equals": "/"}}, message="never /", name="no-root")
    agent = Agent(model=ScriptedModel(script), tools=[delete, echo], policy=Policy([no_root]))
    runner = Runner(agent)
    result = runner.run("Please help.")
    assert result.status == "awaiting_approval"
    return runner, result


def test_a_second_decision_is_already_decided_naming_who_and_how(parked: tuple[Runner, RunResult]) -> None:
    runner, run = parked
    runner.decide(run.run_id, "toolu_1", Approve(actor="alice"))
    with pytest.raises(AlreadyDecided, match=r"call 'toolu_1' was already decided \(approved by alice\)") as caught:
        runner.decide(run.run_id, "toolu_1", Deny("changed my mind", actor="bob"))
    assert (caught.value.actor, caught.value.approved) == ("alice", True)
    assert (caught.value.run_id, caught.value.call_id) == (run.run_id, "toolu_1")
    assert isinstance(caught.value, ApprovalError)


def test_an_edit_back_to_the_input_shown_is_a_plain_approval(parked: tuple[Runner, RunResult]) -> None:
    """The model is not told a reviewer edited what nobody changed (key order aside)."""
    from tether.facts.events import ApprovalDecided

    runner, run = parked
    runner.decide(run.run_id, "toolu_1", Approve(input={"path": "/tmp/x"}, actor="alice"))
    [decided] = [e.fact for e in runner.store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)]
    assert (decided.approved, decided.input) == (True, None)


def test_a_wrong_fingerprint_is_stale_naming_both(parked: tuple[Runner, RunResult]) -> None:
    runner, run = parked
    with pytest.raises(StaleFingerprint, match="the arguments differ from those shown") as caught:
        runner.decide(run.run_id, "toolu_1", Approve(), fingerprint="0" * 16)
    assert (caught.value.expected, caught.value.shown) == ("0" * 16, fingerprint({"path": "/tmp/x"}))


def test_an_edit_a_rule_denies_is_denied_by_policy_with_the_rules_reason(parked: tuple[Runner, RunResult]) -> None:
    runner, run = parked
    with pytest.raises(DeniedByPolicy, match=r"the edited input is denied by policy \(.*never /\)") as caught:
        runner.decide(run.run_id, "toolu_1", Approve(input={"path": "/"}))
    assert caught.value.reason == "rule 1 (no-root): never /"
    assert runner.load(run.run_id).decisions == {}


def test_an_edit_the_schema_rejects_is_invalid_edited_input_in_plain_words(parked: tuple[Runner, RunResult]) -> None:
    runner, run = parked
    with pytest.raises(InvalidEditedInput, match="edited input is invalid for tool 'delete'") as caught:
        runner.decide(run.run_id, "toolu_1", Approve(input={"path": "/tmp/y", "recursive": "maybe"}))
    assert caught.value.tool == "delete"
    assert "recursive" in caught.value.problems
    assert "Input should be a valid boolean" in caught.value.problems
    assert str(caught.value).endswith(caught.value.problems)  # the CLI and the inspector say it in these words
    assert "errors.pydantic.dev" not in str(caught.value)


def test_a_call_the_model_never_asked_for_is_unknown(parked: tuple[Runner, RunResult]) -> None:
    runner, run = parked
    with pytest.raises(UnknownCall, match=f"run {run.run_id} has no tool call 'toolu_nope'"):
        runner.decide(run.run_id, "toolu_nope", Approve())


def test_a_call_that_is_not_waiting_is_not_awaiting_approval(parked: tuple[Runner, RunResult]) -> None:
    runner, run = parked
    with pytest.raises(NotAwaitingApproval, match="call 'toolu_0' is not pending approval") as caught:
        runner.decide(run.run_id, "toolu_0", Approve())  # an earlier batch's call, never gated
    assert caught.value.status == "awaiting_approval"
    runner.decide(run.run_id, "toolu_1", Deny("no"))
    runner.drive(run.run_id)
    with pytest.raises(NotAwaitingApproval, match=f"run {run.run_id} is not awaiting approval") as ended:
        runner.decide(run.run_id, "toolu_0", Approve())
    assert ended.value.status == "done"


def test_a_response_without_content_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="malformed response: content: field required"):
        ModelResponse.from_dict({"stop_reason": "end_turn"})
    broken = Runner(Agent(model=ScriptedModel([{"stop_reason": "end_turn"}]), tools=[echo])).run("Hi.")
    assert broken.status == "failed"
    assert "scripted reply #1 sent a malformed response" in str(broken.error)
