"""OpenTelemetry spans for runs, read back from the SDK's in-memory exporter.

Each runner below gets its own ``OpenTelemetry`` (as another process would): the run's trace
context travels only through the store, so a decision and a resume made by other runners
still land in the run's trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from support import model_reply, token_usage, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Policy, Rule, Runner, tool
from tether.drivers.otel import OpenTelemetry
from tether.errors import ModelError
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore
from tether.surfaces.cli import main
from tether.testing import ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(approval=True)
def publish(text: str) -> str:
    """Publish a text."""
    return f"published {text}"


def answer(text: str) -> dict[str, Any]:
    reply = model_reply([{"type": "text", "text": text}], "end_turn")
    reply["usage"] = token_usage(30, 5, read=100)
    return reply


def asks(*uses: dict[str, Any]) -> dict[str, Any]:
    reply = tool_use_turn(*uses)
    reply["usage"] = token_usage(20, 10)
    return reply


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


def telemetry(exporter: InMemorySpanExporter) -> OpenTelemetry:
    """Tracing as one process would have it: its own provider, the shared exporter."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetry(provider.get_tracer("test"))


def agent(*script: dict[str, Any] | BaseException, tools: list[Any] | None = None, **options: Any) -> Agent:
    return Agent(model=ScriptedModel(list(script)), tools=tools or [add, publish], name="helper", **options)


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name.startswith(prefix)]


