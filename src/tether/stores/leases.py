"""Who drives a run: a lease row in the store, claimed first and renewed while the drive lasts.

A drive claims the run's lease before any model call or tool start (:func:`hold`, or
:func:`ahold` in an event loop); a heartbeat (a thread, or a task for :class:`AsyncLease`)
renews it every third of its time to live, so a long tool, model call or wait keeps it; a
process that dies stops renewing and its lease expires. Whoever holds the lease owns every
call in flight: a call another owner started and never finished was abandoned, and the
in-doubt rules resolve it.

The lease names its holder process (:class:`~tether.stores.Holder`): a claim refused by a
holder that, on this very host and in this PID namespace, is certainly gone (killed, say), or
by a drive of this process that ended without giving the lease up (the store failed to delete
it: a full disk), takes the run over at once, and says so (a warning on this module's logger,
and :attr:`Lease.took_over`). Anywhere else a pid says nothing (another host, a container that
reuses pids): the lease is honoured until it expires.

A drive that finds its lease taken (an operator's ``--force``, or a renewal that came too
late) stops before its next write (:class:`~tether.errors.RunBusy`). Owner strings are
``host:pid:token``, unique per drive, for messages only.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress

from tether.errors import RunBusy, StoreError
from tether.stores import AsyncStore, RunLease, Store, holders
from tether.stores.awaitable import completed

DEFAULT_TTL = 30.0
"""Seconds a lease lasts unless renewed: how long a killed driver keeps its runs busy (but for a
resumer on its host and in its PID namespace, which takes them over at once)."""

log = logging.getLogger(__name__)


_HELD: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("tether_held_leases", default=frozenset())
"""The runs whose lease the current context (thread, task) holds: what it writes to them is a drive's."""


def held_here(run_id: str) -> bool:
    """Whether this context holds ``run_id``'s lease, so a write to that run now is its drive's own step.

    A :class:`~tether.stores.sql.TransactionHook` tells a drive's writes (it goes on by itself) from
    a decision or a cancellation made from outside (which must wake a driver).
    """
    return run_id in _HELD.get()


@contextmanager
def _marked_held(run_id: str) -> Iterator[None]:
    token = _HELD.set(_HELD.get() | {run_id})
    try:
        yield
    finally:
        _HELD.reset(token)


_DRIVING: set[str] = set()
"""The owners of this process's drives, from before their claim to after their release: a lease
this process holds under another owner is left over from a drive that ended without releasing it."""


def _new_owner() -> str:
    """A new drive's owner id: this host and pid (for people to read), and a random token."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Held:
    """What a held lease knows and decides, whichever way its store is called (see :class:`Lease`)."""

    def __init__(self, claimed: RunLease, ttl: float, took_over: RunLease | None) -> None:
        self.run_id = claimed.run_id
        self.owner = claimed.owner
        self.ttl = ttl
        self.expires_at = claimed.expires_at
        self.took_over = took_over
        """The lease of a dead holder (on this host) this drive took over before it expired; None if none."""
        self.lost: str | None = None
        """Who took the run over (``another process`` if it has let the run go since); once set,
        this drive must write nothing more."""

    def _due(self) -> bool:
        """Whether the heartbeat fell behind (the process was paused, the database unreachable): renew first."""
        return self.lost is None and time.time() > self.expires_at - self.ttl / 3

    def _raise_if_lost(self) -> None:
        if self.lost is not None:
            raise RunBusy(self.run_id, self.lost, None, lost=True)

    def _renewed(self, lease: RunLease | None) -> None:
        """Take the store's answer to a renewal: extended, or lost for good."""
        if lease is None:
            self.lost = "another process"
        elif lease.owner == self.owner:
            self.expires_at = lease.expires_at
        else:
            self.lost = lease.owner


