"""The ``anthropic`` SDK's side of the Claude adapter: its clients and its errors — the only module importing it.

:class:`~tether.models.anthropic.AnthropicModel` imports this module when its first call is
made, so a program that only reads runs, queues them or calls another provider never pays for
importing the SDK. Vendor errors are translated here, once, into :class:`tether.errors.ModelError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import anthropic

from tether import heap
from tether.errors import ModelError
from tether.models.sdk import CappedRetries, transient, translating, unreached
from tether.redact import scrub

MAX_QUOTED = 500
"""Characters of an unreadable stream's error kept in the run's error (the SDK's quotes the whole tool input)."""


class Client(CappedRetries, anthropic.Anthropic):
    """The sync client, its retry waits capped and reported."""


class AsyncClient(CappedRetries, anthropic.AsyncAnthropic):
    """The async client, its retry waits capped and reported."""


@contextmanager
def translated_errors() -> Iterator[list[float]]:
    """Collect one call's SDK retry waits; turn what the SDK raises into :class:`~tether.errors.ModelError`.

    Beyond what :func:`~tether.models.sdk.translating` turns: a streamed tool input the SDK
    could not parse, and its way of saying no credentials were found.
    """
    with translating(anthropic.AnthropicError, translate_error, "the Anthropic API") as waits:
        try:
            yield waits
        except ValueError as error:  # the SDK could not parse a streamed tool input; a new call may do better
            said = str(error)  # it quotes the whole input: the head says enough
            if len(said) > MAX_QUOTED:
                said = f"{said[:MAX_QUOTED]}... ({len(said)} characters)"
            message = f"the response stream could not be read: {said}"
            raise ModelError(message, retryable=True, retry_waits=tuple(waits)) from error
        except TypeError as error:  # the SDK's way of saying no credentials were found
            raise _credentials_error(error) from error


def _credentials_error(error: TypeError) -> ModelError:
    if "authentication" not in str(error).lower() and "api_key" not in str(error).lower():
        raise error
    # retryable: the run is kept resumable, so setting the key and resuming loses none of it
    return ModelError(f"no Anthropic credentials: pass api_key= or set ANTHROPIC_API_KEY ({error})", retryable=True)


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
        message = f"cannot reach the Anthropic API{unreached(error)}: {error}"
        return ModelError(message, retryable=True, retry_waits=retry_waits)
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


heap.freeze_late_import()  # imported at a model's first call: the SDK joins a frozen heap (tether.heap)
