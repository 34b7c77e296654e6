"""Whole runs, offline: ScriptedModel + in-memory store, through Runner AND AsyncRunner.

Every scenario ends with :meth:`Harness.verify`, which checks what holds for any run:
each request the model got satisfies the tool_use/tool_result pairing rules, the event
log is numbered 0..n-1 from ``run_started`` (to ``run_finished`` once finished), and the
run rebuilt from the store equals the live one.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pytest

import tether
from support import tool_use
from tether import Agent, Approve, AsyncRunner, Deny, Limits, RetryPolicy, Runner, RunResult, tool
from tether.core.approvals import DecideLater
from tether.core.state import RunState
from tether.errors import ApprovalError, ModelError
from tether.facts.history import check_pairing
from tether.facts.status import ENDED
from tether.models.scripted import ScriptedModel
from tether.stores.memory import MemoryStore
from tether.testing import validate_messages_request
from tether.tools import Tool

PROMPT = "Please help."
NEVER = threading.Event()
"""Never set: a tool blocked on it hangs until the process exits (a daemon thread)."""


# Messages API response builders ----------------------------------------------------------
def response(content: list[dict[str, Any]], stop_reason: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": "claude-scripted",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
        **extra,
    }


def text(answer: str, stop_reason: str = "end_turn") -> dict[str, Any]:
    return response([{"type": "text", "text": answer}], stop_reason)


def calls(*uses: dict[str, Any], preface: str | None = None, stop_reason: str = "tool_use") -> dict[str, Any]:
    content = ([{"type": "text", "text": preface}] if preface else []) + list(uses)
    return response(content, stop_reason)


def result_block(call_id: str, content: str, *, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def results_of(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert message["role"] == "user"
    return {b["tool_use_id"]: b for b in message["content"] if b["type"] == "tool_result"}


# The harness -------------------------------------------------------------------------------
@dataclass
class Harness:
    """One agent with a scripted model, driven by the sync or the async runner."""

    kind: str
    script: Sequence[Any]
    tools: Sequence[Tool] = ()
    limits: Limits = field(default_factory=Limits)
    store: MemoryStore = field(default_factory=MemoryStore)
    approver: Any = None

    def __post_init__(self) -> None:
        self.model = ScriptedModel(list(self.script))
        self.agent = Agent(model=self.model, tools=list(self.tools), limits=self.limits)
        runner_class = Runner if self.kind == "sync" else AsyncRunner
        self.runner: Runner | AsyncRunner = runner_class(self.agent, self.store, approver=self.approver)
        self.live: dict[str, RunState] = {}

    @staticmethod
    def settle(outcome: Any) -> Any:
        """What a runner call gave: as is (Runner), or awaited (AsyncRunner's are coroutines)."""
        return asyncio.run(outcome) if inspect.iscoroutine(outcome) else outcome

    def start(self, prompt: str = PROMPT, **kwargs: Any) -> RunState:
        state: RunState = self.settle(self.runner.create(prompt, **kwargs))
        self.live[state.id] = state
        return state

    def drive(self, run: str | RunState) -> RunResult:
        if isinstance(run, str):  # resumed from the store, as another process would
            loaded: RunState = self.settle(self.runner.load(run))
            self.live[loaded.id] = loaded
            run = loaded
        if isinstance(self.runner, AsyncRunner):
            result: RunResult = self.settle(self.runner.drive(run))
            return result
        return self.runner.drive(run)

    def run(self, prompt: str = PROMPT, **kwargs: Any) -> RunResult:
        return self.drive(self.start(prompt, **kwargs))

    def decide(self, run_id: str, call_id: str, decision: Any, **kwargs: Any) -> RunResult:
        result: RunResult = self.settle(self.runner.decide(run_id, call_id, decision, **kwargs))
        return result

    def messages(self, run_id: str) -> list[dict[str, Any]]:
        state: RunState = self.settle(self.runner.load(run_id))
        return state.messages

    def event_types(self, run_id: str) -> list[str]:
        return [e.type for e in self.store.load_events(run_id)]

    def verify(self) -> None:
        assert self.model.requests, "the scenario never called the model"
        for index, request in enumerate(self.model.requests):
            check_pairing(request.messages, run_id=f"request #{index}")
            body: dict[str, Any] = {
                "model": request.model,
                "max_tokens": request.max_tokens,
                "messages": request.messages,
            }
            if request.tools:
                body["tools"] = request.tools
            if request.system is not None:
                body["system"] = request.system
            assert validate_messages_request(body) is None, f"request #{index}"
        for run_id, live in self.live.items():
            events = self.store.load_events(run_id)
            assert [e.seq for e in events] == list(range(len(events)))
            assert events[0].type == "run_started"
            rebuilt = self.settle(self.runner.load(run_id))
            assert rebuilt.messages == live.messages
            assert (rebuilt.status, rebuilt.output, rebuilt.result, rebuilt.error) == (
                live.status,
                live.output,
                live.result,
                live.error,
            )
            assert (rebuilt.steps, rebuilt.tool_calls, rebuilt.version) == (
                live.steps,
                live.tool_calls,
                live.version,
            )
            types = [e.type for e in events]
            if live.status in ENDED:
                assert types[-1] == "run_finished"
                assert types.count("run_finished") == 1
            else:
                assert "run_finished" not in types


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# Tools ---------------------------------------------------------------------------------------
class Calls:
    """What tools were actually run, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def add(self, name: str, value: Any) -> None:
        with self.lock:
            self.log.append((name, value))

    def names(self) -> list[str]:
        return [name for name, _ in self.log]


@pytest.fixture
def ran() -> Calls:
    return Calls()


def make_add(ran: Calls) -> Tool:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.add("add", (a, b))
        return a + b

    return add


def make_echo(ran: Calls, **options: Any) -> Tool:
    def echo(value: str) -> str:
        """Echo the value back."""
        ran.add("echo", value)
        return f"echo:{value}"

    return tool(**options)(echo)


# Basic turns ---------------------------------------------------------------------------------
def test_text_only_answer_is_done_with_output(kind: str) -> None:
    h = Harness(kind, [text("Hello there!")])
    result = h.run()
    assert result.status == "done"
    assert result.output == "Hello there!"
    assert result.error is None
    assert result.steps == 1
    assert result.tool_calls == 0
    assert result.usage.input_tokens == 10
    assert len(h.model.requests) == 1
    assert h.model.requests[0].messages == [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    assert h.model.requests[0].invocation == 0
    assert h.messages(result.run_id)[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello there!"}],
    }
    types = h.event_types(result.run_id)
    assert types[0] == "run_started"
    assert types[-1] == "run_finished"
    h.verify()


def test_one_tool_result_is_fed_back_as_one_user_message(kind: str, ran: Calls) -> None:
    h = Harness(
        kind,
        [calls(tool_use("toolu_1", "add", {"a": 2, "b": 3}), preface="Adding."), text("It is 5.")],
        tools=[make_add(ran)],
    )
    result = h.run()
    assert result.status == "done"
    assert result.output == "It is 5."
    assert result.tool_calls == 1
    assert ran.log == [("add", (2, 3))]
    assert len(h.model.requests) == 2
    sent = h.model.requests[1].messages
    assert len(sent) == 3
    assert sent[1]["role"] == "assistant"
    assert sent[1]["content"][-1] == tool_use("toolu_1", "add", {"a": 2, "b": 3})
    assert sent[2] == {"role": "user", "content": [result_block("toolu_1", "5")]}
    assert h.model.requests[1].invocation == 1
    # the tool's start is recorded (committed) before its result
    types = h.event_types(result.run_id)
    assert types.index("tool_started") < types.index("tool_finished") < types.index("results_returned")
    h.verify()


def test_three_parallel_calls_come_back_in_one_message_in_call_order(kind: str, ran: Calls) -> None:
    h = Harness(
        kind,
        [
            calls(
                tool_use("toolu_c", "echo", {"value": "first"}),
                tool_use("toolu_a", "add", {"a": 1, "b": 1}),
                tool_use("toolu_b", "echo", {"value": "third"}),
            ),
            text("All three done."),
        ],
        tools=[make_add(ran), make_echo(ran)],
    )
    result = h.run()
    assert result.status == "done"
    assert ran.log == [("echo", "first"), ("add", (1, 1)), ("echo", "third")]
    sent = h.model.requests[1].messages
    assert len(sent) == 3  # one user message holds all the results
    assert sent[2] == {
        "role": "user",
        "content": [
            result_block("toolu_c", "echo:first"),
            result_block("toolu_a", "2"),
            result_block("toolu_b", "echo:third"),
        ],
    }
    h.verify()


# Tool failures become data ---------------------------------------------------------------------
def test_a_raising_tool_becomes_an_error_result_and_the_run_continues(kind: str) -> None:
    message = "disk on fire: /dev/sda1 (errno 5) — 'quoted' \"double\""

    @tool
    def explode(path: str) -> str:
        """Explode."""
        raise OSError(message)

    h = Harness(kind, [calls(tool_use("toolu_1", "explode", {"path": "/"})), text("Sorry.")], tools=[explode])
    result = h.run()
    assert result.status == "done"
    assert result.output == "Sorry."
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert block["is_error"] is True
    assert message in block["content"]
    assert "OSError" in block["content"]
    h.verify()


def test_unknown_tool_is_an_error_result_naming_it(kind: str, ran: Calls) -> None:
    h = Harness(
        kind,
        [calls(tool_use("toolu_1", "launch_rockets", {"count": 3})), text("Cannot do that.")],
        tools=[make_add(ran)],
    )
    result = h.run()
    assert result.status == "done"
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert block["is_error"] is True
    assert "launch_rockets" in block["content"]
    assert "unknown tool" in block["content"]
    assert ran.log == []
    h.verify()


def test_invalid_arguments_are_an_error_result_with_pydantics_message(kind: str, ran: Calls) -> None:
    add = make_add(ran)
    bad = {"a": "two", "c": 1}
    with pytest.raises(pydantic.ValidationError) as caught:
        add.validate(bad)
    pydantic_message = str(caught.value)
    h = Harness(kind, [calls(tool_use("toolu_1", "add", bad)), text("Oops.")], tools=[add])
    result = h.run()
    assert result.status == "done"
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert block["is_error"] is True
    assert pydantic_message in block["content"]
    assert "'add'" in block["content"]
    assert ran.log == []
    h.verify()


def test_max_steps_fails_the_run_naming_the_limit(kind: str, ran: Calls) -> None:
    h = Harness(
        kind,
        [
            calls(tool_use("toolu_1", "add", {"a": 1, "b": 1})),
            calls(tool_use("toolu_2", "add", {"a": 2, "b": 2})),
            calls(tool_use("toolu_3", "add", {"a": 3, "b": 3})),
            text("never reached"),
        ],
        tools=[make_add(ran)],
        limits=Limits(max_steps=2),
    )
    result = h.run()
    assert result.status == "failed"
    assert result.error is not None
    assert "max_steps" in result.error
    assert "2" in result.error
    assert result.steps == 2
    assert len(h.model.requests) == 2
    assert ran.log == [("add", (1, 1)), ("add", (2, 2))]
    assert result.output is None
    h.verify()


def test_a_final_tool_ends_the_run_with_its_validated_input(kind: str) -> None:
    @tool(final=True)
    def submit(answer: str, confidence: float) -> str:
        """Submit the final answer."""
        return "submitted"

    h = Harness(
        kind,
        [
            calls(tool_use("toolu_1", "submit", {"answer": "42", "confidence": "0.9"})),
            text("must not be requested"),
        ],
        tools=[submit],
    )
    result = h.run()
    assert result.status == "done"
    assert result.result == {"answer": "42", "confidence": 0.9}  # coerced by validation
    assert result.error is None
    assert len(h.model.requests) == 1
    h.verify()


# Retries and timeouts -------------------------------------------------------------------------
def test_retry_succeeds_on_the_third_attempt(kind: str) -> None:
    attempts: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0.01))
    def flaky(key: str) -> str:
        """Fails twice, then works."""
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise ConnectionError(f"attempt {len(attempts)} failed")
        return f"value of {key}"

    h = Harness(kind, [calls(tool_use("toolu_1", "flaky", {"key": "k"})), text("Got it.")], tools=[flaky])
    result = h.run()
    assert result.status == "done"
    assert attempts == [1, 2, 3]
    assert result.tool_calls == 3
    assert h.model.requests[1].messages[-1] == {
        "role": "user",
        "content": [result_block("toolu_1", "value of k")],
    }
    assert h.event_types(result.run_id).count("retry_scheduled") == 2
    assert len(h.model.requests) == 2  # retries are not model calls
    h.verify()


def test_retry_exhausted_is_an_error_with_the_last_error(kind: str) -> None:
    attempts: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0.01))
    def broken(key: str) -> str:
        """Always fails."""
        attempts.append(len(attempts) + 1)
        raise ConnectionError(f"attempt {len(attempts)} failed")

    h = Harness(kind, [calls(tool_use("toolu_1", "broken", {"key": "k"})), text("Gave up.")], tools=[broken])
    result = h.run()
    assert result.status == "done"
    assert attempts == [1, 2, 3]
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert block["is_error"] is True
    assert "attempt 3 failed" in block["content"]
    assert "attempt 1 failed" not in block["content"]
    assert "3 attempts" in block["content"]
    h.verify()


def test_an_error_not_in_retry_on_is_not_retried(kind: str) -> None:
    attempts: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0.01, retry_on=(ConnectionError,)))
    def picky(key: str) -> str:
        """Fails with a non-retryable error."""
        attempts.append(1)
        raise ValueError("bad key")

    h = Harness(kind, [calls(tool_use("toolu_1", "picky", {"key": "k"})), text("ok")], tools=[picky])
    h.run()
    assert attempts == [1]
    assert "bad key" in results_of(h.model.requests[1].messages[-1])["toolu_1"]["content"]
    h.verify()


def test_a_hung_sync_tool_times_out(kind: str) -> None:
    @tool(timeout=0.2)
    def hang(what: str) -> str:
        """Never returns."""
        NEVER.wait()
        return "unreachable"

    h = Harness(kind, [calls(tool_use("toolu_1", "hang", {"what": "x"})), text("It hung.")], tools=[hang])
    result = h.run()
    assert result.status == "done"
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert block["is_error"] is True
    assert "timed out" in block["content"]
    assert "'hang'" in block["content"]
    h.verify()


def test_a_hung_async_tool_times_out(kind: str) -> None:
    @tool(timeout=0.2)
    async def ahang(what: str) -> str:
        """Never returns in time."""
        await asyncio.sleep(30)
        return "unreachable"

    h = Harness(kind, [calls(tool_use("toolu_1", "ahang", {"what": "x"})), text("It hung.")], tools=[ahang])
    result = h.run()
    assert result.status == "done"
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert block["is_error"] is True
    assert "timed out" in block["content"]
    h.verify()


# Approvals ------------------------------------------------------------------------------------
def make_delete(ran: Calls) -> Tool:
    @tool(approval=True)
    def delete(path: str, recursive: bool = False) -> str:
        """Delete a path."""
        ran.add("delete", path)
        return f"deleted {path}"

    return delete


def gated_run(kind: str, ran: Calls, script: list[dict[str, Any]] | None = None) -> tuple[Harness, RunResult]:
    h = Harness(
        kind,
        script or [calls(tool_use("toolu_1", "delete", {"path": "/tmp/x"})), text("Finished.")],
        tools=[make_delete(ran), make_echo(ran)],
    )
    return h, h.run()


def test_an_approval_tool_without_approver_parks_the_run(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    assert parked.status == "awaiting_approval"
    assert parked.output is None
    assert ran.log == []
    assert len(parked.pending_approvals) == 1
    pending = parked.pending_approvals[0]
    assert pending["call_id"] == "toolu_1"
    assert pending["tool"] == "delete"
    assert pending["input"] == {"path": "/tmp/x"}
    assert pending["reason"]
    assert pending["fingerprint"]
    assert len(h.model.requests) == 1
    # driving again does nothing while the decision is missing
    again = h.drive(parked.run_id)
    assert again.status == "awaiting_approval"
    assert len(h.model.requests) == 1
    assert ran.log == []
    h.verify()


def test_approve_then_drive_again_runs_the_tool(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    decided = h.decide(parked.run_id, "toolu_1", Approve())
    assert decided.status == "executing_tool"
    assert decided.pending_approvals == []
    assert ran.log == []  # deciding does not drive
    result = h.drive(parked.run_id)
    assert result.status == "done"
    assert result.output == "Finished."
    assert ran.log == [("delete", "/tmp/x")]
    assert h.model.requests[1].messages[-1] == {
        "role": "user",
        "content": [result_block("toolu_1", "deleted /tmp/x")],
    }
    h.verify()


def test_deny_gives_the_model_an_error_with_the_reason(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    h.decide(parked.run_id, "toolu_1", Deny("too risky"))
    result = h.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == []
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert block["is_error"] is True
    assert "too risky" in block["content"]
    h.verify()


def test_approve_with_edited_input_is_validated_and_used(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    with pytest.raises(ApprovalError, match="edited input is invalid") as caught:
        h.decide(parked.run_id, "toolu_1", Approve(input={"path": "/tmp/safe", "recursive": "maybe"}))
    assert caught.value.call_id == "toolu_1"
    with pytest.raises(ApprovalError):
        h.decide(parked.run_id, "toolu_1", Approve(input={"path": "/tmp/safe", "force": True}))
    # the refused edits changed nothing
    still = h.settle(h.runner.load(parked.run_id))
    assert still.status == "awaiting_approval"
    assert still.decisions == {}
    h.decide(parked.run_id, "toolu_1", Approve(input={"path": "/tmp/safe"}))
    result = h.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == [("delete", "/tmp/safe")]
    block = results_of(h.model.requests[1].messages[-1])["toolu_1"]
    assert "deleted /tmp/safe" in block["content"]
    assert "is_error" not in block
    h.verify()


def test_a_second_decision_on_the_same_call_is_refused(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    h.decide(parked.run_id, "toolu_1", Approve(actor="alice"))
    already = r"call 'toolu_1' was already decided \(approved by alice\)"  # not "run ... is not awaiting"
    with pytest.raises(ApprovalError, match=already):
        h.decide(parked.run_id, "toolu_1", Deny("changed my mind"))
    with pytest.raises(ApprovalError, match=already):
        h.decide(parked.run_id, "toolu_1", Approve())
    result = h.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == [("delete", "/tmp/x")]
    with pytest.raises(ApprovalError, match=already):
        h.decide(parked.run_id, "toolu_1", Approve())
    h.verify()


def test_a_decision_with_a_wrong_fingerprint_is_refused(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    shown = parked.pending_approvals[0]["fingerprint"]
    with pytest.raises(ApprovalError, match="differ"):
        h.decide(parked.run_id, "toolu_1", Approve(), fingerprint="0" * 16)
    assert h.settle(h.runner.load(parked.run_id)).status == "awaiting_approval"
    h.decide(parked.run_id, "toolu_1", Approve(), fingerprint=shown)
    assert h.drive(parked.run_id).status == "done"
    h.verify()


def test_a_decision_on_an_unknown_call_is_refused(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    with pytest.raises(ApprovalError):
        h.decide(parked.run_id, "toolu_nope", Approve())
    h.verify()


def test_gated_calls_of_one_batch_are_shown_and_resumed_together(kind: str, ran: Calls) -> None:
    script = [
        calls(
            tool_use("toolu_1", "delete", {"path": "/a"}),
            tool_use("toolu_2", "echo", {"value": "free"}),
            tool_use("toolu_3", "delete", {"path": "/b"}),
        ),
        text("Finished."),
    ]
    h, parked = gated_run(kind, ran, script)
    assert parked.status == "awaiting_approval"
    assert [p["call_id"] for p in parked.pending_approvals] == ["toolu_1", "toolu_3"]
    assert ran.log == [("echo", "free")]  # the ungated call ran; the gated ones wait

    after_one = h.decide(parked.run_id, "toolu_3", Deny("not /b"))
    assert after_one.status == "awaiting_approval"
    assert [p["call_id"] for p in after_one.pending_approvals] == ["toolu_1"]
    with pytest.raises(ApprovalError, match="already decided"):
        h.decide(parked.run_id, "toolu_3", Approve())
    still = h.drive(parked.run_id)
    assert still.status == "awaiting_approval"
    assert ran.log == [("echo", "free")]
    assert len(h.model.requests) == 1

    h.decide(parked.run_id, "toolu_1", Approve())
    result = h.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == [("echo", "free"), ("delete", "/a")]
    sent = h.model.requests[1].messages[-1]  # results still in call order, once, after all
    assert [b["tool_use_id"] for b in sent["content"]] == ["toolu_1", "toolu_2", "toolu_3"]
    assert sent["content"][0] == result_block("toolu_1", "deleted /a")
    assert sent["content"][1] == result_block("toolu_2", "echo:free")
    assert sent["content"][2]["is_error"] is True
    assert "not /b" in sent["content"][2]["content"]
    h.verify()


def test_an_approver_decides_inline(kind: str, ran: Calls) -> None:
    from tether.testing import RecordingApprover

    approver = RecordingApprover({"delete": Approve(actor="tester")})
    h = Harness(
        kind,
        [calls(tool_use("toolu_1", "delete", {"path": "/tmp/x"})), text("Finished.")],
        tools=[make_delete(ran)],
        approver=approver,
    )
    result = h.run()
    assert result.status == "done"
    assert ran.log == [("delete", "/tmp/x")]
    assert [[r.call_id for r in batch] for batch in approver.seen] == [["toolu_1"]]
    h.verify()


# Stop reasons ---------------------------------------------------------------------------------
def test_max_tokens_inside_a_tool_use_is_discarded_and_reasked_with_more_tokens(kind: str, ran: Calls) -> None:
    cut = calls(tool_use("toolu_cut", "add", {"a": 1}), preface="Let me add.", stop_reason="max_tokens")
    h = Harness(
        kind,
        [cut, calls(tool_use("toolu_1", "add", {"a": 1, "b": 2})), text("3")],
        tools=[make_add(ran)],
    )
    result = h.run()
    assert result.status == "done"
    assert ran.log == [("add", (1, 2))]  # the cut-off call never ran
    first, second = h.model.requests[0], h.model.requests[1]
    assert first.max_tokens == Limits().max_tokens
    assert second.max_tokens == 2 * first.max_tokens
    assert second.messages == first.messages  # the cut response is not in the history
    assert all(block.get("id") != "toolu_cut" for message in h.messages(result.run_id) for block in message["content"])
    assert "warning" in h.event_types(result.run_id)
    h.verify()


def test_max_tokens_inside_a_tool_use_at_the_ceiling_fails(kind: str, ran: Calls) -> None:
    cut = calls(tool_use("toolu_cut", "add", {"a": 1}), stop_reason="max_tokens")
    h = Harness(
        kind,
        [cut, text("unused")],
        tools=[make_add(ran)],
        limits=Limits(max_tokens=1000, max_tokens_ceiling=1000),
    )
    result = h.run()
    assert result.status == "failed"
    assert result.error is not None
    assert "max_tokens" in result.error
    assert ran.log == []
    assert h.messages(result.run_id) == h.model.requests[0].messages
    h.verify()


def test_pause_turn_reinvokes_and_extends_the_same_assistant_message(kind: str) -> None:
    first = response([{"type": "text", "text": "Searching the web..."}], "pause_turn")
    second = response([{"type": "text", "text": " Found it."}], "end_turn")
    h = Harness(kind, [first, second])
    result = h.run()
    assert result.status == "done"
    assert len(h.model.requests) == 2
    assert h.model.requests[1].messages[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Searching the web..."}],
    }
    messages = h.messages(result.run_id)
    assert len(messages) == 2
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Searching the web..."},
            {"type": "text", "text": " Found it."},
        ],
    }
    assert result.output == "Searching the web... Found it."
    h.verify()


def test_refusal_fails_with_the_reason(kind: str) -> None:
    refusal = response([{"type": "text", "text": "I can't help with that."}], "refusal")
    h = Harness(kind, [refusal, text("unused")])
    result = h.run()
    assert result.status == "failed"
    assert result.error is not None
    assert "refused" in result.error
    assert "I can't help with that." in result.error
    assert len(h.model.requests) == 1
    h.verify()


def test_context_window_exceeded_fails(kind: str) -> None:
    h = Harness(kind, [response([], "model_context_window_exceeded"), text("unused")])
    result = h.run()
    assert result.status == "failed"
    assert result.error is not None
    assert "context window" in result.error
    assert h.messages(result.run_id) == [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    h.verify()


def test_an_unknown_stop_reason_fails_naming_it(kind: str) -> None:
    h = Harness(kind, [text("hmm", stop_reason="weird"), text("unused")])
    result = h.run()
    assert result.status == "failed"
    assert result.error is not None
    assert "'weird'" in result.error
    assert len(h.model.requests) == 1
    h.verify()


# Model errors ---------------------------------------------------------------------------------
def test_a_model_error_fails_the_run_with_history_intact(kind: str) -> None:
    h = Harness(kind, [ModelError("overloaded, try later", status=529, retryable=True)])
    result = h.run()
    assert result.status == "failed"
    assert result.error is not None
    assert "overloaded, try later" in result.error
    assert result.steps == 0
    assert h.messages(result.run_id) == [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    h.verify()


def test_a_model_error_mid_run_keeps_the_results_already_returned(kind: str, ran: Calls) -> None:
    h = Harness(
        kind,
        [calls(tool_use("toolu_1", "add", {"a": 1, "b": 2})), ModelError("connection reset")],
        tools=[make_add(ran)],
    )
    result = h.run()
    assert result.status == "failed"
    assert result.error is not None
    assert "connection reset" in result.error
    messages = h.messages(result.run_id)
    assert messages == h.model.requests[1].messages  # exactly what was sent; nothing added
    assert messages[-1] == {"role": "user", "content": [result_block("toolu_1", "3")]}
    h.verify()


# Continue and resume --------------------------------------------------------------------------
def test_continue_sends_the_earlier_full_history_plus_the_new_prompt(kind: str, ran: Calls) -> None:
    first = Harness(
        kind,
        [calls(tool_use("toolu_1", "add", {"a": 2, "b": 2})), text("4.")],
        tools=[make_add(ran)],
    )
    done = first.run("What is 2+2?")
    assert done.status == "done"
    earlier = first.messages(done.run_id)

    second = Harness(kind, [text("8.")], tools=[make_add(ran)], store=first.store)
    result = second.run("And doubled?", continue_from=done.run_id)
    assert result.status == "done"
    assert result.run_id != done.run_id
    sent = second.model.requests[0].messages
    assert sent == [*earlier, {"role": "user", "content": [{"type": "text", "text": "And doubled?"}]}]
    assert sent[1]["content"][-1]["type"] == "tool_use"  # not flattened to text
    assert sent[2]["content"][0]["type"] == "tool_result"
    assert first.messages(done.run_id) == earlier  # the parent run is untouched
    first.verify()
    second.verify()


def test_continue_after_a_final_tool_merges_the_prompt_after_the_results(kind: str) -> None:
    @tool(final=True)
    def submit(answer: str) -> str:
        """Submit."""
        return answer

    first = Harness(kind, [calls(tool_use("toolu_1", "submit", {"answer": "x"}))], tools=[submit])
    done = first.run()
    assert done.status == "done"
    second = Harness(kind, [text("ok")], tools=[submit], store=first.store)
    result = second.run("Now explain.", continue_from=done.run_id)
    assert result.status == "done"
    last = second.model.requests[0].messages[-1]
    assert last["role"] == "user"
    assert last["content"][0]["type"] == "tool_result"
    assert last["content"][-1] == {"type": "text", "text": "Now explain."}
    first.verify()
    second.verify()


def test_continue_from_a_run_cancelled_mid_batch_is_usable(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    cancelled = h.settle(h.runner.cancel(parked.run_id, "changed plans"))
    assert cancelled.status == "cancelled"
    second = Harness(kind, [text("ok")], tools=[make_delete(ran)], store=h.store)
    result = second.run("Do something else.", continue_from=parked.run_id)
    assert result.status == "done"
    second.verify()


def test_a_run_rebuilt_from_the_store_has_the_same_messages(kind: str, ran: Calls) -> None:
    h = Harness(
        kind,
        [
            calls(tool_use("toolu_1", "add", {"a": 1, "b": 2}), tool_use("toolu_2", "echo", {"value": "v"})),
            calls(tool_use("toolu_3", "add", {"a": 3, "b": 4})),
            text("Done."),
        ],
        tools=[make_add(ran), make_echo(ran)],
    )
    live = h.start()
    h.drive(live)
    rebuilt = h.settle(h.runner.load(live.id))
    assert rebuilt.messages == live.messages
    assert len(rebuilt.messages) == 6
    assert rebuilt.status == live.status == "done"
    assert rebuilt.output == "Done."
    h.verify()


def test_a_parked_run_resumes_in_a_fresh_runner(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    h.decide(parked.run_id, "toolu_1", Approve())
    other = Harness(kind, h.script, tools=h.tools, store=h.store)  # "another process"
    result = other.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == [("delete", "/tmp/x")]
    # the fresh model continued the same script (indexed by the run's invocation count)
    assert [r.invocation for r in other.model.requests] == [1]
    assert other.messages(parked.run_id)[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Finished."}],
    }
    del h.live[parked.run_id]  # advanced by the other runner; h's copy is stale
    h.verify()
    other.verify()


def test_cancel_stops_a_parked_run(kind: str, ran: Calls) -> None:
    h, parked = gated_run(kind, ran)
    result = h.settle(h.runner.cancel(parked.run_id, "no longer needed"))
    assert result.status == "cancelled"
    assert result.error is not None
    assert "no longer needed" in result.error
    assert h.drive(parked.run_id).status == "cancelled"
    assert ran.log == []
    h.verify()


def test_public_names_are_exported() -> None:
    for name in ("Agent", "Runner", "AsyncRunner", "Approve", "Deny", "Limits", "RetryPolicy", "tool"):
        assert hasattr(tether, name)


class Crash(KeyboardInterrupt):
    """Stands in for the process dying mid-tool (like Ctrl-C, the one exception that escapes a tool)."""


def test_a_call_interrupted_mid_run_needs_approval_before_running_again(ran: Calls) -> None:
    crashes = [True]

    @tool
    def transfer(amount: int) -> str:
        """Move money (not idempotent)."""
        ran.add("transfer", amount)
        if crashes:
            crashes.pop()
            raise Crash
        return f"moved {amount}"

    script = [calls(tool_use("toolu_1", "transfer", {"amount": 5})), text("Transferred.")]
    h = Harness("sync", script, tools=[transfer])
    state = h.start()
    with pytest.raises(Crash):
        h.drive(state)
    assert set(h.settle(h.runner.load(state.id)).in_flight) == {"toolu_1"}

    restarted = Harness("sync", script, tools=[transfer], store=h.store, approver=DecideLater())
    parked = restarted.drive(state.id)
    assert parked.status == "awaiting_approval"
    assert [p["call_id"] for p in parked.pending_approvals] == ["toolu_1"]
    assert "interrupted" in parked.pending_approvals[0]["reason"]
    assert ran.log == [("transfer", 5)]  # not silently run twice
    restarted.decide(state.id, "toolu_1", Approve())
    result = restarted.drive(state.id)
    assert result.status == "done"
    assert ran.log == [("transfer", 5), ("transfer", 5)]
    restarted.verify()


def test_an_idempotent_call_interrupted_mid_run_is_simply_run_again(ran: Calls) -> None:
    crashes = [True]

    @tool(idempotent=True)
    def fetch(key: str) -> str:
        """Read something."""
        ran.add("fetch", key)
        if crashes:
            crashes.pop()
            raise Crash
        return f"value of {key}"

    script = [calls(tool_use("toolu_1", "fetch", {"key": "k"})), text("Fetched.")]
    h = Harness("sync", script, tools=[fetch])
    state = h.start()
    with pytest.raises(Crash):
        h.drive(state)
    restarted = Harness("sync", script, tools=[fetch], store=h.store)
    result = restarted.drive(state.id)
    assert result.status == "done"
    assert ran.log == [("fetch", "k"), ("fetch", "k")]
    restarted.verify()


def test_an_approval_policy_can_allow_or_deny_per_call(kind: str, ran: Calls) -> None:
    def only_tmp(arguments: Any, context: Any) -> tether.ApprovalVerdict:
        if arguments.path.startswith("/tmp/"):
            return tether.ApprovalVerdict("allow")
        return tether.ApprovalVerdict("deny", f"{arguments.path} is outside /tmp")

    @tool(approval=only_tmp)
    def remove(path: str) -> str:
        """Remove a file."""
        ran.add("remove", path)
        return f"removed {path}"

    h = Harness(
        kind,
        [
            calls(tool_use("toolu_1", "remove", {"path": "/tmp/a"}), tool_use("toolu_2", "remove", {"path": "/etc"})),
            text("Partly done."),
        ],
        tools=[remove],
    )
    result = h.run()
    assert result.status == "done"
    assert ran.log == [("remove", "/tmp/a")]
    sent = results_of(h.model.requests[1].messages[-1])
    assert sent["toolu_1"] == result_block("toolu_1", "removed /tmp/a")
    assert sent["toolu_2"]["is_error"] is True
    assert "/etc is outside /tmp" in sent["toolu_2"]["content"]
    h.verify()
