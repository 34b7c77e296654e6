"""Running one attempt of a tool call under its timeout, sync or async.

Python cannot kill a thread, so a sync tool past its timeout is abandoned, not stopped: it
keeps running in a daemon thread. Two rules keep that safe:

- the attempt's cancel signal (a ``threading.Event`` the tool may take as a parameter) is
  set, so a tool that checks it can stop early;
- while an abandoned attempt of a call still runs, no new attempt of that call starts in
  this process: the next attempt first waits for it (up to its own timeout), and if it is
  still running, times out again without starting anything. Attempts of one call never
  overlap, so a tool never performs its side effect twice at once.

Calls are told apart by ``(run_id, call_id)``; without a run id (a tool executed directly,
outside a runner) nothing is remembered.

A tool cannot end the program: a ``BaseException`` it raises that is not an ``Exception``
(``sys.exit()``, argparse on a bad flag, a stray ``GeneratorExit``, a ``CancelledError`` nobody
asked for, a framework's own) comes out as :class:`ToolExit`, an ordinary tool error. Two stay
what they are: ``KeyboardInterrupt`` (the user's Ctrl-C) and the ``CancelledError`` of an async
attempt that is really being cancelled (its timeout, or the drive's own cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any

CallKey = tuple[str, str]
"""``(run_id, call_id)``: one tool call of one run."""


class ToolTimeout(TimeoutError):
    """The tool did not finish within its timeout."""

    def __init__(self, message: str, *, still_running: bool = False) -> None:
        super().__init__(message)
        self.still_running = still_running
        """A sync tool's thread was abandoned and is still running: the call may yet complete."""


class OutcomeUnknown(ConnectionError):
    """The call reached something that may have acted on it, and no answer came back.

    A remote server that died, dropped the connection or went silent mid-call: like a sync
    tool abandoned at its timeout, it may have taken effect, so a call of a tool that is not
    idempotent is never re-run automatically (the engine marks it in doubt). Transient, so an
    idempotent tool's retry policy retries it.
    """


class ToolExit(Exception):
    """A tool raised a ``BaseException`` that is not an ``Exception``: its error, not the program's end."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original
        """What the tool raised (``SystemExit(2)``...); its type is what the model and the log are told."""


def _call(function: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Call a sync tool; what it raises that would end the program comes out as :class:`ToolExit`."""
    try:
        return function(**kwargs)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as error:
        raise ToolExit(error) from error


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    """Await an async tool, as :func:`_call` calls a sync one; a real cancellation stays one."""
    try:
        return await awaitable
    except (Exception, KeyboardInterrupt):
        raise
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this attempt is being cancelled (timeout, or the drive): not the tool's doing
        raise ToolExit(error) from error
    except GeneratorExit as error:
        if error.__traceback__ is not None and error.__traceback__.tb_next is None:
            raise  # thrown in here by close(): this coroutine is being discarded, not the tool failing
        raise ToolExit(error) from error
    except BaseException as error:
        raise ToolExit(error) from error


class _Worker:
    """One sync attempt in a daemon thread; says when it is done, from any thread."""

    def __init__(self, function: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self._function = function
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        context = contextvars.copy_context()  # the caller's context (a current span...), as asyncio.to_thread does
        self.thread = threading.Thread(target=context.run, args=(self._run,), name="tether-tool", daemon=True)

    def _run(self) -> None:
        try:
            self.value = _call(self._function, self._kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits for the attempt
            self.error = error
        with self._lock:
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the attempt ends (at once if it has)."""
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def result(self) -> Any:
        """The function's value, or its exception raised here."""
        if self.error is not None:
            raise self.error
        return self.value

    async def wait_async(self, timeout: float | None) -> bool:
        """Wait inside an event loop without blocking it; True if the attempt ended."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not ended.done():
                ended.set_result(None)

        def from_thread() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(settle)

        self.on_done(from_thread)
        try:
            await asyncio.wait_for(asyncio.shield(ended), timeout)
        except TimeoutError:
            return False
        return True


_lingering: dict[CallKey, _Worker] = {}
"""Abandoned attempts still running, by call; each removes itself when it ends."""
_lingering_lock = threading.Lock()


def _abandon(key: CallKey | None, worker: _Worker, cancel: threading.Event) -> None:
    """Leave an attempt running: signal it to stop, and remember it by call until it ends."""
    cancel.set()
    if key is None:
        return
    with _lingering_lock:
        _lingering[key] = worker

    def forget() -> None:
        with _lingering_lock:
            if _lingering.get(key) is worker:
                del _lingering[key]

    worker.on_done(forget)


def _still_running(key: CallKey | None) -> _Worker | None:
    if key is None:
        return None
    with _lingering_lock:
        worker = _lingering.get(key)
    return worker if worker is not None and not worker.done.is_set() else None


def _timed_out(timeout: float | None) -> ToolTimeout:
    return ToolTimeout(f"timed out after {timeout:g}s", still_running=True)


def _busy() -> ToolTimeout:
    return ToolTimeout(
        "is still running from an earlier attempt that timed out; it was not started again", still_running=True
    )


def run_sync(
    function: Callable[..., Any],
    kwargs: dict[str, Any],
    timeout: float | None,
    *,
    cancel: threading.Event,
    key: CallKey | None = None,
) -> Any:
    """Run a sync tool in this thread, or in a worker thread abandoned past ``timeout``."""
    earlier = _still_running(key)
    if earlier is not None and not earlier.done.wait(timeout):
        raise _busy()
    if timeout is None:
        return _call(function, kwargs)
    worker = _Worker(function, kwargs)
    worker.thread.start()
    if not worker.done.wait(timeout):
        _abandon(key, worker, cancel)
        raise _timed_out(timeout)
    return worker.result()


async def run_sync_in_loop(
    function: Callable[..., Any],
    kwargs: dict[str, Any],
    timeout: float | None,
    *,
    cancel: threading.Event,
    key: CallKey | None = None,
) -> Any:
    """Run a sync tool in a worker thread without blocking the event loop."""
    earlier = _still_running(key)
    if earlier is not None and not await earlier.wait_async(timeout):
        raise _busy()
    worker = _Worker(function, kwargs)
    worker.thread.start()
    ended = False
    try:
        ended = await worker.wait_async(timeout)
    finally:
        if not ended:  # timed out, or the drive itself was cancelled: the thread runs on
            _abandon(key, worker, cancel)
    if not ended:
        raise _timed_out(timeout)
    return worker.result()


async def run_async(awaitable: Awaitable[Any], timeout: float | None, *, cancel: threading.Event) -> Any:
    """Await an async tool; past ``timeout`` it is cancelled (it does not linger)."""
    try:
        return await asyncio.wait_for(_awaited(awaitable), timeout)
    except TimeoutError:
        cancel.set()
        raise ToolTimeout(f"timed out after {timeout:g}s") from None
