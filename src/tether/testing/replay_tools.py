"""Tools and people as recorded: stubbed tools answering with a run's results, an approver deciding as people did.

A stubbed tool keeps its name, description, schema and policies; nothing runs. Calls are matched
to recorded results by tool and input (validated, so defaults count alike). A recorded error is
raised again so that the engine writes the same text (a call that took several attempts is
answered at once, with its last error).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pydantic

from tether.canonical import canonical_json
from tether.core.approvals import ApprovalRequest, Approve, Decision, Deny
from tether.policy.policies import ApprovalContext, ApprovalSetting, ApprovalVerdict, RetryPolicy, decide_approval
from tether.testing.recording import RecordedDecision, RecordedResult
from tether.tools import ModelRetry, SchemaInput, Tool

Unmatched = Literal["ask", "deny"]
"""What becomes of a call no recorded result answers: a person is asked, or it is refused."""
UNMATCHED: tuple[Unmatched, ...] = ("ask", "deny")
NOT_REPLAYED = "the recorded run never made this call, and a replay runs no tool"
_RAISED = re.compile(r"Error \((?P<cls>\w+)\): tool '[^']*' raised (?P<type>\w+): (?P<message>.*)", re.DOTALL)


class NotRecorded(LookupError):
    """A stubbed tool was called with an input no recorded result answers."""


class _Results:
    """The recorded results of one tool, each answering one call, matched by input (in recorded order)."""

    def __init__(self, tool: Tool, results: Sequence[RecordedResult]) -> None:
        self.tool = tool
        self.left = [(_key(tool, result.input), result) for result in results]
        self.lock = threading.Lock()
        """Concurrent calls of one turn take their results from threads of their own."""

    def find(self, key: str) -> RecordedResult | None:
        with self.lock:
            return next((result for known, result in self.left if known == key), None)

    def take(self, key: str) -> RecordedResult:
        with self.lock:
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


def stub_tool(tool: Tool, results: Sequence[RecordedResult], *, unmatched: Unmatched | None = None) -> Tool:
    """``tool`` answered from ``results`` (its name, description, schema and policies kept; nothing runs).

    A call with an input no result holds raises :class:`NotRecorded` (the model gets an error), or
    is gated by ``unmatched``: ``"ask"``, it needs a person's approval (a drive without one parks
    there); ``"deny"``, it is refused (the model is told the recorded run never made it).
    """
    recorded = _Results(tool, results)

    def answer(**arguments: Any) -> str:
        result = recorded.take(_key(tool, arguments.get("arguments", arguments) if _raw(tool) else arguments))
        if not result.is_error:
            return result.content
        raise _error_of(result.content)

    approval: ApprovalSetting = tool.approval
    if unmatched is not None:
        approval = _gate(tool, recorded, unmatched)
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


def _gate(tool: Tool, recorded: _Results, unmatched: Unmatched) -> ApprovalSetting:
    refusal = ApprovalVerdict("require_approval" if unmatched == "ask" else "deny", NOT_REPLAYED)

    def gate(arguments: Any, context: ApprovalContext) -> ApprovalVerdict | bool:
        dumped = arguments.model_dump(mode="json") if isinstance(arguments, pydantic.BaseModel) else arguments
        if recorded.find(canonical_json(dumped)) is None:
            return refusal
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
    """Decides each gated call as a person did in the recorded run: the same tool with the same input.

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
        """The decision on this very call (same tool and input), the one with its call id first."""
        asked = canonical_json(request.input)
        alike = [d for d in self.decisions if d.tool == request.tool and canonical_json(d.input) == asked]
        return next((d for d in alike if d.call_id == request.call_id), alike[0] if alike else None)


__all__ = ["NOT_REPLAYED", "UNMATCHED", "NotRecorded", "ReplayApprover", "Unmatched", "stub_tool"]
