"""Replaying a stored run offline: its recording drives a scripted model, and can stand in for its tools.

A run's log already holds everything a replay needs: the opening prompt, each model answer (and,
folded from the events before it, the request it answered: the history, system prompt, tools
offered and settings), each tool result and each person's decision. :func:`replay` reads them
into a :class:`Replay`:

- :attr:`Replay.model` answers each model call as recorded, and refuses, with a readable diff, a
  request that differs from the recorded one in what matters (messages, system prompt, tools
  offered, settings): the agent under test no longer behaves as it did;
- :meth:`Replay.tools` gives tools answered from the recorded results (no side effects), matched
  by tool and input; :attr:`Replay.approver` decides gated calls as people did;
- :meth:`Replay.run` drives the agent through all that and compares the trajectory (calls and
  inputs in order, end state) with the recorded one.

A replay of an unchanged agent reaches the same end with the same calls. What is not replayed:
the requests of history summaries (answered as recorded, never compared) and the system prompt
and tools of an agent a run was handed to (only the history is compared then). A tool error is
reproduced by its message; one that took several attempts is answered at once.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from tether.agent import Agent, HandoffTool
from tether.canonical import canonical_json
from tether.core.approvals import ApprovalRequest, Approve, Decision, Deny
from tether.core.state import RunState
from tether.drivers.loader import agent_from_spec, import_tools_module
from tether.drivers.runner import Runner, RunResult
from tether.errors import ConfigError, ModelError
from tether.facts.events import (
    ApprovalDecided,
    Event,
    HistoryCompacted,
    ModelResponded,
    RunStarted,
    ToolFinished,
)
from tether.facts.history import Message
from tether.models import ModelRequest, ModelResponse, ModelSettings
from tether.policy.policies import ApprovalContext, ApprovalSetting, ApprovalVerdict, RetryPolicy, decide_approval
from tether.stores import Store
from tether.tools import ModelRetry, SchemaInput, Tool
from tether.tools.output import OUTPUT_TOOL
from tether.views.trajectory import Trajectory, trajectory_of

RECORDING_VERSION = 1
"""The format of :meth:`Recording.to_json`; a file of another is refused."""
_RAISED = re.compile(r"Error \((?P<cls>\w+)\): tool '[^']*' raised (?P<type>\w+): (?P<message>.*)", re.DOTALL)


class ReplayMismatch(ModelError):
    """The agent asked the model something the recorded run did not: the recording cannot answer.

    A model error, so the replayed run fails with it (its ``error`` holds the diff).
    """

    def __init__(self, message: str, *, invocation: int) -> None:
        super().__init__(message)
        self.invocation = invocation
        """The model call (from 0) that differs."""


@dataclass(frozen=True)
class Exchange:
    """One recorded model call: what it was asked (as far as a replay compares it) and what it answered."""

    response: dict[str, Any]
    """The Messages API response object, as the model gave it."""
    messages: list[Message] | None = None
    """The history sent; None for a call that is answered but never compared (a history summary)."""
    system: str | None = None
    tools: dict[str, Any] | None = None
    """Each tool offered, by name: its description and input schema; None: not known (after a handoff)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The model's name, its settings and the call's ``tool_choice``."""

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RecordedResult:
    """A tool's result, as the tool gave it (its whole text, before any cut for the model)."""

    call_id: str
    tool: str
    input: Any
    """The input it ran with (a person's edit, if any)."""
    content: str
    is_error: bool


@dataclass(frozen=True)
class RecordedDecision:
    """A person's decision on one call."""

    call_id: str
    tool: str
    input: Any
    """The model's input, which the decision was about."""
    approved: bool
    reason: str = ""
    edited: dict[str, Any] | None = None
    remember_for_run: bool = False
    actor: str = "replay"
    """Who decided (the model reads it in a denial's result)."""