def parent_of(span: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> ReadableSpan:
    assert span.parent is not None
    return next(s for s in spans if s.context.span_id == span.parent.span_id)


def test_a_run_traces_its_drive_steps_model_calls_and_tool_calls(exporter: InMemorySpanExporter) -> None:
    script = (asks(tool_use("toolu_1", "add", {"a": 2, "b": 3})), answer("5"))
    result = Runner(agent(*script), MemoryStore(), telemetry=telemetry(exporter)).run("2 + 3?", tenant="acme")
    spans = exporter.get_finished_spans()

    [root] = [span for span in spans if span.parent is None]
    assert root.name == "invoke_agent helper"
    assert root.attributes is not None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["tether.run.id"] == result.run_id
    assert {span.context.trace_id for span in spans} == {root.context.trace_id}
    [drive] = named(spans, "tether.drive")
    assert parent_of(drive, spans) is root
    assert drive.attributes is not None
    assert (drive.attributes["tether.run.status"], drive.attributes["tether.tenant"]) == ("done", "acme")
    steps = named(spans, "tether.step")
    assert [s.name for s in steps] == [
        "tether.step tools_requested",
        "tether.step tool_finished",
        "tether.step answered",
    ]
    assert all(parent_of(step, spans) is drive for step in steps)
    assert steps[0].attributes is not None
    assert (steps[0].attributes["tether.step.from"], steps[0].attributes["tether.step.to"]) == (
        "thinking",
        "executing_tool",
    )

    first_call, second_call = named(spans, "chat")
    assert parent_of(first_call, spans) is steps[0]
    assert first_call.attributes is not None
    assert first_call.attributes["gen_ai.operation.name"] == "chat"
    assert first_call.attributes["gen_ai.request.model"] == "scripted"  # the adapter's own name
    assert first_call.attributes["gen_ai.provider.name"] == "ScriptedModel"
    assert first_call.attributes["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first_call.attributes["gen_ai.usage.input_tokens"] == 20
    assert first_call.attributes["gen_ai.usage.output_tokens"] == 10
    assert second_call.attributes is not None
    assert second_call.attributes["gen_ai.usage.input_tokens"] == 130  # cached tokens are input tokens too
    assert second_call.attributes["gen_ai.usage.cache_read.input_tokens"] == 100

    [call] = named(spans, "execute_tool")
    assert call.name == "execute_tool add"
    assert parent_of(call, spans) is steps[1]
    assert call.attributes is not None
    assert (call.attributes["gen_ai.tool.name"], call.attributes["gen_ai.tool.call.id"]) == ("add", "toolu_1")
    assert call.attributes["tether.tool.outcome"] == "ok"
    assert call.status.status_code == StatusCode.UNSET


def test_a_parked_run_decided_and_resumed_elsewhere_stays_in_one_trace(exporter: InMemorySpanExporter) -> None:
    store = MemoryStore()
    script = (asks(tool_use("toolu_1", "publish", {"text": "hi"})), answer("Published."))
    parked = Runner(agent(*script), store, telemetry=telemetry(exporter)).run("Publish hi.")
    assert parked.status == "awaiting_approval"
    [root] = [span for span in exporter.get_finished_spans() if span.parent is None]
    parked_at = store.load_events(parked.run_id)[-2].at  # approval_requested, then the transition

    Runner(agent(*script), store, telemetry=telemetry(exporter)).decide(parked.run_id, "toolu_1", Approve(actor="ann"))
    resumed = Runner(agent(*script), store, telemetry=telemetry(exporter)).drive(parked.run_id)

    assert resumed.status == "done"
    spans = exporter.get_finished_spans()
    assert {span.context.trace_id for span in spans} == {root.context.trace_id}
    [wait] = named(spans, "tether.approval_wait")
    assert wait.name == "tether.approval_wait publish"
    assert parent_of(wait, spans) is root
    assert wait.attributes is not None
    assert (wait.attributes["tether.approval.approved"], wait.attributes["tether.approval.actor"]) == (True, "ann")
    assert wait.attributes["gen_ai.tool.call.id"] == "toolu_1"
    assert wait.start_time == int(parked_at * 1_000_000_000)
    first, second = named(spans, "tether.drive")
    assert parent_of(first, spans) is root
    assert parent_of(second, spans) is root
    assert second.attributes is not None
    assert second.attributes["tether.run.status"] == "done"
    [call] = named(spans, "execute_tool")
    assert parent_of(parent_of(call, spans), spans) is second


def test_a_denied_call_and_a_failed_model_call_are_marked(exporter: InMemorySpanExporter) -> None:
    script = (asks(tool_use("toolu_1", "add", {"a": 666, "b": 1})), ModelError("overloaded", retryable=True))
    no_666 = Policy(rules=[Rule(tool="add", when={"a": {"equals": 666}}, action="deny", message="not that number")])
    result = Runner(agent(*script, policy=no_666), MemoryStore(), telemetry=telemetry(exporter)).run("666 + 1?")

    assert result.status == "failed"
    spans = exporter.get_finished_spans()
    [call] = named(spans, "execute_tool")
    assert call.attributes is not None
    assert call.attributes["tether.tool.outcome"] == "denied"
    assert call.status.status_code == StatusCode.ERROR
    failed = named(spans, "chat")[-1]
    assert failed.status.status_code == StatusCode.ERROR
    assert "overloaded" in (failed.status.description or "")
    [drive] = named(spans, "tether.drive")
    assert drive.status.status_code == StatusCode.ERROR


def test_a_fork_starts_its_own_trace_naming_the_original(exporter: InMemorySpanExporter) -> None:
    store = MemoryStore()
    script = (asks(tool_use("toolu_1", "add", {"a": 2, "b": 3})), answer("5"), answer("again"))
    runner = Runner(agent(*script), store, telemetry=telemetry(exporter))
    original = runner.run("2 + 3?").run_id
    fork = runner.fork(original, at_event=1)
    runner.drive(fork.id)

    spans = exporter.get_finished_spans()
    roots = [span for span in spans if span.parent is None]
    assert len(roots) == 2
    assert roots[1].attributes is not None
    assert roots[1].attributes["tether.run.forked_from"] == original
    assert roots[1].attributes["tether.run.id"] == fork.id
    assert roots[0].context.trace_id != roots[1].context.trace_id
    assert parent_of(named(spans, "tether.drive")[-1], spans) is roots[1]


def test_a_child_run_is_traced_under_its_parents_tool_call(exporter: InMemorySpanExporter) -> None:
    child = Agent(model=ScriptedModel([answer("looks fine")]), name="reviewer")
    review = child.as_tool("review", "Have the reviewer check a draft.")
    parent = Agent(
        model=ScriptedModel([asks(tool_use("toolu_review", "review", {"task": "check"})), answer("done")]),
        tools=[review],
        name="writer",
    )
    result = Runner(parent, MemoryStore(), telemetry=telemetry(exporter)).run("write and review")

    assert result.status == "done"
    spans = exporter.get_finished_spans()
    [root] = [span for span in spans if span.parent is None]
    assert root.name == "invoke_agent writer"
    assert {span.context.trace_id for span in spans} == {root.context.trace_id}
    [call] = named(spans, "execute_tool review")
    drives = named(spans, "tether.drive")
    assert len(drives) == 2
    child_drive = next(drive for drive in drives if parent_of(drive, spans) is not root)
    assert parent_of(child_drive, spans) is call
    assert child_drive.attributes is not None
    assert child_drive.attributes["tether.run.id"] != result.run_id
    assert root.attributes is not None
    assert root.attributes["tether.run.id"] == result.run_id  # the child's creation did not rename it


def test_concurrent_calls_each_get_their_span(exporter: InMemorySpanExporter) -> None:
    script = (
        asks(tool_use("toolu_1", "add", {"a": 1, "b": 2}), tool_use("toolu_2", "add", {"a": 3, "b": 4})),
        answer("3, 7"),
    )
    runner = Runner(agent(*script, concurrent_tools=True), MemoryStore(), telemetry=telemetry(exporter))
    assert runner.run("1 + 2 and 3 + 4?").status == "done"

    spans = exporter.get_finished_spans()
    calls = named(spans, "execute_tool")
    ids = [span.attributes["gen_ai.tool.call.id"] for span in calls if span.attributes]
    assert sorted(ids, key=str) == ["toolu_1", "toolu_2"]
    assert all(span.attributes and span.attributes["tether.tool.outcome"] == "ok" for span in calls)
    assert all(parent_of(span, spans).name.startswith("tether.step") for span in calls)


INNER: list[Any] = []
"""The tracer the ``lookup`` tool makes its own span with (set by the test)."""


@tool
def lookup(key: str) -> str:
    """Look a key up (tracing the lookup as instrumented code would)."""
    with INNER[0].start_as_current_span("lookup db"):
        return key.upper()


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("runner_type", [Runner, AsyncRunner])
async def test_spans_made_inside_a_tool_nest_under_its_call(
    exporter: InMemorySpanExporter, runner_type: Any, concurrent: bool
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    INNER[:] = [provider.get_tracer("inner")]
    turn = asks(tool_use("toolu_1", "lookup", {"key": "a"}), tool_use("toolu_2", "lookup", {"key": "b"}))
    tools = agent(turn, answer("A, B"), tools=[lookup], concurrent_tools=concurrent)
    runner = runner_type(tools, MemoryStore(), telemetry=OpenTelemetry(provider.get_tracer("t")))
    result = runner.run("look a and b up")
    assert (await result if runner_type is AsyncRunner else result).status == "done"

    spans = exporter.get_finished_spans()
    parents = [parent_of(span, spans) for span in named(spans, "lookup db")]
    assert sorted(str(span.attributes and span.attributes["gen_ai.tool.call.id"]) for span in parents) == [
        "toolu_1",
        "toolu_2",
    ]


async def test_the_async_runner_traces_the_same_way(exporter: InMemorySpanExporter) -> None:
    store = MemoryStore()
    script = (asks(tool_use("toolu_1", "publish", {"text": "hi"})), answer("Published."))
    parked = await AsyncRunner(agent(*script), store, telemetry=telemetry(exporter)).run("Publish hi.")
    later = AsyncRunner(agent(*script), store, telemetry=telemetry(exporter))
    await later.decide(parked.run_id, "toolu_1", Approve(actor="ann"))
    resumed = await later.drive(parked.run_id)

    assert resumed.status == "done"
    spans = exporter.get_finished_spans()
    [root] = [span for span in spans if span.parent is None]
    assert {span.context.trace_id for span in spans} == {root.context.trace_id}
    assert [span.name for span in named(spans, "tether.drive")] == ["tether.drive", "tether.drive"]
    assert [span.name for span in named(spans, "execute_tool")] == ["execute_tool publish"]
    assert len(named(spans, "tether.approval_wait")) == 1
    assert len(named(spans, "chat")) == 2


@pytest.mark.slow
def test_without_telemetry_nothing_imports_opentelemetry() -> None:
    code = textwrap.dedent(
        """
        import sys
        from tether import Agent, Runner
        from tether.testing import ScriptedModel
        from tether.surfaces import cli
        reply = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
        assert Runner(Agent(model=ScriptedModel([reply]))).run("hi").status == "done"
        print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
        """
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert shown.stdout.strip() == "[]"


def test_the_cli_traces_with_the_standard_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SQLStore(db)
    script = (asks(tool_use("toolu_1", "publish", {"text": "hi"})), answer("Published."))
    try:
        parked = Runner(agent(*script), store).run("Publish hi.")
    finally:
        store.close()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")

    assert main(["deny", parked.run_id, "toolu_1", "--reason", "not today", "--by", "ann", "--db", db]) == 0
    spans = capsys.readouterr().err
    assert '"name": "tether.approval_wait publish"' in spans
    assert '"tether.approval.reason": "not today"' in spans
    assert '"service.name": "tether"' in spans

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    assert main(["deny", parked.run_id, "toolu_1", "--db", db]) == 2
    assert "OTEL_TRACES_EXPORTER=zipkin: tether knows otlp, console, none" in capsys.readouterr().err


def test_a_decision_in_the_inspector_lands_in_the_runs_trace(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    from starlette.testclient import TestClient

    from tether.core.approvals import DecideLater
    from tether.drivers.loader import agent_from_spec
    from tether.policy.access import Credentials
    from tether.surfaces.web.app import create_app
    from tether.surfaces.web.decisions import InProcess
    from ui_runs import SHOWN_FINGERPRINT, Project

    project = Project.make(tmp_path / "project")
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    tracing = telemetry(exporter)
    try:
        runner = Runner(agent_from_spec(project.spec), store, approver=DecideLater(), telemetry=tracing)
        parked = runner.run("Refund INV-7.")
        token = "operator-token-0123456789"
        resume = InProcess(store, max_wait=0, telemetry=tracing).drive
        app = create_app(store, Credentials({token: None}), resume=resume, telemetry=tracing)
        script = TestClient(app, follow_redirects=False, headers={"Authorization": f"Bearer {token}"})
        form = {"run_id": parked.run_id, "call_id": "toolu_refund", "fingerprint": SHOWN_FINGERPRINT}
        assert script.post("/decide", data={**form, "action": "approve", "by": "ann"}).status_code == 303
        assert store.load_run(parked.run_id).status == "done"
    finally:
        store.close()

    assert_one_trace_decided_by(exporter.get_finished_spans(), "refund", "ann")


def test_the_example_service_traces_a_run_and_its_decision_in_one_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: InMemorySpanExporter
) -> None:
    """create_app(telemetry=...): the request that parks the run, then the person's decision over HTTP."""
    pytest.importorskip("uvicorn", reason="the service example needs the 'service' extra")
    import urllib.request

    from support import serving_app
    from tether.examples.service import create_app
    from tether.policy.access import Credentials
    from tether.stores.sql import AsyncSQLStore

    monkeypatch.setenv("TETHER_DEMO_WORKSPACE", str(tmp_path / "workspace"))
    app = create_app(
        store=AsyncSQLStore(f"sqlite:///{tmp_path / 'service.db'}"),
        credentials=Credentials({"acme-token-0123456789": "acme"}),
        telemetry=telemetry(exporter),
    )
    loopback = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": "Bearer acme-token-0123456789", "Content-Type": "application/json"}
        request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST", headers=headers)
        with loopback.open(request, timeout=30) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    with serving_app(app) as base:
        parked = post(base, "/runs", {"prompt": "Write and run fib.py."})
        assert parked["status"] == "awaiting_approval"
        done = post(base, f"/runs/{parked['run_id']}/approvals/toolu_demo_run", {"approve": True, "actor": "alice"})
    assert done["status"] == "done"

    assert_one_trace_decided_by(exporter.get_finished_spans(), "run_python", "alice")


def assert_one_trace_decided_by(spans: tuple[ReadableSpan, ...], tool: str, actor: str) -> None:
    """One trace: the drive that parked the run, the wait for ``actor``'s decision, the drive after it."""
    [root] = [span for span in spans if span.parent is None]
    assert {span.context.trace_id for span in spans} == {root.context.trace_id}
    [wait] = named(spans, f"tether.approval_wait {tool}")
    assert wait.attributes is not None
    assert wait.attributes["tether.approval.actor"] == actor
    assert len(named(spans, "tether.drive")) == 2
