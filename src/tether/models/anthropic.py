"""The Claude adapter on the official ``anthropic`` SDK, imported when the first call is made.

The SDK's clients and its errors, translated once into :class:`tether.errors.ModelError`, are in
:mod:`tether.models.anthropic_client`, the only module importing ``anthropic``. The SDK
does the HTTP retries (429/529/5xx, honouring Retry-After); what reaches tether is the
error that remains after them. A streamed call (:meth:`AnthropicModel.stream`) is retried
the same way until its stream starts; a failure after that (an ``error`` event, a dropped
connection) is not retried by the SDK and reaches tether as the same kind of error.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from tether.errors import ConfigError, ModelError
from tether.facts.history import MAX_CACHE_BREAKPOINTS, with_cache_breakpoints
from tether.models import ModelRequest, ModelResponse, ModelSettings, TextListener
from tether.models.sdk import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_RETRY_WAIT,
    DEFAULT_TIMEOUT,
    RetryWaitListener,
    SdkAdapter,
    too_deep,
)

if TYPE_CHECKING:
    from tether.models.anthropic_client import AsyncClient, Client

DEFAULT_MODEL = "claude-sonnet-5-5"
"""Used when neither ``--model`` nor ``$TETHER_MODEL`` names one."""


def default_model_name() -> str:
    """``$TETHER_MODEL``, else :data:`DEFAULT_MODEL`."""
    return os.environ.get("TETHER_MODEL") or DEFAULT_MODEL


class AnthropicModel(SdkAdapter["Client", "AsyncClient"]):
    """One Messages API call per :meth:`complete`, with prompt caching on by default.

    Credentials and endpoint come from ``ANTHROPIC_API_KEY`` / ``ANTHROPIC_BASE_URL``
    unless given. Retries are explicit: ``max_retries`` SDK retries with its backoff.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: float = DEFAULT_TIMEOUT,
        prompt_caching: bool = True,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
        on_retry_wait: RetryWaitListener | None = None,
        stream_fallback: bool = True,
    ) -> None:
        super().__init__(
            api_key=api_key,
            base_url=base_url,
            max_retries=max_retries,
            timeout=timeout,
            max_retry_wait=max_retry_wait,
            on_retry_wait=on_retry_wait,
            stream_fallback=stream_fallback,
        )
        self.name = model or default_model_name()
        self.prompt_caching = prompt_caching

    def check_settings(self, settings: ModelSettings) -> None:
        """Refuse settings the Messages API has no place for (an :class:`~tether.agent.Agent` calls this when made).

        Raises:
            ConfigError: temperature or top_p: anthropic-version 2026-10-21, the one the SDK
                sends, refuses sampling parameters.
        """
        given = [name for name in ("temperature", "top_p") if getattr(settings, name) is not None]
        if given:
            raise ConfigError(
                f"{' and '.join(given)}: Claude's Messages API (anthropic-version 2026-10-21) takes no sampling "
                "parameters; leave them unset for Claude models"
            )

    def new_client(self, options: dict[str, Any]) -> Client:
        """The sync ``anthropic`` client."""
        from tether.models.anthropic_client import Client

        return Client(**options)

    def new_async_client(self, options: dict[str, Any]) -> AsyncClient:
        """The async ``anthropic`` client."""
        from tether.models.anthropic_client import AsyncClient

        return AsyncClient(**options)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        self.check_settings(request.settings)  # an agent checked them; a hand-made request may not have been
        messages = request.messages
        if self.prompt_caching:
            budget = MAX_CACHE_BREAKPOINTS - sum("cache_control" in tool for tool in request.tools)
            messages = with_cache_breakpoints(messages, budget=budget)
        params: dict[str, Any] = {
            "model": self.name,
            "max_tokens": request.max_tokens,
            "messages": messages,
        }
        if request.system:
            params["system"] = request.system
        if request.tools:
            params["tools"] = request.tools
            if request.tool_choice is not None:
                params["tool_choice"] = request.tool_choice
        return {**params, **_settings_params(request.settings)}

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Make the call with the sync client."""
        params = self._params(request)
        with _translated_errors() as waits:
            message = self._sync_client().messages.create(**params)
        return _response(message, waits)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Make the call with the async client (one per event loop: connections belong to a loop)."""
        params = self._params(request)
        with _translated_errors() as waits:
            message = await self._loop_client().messages.create(**params)
        return _response(message, waits)

    def stream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Make the same call streamed, telling ``on_text`` each text delta; returns what :meth:`complete` would.

        The SDK retries a stream only until it starts. One that breaks after that on a
        transient error (``overloaded_error`` mid-stream, a dropped connection) is made again
        once without streaming, which the SDK retries with its backoff, unless
        ``stream_fallback=False``: still one model invocation, since the broken one answered nothing.
        """
        relay, params = _TextRelay(on_text), self._params(request)
        try:
            with _translated_errors() as waits, self._sync_client().messages.stream(**params) as events:
                for event in _folded(events):
                    relay.see(event)
                message = relay.finished(events.get_final_message())
        except ModelError as error:
            if not self._falls_back_from(relay, error):
                raise
            return self.complete(request)
        return _response(message, waits)

    async def astream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Async twin of :meth:`stream`."""
        relay, params = _TextRelay(on_text), self._params(request)
        try:
            with _translated_errors() as waits:
                async with self._loop_client().messages.stream(**params) as events:
                    async for event in _afolded(events):
                        relay.see(event)
                    message = relay.finished(await events.get_final_message())
        except ModelError as error:
            if not self._falls_back_from(relay, error):
                raise
            return await self.acomplete(request)
        return _response(message, waits)

    def _falls_back_from(self, relay: _TextRelay, error: ModelError) -> bool:
        """A broken stream is asked again unstreamed; a malformed one is not (it answered, badly)."""
        return self._falls_back(relay.started, error) and not isinstance(error, _MalformedStream)


