"""What the adapters built on a vendor SDK share, with no vendor import: clients and their retries.

The ``anthropic`` and ``openai`` SDKs come from the same generator: both retry 429/5xx
themselves, honouring any Retry-After the API sends, and compute each wait in one method.
:class:`CappedRetries` overrides that method to cap the wait and report it; :class:`SdkAdapter`
holds one sync client and one async client per event loop (connections belong to a loop).
Each adapter module subclasses both with its SDK's classes and translates its SDK's errors.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar

from tether.errors import ModelError

DEFAULT_MAX_RETRIES = 4
DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_RETRY_WAIT = 60.0
"""Cap on one SDK retry wait: the SDKs honour a Retry-After the API sends, up to minutes."""

RetryWaitListener = Callable[[float, int], None]
"""Told how long the SDK is about to wait before a retry, and which retry (1 = the first),
for a live view."""
_call_waits: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("tether_call_waits", default=None)
"""The waits of the call under way in this thread or task (see :func:`collecting_waits`)."""


@contextmanager
def collecting_waits() -> Iterator[list[float]]:
    """The list the SDK's retry waits of the call made inside this block are added to."""
    waits: list[float] = []
    token = _call_waits.set(waits)
    try:
        yield waits
    finally:
        _call_waits.reset(token)


class CappedRetries:
    """Mixin for an SDK client class: the SDK's own retries, with each wait capped and reported.

    It overrides the SDK's retry-delay hook, the one place the wait is computed; the
    retrying itself (which statuses, Retry-After parsing, backoff) stays the SDK's.
    """

    max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT
    on_retry_wait: RetryWaitListener | None = None

    def _calculate_retry_timeout(self, remaining_retries: int, options: Any, *args: Any, **kwargs: Any) -> float:
        computed = super()._calculate_retry_timeout(remaining_retries, options, *args, **kwargs)  # type: ignore[misc]
        wait = min(float(computed), self.max_retry_wait)
        retry = options.get_max_retries(self.max_retries) - remaining_retries + 1  # type: ignore[attr-defined]
        waits = _call_waits.get()
        if waits is not None:
            waits.append(round(wait, 3))
        if self.on_retry_wait is not None:
            self.on_retry_wait(wait, retry)
        return wait


class SyncClient(Protocol):
    """A sync SDK client with :class:`CappedRetries` mixed in."""

    max_retry_wait: float
    on_retry_wait: RetryWaitListener | None

    def close(self) -> None:
        """Close its connections."""


class AsyncClient(Protocol):
    """An async SDK client with :class:`CappedRetries` mixed in."""

    max_retry_wait: float
    on_retry_wait: RetryWaitListener | None

    async def close(self) -> None:
        """Close its connections."""


SyncT = TypeVar("SyncT", bound=SyncClient)
AsyncT = TypeVar("AsyncT", bound=AsyncClient)
ClientT = TypeVar("ClientT", bound=SyncClient | AsyncClient)


class SdkAdapter(abc.ABC, Generic[SyncT, AsyncT]):
    """The clients of one adapter: made when first needed, with the adapter's options.

    ``api_key`` and ``base_url`` are passed on only when given: otherwise the SDK reads its
    usual environment variables. Nothing here is ever stored with a run.
    """

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None,
        max_retries: int,
        timeout: float,
        max_retry_wait: float,
        on_retry_wait: RetryWaitListener | None,
        stream_fallback: bool,
    ) -> None:
        self.stream_fallback = stream_fallback
        """A stream that breaks after it started is asked again once, unstreamed (see ``stream``)."""
        self.max_retry_wait = max_retry_wait
        self.on_retry_wait = on_retry_wait
        self._options: dict[str, Any] = {"max_retries": max_retries, "timeout": timeout}
        if api_key is not None:
            self._options["api_key"] = api_key
        if base_url is not None:
            self._options["base_url"] = base_url
        self._client: SyncT | None = None
        self._async_client: AsyncT | None = None
        self._async_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    @abc.abstractmethod
    def new_client(self, options: dict[str, Any]) -> SyncT:
        """A sync client of the SDK (with :class:`CappedRetries`) made with ``options``."""
        raise NotImplementedError

    @abc.abstractmethod
    def new_async_client(self, options: dict[str, Any]) -> AsyncT:
        """An async client of the SDK (with :class:`CappedRetries`) made with ``options``."""
        raise NotImplementedError

    def _sync_client(self) -> SyncT:
        if self._client is None:
            self._client = self._configure(self.new_client(dict(self._options)))
        return self._client

    def _loop_client(self) -> AsyncT:
        loop = asyncio.get_running_loop()
        if self._async_client is None or self._async_loop is None or self._async_loop() is not loop:
            self._async_client = self._configure(self.new_async_client(dict(self._options)))
            self._async_loop = weakref.ref(loop)
        return self._async_client

    def _configure(self, client: ClientT) -> ClientT:
        client.max_retry_wait = self.max_retry_wait
        client.on_retry_wait = self.on_retry_wait
        return client

    def _falls_back(self, started: bool, error: ModelError) -> bool:
        """Whether a stream that broke with ``error`` is asked again unstreamed.

        Only once it had started (before, the SDK's own retries applied) and only if trying
        again may help.
        """
        return self.stream_fallback and started and error.retryable

    def close(self) -> None:
        """Close the sync client's connections."""
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Close the async client's connections."""
        if self._async_client is not None:
            await self._async_client.close()
            self._async_client = None


@contextmanager
def translating(
    sdk_error: type[Exception], translate: Callable[[Any, list[float]], ModelError], source: str
) -> Iterator[list[float]]:
    """Collect one call's SDK retry waits; turn what the SDK raises into :class:`ModelError`.

    ``translate`` turns the SDK's own errors (``sdk_error``); a connection that breaks mid-stream
    raises the HTTP client's errors past the SDK's wrapping: those are transient.
    """
    import httpx2  # the SDKs' HTTP client: imported with them, by the first call

    with collecting_waits() as waits:
        try:
            yield waits
        except sdk_error as error:
            raise translate(error, waits) from error
        except httpx2.TransportError as error:  # read mid-stream, past the SDK's own wrapping
            message = f"the connection to {source} broke mid-stream: {error}"
            raise ModelError(message, retryable=True, retry_waits=tuple(waits)) from error
        except RecursionError as error:  # the SDK's JSON reader: a response nested ~1,000 levels deep
            raise too_deep(source, None, error, waits) from error


def unreached(error: Any) -> str:
    """`` at URL``: where a request that got no answer went, so a wrong base URL shows; "" if unknown.

    The query and any user or password in the URL are left out (the message is stored with the run).
    """
    url = getattr(getattr(error, "request", None), "url", None)
    if url is None:
        return ""
    return f" at {url.scheme}://{url.netloc.decode('ascii', 'replace')}{url.path}"


def too_deep(source: str, response_id: str | None, error: BaseException, waits: list[float]) -> ModelError:
    """A response that nests values too deeply to be read: malformed, so a later call may do better (transient)."""
    which = f"a malformed response {response_id}" if response_id else "a malformed response"
    message = f"{source} sent {which}: a value nested too deeply to read ({error})"
    return ModelError(message, retryable=True, retry_waits=tuple(waits))


def transient(status: int) -> bool:
    """Whether an error with this HTTP status may pass if the call is made again later."""
    return status in (408, 409, 429) or status >= 500
