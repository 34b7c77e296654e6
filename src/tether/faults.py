"""What kind of failure a tool error is, so the right thing happens next.

Five classes drive the default retry decision and appear in the event log and in the
``is_error`` text the model reads:

- ``retryable``: transient (timeouts, connection errors, HTTP 408/429/5xx) — retry it;
- ``user_fixable``: the request was wrong (HTTP 400/422, invalid input) — tell the model;
- ``permission``: not allowed (HTTP 401/403, PermissionError) — tell the model, don't retry;
- ``conflict``: the world changed under the call (HTTP 409, FileExistsError);
- ``fatal``: a bug in the tool (TypeError, AttributeError, ...) — retrying cannot help.

Errors without a strong signal count as ``retryable``: a tool's own exception is usually
transient, and a RetryPolicy bounds the attempts anyway. Override per tool with
``RetryPolicy(classify=...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

ErrorClass = Literal["retryable", "user_fixable", "permission", "conflict", "fatal"]
Classifier = Callable[[BaseException], "ErrorClass | None"]

_FATAL = (TypeError, AttributeError, NameError, NotImplementedError, ImportError, AssertionError, RecursionError)


def http_status(error: BaseException) -> int | None:
    """The HTTP status an httpx/requests-style error carries, if any (duck-typed)."""
    response = getattr(error, "response", None)
    for holder in (response, error):
        status = getattr(holder, "status_code", None) or getattr(holder, "status", None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
    return None


def classify_status(status: int) -> ErrorClass:
    """The class of an HTTP status code."""
    if status in (408, 429) or status >= 500:
        return "retryable"
    if status in (401, 403):
        return "permission"
    if status == 409:
        return "conflict"
    return "user_fixable"


def classify(error: BaseException, override: Classifier | None = None) -> ErrorClass:
    """Classify ``error``; ``override`` (a tool's hook) wins when it returns a class."""
    if override is not None:
        chosen = override(error)
        if chosen is not None:
            return chosen
    status = http_status(error)
    if status is not None and status >= 400:
        return classify_status(status)
    if isinstance(error, PermissionError):
        return "permission"
    if isinstance(error, FileExistsError):
        return "conflict"
    if isinstance(error, TimeoutError | ConnectionError):
        return "retryable"
    if isinstance(error, _FATAL):
        return "fatal"
    return "retryable"