def _settings_params(settings: ModelSettings) -> dict[str, Any]:
    """The Messages API fields the settings set (tool_choice and max_tokens are the request's)."""
    params: dict[str, Any] = {}
    if settings.stop_sequences:
        params["stop_sequences"] = list(settings.stop_sequences)
    if settings.thinking_budget is not None:
        params["thinking"] = {"type": "enabled", "budget_tokens": settings.thinking_budget}
    return params


class _MalformedStream(ModelError):
    """The SDK could not fold the stream's events into a message: the API sent malformed ones."""

    def __init__(self, error: Exception) -> None:
        message = f"the Anthropic API sent a malformed response stream (unreadable: {type(error).__name__}: {error})"
        super().__init__(message, retryable=True)


_FOLDING_ERRORS = (AttributeError, KeyError, TypeError)
"""What the SDK raises when an event does not have the shape it expects (it does not validate them)."""


def _folded(events: Iterable[Any]) -> Iterator[Any]:
    """The SDK's stream events; what it raises folding a malformed one into the message: :class:`_MalformedStream`."""
    iterator = iter(events)
    while True:
        try:
            event = next(iterator)
        except StopIteration:
            return
        except _FOLDING_ERRORS as error:
            raise _MalformedStream(error) from error
        yield event


async def _afolded(events: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """Async twin of :func:`_folded`."""
    iterator = aiter(events)
    while True:
        try:
            event = await anext(iterator)
        except StopAsyncIteration:
            return
        except _FOLDING_ERRORS as error:
            raise _MalformedStream(error) from error
        yield event


class _TextRelay:
    """Passes a stream's text deltas on, and notices a stream that ended before ``message_stop``."""

    def __init__(self, on_text: TextListener) -> None:
        self.on_text = on_text
        self.started = False
        """``message_start`` arrived: the SDK's own retries are behind us."""
        self.stopped = False

    def see(self, event: Any) -> None:
        if event.type == "message_start":
            self.started = True
        elif event.type == "text":  # the SDK's event for a text_delta
            self.on_text(event.text)
        elif event.type == "message_stop":
            self.stopped = True

    def finished(self, message: Any) -> Any:
        if not self.stopped:  # the SDK returns whatever arrived: never take half a message for a whole one
            raise ModelError("the response stream ended before the message was complete", retryable=True)
        return message


def _translated_errors() -> AbstractContextManager[list[float]]:
    """Collect one call's SDK retry waits; turn what the SDK raises into :class:`ModelError` (imports the SDK)."""
    from tether.models.anthropic_client import translated_errors

    return translated_errors()


def _response(message: Any, waits: list[float]) -> ModelResponse:
    """The SDK's message as tether's response, checked: the SDK builds it from the JSON unvalidated."""
    try:
        data = message.model_dump(mode="json", exclude_none=False, warnings=False)
    except (ValueError, RecursionError) as error:  # pydantic serialises ~250 levels deep at most
        raise too_deep("the Anthropic API", getattr(message, "id", None), error, waits) from error
    content = data.get("content")
    if isinstance(content, list):
        # Drop null top-level block fields the SDK fills in (e.g. "caller": null): sent back in the
        # history they are invalid params. Nulls inside a tool's input are kept as the model wrote them.
        data["content"] = [_without_nulls(block) if isinstance(block, dict) else block for block in content]
    try:
        response = ModelResponse.from_dict(data, source="the Anthropic API")
    except ModelError as error:  # malformed: the waits before it were still spent on this call
        error.retry_waits = tuple(waits)
        raise
    return dataclasses.replace(response, retry_waits=tuple(waits))


def _without_nulls(block: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in block.items() if value is not None}
