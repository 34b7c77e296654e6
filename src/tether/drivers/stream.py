"""Following a run's events as they are recorded, from a cursor: what ``Runner.stream`` and ``AsyncRunner.stream`` do.

The store's event log is the stream (see :mod:`tether.facts.stream`): whichever process drives
the run, a follower reads the events after its cursor, so one that reconnects with the last
cursor it saw misses nothing and sees nothing twice. :func:`following` decides what to read and
when the stream ends, and does no I/O (like :class:`tether.core.flow.Flow`); :func:`follow`
performs it with plain calls (a waiting thread), :func:`afollow` awaits it.

How a follower learns of new events: a runner in the same process tells :data:`HUB` of each
commit of the run's (so a follower reads at once) and hands it the model's text as it arrives
(:class:`~tether.facts.stream.TextDelta`, never stored); a run driven by another process is
seen by reading the log every ``poll`` seconds, one indexed read of the events after the cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from tether.errors import UnknownCursor
from tether.facts.events import Event, RunFinished
from tether.facts.stream import StreamEvent, TextDelta, stream_event
from tether.stores import AsyncStore, Store

POLL = 0.5
"""Seconds between reads of the log while nothing is heard of the run (a run driven elsewhere)."""
BATCH = 500
"""Events read at most at once: a follower far behind catches up in reads of this many."""

Batch = tuple[StreamEvent, ...]
"""What a follower gives at a time: the events of one read (or a text delta); empty: a read found nothing new."""


# Deciding what to read ---------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    """Read the run's events after seq ``after``, at most ``limit``; gives back the list."""

    after: int
    limit: int


@dataclass(frozen=True)
class Deliver:
    """Hand these events to the consumer."""

    events: Batch


@dataclass(frozen=True)
class Idle:
    """Nothing new: wait for news of the run or ``poll`` seconds; gives back whether to stop (after one more read).

    Meanwhile the model's text is handed on as it arrives, if it is of the answer that follows
    ``cursor``, the last event delivered: text a follower is not right there for is dropped
    (it is in the :class:`~tether.facts.stream.ModelStepDone` after it), so it never comes out of order.
    """

    cursor: int


Following = Generator[Read | Deliver | Idle, Any, None]


def following(run_id: str, after: int | None) -> Following:
    """Read and deliver the run's events after ``after`` (None: from its first) until it has ended.

    The stream ends once the last event read is the run's end (a ``run_finished``), or one read
    after the driver says stop. A run that failed resumably goes on if it is resumed: a consumer
    follows it again from its cursor. Started at a cursor, the event there is read first: a
    stream asked to go on after the run's end ends at once, and a cursor the log lacks is refused.

    Raises:
        UnknownCursor: the log holds no event ``after``.
    """
    cursor = -1 if after is None else after
    ended = False
    if cursor >= 0:
        there: list[Event] = yield Read(cursor - 1, 1)
        if not there or there[0].seq != cursor:
            raise UnknownCursor(run_id, cursor)
        ended = there[0].type == RunFinished.kind
    stopping = False
    while True:
        events: list[Event] = yield Read(cursor, BATCH)
        if events:
            cursor, ended = events[-1].seq, events[-1].type == RunFinished.kind
            shown = tuple(shown for event in events if (shown := stream_event(run_id, event)) is not None)
            if shown:
                yield Deliver(shown)
        if len(events) == BATCH:
            continue
        if ended or stopping:
            return
        stopping = yield Idle(cursor)


# News of runs driven in this process --------------------------------------------------------
Text = tuple[int, str]
"""Text of an answer as it arrives, after the event whose seq it holds (see :attr:`Idle.cursor`)."""


class _Inbox(Protocol):
    def put(self, item: Text | None) -> None:
        """Take text as it arrives, or (None) word that the run committed; from any thread."""


class _ThreadInbox:
    """A follower that waits in a thread (:func:`follow`)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Text | None] = queue.SimpleQueue()

    def put(self, item: Text | None) -> None:
        self._queue.put(item)

    def wait(self, seconds: float) -> Iterator[Text]:
        """The text that arrives until the run commits or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                return
            if item is None:
                return
            yield item