class Lease(_Held):
    """A run's lease while this process holds it: renewed by a heartbeat thread, checked before work.

    Get one from :func:`hold`; as a context manager it renews the lease while inside, and
    gives it up on the way out. :class:`AsyncLease` is the same for an event loop.
    """

    def __init__(self, store: Store, claimed: RunLease, ttl: float, took_over: RunLease | None = None) -> None:
        super().__init__(claimed, ttl, took_over)
        self.store = store
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name=f"tether-lease-{self.run_id}", daemon=True)

    def check(self) -> None:
        """Raise :class:`RunBusy` unless this drive still holds the lease (before any model call, tool or write).

        Cheap while the heartbeat keeps the lease fresh; when it has not, it is renewed here first.
        """
        if self._due():
            self.renew()
        self._raise_if_lost()

    def renew(self) -> None:
        """Extend the lease; if it was taken meanwhile (and maybe released since), it is lost for good.

        Never re-taken: after ``tether resume --force`` parked a run and let it go, a hung
        old driver must not grab it back.
        """
        with self._lock:
            if self.lost is None:
                self._renewed(self.store.renew_run(self.run_id, self.owner, now=time.time(), ttl=self.ttl))

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3) and self.lost is None:
            with suppress(StoreError):  # tried again next beat; check() stops the drive if the lease lapses
                self.renew()

    def __enter__(self) -> Lease:
        self._heartbeat.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop renewing, and give the lease up unless another owner has it."""
        self._stop.set()
        self._heartbeat.join()
        if self.lost is None:
            with suppress(StoreError):  # unreachable database: the lease simply expires
                self.store.release_run(self.run_id, self.owner)


class AsyncLease(_Held):
    """:class:`Lease` for an event loop: its store is awaited and its heartbeat is a task, not a thread.

    Get one from :func:`ahold`. Leaving it (even when the drive's task was cancelled) stops the
    heartbeat and gives the lease up before the cancellation goes on.
    """

    def __init__(self, store: AsyncStore, claimed: RunLease, ttl: float, took_over: RunLease | None = None) -> None:
        super().__init__(claimed, ttl, took_over)
        self.store = store
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._heartbeat: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """See :meth:`Lease.check`."""
        if self._due():
            await self.renew()
        self._raise_if_lost()

    async def renew(self) -> None:
        """See :meth:`Lease.renew`."""
        async with self._lock:
            if self.lost is None:
                self._renewed(await self.store.renew_run(self.run_id, self.owner, now=time.time(), ttl=self.ttl))

    async def _beat(self) -> None:
        while self.lost is None:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.ttl / 3)
                return
            with suppress(StoreError):  # tried again next beat; check() stops the drive if the lease lapses
                await self.renew()

    async def __aenter__(self) -> AsyncLease:
        self._heartbeat = asyncio.create_task(self._beat(), name=f"tether-lease-{self.run_id}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop renewing, and give the lease up unless another owner has it (both seen through to the end)."""
        await completed(self._leave())

    async def _leave(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            await self._heartbeat
        if self.lost is None:
            with suppress(StoreError):  # unreachable database: the lease simply expires
                await self.store.release_run(self.run_id, self.owner)


def _check_ttl(ttl: float) -> None:
    if ttl <= 0:
        raise ValueError(f"a lease's ttl must be positive, not {ttl}")


def _taken(claimed: RunLease, owner: str) -> RunLease:
    """The lease claimed for ``owner``; :class:`RunBusy` if the claim found another holder."""
    if claimed.owner != owner:
        raise RunBusy(claimed.run_id, claimed.owner, claimed.expires_at)
    return claimed


def _dead_holder(claimed: RunLease, owner: str) -> RunLease | None:
    """The lease that refused ``owner``'s claim, if its drive has certainly ended.

    Either its process is gone (see :mod:`holders`), or it is this process and the drive is
    not one of :data:`_DRIVING` (it ended, but could not give the lease up: a full disk).
    """
    holder = claimed.holder
    if claimed.owner == owner or holder is None:
        return None
    ended_here = holder == holders.this_process() and claimed.owner not in _DRIVING
    return claimed if ended_here or holders.is_gone(holder) else None


def _took_over(claimed: RunLease, owner: str, dead: RunLease) -> RunLease | None:
    """``dead`` once this drive's claim replaced it (say so); None if another resumer was first."""
    if claimed.owner != owner:
        return None
    pid = dead.holder.pid if dead.holder is not None else "?"
    log.warning(
        "run %s: the drive that held it (%s, pid %s on this host) has ended; taken over now, without waiting "
        "for its lease to expire",
        claimed.run_id,
        dead.owner,
        pid,
    )
    return dead


@contextmanager
def hold(store: Store, run_id: str, *, ttl: float = DEFAULT_TTL, force: bool = False) -> Iterator[Lease]:
    """Claim the run's lease for the duration of a drive; :class:`RunBusy` if another process holds it.

    A holder that is certainly gone (see :mod:`tether.stores.holders`) is replaced at once.
    ``force`` takes it even from a live holder (an operator who knows that holder is gone;
    if it is not, it stops at its next check).
    """
    _check_ttl(ttl)
    owner, me, took_over = _new_owner(), holders.this_process(), None
    _DRIVING.add(owner)
    try:
        claimed = store.claim_run(run_id, owner, now=time.time(), ttl=ttl, force=force, holder=me)
        if (dead := _dead_holder(claimed, owner)) is not None:
            claimed = store.claim_run(run_id, owner, now=time.time(), ttl=ttl, holder=me, replacing=dead.owner)
            took_over = _took_over(claimed, owner, dead)
        with Lease(store, _taken(claimed, owner), ttl, took_over) as lease, _marked_held(run_id):
            yield lease
    finally:
        _DRIVING.discard(owner)


@asynccontextmanager
async def ahold(
    store: AsyncStore, run_id: str, *, ttl: float = DEFAULT_TTL, force: bool = False
) -> AsyncIterator[AsyncLease]:
    """Claim the run's lease for an async drive, as :func:`hold` does (used as ``async with``)."""
    _check_ttl(ttl)
    owner, me, took_over = _new_owner(), holders.this_process(), None
    _DRIVING.add(owner)
    try:
        try:
            claimed = await store.claim_run(run_id, owner, now=time.time(), ttl=ttl, force=force, holder=me)
            if (dead := _dead_holder(claimed, owner)) is not None:
                replaced = await store.claim_run(
                    run_id, owner, now=time.time(), ttl=ttl, holder=me, replacing=dead.owner
                )
                took_over, claimed = _took_over(replaced, owner, dead), replaced
            claimed = _taken(claimed, owner)
        except asyncio.CancelledError:  # the claim was made (an operation ends whole): give it up again
            with suppress(StoreError):
                await store.release_run(run_id, owner)
            raise
        async with AsyncLease(store, claimed, ttl, took_over) as lease:
            with _marked_held(run_id):
                yield lease
    finally:
        _DRIVING.discard(owner)
