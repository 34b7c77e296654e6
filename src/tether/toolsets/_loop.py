"""An event loop on a thread of its own, so a toolset's async client serves sync and async callers.

An MCP session (and an HTTP connection pool) belongs to the loop it was opened in. The
toolset opens it in this loop once; the sync ``Runner`` waits on it from any thread, and
the ``AsyncRunner`` awaits it from its own loop without blocking that loop (cancelling the
await cancels the work here too).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """A daemon thread running an asyncio loop until :meth:`close`."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``work`` in the loop and wait for it here (cancelled there past ``timeout``)."""
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def arun(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` run in the loop, from another loop; cancelling this await cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    def close(self) -> None:
        """Stop the loop and its thread (what runs in it should be finished first)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
