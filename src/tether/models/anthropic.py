"""The Claude adapter on the official ``anthropic`` SDK — the only module importing it.

Vendor errors are translated here, once, into :class:`tether.errors.ModelError`. The SDK
does the HTTP retries (429/529/5xx, honouring Retry-After); what reaches tether is the
error that remains after them. A streamed call (:meth:`AnthropicModel.stream`) is retried
the same way until its stream starts; a failure after that (an ``error`` event, a dropped
connection) is not retried by the SDK and reaches tether as the same kind of error.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import anthropic

from tether.errors import ConfigError, ModelError
from tether.facts.history import MAX_CACHE_BREAKPOINTS, with_cache_breakpoints
from tether.models import ModelRequest, ModelResponse, ModelSettings, TextListener
from tether.models.sdk import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_RETRY_WAIT,
    DEFAULT_TIMEOUT,
    CappedRetries,
    RetryWaitListener,
    SdkAdapter,
    transient,
    translating,
)
from tether.redact import scrub

DEFAULT_MODEL = "claude-sonnet-5-5"
"""Used when neither ``--model`` nor ``$TETHER_MODEL`` names one."""


class _Client(CappedRetries, anthropic.Anthropic):
    pass


class _AsyncClient(CappedRetries, anthropic.AsyncAnthropic):
    pass


def default_model_name() -> str:
    """``$TETHER_MODEL``, else :data:`DEFAULT_MODEL`."""
    return os.environ.get("TETHER_MODEL") or DEFAULT_MODEL


class AnthropicModel(SdkAdapter[_Client, _AsyncClient]):
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

    def new_client(self, options: dict[str, Any]) -> _Client:
        """The sync ``anthropic`` client."""
        return _Client(**options)

    def new_async_client(self, options: dict[str, Any]) -> _AsyncClient:
        """The async ``anthropic`` client."""
        return _AsyncClient(**options)

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


@contextmanager
def _translated_errors() -> Iterator[list[float]]:
    """Collect one call's SDK retry waits; turn what the SDK raises into :class:`ModelError`.

    Beyond what :func:`~tether.models.sdk.translating` turns: a streamed tool input the SDK
    could not parse, and its way of saying no credentials were found.
    """
    with translating(anthropic.AnthropicError, translate_error, "the Anthropic API") as waits:
        try:
            yield waits
        except ValueError as error:  # the SDK could not parse a streamed tool input; a new call may do better
            message = f"the response stream could not be read: {error}"
            raise ModelError(message, retryable=True, retry_waits=tuple(waits)) from error
        except TypeError as error:  # the SDK's way of saying no credentials were found
            raise _credentials_error(error) from error


def _credentials_error(error: TypeError) -> ModelError:
    if "authentication" not in str(error).lower() and "api_key" not in str(error).lower():
        raise error
    # retryable: the run is kept resumable, so setting the key and resuming loses none of it
    return ModelError(f"no Anthropic credentials: pass api_key= or set ANTHROPIC_API_KEY ({error})", retryable=True)


def _response(message: Any, waits: list[float]) -> ModelResponse:
    """The SDK's message as tether's response, checked: the SDK builds it from the JSON unvalidated."""
    data = message.model_dump(mode="json", exclude_none=False, warnings=False)
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


STREAM_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
"""The HTTP status each error ``type`` has outside a stream (an ``error`` event comes after a 200)."""


def translate_error(error: anthropic.AnthropicError, waits: list[float] | None = None) -> ModelError:
    """Turn an SDK error into a :class:`ModelError` that says what happened (and how long it waited)."""
    retry_waits = tuple(waits or ())
    if isinstance(error, anthropic.APIStatusError) and error.status_code < 300:
        return _stream_error(error, retry_waits)
    if isinstance(error, anthropic.APIStatusError):
        message = _api_message(error)
        status = error.status_code
        if status == 400 and "prompt is too long" in message.lower():
            return ModelError(
                f"context window exceeded: {message}", status=status, retry_waits=retry_waits, context_exceeded=True
            )
        return ModelError(
            f"Anthropic API error {status}: {message}",
            status=status,
            retryable=transient(status),
            retry_waits=retry_waits,
        )
    if isinstance(error, anthropic.APIConnectionError):
        return ModelError(f"cannot reach the Anthropic API: {error}", retryable=True, retry_waits=retry_waits)
    return ModelError(f"Anthropic client error: {error}", retry_waits=retry_waits)


def _api_message(error: anthropic.APIStatusError) -> str:
    """The API's error message, without the credentials it may echo (it is stored and shown)."""
    body = error.body
    message = str(error.message)
    if isinstance(body, dict):
        detail = body.get("error")
        if isinstance(detail, dict) and isinstance(detail.get("message"), str):
            message = str(detail["message"])
    return scrub(message, _sent_credentials(error))


def _sent_credentials(error: anthropic.APIStatusError) -> list[str]:
    """The key or token the failed request carried (from ``api_key=`` or the environment)."""
    headers = error.request.headers
    sent = [headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")]
    configured = [os.environ.get("ANTHROPIC_API_KEY"), os.environ.get("ANTHROPIC_AUTH_TOKEN")]
    return [secret.strip() for secret in [*sent, *configured] if secret]


def _stream_error(error: anthropic.APIStatusError, retry_waits: tuple[float, ...]) -> ModelError:
    """An ``error`` event in a stream that had started (HTTP 200): judged as its HTTP twin."""
    kind = error.type or "unknown error"
    status = STREAM_ERROR_STATUS.get(kind)
    retryable = status is not None and transient(status)
    message = f"Anthropic API error mid-stream ({kind}): {_api_message(error)}"
    return ModelError(message, status=status, retryable=retryable, retry_waits=retry_waits)
