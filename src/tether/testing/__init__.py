"""Test doubles users can import: the offline model, a recording approver, a fake Messages API.

- :class:`ScriptedModel` answers from a list of Messages API responses, with no network: the
  fastest way to test an agent's tools, policies and approvals.
- :class:`FakeMessagesAPI` is a local HTTP server speaking the Messages API, for testing the
  real Claude adapter end to end: point ``AnthropicModel(base_url=api.url)`` at it, script its
  replies, and every request is validated the way the real API validates it (a broken
  ``tool_use``/``tool_result`` pairing, a fifth cache breakpoint... get the API's HTTP 400).
  :func:`validate_messages_request` is that check alone. See
  :mod:`tether.testing.fake_messages_api` for streaming and error scripting.
- :class:`FakeChatCompletionsAPI` does the same for an OpenAI-compatible Chat Completions API,
  for the OpenAI adapter (``OpenAIModel(base_url=api.url)``); it refuses a conversation whose
  ``tool_calls`` are not answered in order by ``tool`` messages, as a strict server does.
  :func:`validate_chat_request` is that check alone.
- :class:`RecordingApprover` answers gated calls from a mapping and records what it was shown.
- :func:`replay` turns a stored run into a test: a model answering as the run's model did (and
  refusing, with a diff, a request that differs), tools answering with the recorded results, and
  the recorded trajectory to compare a new run with. See :mod:`tether.testing.replaying`.

Nothing here needs a test framework.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tether.core.approvals import ApprovalRequest, Approver, Decision
from tether.models.scripted import ScriptedModel
from tether.testing.fake_chat_completions import FakeChatCompletionsAPI, validate_chat_request
from tether.testing.fake_messages_api import FakeMessagesAPI, validate_messages_request
from tether.testing.recording import Recording
from tether.testing.replay_model import ReplayMismatch
from tether.testing.replaying import Replay, replay


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

__all__ = [
    "FakeChatCompletionsAPI",
    "FakeMessagesAPI",
    "Recording",
    "RecordingApprover",
    "Replay",
    "ReplayMismatch",
    "ScriptedModel",
    "replay",
    "validate_chat_request",
    "validate_messages_request",
]
