"""Live pages: server-sent events that say when what a page shows has changed.

A page is rendered with the version it shows (a run's row version, or the list's
:func:`~tether.surfaces.web.pages.digest`); its script listens on a stream that watches the
store's rows (one indexed read per poll, never the log) and sends ``changed`` when they move
past it, so the page fetches itself again. A run's stream sends ``end`` and closes once the
run has ended for good (a run that failed in a way a retry may mend is followed on). Any
process may be driving the run: the store is the only source. A stream a session opened says
``signed-out`` and closes once that session ends (:func:`while_signed_in`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from starlette.concurrency import run_in_threadpool

from tether.drivers.runner import shown_status
from tether.errors import RunNotFound
from tether.facts.status import ENDED
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
) -> AsyncGenerator[str, None]:
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
) -> AsyncGenerator[str, None]:
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


async def while_signed_in(stream: AsyncGenerator[str, None], signed_in: Callable[[], bool]) -> AsyncIterator[str]:
    """``stream``'s messages while ``signed_in()``; then ``signed-out``, and the end.

    Checked before each message goes out, so nothing reaches a page after its session ended
    (signed out, timed out); ``stream`` should stop too (its ``gone`` asking ``signed_in``), so
    the connection closes within a poll rather than at its next message.
    """
    async with aclosing(stream):
        async for said in stream:
            if not signed_in():
                break
            yield said
    if not signed_in():
        yield message("signed-out", {})


__all__ = ["HEARTBEAT", "list_changes", "message", "run_changes", "while_signed_in"]
