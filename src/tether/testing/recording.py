"""A stored run's recording: what a replay needs, read from the run's log, as plain JSON-able data.

A run's log already holds it all: the opening prompt, each model answer (and, folded from the
events before it, the request it answered: the history, system prompt, tools offered and
settings), each tool result and each person's decision. :meth:`Recording.from_events` reads them;
:meth:`Recording.to_json` is what ``tether export --as-test`` writes beside a test. The replay
itself is :mod:`tether.testing.replaying`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.core.state import RunState
from tether.errors import ConfigError
from tether.facts.events import ApprovalDecided, Event, HistoryCompacted, ModelResponded, RunStarted, ToolFinished
from tether.facts.history import Message
from tether.models import ModelSettings
from tether.tools.output import OUTPUT_TOOL
from tether.views.trajectory import Trajectory, trajectory_of

RECORDING_VERSION = 1
"""The format of :meth:`Recording.to_json`; a file of another is refused."""


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
                f"run {run_id} opens with {len(opening)} messages: it continues a conversation or is a fork, "
                "and only a run started from one prompt can be replayed"
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

    @property
    def handed_off(self) -> bool:
        """Whether another agent answered some model call (a handoff): its prompt and tools are not recorded."""
        return any(exchange.messages is not None and exchange.tools is None for exchange in self.exchanges)

    def to_json(self) -> dict[str, Any]:
        """The recording as one JSON object (what ``tether export --as-test`` writes beside the test)."""
        return {
            "version": RECORDING_VERSION,
            "run_id": self.run_id,
            "prompt": self.prompt,
            "spec": self.spec,
            "exchanges": _packed(self.exchanges),
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
                _unpacked(data["exchanges"]),
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


def _packed(exchanges: Sequence[Exchange]) -> list[dict[str, Any]]:
    """The exchanges' JSON, each history written as what it adds to the one before (when it extends it).

    Each request holds the whole history so far: written whole, a long run's recording would grow
    with the square of its length.
    """
    packed: list[dict[str, Any]] = []
    before: list[Message] | None = None
    for exchange in exchanges:
        data = exchange.to_json()
        messages = exchange.messages
        if messages is not None and before is not None and messages[: len(before)] == before:
            data["messages"] = {"after_previous": messages[len(before) :]}
        packed.append(data)
        before = messages if messages is not None else before
    return packed


def _unpacked(packed: Sequence[Mapping[str, Any]]) -> list[Exchange]:
    """The inverse of :func:`_packed`."""
    exchanges: list[Exchange] = []
    before: list[Message] = []
    for data in packed:
        messages = data.get("messages")
        if isinstance(messages, Mapping):
            messages = [*before, *messages["after_previous"]]
        exchanges.append(Exchange(**{**data, "messages": messages}))
        before = messages if messages is not None else before
    return exchanges


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


__all__ = ["RECORDING_VERSION", "Exchange", "RecordedDecision", "RecordedResult", "Recording"]
