"""Any :class:`~tether.stores.Store` as an :class:`~tether.stores.AsyncStore`, without blocking the loop.

A store that may block (a SQL store waits on the database, a lock, the disk) is called in a
worker thread (``asyncio.to_thread``), so ``AsyncRunner(agent, store=SQLStore(...))`` keeps the
loop free; a :class:`~tether.stores.memory.MemoryStore` never blocks (a dictionary under a
lock held for microseconds), so it is called directly and costs no thread hop.
:class:`~tether.stores.sql.AsyncSQLStore` needs none of this: it is awaitable natively.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import ParamSpec, TypeVar, cast

from tether.facts.events import Event
from tether.stores import AsyncStore, Holder, RunLease, RunLog, RunQuery, RunRecord, RunsFound, Snapshot, Store
from tether.stores.memory import MemoryStore

P = ParamSpec("P")
T = TypeVar("T")


class AwaitableStore:
    """A sync store behind :class:`~tether.stores.AsyncStore`'s methods (see :func:`as_async_store`).

    Each call runs to its end, even when the awaiting task is cancelled meanwhile (the
    cancellation is raised once it has): a write is made whole or not at all, and nothing the
    store does outlives what the caller was told.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        """The sync store it calls."""
        self._in_thread = not isinstance(store, MemoryStore)

    @property
    def snapshot_every(self) -> int:
        """The sync store's (see :attr:`Store.snapshot_every`)."""
        return self.store.snapshot_every

    async def _call(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if not self._in_thread:
            return method(*args, **kwargs)
        return await completed(asyncio.to_thread(method, *args, **kwargs))  # a thread cannot be stopped anyway

    async def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        """See :meth:`Store.create_run`."""
        return await self._call(self.store.create_run, record, events)

    async def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        """See :meth:`Store.append`."""
        return await self._call(self.store.append, record, expected_version, events)

    async def load_run(self, run_id: str, *, tenant: str | None = None) -> RunRecord:
        """See :meth:`Store.load_run`."""
        return await self._call(self.store.load_run, run_id, tenant=tenant)

    async def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """See :meth:`Store.load_events`."""
        return await self._call(self.store.load_events, run_id, tenant=tenant, after=after, limit=limit)

    async def load_log(self, run_id: str, *, tenant: str | None = None, snapshot_format: str | None = None) -> RunLog:
        """See :meth:`Store.load_log`."""
        return await self._call(self.store.load_log, run_id, tenant=tenant, snapshot_format=snapshot_format)

    async def save_snapshot(self, run_id: str, snapshot: Snapshot) -> None:
        """See :meth:`Store.save_snapshot`."""
        return await self._call(self.store.save_snapshot, run_id, snapshot)

    async def list_runs(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        waiting_retry: bool | None = None,
    ) -> list[RunRecord]:
        """See :meth:`Store.list_runs`."""
        return await self._call(
            self.store.list_runs, status=status, tenant=tenant, limit=limit, waiting_retry=waiting_retry
        )

    async def query_runs(self, query: RunQuery, *, limit: int = 50, offset: int = 0) -> RunsFound:
        """See :meth:`Store.query_runs`."""
        return await self._call(self.store.query_runs, query, limit=limit, offset=offset)

    async def list_due(self, now: float, *, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """See :meth:`Store.list_due`."""
        return await self._call(self.store.list_due, now, tenant=tenant, limit=limit)

    async def delete_runs(
        self,
        *,
        finished_before: float,
        statuses: Collection[str],
        tenant: str | None = None,
        include_retryable: bool = False,
        include_parked: bool = False,
    ) -> int:
        """See :meth:`Store.delete_runs`."""
        delete = functools.partial(
            self.store.delete_runs,
            finished_before=finished_before,
            statuses=statuses,
            tenant=tenant,
            include_retryable=include_retryable,
            include_parked=include_parked,
        )
        return await self._call(delete)

    async def claim_run(
        self,
        run_id: str,
        owner: str,
        *,
        now: float,
        ttl: float,
        force: bool = False,
        holder: Holder | None = None,
        replacing: str | None = None,
    ) -> RunLease:
        """See :meth:`Store.claim_run`."""
        return await self._call(
            self.store.claim_run, run_id, owner, now=now, ttl=ttl, force=force, holder=holder, replacing=replacing
        )

    async def renew_run(self, run_id: str, owner: str, *, now: float, ttl: float) -> RunLease | None:
        """See :meth:`Store.renew_run`."""
        return await self._call(self.store.renew_run, run_id, owner, now=now, ttl=ttl)

    async def release_run(self, run_id: str, owner: str) -> None:
        """See :meth:`Store.release_run`."""
        return await self._call(self.store.release_run, run_id, owner)

    async def lease_of(self, run_id: str) -> RunLease | None:
        """See :meth:`Store.lease_of`."""
        return await self._call(self.store.lease_of, run_id)

    async def cache_get(self, key: str, now: float) -> str | None:
        """See :meth:`Store.cache_get`."""
        return await self._call(self.store.cache_get, key, now)

    async def cache_put(self, key: str, tool: str, value: str, expires_at: float) -> None:
        """See :meth:`Store.cache_put`."""
        return await self._call(self.store.cache_put, key, tool, value, expires_at)

    async def cache_purge(self, now: float) -> int:
        """See :meth:`Store.cache_purge`."""
        return await self._call(self.store.cache_purge, now)

    async def close(self) -> None:
        """See :meth:`Store.close`."""
        return await self._call(self.store.close)


async def completed(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the awaiting task is cancelled meanwhile; then re-raise that.

    For writes and for work that cannot be stopped (a thread): whoever cancelled learns of it
    only once the store holds the whole write or none of it.
    """
    done = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait([done])
        raise


def is_async_store(store: Store | AsyncStore) -> bool:
    """Whether ``store`` is awaited (its methods are coroutine functions) rather than called."""
    return inspect.iscoroutinefunction(store.append)


def as_async_store(store: Store | AsyncStore) -> AsyncStore:
    """``store`` itself if it is an :class:`~tether.stores.AsyncStore`, else an :class:`AwaitableStore` around it."""
    if is_async_store(store):
        return cast(AsyncStore, store)
    return AwaitableStore(cast(Store, store))


__all__ = ["AwaitableStore", "as_async_store", "completed", "is_async_store"]