@dataclass(frozen=True)
class Recording:
    """Everything a replay of one run needs, as plain JSON-able data (see :meth:`to_json`)."""

    run_id: str
    prompt: str
    spec: dict[str, Any]
    """The run's spec: how its agent was made (tools module, system prompt, model, settings)."""
    exchanges: list[Exchange]
    results: list[RecordedResult]
    decisions: list[RecordedDecision]
    trajectory: Trajectory

    @classmethod
    def from_events(cls, run_id: str, events: Sequence[Event]) -> Recording:
        """Read a run's whole log.

        Raises:
            ConfigError: the log does not start a run from one prompt (a continued conversation or a fork).
        """
        first = events[0].fact if events else None
        if not isinstance(first, RunStarted):
            raise ConfigError(f"run {run_id}: its log does not begin with the run's start, so it cannot be replayed")
        opening = first.messages
        if len(opening) != 1 or opening[0].get("role") != "user" or not _text(opening[0]):
            raise ConfigError(
                f"run {run_id} opens with {len(opening)} messages (it continues a conversation or is a fork): "
                "only a run started from one prompt can be replayed"
            )
        state = RunState(id=run_id)
        exchanges: list[Exchange] = []
        results: list[RecordedResult] = []
        decisions: list[RecordedDecision] = []
        for event in events:
            fact = event.fact
            if isinstance(fact, ModelResponded):
                exchanges.append(_exchange(state, first.spec, fact))
            elif isinstance(fact, HistoryCompacted) and fact.summary is not None:
                exchanges.append(Exchange(_response([{"type": "text", "text": fact.summary}], "end_turn")))
            elif isinstance(fact, ToolFinished) and _ran(fact):
                call = state.call(fact.call_id)
                ran = state.input_to_run(call) if call is not None else None
                results.append(
                    RecordedResult(fact.call_id, fact.tool, ran, fact.full_content or fact.content, fact.is_error)
                )
            elif isinstance(fact, ApprovalDecided):
                call = state.call(fact.call_id)
                asked = call.input if call is not None else None
                decisions.append(
                    RecordedDecision(
                        fact.call_id,
                        fact.tool,
                        asked,
                        fact.approved,
                        fact.reason,
                        fact.input,
                        fact.remember_for_run,
                        fact.actor,
                    )
                )
            state.apply(event)
        return cls(run_id, _text(opening[0]), first.spec, exchanges, results, decisions, trajectory_of(events))

    def to_json(self) -> dict[str, Any]:
        """The recording as one JSON object (what ``tether export --as-test`` writes beside the test)."""
        return {
            "version": RECORDING_VERSION,
            "run_id": self.run_id,
            "prompt": self.prompt,
            "spec": self.spec,
            "exchanges": [exchange.to_json() for exchange in self.exchanges],
            "results": [dataclasses.asdict(result) for result in self.results],
            "decisions": [dataclasses.asdict(decision) for decision in self.decisions],
            "trajectory": self.trajectory.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str = "the recording") -> Recording:
        """The inverse of :meth:`to_json`.

        Raises:
            ConfigError: ``data`` is not a recording of this version.
        """
        if data.get("version") != RECORDING_VERSION:
            raise ConfigError(f"{source} is not a tether recording of version {RECORDING_VERSION}")
        try:
            return cls(
                str(data["run_id"]),
                str(data["prompt"]),
                dict(data["spec"]),
                [Exchange(**exchange) for exchange in data["exchanges"]],
                [RecordedResult(**result) for result in data["results"]],
                [RecordedDecision(**decision) for decision in data["decisions"]],
                Trajectory.from_json(data["trajectory"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"{source} is not a valid tether recording: {error!r}") from None

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        """Read a recording file."""
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read recording {file}: {error}") from error
        if not isinstance(data, dict):
            raise ConfigError(f"{file} is not a tether recording (expected a JSON object)")
        return cls.from_json(data, source=str(file))


def _text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(block.get("text", "")) for block in content or [] if block.get("type") == "text")


def _ran(fact: ToolFinished) -> bool:
    """Whether the result came from the tool (run, or its cached result), not from the engine refusing the call."""
    refused = fact.denied_by is not None or fact.budget_limit is not None or fact.interrupted
    return (fact.attempt is not None or fact.cached) and not refused


def _response(content: list[dict[str, Any]], stop_reason: str | None, **rest: Any) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": content, "stop_reason": stop_reason, **rest}


def _exchange(state: RunState, spec: dict[str, Any], fact: ModelResponded) -> Exchange:
    """The call ``fact`` answered, as the run stood just before it (``state``)."""
    settings = ModelSettings.from_dict(spec.get("model_settings"))
    if state.final_answer_requested:
        choice: dict[str, Any] | None = {"type": "none"}
    elif state.demanding_result:
        choice = {"type": "tool", "name": OUTPUT_TOOL}
    else:
        choice = settings.tool_choice_param()
    handed = state.agent is not None
    response = _response(fact.content, fact.stop_reason, usage=fact.usage.to_dict(), model=fact.model, id=fact.id)
    return Exchange(
        response,
        messages=copy.deepcopy(state.messages),
        system=None if handed else spec.get("system"),
        tools=None if handed else _tools_of(spec),
        settings={"model": spec.get("model"), **settings.to_dict(), "tool_choice": choice},
    )


def _tools_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    descriptions = spec.get("tool_descriptions") or {}
    return {
        name: {"description": descriptions.get(name), "input_schema": schema}
        for name, schema in (spec.get("tool_schemas") or {}).items()
    }


# The model -------------------------------------------------------------------------------
class ReplayModel:
    """Answers each model call as the recording did, while the request is the recorded one.

    ``strict`` (the default) compares everything that matters: messages, system prompt, tools
    offered (names, descriptions, schemas) and settings. Not strict, only the messages are
    compared, and what else differs is kept in :attr:`ignored`: how ``tether replay`` lets the
    recorded model answer an agent with another system prompt or tools, by turn, until the
    conversation itself goes elsewhere.
    """

    def __init__(self, recording: Recording, *, strict: bool = True) -> None:
        self.recording = recording
        self.strict = strict
        self.name = f"replay:{recording.run_id}"
        self.ignored: list[str] = []
        """Differences let through (not strict), one line each."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        """The recorded answer to call number ``request.invocation``.

        Raises:
            ReplayMismatch: the recording holds no such call, or the request differs from it.
        """
        exchanges, index = self.recording.exchanges, request.invocation
        if index >= len(exchanges):
            raise ReplayMismatch(
                f"replay of run {self.recording.run_id}: the recorded run made {len(exchanges)} model calls; "
                f"this one asks for call #{index + 1}",
                invocation=index,
            )
        exchange = exchanges[index]
        where = f"replay of run {self.recording.run_id}, model call #{index + 1}"
        if exchange.messages is not None:
            changed = _messages_diff(exchange.messages, request.messages)
            if changed:
                raise ReplayMismatch(
                    f"{where}: the messages differ from the recorded ones\n{changed}", invocation=index
                )
        found = request_differences(exchange, request)
        if found and self.strict:
            raise ReplayMismatch(
                f"{where}: the request differs from the recorded one\n" + "\n".join(found), invocation=index
            )
        self.ignored.extend(f"call #{index + 1}: {line.splitlines()[0]}" for line in found)
        return ModelResponse.from_dict(exchange.response, source=f"the recording of run {self.recording.run_id}")

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Same as :meth:`complete`; nothing to wait for."""
        return self.complete(request)


def request_differences(exchange: Exchange, request: ModelRequest) -> list[str]:
    """How ``request`` differs from the recorded one besides its messages, one entry each (with its diff)."""
    found: list[str] = []
    if exchange.messages is None:
        return found
    known = exchange.system is not None or exchange.tools is not None  # not after a handoff
    if known and (exchange.system or None) != (request.system or None):
        found.append("system prompt changed\n" + _text_diff(exchange.system or "", request.system or ""))
    if exchange.tools is not None:
        offered = {tool["name"]: tool for tool in request.tools}
        for name in sorted(set(exchange.tools) | set(offered)):
            if name not in offered:
                found.append(f"tool {name!r} is no longer offered")
            elif name not in exchange.tools:
                found.append(f"tool {name!r} is offered and was not")
            else:
                found.extend(_tool_diff(name, exchange.tools[name], offered[name]))
    settings = {"model": request.model, **request.settings.to_dict(), "tool_choice": request.tool_choice}
    for key in sorted(set(exchange.settings) | set(settings)):
        if canonical_json(exchange.settings.get(key)) != canonical_json(settings.get(key)):
            was, now = json.dumps(exchange.settings.get(key)), json.dumps(settings.get(key))
            found.append(f"setting {key}: recorded {was}, now {now}")
    return found


def _tool_diff(name: str, recorded: Mapping[str, Any], offered: Mapping[str, Any]) -> list[str]:
    found = []
    if recorded.get("description") is not None and recorded.get("description") != offered.get("description"):
        diff = _text_diff(str(recorded.get("description")), str(offered.get("description")))
        found.append(f"tool {name!r}: description changed\n{diff}")
    if canonical_json(recorded.get("input_schema")) != canonical_json(offered.get("input_schema")):
        diff = _text_diff(_pretty(recorded.get("input_schema")), _pretty(offered.get("input_schema")))
        found.append(f"tool {name!r}: input schema changed\n{diff}")
    return found


def _messages_diff(recorded: list[Message], sent: list[Message]) -> str:
    """A unified diff of the two histories, from the first message that differs; empty when equal."""
    was, now = [_plain(m) for m in recorded], [_plain(m) for m in sent]
    if canonical_json(was) == canonical_json(now):
        return ""
    first = next(
        (i for i, (a, b) in enumerate(zip(was, now, strict=False)) if canonical_json(a) != canonical_json(b)), None
    )
    if first is None:
        first = min(len(was), len(now))
    head = f"first difference at message {first} (of {len(was)} recorded, {len(now)} sent)"
    return head + "\n" + _text_diff(_pretty(was[first:]), _pretty(now[first:]))


def _plain(message: Message) -> dict[str, Any]:
    """A message as compared: text content as a block, without cache marks (an adapter's detail)."""
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    return {
        "role": message.get("role"),
        "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks],
    }


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _text_diff(recorded: str, now: str) -> str:
    lines = difflib.unified_diff(
        recorded.splitlines(), now.splitlines(), fromfile="recorded", tofile="now", lineterm="", n=2
    )
    return "\n".join(lines)


# The tools and the approver --------------------------------------------------------------
class NotRecorded(LookupError):
    """A stubbed tool was called with an input no recorded result answers."""


class _Results:
    """The recorded results of one tool, each answering one call, matched by input (in recorded order)."""

    def __init__(self, tool: Tool, results: Sequence[RecordedResult]) -> None:
        self.tool = tool
        self.left = [(_key(tool, result.input), result) for result in results]

    def find(self, key: str) -> RecordedResult | None:
        return next((result for known, result in self.left if known == key), None)

    def take(self, key: str) -> RecordedResult:
        for index, (known, result) in enumerate(self.left):
            if known == key:
                del self.left[index]
                return result
        raise NotRecorded(f"no recorded result of {self.tool.name!r} for input {key}")


def _key(tool: Tool, value: Any) -> str:
    """An input as compared: validated by the tool (defaults filled in) when it can be, else as given."""
    try:
        return canonical_json(tool.validate(value).model_dump(mode="json"))
    except pydantic.ValidationError:
        return canonical_json(value)


def stub_tool(tool: Tool, results: Sequence[RecordedResult], *, gate_unmatched: bool = False) -> Tool:
    """``tool`` answered from ``results`` (its name, description, schema and policies kept; nothing runs).

    A call with an input no result holds raises :class:`NotRecorded` (the model gets an error);
    with ``gate_unmatched`` it needs a person's approval instead, so a drive without one parks there.
    """
    recorded = _Results(tool, results)

    def answer(**arguments: Any) -> str:
        result = recorded.take(_key(tool, arguments.get("arguments", arguments) if _raw(tool) else arguments))
        if not result.is_error:
            return result.content
        raise _error_of(result.content)

    approval: ApprovalSetting = tool.approval
    if gate_unmatched:
        approval = _gate(tool, recorded)
    base = {item.name: getattr(tool, item.name) for item in dataclasses.fields(Tool)}
    stubbed = Tool(**base)  # a plain tool: an agent tool's calls are answered too, not served by a child run
    return dataclasses.replace(
        stubbed,
        function=answer,
        approval=approval,
        retry=RetryPolicy(classify=_recorded_class),
        timeout=None,
        wants_call_id=False,
        cancel_parameter=None,
        cache_ttl=None,
    )


def _raw(tool: Tool) -> bool:
    return issubclass(tool.input_model, SchemaInput)


def _gate(tool: Tool, recorded: _Results) -> ApprovalSetting:
    def gate(arguments: Any, context: ApprovalContext) -> ApprovalVerdict | bool:
        dumped = arguments.model_dump(mode="json") if isinstance(arguments, pydantic.BaseModel) else arguments
        if recorded.find(canonical_json(dumped)) is None:
            return ApprovalVerdict("require_approval", "the recorded run never made this call: replay does not run it")
        return decide_approval(tool.approval, arguments, context)

    return gate


class _RecordedError(Exception):
    error_class: str = "fatal"


def _error_of(content: str) -> Exception:
    """An exception the engine turns back into ``content`` (a tool's ``Error ...`` text)."""
    raised = _RAISED.fullmatch(content)
    if raised is None:
        return ModelRetry(content.removeprefix("Error: "))
    kind: type[_RecordedError] = type(raised["type"], (_RecordedError,), {"error_class": raised["cls"]})
    return kind(raised["message"])


def _recorded_class(error: BaseException) -> Any:
    return error.error_class if isinstance(error, _RecordedError) else None


class ReplayApprover:
    """Decides each gated call as a person did in the recorded run: by call id, else by tool and input.

    A call nobody decided then stays pending (the replayed run parks, as the recorded one may have).
    """

    def __init__(self, decisions: Sequence[RecordedDecision]) -> None:
        self.decisions = list(decisions)
        self.seen: list[ApprovalRequest] = []
        """Every request shown, in order."""

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """The recorded decision of each request, where there is one."""
        answers: dict[str, Decision] = {}
        for request in requests:
            self.seen.append(request)
            found = self._find(request)
            if found is None:
                continue
            self.decisions.remove(found)
            if found.approved:
                answers[request.call_id] = Approve(
                    found.edited, actor=found.actor, remember_for_run=found.remember_for_run
                )
            else:
                answers[request.call_id] = Deny(found.reason, actor=found.actor)
        return answers

    def _find(self, request: ApprovalRequest) -> RecordedDecision | None:
        by_id = next((d for d in self.decisions if d.call_id == request.call_id and d.tool == request.tool), None)
        if by_id is not None:
            return by_id
        asked = canonical_json(request.input)
        return next((d for d in self.decisions if d.tool == request.tool and canonical_json(d.input) == asked), None)


# The replay ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replayed:
    """A replay's outcome: the new run, its trajectory, and how it differs from the recorded one."""

    recorded_run: str
    result: RunResult
    trajectory: Trajectory
    expected: Trajectory
    differences: list[str]
    """One line per difference; empty when the replay agrees with the recording."""

    @property
    def agrees(self) -> bool:
        """Whether the replay made the same calls and ended the same way."""
        return not self.differences

    def report(self) -> str:
        """Why the replayed run stopped (a :class:`ReplayMismatch`'s diff), then how its trajectory differs."""
        if self.agrees:
            return f"the replay agrees with run {self.recorded_run}"
        lines = [f"the replay differs from run {self.recorded_run}"]
        if self.result.error:
            lines.append(f"the replayed run failed: {self.result.error}")
        lines += ["trajectory (expected as recorded, got in the replay):", *(f"  {line}" for line in self.differences)]
        return "\n".join(lines)


class Replay:
    """What a replay of one recorded run needs: its prompt, a model, tools and an approver answering as recorded."""

    def __init__(self, recording: Recording, *, strict: bool = True) -> None:
        self.recording = recording
        self.prompt = recording.prompt
        """The run's prompt."""
        self.model = ReplayModel(recording, strict=strict)
        self.approver = ReplayApprover(recording.decisions)
        self.expected = recording.trajectory
        """The recorded trajectory."""

    def tools(self, tools: Sequence[Tool], *, gate_unmatched: bool = False) -> list[Tool]:
        """``tools`` answered from the recorded results (see :func:`stub_tool`); handoff tools stay as they are."""
        stubbed: list[Tool] = []
        for tool in tools:
            if isinstance(tool, HandoffTool):
                stubbed.append(tool)
            else:
                results = [r for r in self.recording.results if r.tool == tool.name]
                stubbed.append(stub_tool(tool, results, gate_unmatched=gate_unmatched))
        return stubbed

    def agent(self, agent: Agent, *, stub_tools: bool = True, model: Any = None) -> Agent:
        """``agent`` answered by the recording: its model (or ``model``), and its tools unless ``stub_tools`` is False.

        A toolset's tools are listed (its servers reached) and stubbed like the rest.
        """
        added = {id(tool) for tool in agent.handoff_tools}  # the agent adds them again from its handoffs
        own = [tool for tool in agent.all_tools if id(tool) not in added]
        if agent.output_type is not None:
            own = [tool for tool in own if tool.name != OUTPUT_TOOL]  # the agent adds it again
        tools = self.tools(own) if stub_tools else own
        return dataclasses.replace(agent, model=model or self.model, tools=tools, toolsets=())

    @classmethod
    def load(cls, path: str | Path, *, strict: bool = True) -> Replay:
        """The replay of a recording file (what ``tether export --as-test`` writes)."""
        return cls(Recording.load(path), strict=strict)

    def agent_from_spec(self, given: Mapping[str, Any], *, cwd: str | Path) -> Agent:
        """The agent ``tether run`` made for the run, with ``given`` spec entries instead (tools, system...).

        Its tools modules are imported from ``cwd`` (the directory the run was started in, as a
        test finds it); its model is this replay's.
        """
        spec = {**self.recording.spec, **given, "cwd": str(Path(cwd).resolve())}
        return agent_from_spec(spec, model=self.model)

    def check(self, agent: Agent, *, stub_tools: bool = True) -> Replayed:
        """Replay with ``agent`` (see :meth:`agent`) and fail unless it agrees with the recording.

        Raises:
            AssertionError: the replay differs; its message lists how, with the request's diff.
        """
        __tracebackhide__ = True  # pytest shows the test's line and the message, not this frame
        replayed = self.run(self.agent(agent, stub_tools=stub_tools))
        if not replayed.agrees:
            raise AssertionError(replayed.report())
        return replayed

    def run(self, agent: Agent, *, store: Store | None = None) -> Replayed:
        """Drive a new run of ``agent`` (as :meth:`agent` makes it: pass it made) with the recorded prompt.

        The run is kept in ``store`` (default: in memory); nothing else is touched.
        """
        runner = Runner(agent, store, approver=self.approver)
        result = runner.run(self.prompt)
        trajectory = trajectory_of(runner.store.load_events(result.run_id))
        differences = self.expected.differences(trajectory)
        return Replayed(self.recording.run_id, result, trajectory, self.expected, differences)


def agent_at(reference: str, *, cwd: str | Path) -> Agent:
    """The agent ``MODULE:ATTR`` names: an :class:`~tether.Agent`, or a function of no arguments making one.

    The module is imported as ``tether run`` imports a tools module: from ``cwd`` first, else installed.

    Raises:
        ConfigError: not ``MODULE:ATTR``, the module does not import, or the attribute is no agent.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"agent {reference!r}: expected MODULE:ATTR, e.g. myapp.agents:support")
    try:
        found = getattr(import_tools_module(module_name, Path(cwd).resolve()), attribute)
    except Exception as error:
        raise ConfigError(f"agent {reference!r}: {type(error).__name__}: {error}") from error
    made = found() if callable(found) and not isinstance(found, Agent) else found
    if not isinstance(made, Agent):
        raise ConfigError(f"agent {reference!r} is {made!r}, not a tether Agent (nor a function making one)")
    return made


def replay(store: Store, run_id: str, *, tenant: str | None = None, strict: bool = True) -> Replay:
    """What running ``run_id``'s agent again offline needs, read from ``store`` (see :class:`Replay`).

    Raises:
        RunNotFound: no such run.
        ConfigError: the run cannot be replayed (it continues a conversation or is a fork).
    """
    return Replay(Recording.from_events(run_id, store.load_events(run_id, tenant=tenant)), strict=strict)


__all__ = [
    "Exchange",
    "NotRecorded",
    "RecordedDecision",
    "RecordedResult",
    "Recording",
    "Replay",
    "ReplayApprover",
    "ReplayMismatch",
    "ReplayModel",
    "Replayed",
    "agent_at",
    "replay",
    "request_differences",
    "stub_tool",
]
