"""Live pages: server-sent events that say when what a page shows has changed.

A page is rendered with the version it shows (a run's row version, or the list's
:func:`~tether.surfaces.web.pages.digest`); its script listens on a stream and fetches the page
again when it says ``changed``. A run's stream is the run's own event stream
(:func:`tether.drivers.stream.afollow`, what ``AsyncRunner.stream`` reads): ``changed`` each
time the run records events past the page, ``end`` once it has ended for good (a run that failed
in a way a retry may mend is followed on). Any process may be driving the run: the store is the
only source (a drive in this process wakes the stream at once). The list's stream watches the
rows (one indexed read per poll, never the logs). A stream a session opened says ``signed-out``
and closes once that session ends (:func:`while_signed_in`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from starlette.concurrency import run_in_threadpool

from tether.drivers import stream
from tether.drivers.runner import shown_status
from tether.errors import RunNotFound
from tether.facts.status import RunStatus
from tether.facts.stream import TextDelta
from tether.stores import Store
from tether.stores.awaitable import as_async_store
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
    """``changed`` each time the run records events past the page's version ``since``; ``end`` once it has ended.

    The run's events are read from the first: those the page may show are passed over, and
    once they are read, a row that moved past ``since`` meanwhile is said at once (or at the end).
    A run that failed in a way a retry may mend is followed on, from where its stream ended.
    """
    said, caught_up, cursor = time.monotonic(), False, None
    try:
        while True:
            following = stream.afollow(as_async_store(store), run_id, tenant=tenant, after=cursor, poll=poll)
            try:
                async for batch in following:
                    if await gone():
                        return
                    cursor = next((e.cursor for e in reversed(batch) if e.cursor is not None), cursor)
                    if caught_up and any(not isinstance(event, TextDelta) for event in batch):
                        said = time.monotonic()
                        yield message("changed", await _state(store, run_id, tenant))
                    elif not batch and not caught_up:  # the log is read up to now: did the run move since the page?
                        caught_up, state = True, await _state(store, run_id, tenant)
                        if state["version"] != since:
                            said = time.monotonic()
                            yield message("changed", state)
                    elif not batch and time.monotonic() - said >= HEARTBEAT:
                        said = time.monotonic()
                        yield HEARTBEAT_COMMENT
            finally:
                await following.aclose()  # a page gone: its follower stops listening now
            record = await run_in_threadpool(store.load_run, run_id, tenant=tenant)
            state = {"version": record.version, "status": shown_status(record)}
            if not caught_up and state["version"] != since:  # it ended before the stream caught up
                caught_up = True
                yield message("changed", state)
            if not record.summary.get("retryable"):
                yield message("end", state)
                return
            while record.status == RunStatus.failed and not await gone():  # until a retry moves it on
                await asyncio.sleep(poll)
                if time.monotonic() - said >= HEARTBEAT:
                    said = time.monotonic()
                    yield HEARTBEAT_COMMENT
                record = await run_in_threadpool(store.load_run, run_id, tenant=tenant)
            if await gone():
                return
    except RunNotFound:  # deleted meanwhile (tether gc)
        yield message("end", {"version": since, "status": "deleted"})


async def _state(store: Store, run_id: str, tenant: str | None) -> dict[str, Any]:
    record = await run_in_threadpool(store.load_run, run_id, tenant=tenant)
    return {"version": record.version, "status": shown_status(record)}


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
