"""Live pages: server-sent events that say when what a page shows has changed.

A page is rendered with the version it shows (a run's row version, or the list's
:func:`~tether.surfaces.web.pages.digest`); its script listens on a stream that watches the
store's rows (one indexed read per poll, never the log) and sends ``changed`` when they move
past it, so the page fetches itself again. A run's stream sends ``end`` and closes once the
run has ended for good (a run that failed in a way a retry may mend is followed on). Any
process may be driving the run: the store is the only source.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from tether.core.status import ENDED
from tether.drivers.runner import shown_status
from tether.errors import RunNotFound
from tether.stores import Store
from tether.surfaces.web import pages

Disconnected = Callable[[], Awaitable[bool]]
HEARTBEAT = 15.0
"""Seconds of silence after which a comment keeps an idle stream open through proxies."""
HEARTBEAT_COMMENT = ": still here\n\n"


def message(kind: str, data: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def run_changes(
    store: Store, run_id: str, tenant: str | None, since: int | None, *, poll: float, gone: Disconnected
) -> AsyncIterator[str]:
    """``changed`` each time the run's version moves past ``since``; ``end`` once it has ended."""
    said = time.monotonic()
    while not await gone():
        try:
            record = await run_in_threadpool(store.load_run, run_id, tenant=tenant)
        except RunNotFound:  # deleted meanwhile (tether gc)
            yield message("end", {"version": since, "status": "deleted"})
            return
        state = {"version": record.version, "status": shown_status(record)}
        if record.version != since:
            since = record.version
            said = time.monotonic()
            yield message("changed", state)
        if record.status in ENDED and not record.summary.get("retryable"):  # a retry may still move it
            yield message("end", state)
            return
        await asyncio.sleep(poll)
        if time.monotonic() - said >= HEARTBEAT:
            said = time.monotonic()
            yield HEARTBEAT_COMMENT


async def list_changes(
    store: Store, tenant: str | None, since: str | None, *, poll: float, gone: Disconnected
) -> AsyncIterator[str]:
    """``changed`` each time any visible run moves (the runs list and the inbox listen)."""
    said = time.monotonic()
    while not await gone():
        now = await run_in_threadpool(pages.digest, store, tenant)
        if now != since:
            since = now
            said = time.monotonic()
            yield message("changed", {"digest": now})
        await asyncio.sleep(poll)
        if time.monotonic() - said >= HEARTBEAT:
            said = time.monotonic()
            yield HEARTBEAT_COMMENT


__all__ = ["HEARTBEAT", "list_changes", "message", "run_changes"]
