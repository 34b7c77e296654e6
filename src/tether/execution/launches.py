"""Attempts launched without waiting for them, and waiting for the first of them to end.

The drivers perform :class:`~tether.core.flow.Launch` and :class:`~tether.core.flow.Landed`
with these: :class:`~tether.drivers.runner.Runner` runs each attempt in a daemon thread of its
own (a hung tool never holds up Ctrl-C or the program's end, as in :mod:`tether.execution.attempts`),
:class:`~tether.drivers.runner.AsyncRunner` as a task. How many run at once is the flow's
decision (``Agent.max_concurrent_tools``); timeouts stay each attempt's own.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent import futures
from typing import Any

Outcome = str | BaseException
"""What a launched attempt gave: the tool's serialised result, or what it raised."""


def launch(attempt: Callable[[], str]) -> futures.Future[str]:
    """Start ``attempt`` in a daemon thread (in the caller's context); the future settles when it ends."""
    future: futures.Future[str] = futures.Future()

    def run() -> None:
        try:
            value = attempt()
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits (landed)
            future.set_exception(error)
        else:
            future.set_result(value)

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(run,), name="tether-tool", daemon=True).start()
    return future


def landed(launched: Sequence[futures.Future[str]]) -> list[tuple[futures.Future[str], Outcome]]:
    """Block until one of ``launched`` has ended; every one that has, in the order given."""
    futures.wait(launched, return_when=futures.FIRST_COMPLETED)
    return [(future, _outcome(future.exception(), future.result)) for future in launched if future.done()]


def alaunch(attempt: Coroutine[Any, Any, str]) -> asyncio.Task[str]:
    """Start ``attempt`` as a task of the running loop."""
    task = asyncio.ensure_future(attempt)
    task.add_done_callback(_retrieve)  # a task left behind (the drive stopped) logs nothing
    return task


async def alanded(launched: Sequence[asyncio.Task[str]]) -> list[tuple[asyncio.Task[str], Outcome]]:
    """Wait until one of ``launched`` has ended; every one that has, in the order given.

    Cancelling the wait (the drive is cancelled) cancels the attempts too.
    """
    try:
        await asyncio.wait(launched, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        for task in launched:
            task.cancel()
        raise
    return [(task, _task_outcome(task)) for task in launched if task.done()]


def _outcome(error: BaseException | None, result: Callable[[], str]) -> Outcome:
    return error if error is not None else result()


def _task_outcome(task: asyncio.Task[str]) -> Outcome:
    if task.cancelled():
        return asyncio.CancelledError()
    return _outcome(task.exception(), task.result)


def _retrieve(task: asyncio.Task[str]) -> None:
    if not task.cancelled():
        task.exception()