class _LoopInbox:
    """A follower that waits on an event loop (:func:`afollow`)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Text | None] = asyncio.Queue()

    def put(self, item: Text | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody follows any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def wait(self, seconds: float) -> AsyncIterator[Text]:
        """The text that arrives until the run commits or ``seconds`` pass."""
        deadline = self._loop.time() + seconds
        while (left := deadline - self._loop.time()) > 0:
            try:
                item = await asyncio.wait_for(self._queue.get(), left)
            except TimeoutError:
                return
            if item is None:
                return
            yield item


class Hub:
    """Who follows which run in this process: runners tell it of commits and text, it tells the followers.

    Cheap when nobody follows: a commit looks its run up in a dictionary and goes on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inboxes: dict[tuple[object, str], tuple[_Inbox, ...]] = {}

    @contextlib.contextmanager
    def listening(self, store: Store | AsyncStore, run_id: str, inbox: _Inbox) -> Iterator[None]:
        """Send ``inbox`` the news of ``run_id`` in ``store`` while the block lasts."""
        key = (store_key(store), run_id)
        with self._lock:
            self._inboxes[key] = (*self._inboxes.get(key, ()), inbox)
        try:
            yield
        finally:
            with self._lock:
                left = tuple(other for other in self._inboxes.get(key, ()) if other is not inbox)
                if left:
                    self._inboxes[key] = left
                else:
                    self._inboxes.pop(key, None)

    def committed(self, key: object, run_id: str) -> None:
        """A runner here committed events of ``run_id`` (in the store ``key`` names): its followers read now."""
        for inbox in self._inboxes.get((key, run_id), ()):
            inbox.put(None)

    def text_listener(self, key: object, run_id: str, cursor: int) -> Callable[[str], None] | None:
        """What tells ``run_id``'s followers the text of the answer asked for after event ``cursor``; None: no one."""
        if (key, run_id) not in self._inboxes:
            return None

        def tell(text: str) -> None:
            for inbox in self._inboxes.get((key, run_id), ()):
                inbox.put((cursor, text))

        return tell


HUB = Hub()
"""The one hub of this process."""


def store_key(store: Store | AsyncStore) -> object:
    """What names a store's database in :data:`HUB`: its URL (a sync and an async store of one database meet), or it."""
    inner = getattr(store, "store", None)  # an awaitable wrapper: the store it calls
    named = inner if inner is not None else store
    url = getattr(named, "url", None)
    return url if isinstance(url, str) else named


# Performing it -----------------------------------------------------------------------------
def follow(
    store: Store, run_id: str, *, tenant: str | None = None, after: int | None = None, poll: float = POLL
) -> Iterator[Batch]:
    """The run's events after ``after`` as :func:`following` reads them, a batch at a time, waiting in this thread.

    Also each text delta a runner of this process tells :data:`HUB` (a batch of one), and an
    empty batch each time a read found nothing new, before it waits (a consumer's moment to
    check its own things: a heartbeat, a client gone); at most every ``poll`` seconds when idle.
    """
    inbox = _ThreadInbox()
    with HUB.listening(store, run_id, inbox):
        steps, outcome = following(run_id, after), cast(Any, None)  # what performing the last effect gave back
        while (effect := _next(steps, outcome)) is not None:
            outcome = None
            match effect:
                case Read(cursor, limit):
                    outcome = store.load_events(run_id, tenant=tenant, after=cursor, limit=limit)
                case Deliver(events):
                    yield events
                case Idle(cursor):
                    yield ()
                    for position, text in inbox.wait(poll):
                        if position == cursor:
                            yield (TextDelta(run_id, text),)
                    outcome = False


async def afollow(
    store: AsyncStore,
    run_id: str,
    *,
    tenant: str | None = None,
    after: int | None = None,
    poll: float = POLL,
    until: asyncio.Future[Any] | None = None,
) -> AsyncGenerator[Batch, None]:
    """:func:`follow` on an event loop; ``until``: once it is done (a drive), the stream ends after one more read."""
    inbox = _LoopInbox()
    if until is not None:
        until.add_done_callback(lambda _: inbox.put(None))
    with HUB.listening(store, run_id, inbox):
        steps, outcome = following(run_id, after), cast(Any, None)  # what performing the last effect gave back
        while (effect := _next(steps, outcome)) is not None:
            outcome = None
            match effect:
                case Read(cursor, limit):
                    outcome = await store.load_events(run_id, tenant=tenant, after=cursor, limit=limit)
                case Deliver(events):
                    yield events
                case Idle(cursor):
                    yield ()
                    async for position, text in inbox.wait(poll):
                        if position == cursor:
                            yield (TextDelta(run_id, text),)
                    outcome = until is not None and until.done()


def _next(steps: Following, outcome: Any) -> Read | Deliver | Idle | None:
    try:
        return steps.send(outcome)
    except StopIteration:
        return None


__all__ = ["BATCH", "HUB", "POLL", "Batch", "Hub", "afollow", "follow", "following", "store_key"]
