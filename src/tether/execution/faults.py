"""What kind of failure a tool error is, so the right thing happens next.

Five classes drive the default retry decision and appear in the event log and in the
``is_error`` text the model reads:

- ``retryable``: transient — timeouts, connection and network errors (builtin, httpx,
  requests), HTTP 408/429/5xx: retry it;
- ``user_fixable``: the request was wrong — HTTP 400/422 and other 4xx, a missing file, an
  invalid URL: tell the model;
- ``permission``: not allowed — HTTP 401/403, ``PermissionError``: tell the model, don't retry;
- ``conflict``: the world changed under the call — HTTP 409, ``FileExistsError``;
- ``fatal``: a programming error (``TypeError``, ``AttributeError``, ``NameError``,
  ``ImportError``, ``AssertionError``, ``NotImplementedError``...): retrying the same code with
  the same input cannot help.

Anything else (``RuntimeError``, ``ValueError``, a tool's own exception class) is assumed
``retryable``, as retry libraries do: a tool given ``RetryPolicy(max_attempts=3)`` is retried
unless its error says it cannot pass. Only ``retryable`` errors are retried by default; narrow it
with ``RetryPolicy(retry_on=...)`` or override the class with ``RetryPolicy(classify=...)``, and
raise :class:`tether.tools.ModelRetry` to tell the model what to change instead.

HTTP libraries are recognised without importing them: an error's HTTP status is read from
``.response.status_code`` (httpx, requests), and library exceptions that do not derive from
the builtin ``TimeoutError``/``ConnectionError`` are matched by module and class name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from tether.execution.attempts import ToolExit

ErrorClass = Literal["retryable", "user_fixable", "permission", "conflict", "fatal"]
Classifier = Callable[[BaseException], "ErrorClass | None"]

_HTTPX_CLASSES: dict[str, ErrorClass] = {
    "TimeoutException": "retryable",
    "NetworkError": "retryable",
    "RemoteProtocolError": "retryable",
    "ProxyError": "retryable",
    "InvalidURL": "user_fixable",
    "UnsupportedProtocol": "user_fixable",
    "TooManyRedirects": "user_fixable",
    "LocalProtocolError": "fatal",
}
"""httpx's exceptions derive from Exception only; these are the branches that say something."""

_LIBRARY_CLASSES: dict[tuple[str, str], ErrorClass] = {
    # httpx, and httpx2 (the fork the anthropic SDK is built on)
    **{(package, name): kind for package in ("httpx", "httpx2") for name, kind in _HTTPX_CLASSES.items()},
    # requests: every error derives from OSError (IOError), so the builtin rules would call any
    # of them transient; its ConnectionError and Timeout are not their builtin namesakes.
    ("requests", "Timeout"): "retryable",
    ("requests", "ConnectionError"): "retryable",
    ("requests", "ChunkedEncodingError"): "retryable",
    ("requests", "ContentDecodingError"): "retryable",
    ("requests", "TooManyRedirects"): "user_fixable",
    ("requests", "InvalidURL"): "user_fixable",
    ("requests", "MissingSchema"): "user_fixable",
    ("requests", "InvalidSchema"): "user_fixable",
    ("requests", "InvalidHeader"): "user_fixable",
    ("requests", "URLRequired"): "user_fixable",
    ("requests", "RequestException"): "fatal",  # the rest (an unexpected body, a status-less HTTPError)
    # the anthropic SDK, for tools that call Claude themselves (statuses are read first)
    ("anthropic", "APIConnectionError"): "retryable",
}
"""Exceptions of HTTP libraries, by top-level package and class name (the first match in
the exception's MRO wins, so the most specific class decides)."""

_BUILTIN_CLASSES: tuple[tuple[type[BaseException], ErrorClass], ...] = (
    (PermissionError, "permission"),
    (FileExistsError, "conflict"),
    (FileNotFoundError, "user_fixable"),
    (NotADirectoryError, "user_fixable"),
    (IsADirectoryError, "user_fixable"),
    (TimeoutError, "retryable"),
    (ConnectionError, "retryable"),
    (OSError, "retryable"),  # other I/O failures (DNS, unreachable network, EAGAIN) are environmental
    (TypeError, "fatal"),
    (AttributeError, "fatal"),
    (NameError, "fatal"),
    (ImportError, "fatal"),
    (AssertionError, "fatal"),
    (NotImplementedError, "fatal"),
    (SyntaxError, "fatal"),
    (RecursionError, "fatal"),
    (ToolExit, "fatal"),  # sys.exit(), argparse on a bad flag...: the same call would exit again
)
"""Builtin exceptions, most specific first; anything else is ``retryable``."""


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


def _library_class(error: BaseException) -> ErrorClass | None:
    for cls in type(error).__mro__:
        found = _LIBRARY_CLASSES.get((cls.__module__.partition(".")[0], cls.__name__))
        if found is not None:
            return found
    return None


def classify(error: BaseException, override: Classifier | None = None) -> ErrorClass:
    """Classify ``error``; ``override`` (a tool's hook) wins when it returns a class."""
    if override is not None:
        chosen = override(error)
        if chosen is not None:
            return chosen
    status = http_status(error)
    if status is not None and status >= 400:
        return classify_status(status)
    library = _library_class(error)
    if library is not None:
        return library
    for kind, error_class in _BUILTIN_CLASSES:
        if isinstance(error, kind):
            return error_class
    return "retryable"
