"""OpenTelemetry spans for runs: ``Runner(agent, store, telemetry=OpenTelemetry())``.

The only module that imports ``opentelemetry`` (``pip install 'tether[otel]'``). A span cannot
stay open across processes, while a run may be created in one process, parked for days and
resumed in another; so each span covers what one process saw, and the run's trace context is
stored in its spec (a W3C ``traceparent``) so that every later drive, decision and resume joins
the same trace::

    invoke_agent {agent}            the run's creation (and its first drive, for Runner.run)
    ├── tether.drive                one drive, in one process, holding the run's lease
    │   ├── tether.step {trigger}   one committed step of the machine (tools_requested, decided...)
    │   │   ├── chat {model}        one model call (GenAI conventions: model, usage, finish reason)
    │   │   ├── execute_tool {tool} one tool call (name, call id, outcome)
    │   │   └── tether.approval_wait {tool}  a person decided in the drive (the terminal's prompt)
    ├── tether.approval_wait {tool} a decision from anywhere: from when the run parked to the decision
    └── tether.drive                a later drive (a resume), in this process or another

The approval wait is emitted when the decision lands, starting when the run parked (both times
from the run's log). A run created without tracing has no stored context: each of its drives
starts a trace of its own. A child run (an agent tool's) starts under its parent's tool call.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as missing:  # pragma: no cover - the extra installs it
    raise ImportError(f"tracing needs OpenTelemetry: pip install 'tether[otel]' ({missing})") from missing

from tether.agent import Agent
from tether.core.engine import CallModel
from tether.core.flow import Activity, Attempt
from tether.core.state import RunState
from tether.errors import ConfigError
from tether.facts.events import (
    ApprovalDecided,
    ApprovalRequested,
    ContextExceeded,
    Event,
    HistoryCompacted,
    ModelResponded,
    RetryScheduled,
    RunFinished,
    RunStarted,
    ToolFinished,
    ToolStarted,
    Transition,
)
from tether.facts.status import RunStatus, status_name
from tether.models import ModelRequest

# GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/)
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"
"""The older name of :data:`PROVIDER`, still read by many backends: both are set."""
AGENT_NAME = "gen_ai.agent.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
"""Every input token, cached ones included (the conventions' rule for Anthropic's usage)."""
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
# tether's own
RUN_ID = "tether.run.id"
TENANT = "tether.tenant"
RUN_STATUS = "tether.run.status"
"""As people read it: ``thinking``, ``executing_tool``, ``awaiting_approval``, ``done``..."""
FORKED_FROM = "tether.run.forked_from"
STEP_TRIGGER = "tether.step.trigger"
STEP_FROM = "tether.step.from"
STEP_TO = "tether.step.to"
STEP_SEQ = "tether.step.seq"
TOOL_OUTCOME = "tether.tool.outcome"
"""ok, error, denied, cached, interrupted, refused_by_budget, retry_scheduled, escalated or abandoned."""
TOOL_ATTEMPT = "tether.tool.attempt"
APPROVED = "tether.approval.approved"
ACTOR = "tether.approval.actor"
REASON = "tether.approval.reason"
COST = "tether.cost_usd"

_PROPAGATOR = TraceContextTextMapPropagator()
_PROVIDERS = {"tether.models.anthropic": "anthropic", "tether.models.openai": "openai"}


def _version() -> str:
    try:
        return version("tether")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without metadata
        return "0"


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _carrier(span: Span) -> dict[str, Any] | None:
    """``span``'s context as a W3C ``traceparent`` carrier; None when it is not recorded (no SDK)."""
    carrier: dict[str, Any] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier or None


def _context_of(spec: dict[str, Any]) -> Context | None:
    """The trace context stored in a run's spec, or None (the current context then)."""
    carrier = spec.get("trace")
    if not isinstance(carrier, dict):
        return None
    context = _PROPAGATOR.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def provider_of(model: object) -> str:
    """The GenAI provider name of a model adapter (``anthropic``, ``openai``, else its class's name)."""
    kind = type(model)
    return _PROVIDERS.get(kind.__module__, kind.__name__)


