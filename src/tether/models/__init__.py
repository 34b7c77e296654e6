"""Model adapters: one request in, one assistant turn out — never a tool executed.

A :class:`ModelAdapter` needs ONE method, :meth:`~ModelAdapter.complete`. Adapters that can
await natively also offer ``acomplete``; the async driver otherwise runs ``complete`` in a
thread. Adapters that can show the answer while it is written also offer ``stream`` (and
``astream``): the same one call, returning the same response, telling a
:data:`TextListener` each piece of text as it arrives. Drivers use them only when someone
listens. Requests and responses are tether's own types, never SDK objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tether.facts.history import Block, Message
from tether.facts.usage import Usage as Usage
from tether.models.settings import ModelSettings
from tether.models.shape import check_response


@dataclass(frozen=True)
class ModelRequest:
    """Everything one Messages API call needs."""

    model: str
    """Model name the run was started with (adapters may ignore it)."""
    messages: list[Message]
    """The full history, exactly as sent."""
    max_tokens: int
    system: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Messages API tool definitions."""
    invocation: int = 0
    """How many model calls the run made before this one (replays use it as an index)."""
    tool_choice: dict[str, Any] | None = None
    """The Messages API's ``tool_choice``; ``{"type": "none"}`` asks for an answer without tools.
    The engine sets it from :attr:`ModelSettings.tool_choice` unless it must say otherwise."""
    settings: ModelSettings = field(default_factory=ModelSettings)
    """The agent's model settings; each adapter sends those its API has (``tool_choice`` is above)."""


@dataclass(frozen=True)
class ModelResponse:
    """What the model said: one assistant turn."""

    content: list[Block]
    stop_reason: str | None
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    id: str | None = None
    stop_details: dict[str, Any] | None = None
    """Extra detail the API gives with some stop reasons (e.g. a refusal's category)."""
    retry_waits: tuple[float, ...] = ()
    """Seconds the adapter waited before each retry it made to get this answer (rate limits,
    overload); recorded on the ``model_responded`` event."""

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "the model") -> ModelResponse:
        """Read a Messages API response object (as JSON), checked first.

        Raises:
            ModelError: the response is malformed (transient; the message names each problem
                and ``source``, who sent it).
        """
        check_response(data, source=source)
        details = data.get("stop_details")
        return cls(
            content=[dict(block) for block in data["content"]],
            stop_reason=data.get("stop_reason"),
            usage=Usage.from_dict(data.get("usage")),
            model=data.get("model"),
            id=data.get("id"),
            stop_details=details if isinstance(details, dict) else None,
        )


@runtime_checkable
class ModelAdapter(Protocol):
    """Makes exactly one model call per :meth:`complete`."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request; raise :class:`tether.errors.ModelError` on failure."""
        ...


@runtime_checkable
class AsyncModelAdapter(Protocol):
    """An adapter that can also await the call natively."""

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Async twin of :meth:`ModelAdapter.complete`."""
        ...


TextListener = Callable[[str], None]
"""Told each piece of the answer's text while the call is under way, in order.

For live displays only: the pieces of all text blocks, joined, are the response's text;
nothing is persisted until the whole response is, as one step.
"""


@runtime_checkable
class StreamingModelAdapter(Protocol):
    """An adapter that can report the answer's text while its one call is under way."""

    def stream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Same call and same response as :meth:`ModelAdapter.complete`, telling ``on_text`` the text as it comes."""
        ...


@runtime_checkable
class AsyncStreamingModelAdapter(Protocol):
    """An adapter that can also await a streamed call natively."""

    async def astream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Async twin of :meth:`StreamingModelAdapter.stream`."""
        ...


__all__ = [
    "AsyncModelAdapter",
    "AsyncStreamingModelAdapter",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "StreamingModelAdapter",
    "TextListener",
    "Usage",
]
