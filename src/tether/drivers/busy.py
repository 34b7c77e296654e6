"""How many runs at once do tether's own work on an event loop (``AsyncRunner(max_busy_runs=...)``).

A step's own work (the engine deciding, the store writing) runs on the event loop, or on the
store's thread holding the GIL. Once hundreds of runs are ready together, one turn of the loop
runs all of them before a timer or a request of the host's gets in: with 256 runs on SQLite the
loop's lag p99 reached 19 ms. Past the limit, runs queue here instead, first come first served,
and the host's callbacks keep their turn. A run holds its place only while tether works for it:
it gives the place up while it waits for anything else (the model, a tool, an approver, a retry's
sleep, a child run), so no run waits here for another's model call. On PostgreSQL the queue also
keeps runs from waiting on the connection pool, whose timeout fails a step.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

DEFAULT_BUSY_RUNS = 32
"""Twice the SQL store's pool (5 + 10 overflow): a run still deciding its step holds a place but no
connection, and at 16 PostgreSQL lost throughput; SQLite's lag stayed within 10 ms up to 1024 runs."""


class Place:
    """One run's place among the busy ones, given up while it waits elsewhere (:meth:`away`)."""

    def __init__(self, semaphore: asyncio.Semaphore | None) -> None:
        self._semaphore = semaphore
        self._held = semaphore is not None

    @asynccontextmanager
    async def away(self) -> AsyncIterator[None]:
        """While the block waits for something outside tether: the place is free, and taken back after."""
        if self._semaphore is None:
            yield
            return
        self._give_up()
        try:
            yield
        finally:
            await self._semaphore.acquire()  # cancelled here, the place is simply not held
            self._held = True

    def _give_up(self) -> None:
        if self._held and self._semaphore is not None:
            self._held = False
            self._semaphore.release()


class BusyRuns:
    """At most ``limit`` runs at once doing tether's own work on each event loop; None: no limit.

    Shared by every runner given it, and by the runners of their child runs, so the limit covers a
    whole run tree. :data:`SHARED`, every :class:`AsyncRunner`'s by default, makes it one limit per
    event loop, whatever runners (one per request, say) drive its runs.
    """

    def __init__(self, limit: int | None = DEFAULT_BUSY_RUNS) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"max_busy_runs must be at least 1 (or None for no limit), not {limit}")
        self.limit = limit
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @asynccontextmanager
    async def place(self) -> AsyncIterator[Place]:
        """Wait for a place (after those who asked before), hold it for the block, then give it up."""
        semaphore = self._on_this_loop()
        if semaphore is not None:
            await semaphore.acquire()
        place = Place(semaphore)
        try:
            yield place
        finally:
            place._give_up()

    def _on_this_loop(self) -> asyncio.Semaphore | None:
        """The running loop's places: a runner may outlive a loop (``asyncio.run`` twice), or serve two."""
        if self.limit is None:
            return None
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.limit)
        return semaphore


SHARED = BusyRuns()
"""The places every AsyncRunner shares unless given its own: :data:`DEFAULT_BUSY_RUNS` per event loop."""


def of(setting: int | BusyRuns | None) -> BusyRuns:
    """``AsyncRunner(max_busy_runs=...)``: shared places as given, or a limit of the runner's own."""
    return setting if isinstance(setting, BusyRuns) else BusyRuns(setting)
