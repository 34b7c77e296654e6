"""The ``openai`` SDK's side of the OpenAI-compatible adapter: its clients and errors — the only module importing it.

:class:`~tether.models.openai.OpenAIModel` imports this module when its first call is made.
Vendor errors are translated here, once, into :class:`tether.errors.ModelError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager

import openai

from tether import heap
from tether.errors import ModelError
from tether.models.chat_format import SOURCE
from tether.models.sdk import CappedRetries, transient, translating, unreached
from tether.redact import scrub

CONTEXT_ERROR_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
"""Error codes saying the conversation no longer fits the model's context."""


class Client(CappedRetries, openai.OpenAI):
    """The sync client, its retry waits capped and reported."""


class AsyncClient(CappedRetries, openai.AsyncOpenAI):
    """The async client, its retry waits capped and reported."""


def translated_errors() -> AbstractContextManager[list[float]]:
    """Collect one call's SDK retry waits; turn what the SDK raises into :class:`~tether.errors.ModelError`."""
    return translating(openai.OpenAIError, translate_error, SOURCE)


def translate_error(error: openai.OpenAIError, waits: list[float] | None = None) -> ModelError:
    """Turn an SDK error into a :class:`ModelError` that says what happened (and how long it waited)."""
    retry_waits = tuple(waits or ())
    if isinstance(error, openai.APIStatusError):
        message = _api_message(error)
        status = error.status_code
        if error.code in CONTEXT_ERROR_CODES:
            return ModelError(
                f"context window exceeded: {message}", status=status, retry_waits=retry_waits, context_exceeded=True
            )
        return ModelError(
            f"OpenAI API error {status}: {message}", status=status, retryable=transient(status), retry_waits=retry_waits
        )
    if isinstance(error, openai.APIConnectionError):
        return ModelError(f"cannot reach {SOURCE}{unreached(error)}: {error}", retryable=True, retry_waits=retry_waits)
    if isinstance(error, openai.APIError):  # an error chunk mid-stream (after an HTTP 200)
        kind = error.type or error.code or "error"
        retryable = kind in ("server_error", "rate_limit_exceeded", "timeout")
        message = f"OpenAI API error mid-stream ({kind}): {_api_message(error)}"
        return ModelError(message, retryable=retryable, retry_waits=retry_waits)
    if "credentials" in str(error).lower() or "api_key" in str(error).lower():
        return ModelError(  # retryable: the run is kept resumable, so setting the key and resuming loses none of it
            "no OpenAI credentials: pass api_key= or set OPENAI_API_KEY (a local server that checks "
            f"none takes any value) ({error})",
            retryable=True,
        )
    return ModelError(f"OpenAI client error: {error}", retry_waits=retry_waits)


def _api_message(error: openai.APIError) -> str:
    """The API's error message, without the credentials it may echo (it is stored and shown)."""
    body = error.body
    message = str(error.message)
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        message = str(body["message"])
    return scrub(message, _sent_credentials(error))


def _sent_credentials(error: openai.APIError) -> list[str]:
    """The key the failed request carried (from ``api_key=`` or the environment)."""
    sent = error.request.headers.get("authorization", "").removeprefix("Bearer ")
    return [secret.strip() for secret in (sent, os.environ.get("OPENAI_API_KEY")) if secret]


heap.freeze_late_import()  # imported at a model's first call: the SDK joins a frozen heap (tether.heap)