@dataclass
class _Opening:
    """A run span open while its run is created."""

    span: Span
    run_id: str | None = None


@dataclass
class _Drive:
    """The spans one drive has open (a span starts when the drive first does something)."""

    run_id: str
    provider: str
    began: int
    span: Span | None = None
    step: Span | None = None
    step_began: int = 0
    model: Span | None = None
    model_request: ModelRequest | None = None
    """The request of the call :attr:`model` traces (to find it again when the call is made)."""
    tools: dict[str, Span] = field(default_factory=dict)


class OpenTelemetry:
    """Turns what runners tell it (see :class:`tether.drivers.telemetry.Telemetry`) into spans.

    ``tracer``: where spans go; by default the global tracer provider's (set by your SDK setup,
    or by ``opentelemetry-instrument``). One instance may serve many runs and runners at once.
    """

    def __init__(self, tracer: trace.Tracer | None = None, *, provider: Any = None) -> None:
        self.tracer = tracer or trace.get_tracer("tether", _version(), tracer_provider=provider)
        self._provider = provider
        self._drives: dict[str, _Drive] = {}
        self._opening: ContextVar[_Opening | None] = ContextVar(f"tether_otel_opening_{id(self)}", default=None)

    def close(self) -> None:
        """Flush and stop the tracer provider this instance was given (the CLI's), if any."""
        shutdown = getattr(self._provider, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # Runs -------------------------------------------------------------------------------------
    @contextmanager
    def run(self, agent: Agent, *, forked_from: str | None = None) -> Iterator[dict[str, Any] | None]:
        """The run span: open while the run is created (and driven, for ``Runner.run``).

        Re-entered while open and its run not yet created (``Runner.run`` calls ``create``), it gives
        the open span's context.
        """
        opening = self._opening.get()
        if opening is not None and opening.run_id is None:
            yield _carrier(opening.span)
            return
        name = agent.name or "tether"
        attributes: dict[str, Any] = {OPERATION: "invoke_agent", AGENT_NAME: name, PROVIDER: provider_of(agent.model)}
        if forked_from is not None:
            attributes[FORKED_FROM] = forked_from
        span = self.tracer.start_span(f"invoke_agent {name}", attributes=attributes)
        token = self._opening.set(_Opening(span))
        try:
            with trace.use_span(span, end_on_exit=True):
                yield _carrier(span)
        finally:
            self._opening.reset(token)

    def child_trace(self, link: dict[str, Any]) -> dict[str, Any] | None:
        """The context of the parent's tool-call span a child run serves, while its drive is here."""
        drive = self._drives.get(str(link.get("run_id")))
        span = drive.tools.get(str(link.get("call_id"))) if drive is not None else None
        return _carrier(span) if span is not None else None

    @contextmanager
    def drive(self, run_id: str, agent: Agent) -> Iterator[None]:
        """One drive of ``run_id``: its spans start with its first move and all end with it."""
        drive = _Drive(run_id, provider_of(agent.model), time.time_ns())
        self._drives[run_id] = drive
        try:
            yield
        except BaseException as error:
            span = drive.span or self.tracer.start_span(
                "tether.drive", start_time=drive.began, attributes={RUN_ID: run_id}
            )
            drive.span = span
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            self._end_drive(drive, f"the drive stopped: {type(error).__name__}")
            raise
        else:
            self._end_drive(drive, "the drive ended before the call's result was recorded")
        finally:
            self._drives.pop(run_id, None)

    def _end_drive(self, drive: _Drive, unfinished: str) -> None:
        for span in [*drive.tools.values(), *([drive.model] if drive.model is not None else [])]:
            span.set_status(Status(StatusCode.ERROR, unfinished))
            span.set_attribute(ERROR_TYPE, "unfinished")
            span.end()
        if drive.step is not None:
            drive.step.end()
        if drive.span is not None:
            drive.span.end()

    def _started(self, drive: _Drive, state: RunState) -> Span:
        """The drive's span, started (under the run's stored context) when first needed."""
        if drive.span is None:
            attributes = {RUN_ID: state.id, RUN_STATUS: status_name(state.status)}
            if state.tenant is not None:
                attributes[TENANT] = state.tenant
            drive.span = self.tracer.start_span(
                "tether.drive", context=self._parent_of(state), start_time=drive.began, attributes=attributes
            )
            drive.step_began = drive.began
        return drive.span

    def _parent_of(self, state: RunState) -> Context | None:
        context = _context_of(state.spec)
        if context is None and isinstance(link := state.spec.get("parent"), dict):
            carrier = self.child_trace(link)  # a child created before tracing: its parent's call, if here
            context = _PROPAGATOR.extract(carrier) if carrier is not None else None
        return context

    def _step(self, drive: _Drive, state: RunState) -> Span:
        """The step under way: from the end of the last one (or the drive's start) to the next transition."""
        parent = self._started(drive, state)
        if drive.step is None:
            drive.step = self.tracer.start_span(
                "tether.step",
                context=trace.set_span_in_context(parent),
                start_time=drive.step_began,
                attributes={RUN_ID: state.id},
            )
        return drive.step

    def _under(self, span: Span) -> Context:
        return trace.set_span_in_context(span)

    # What drivers tell ------------------------------------------------------------------------
    def announced(self, state: RunState, activity: Activity) -> None:
        """A model call is about to start: its span opens (tool spans open on their committed start)."""
        drive = self._drives.get(state.id)
        if drive is None or not isinstance(activity, CallModel):
            return
        request = activity.request
        provider = drive.provider if activity.model is None else provider_of(activity.model)  # after a handoff
        attributes: dict[str, Any] = {
            OPERATION: "chat",
            PROVIDER: provider,
            SYSTEM: provider,
            REQUEST_MODEL: request.model,
            REQUEST_MAX_TOKENS: request.max_tokens,
            RUN_ID: state.id,
        }
        if activity.summary is not None:
            attributes["tether.model.purpose"] = "summary"
        drive.model_request = request
        drive.model = self.tracer.start_span(
            f"chat {request.model}",
            context=self._under(self._step(drive, state)),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )

    @contextmanager
    def performing(self, effect: CallModel | Attempt) -> Iterator[None]:
        """While a model call or a tool attempt runs, its span is the current one (for spans made inside)."""
        span = self._span_of(effect)
        if span is None:
            yield
            return
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield

    def _span_of(self, effect: CallModel | Attempt) -> Span | None:
        if isinstance(effect, Attempt):
            drive = self._drives.get(effect.run_id)
            return drive.tools.get(effect.action.call.call_id) if drive is not None else None
        return next((d.model for d in self._drives.values() if d.model_request is effect.request), None)

    def committed(self, state: RunState, events: list[Event]) -> None:
        """Committed events end the spans they close: a model call, a tool call, a step, a wait."""
        drive = self._drives.get(state.id)
        if drive is None:
            self._outside_drive(state, events)
            return
        self._started(drive, state)
        moved: tuple[Event, Transition] | None = None
        finished: RunFinished | None = None
        failure: str | None = None
        started: list[ToolStarted] = []
        for event in events:
            fact = event.fact
            if isinstance(fact, ModelResponded | HistoryCompacted) and (
                isinstance(fact, ModelResponded) or fact.usage is not None
            ):
                self._model_answered(drive, state, fact)
            elif isinstance(fact, ToolStarted):
                started.append(fact)
            elif isinstance(fact, ToolFinished):
                self._tool_ended(drive, state, fact.call_id, fact.tool, _outcome(fact), _error_of(fact))
            elif isinstance(fact, RetryScheduled):
                self._tool_ended(
                    drive, state, fact.call_id, fact.tool, "retry_scheduled", (fact.error_type, fact.error)
                )
            elif isinstance(fact, ApprovalRequested) and fact.escalation:
                for call in fact.calls:
                    error = ("escalated", call.last_error or "")
                    self._tool_ended(drive, state, call.call_id, call.tool, "escalated", error)
            elif isinstance(fact, ApprovalDecided):
                self._waited(state, fact, event, self._under(self._step(drive, state)))
            elif isinstance(fact, ContextExceeded):
                failure = fact.error
            elif isinstance(fact, Transition):
                moved = (event, fact)
            elif isinstance(fact, RunFinished):
                finished = fact
        if moved is not None:
            self._moved(drive, state, moved, finished, failure)
        for fact in started:  # after the step that committed them ends: the call is the next step's
            self._tool_started(drive, state, fact)

    def _moved(
        self,
        drive: _Drive,
        state: RunState,
        moved: tuple[Event, Transition],
        finished: RunFinished | None,
        failure: str | None,
    ) -> None:
        """A transition ends the step (and a model call the step gave up on: it failed)."""
        event, transition = moved
        if drive.model is not None:
            why = failure or (finished.error if finished is not None else None) or "the model call failed"
            drive.model.set_status(Status(StatusCode.ERROR, why))
            drive.model.set_attribute(ERROR_TYPE, "model_error")
            drive.model.end()
            drive.model = None
        step = self._step(drive, state)
        step.update_name(f"tether.step {transition.event}")
        step.set_attributes(
            {
                STEP_TRIGGER: transition.event,
                STEP_FROM: status_name(transition.source) if transition.source else "",
                STEP_TO: status_name(transition.target),
            }
        )
        step.set_attribute(STEP_SEQ, event.seq)
        if finished is not None:
            for span in (step, drive.span):
                if span is None:
                    continue
                span.set_attribute(RUN_STATUS, status_name(finished.status))
                if finished.status == RunStatus.failed:
                    span.set_status(Status(StatusCode.ERROR, finished.error or "the run failed"))
        elif drive.span is not None:
            drive.span.set_attribute(RUN_STATUS, status_name(transition.target))
        step.end()
        drive.step = None
        drive.step_began = time.time_ns()

    def _outside_drive(self, state: RunState, events: list[Event]) -> None:
        """A run created (its span names it), or decided from anywhere (the wait for a person)."""
        for event in events:
            fact = event.fact
            opening = self._opening.get()
            if isinstance(fact, RunStarted) and opening is not None and opening.run_id is None:
                opening.run_id = state.id  # the run this span opened (a child run created later is not it)
                opening.span.set_attribute(RUN_ID, state.id)
                if state.tenant is not None:
                    opening.span.set_attribute(TENANT, state.tenant)
            elif isinstance(fact, ApprovalDecided):
                self._waited(state, fact, event, self._parent_of(state))

    # Spans ------------------------------------------------------------------------------------
    def _model_answered(self, drive: _Drive, state: RunState, fact: ModelResponded | HistoryCompacted) -> None:
        span = drive.model
        drive.model = None
        if span is None:  # not announced (a driver that does not tell): a span of its own, at its end
            span = self.tracer.start_span("chat", context=self._under(self._step(drive, state)), kind=SpanKind.CLIENT)
        usage = fact.usage
        attributes: dict[str, Any] = {}
        if fact.model is not None:
            attributes[RESPONSE_MODEL] = fact.model
            span.update_name(f"chat {fact.model}")
        if usage is not None:
            cache_read, cache_written = usage.cache_read_input_tokens, usage.cache_creation_input_tokens
            attributes[INPUT_TOKENS] = usage.input_tokens + cache_read + cache_written
            attributes[OUTPUT_TOKENS] = usage.output_tokens
            attributes[CACHE_READ_TOKENS] = cache_read
            attributes[CACHE_CREATION_TOKENS] = cache_written
        if fact.cost_usd is not None:
            attributes[COST] = fact.cost_usd
        if isinstance(fact, ModelResponded):
            if fact.id is not None:
                attributes[RESPONSE_ID] = fact.id
            if fact.stop_reason is not None:
                attributes[FINISH_REASONS] = [fact.stop_reason]
            if fact.discarded:
                attributes["tether.model.discarded"] = True
        span.set_attributes(attributes)
        span.end()

    def _tool_started(self, drive: _Drive, state: RunState, fact: ToolStarted) -> None:
        drive.tools[fact.call_id] = self._tool_span(drive, state, fact.call_id, fact.tool, fact.attempt)

    def _tool_span(self, drive: _Drive, state: RunState, call_id: str, tool: str, attempt: int | None) -> Span:
        attributes: dict[str, Any] = {
            OPERATION: "execute_tool",
            TOOL_NAME: tool,
            TOOL_CALL_ID: call_id,
            TOOL_TYPE: "function",
            RUN_ID: state.id,
        }
        if attempt is not None:
            attributes[TOOL_ATTEMPT] = attempt
        return self.tracer.start_span(
            f"execute_tool {tool}", context=self._under(self._step(drive, state)), attributes=attributes
        )

    def _tool_ended(  # noqa: PLR0917 - the call's identity and its end, all needed
        self,
        drive: _Drive,
        state: RunState,
        call_id: str,
        tool: str,
        outcome: str,
        error: tuple[str, str] | None,
    ) -> None:
        """End the call's span, or make one (a call answered without running: denied, cached...)."""
        span = drive.tools.pop(call_id, None) or self._tool_span(drive, state, call_id, tool, None)
        span.set_attribute(TOOL_OUTCOME, outcome)
        if error is not None:
            kind, message = error
            span.set_attribute(ERROR_TYPE, kind)
            span.set_status(Status(StatusCode.ERROR, message[:500]))
        span.end()

    def _waited(self, state: RunState, fact: ApprovalDecided, event: Event, parent: Context | None) -> None:
        """The wait for a person, from when the run parked to this decision (times from the run's log)."""
        parked = state.awaiting_since if state.awaiting_since is not None else event.at
        attributes: dict[str, Any] = {
            RUN_ID: state.id,
            TOOL_NAME: fact.tool,
            TOOL_CALL_ID: fact.call_id,
            APPROVED: fact.approved,
            ACTOR: fact.actor,
        }
        if fact.reason:
            attributes[REASON] = fact.reason
        span = self.tracer.start_span(
            f"tether.approval_wait {fact.tool}", context=parent, start_time=_ns(parked), attributes=attributes
        )
        span.end(end_time=_ns(max(event.at, parked)))


def _outcome(fact: ToolFinished) -> str:
    if fact.cached:
        return "cached"
    if fact.denied_by is not None:
        return "denied"
    if fact.interrupted:
        return "interrupted"
    if fact.budget_limit is not None:
        return "refused_by_budget"
    return "error" if fact.is_error else "ok"


def _error_of(fact: ToolFinished) -> tuple[str, str] | None:
    if not fact.is_error:
        return None
    return (fact.error_type or _outcome(fact), fact.content)


EXPORTERS = ("otlp", "console", "none")
"""What ``OTEL_TRACES_EXPORTER`` may name for the CLI."""


def from_environment() -> OpenTelemetry:
    """The CLI's tracing: the global provider if one is set (``opentelemetry-instrument``), else an SDK one.

    The SDK provider reads the standard variables: ``OTEL_SERVICE_NAME`` (default ``tether``),
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_EXPORTER`` (``otlp``, the default, needs
    ``opentelemetry-exporter-otlp-proto-http``, which reads ``OTEL_EXPORTER_OTLP_*``; ``console``
    prints spans to stderr). Call :meth:`OpenTelemetry.close` at the end to flush.

    Raises:
        ConfigError: an unknown exporter, or the OTLP exporter is not installed.
    """
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return OpenTelemetry()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    names = [name.strip() for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if name.strip()]
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        raise ConfigError(f"OTEL_TRACES_EXPORTER={','.join(unknown)}: tether knows {', '.join(EXPORTERS)}")
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    defaults = {} if named else {"service.name": "tether"}
    provider = TracerProvider(resource=Resource.create(defaults))
    for name in names:
        exporter: SpanExporter
        if name == "console":
            exporter = ConsoleSpanExporter(out=sys.stderr)  # stdout holds the CLI's output
        elif name == "otlp":
            try:  # not a dependency of the extra: imported by name
                otlp = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
            except ImportError as missing:
                raise ConfigError(
                    "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: "
                    "pip install opentelemetry-exporter-otlp-proto-http (or set OTEL_TRACES_EXPORTER=console)"
                ) from missing
            exporter = otlp.OTLPSpanExporter()
        else:
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return OpenTelemetry(provider=provider)


__all__ = ["OpenTelemetry", "from_environment", "provider_of"]
