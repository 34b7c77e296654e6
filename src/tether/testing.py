"""Test doubles users can import: the offline model and a recording approver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tether.approvals import ApprovalRequest, Approver, Decision
from tether.models.scripted import ScriptedModel


class RecordingApprover:
    """Answers from a fixed mapping (call id or tool name → decision) and records what it saw."""

    def __init__(self, decisions: Mapping[str, Decision]) -> None:
        self.decisions = dict(decisions)
        self.seen: list[list[ApprovalRequest]] = []
        """Each batch of requests shown, in order."""

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """Look each call up by id, then by tool name; unknown calls stay pending."""
        self.seen.append(list(requests))
        answers: dict[str, Decision] = {}
        for request in requests:
            answer = self.decisions.get(request.call_id) or self.decisions.get(request.tool)
            if answer is not None:
                answers[request.call_id] = answer
        return answers


_: type[Approver] = RecordingApprover

__all__ = ["RecordingApprover", "ScriptedModel"]
