"""Where runs live: a protocol, with in-memory and SQL (sqlmodel) implementations.

A store keeps two things per run: a small row (status, version, summary) rewritten on each
step, and the append-only event log. Each step's events and the row's new version are
written in ONE transaction, guarded by the version the writer loaded (optimistic
concurrency): a writer that lost the race gets :class:`tether.errors.StaleRun`. A third,
the run's lease, says which process drives the run now (see :meth:`Store.claim_run`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tether.errors import ConfigError
from tether.facts.events import Event
from tether.facts.status import ENDED, RunStatus

SCHEMA_VERSION = 5
"""The layout tether stores runs in (tables, row and event data). A SQL database records the
version it was migrated to (see ``tether.stores.sql.MIGRATIONS``); each run's spec records
the one it was written under. 2: the tool-result cache; failed runs say if retryable.
3: run leases (who drives a run). 4: snapshots of runs' folded state. 5: a lease names its
holder process (:class:`Holder`)."""

SNAPSHOT_EVERY = 100
"""A store keeps a snapshot of a run's folded state every this many events, the spacing doubling
each time a long log does (see :func:`tether.core.snapshots.spacing`): resuming reads it and only
the events after it (at most this many or 1/8 of the log, plus one step's)."""


@dataclass(frozen=True)
class RunRecord:
    """The run's row: what listing and status queries need, without the log."""

    id: str
    status: str
    version: int
    tenant: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    """Counters and outcome: steps, tool_calls, usage, output, result, error, pending, and
    ``retryable`` (a failed run that resuming may retry, which ``delete_runs`` keeps)."""
    created_at: float = 0.0
    updated_at: float = 0.0
    unreadable: str | None = None
    """Set only by a listing: what in the stored row could not be read (its spec and summary
    are then empty). Loading that run by id raises :class:`tether.errors.CorruptData`."""


@dataclass(frozen=True)
class Snapshot:
    """A run's state folded from its events up to ``seq`` (see :mod:`tether.core.snapshots`).

    Derived data only: the events stay the truth, and a snapshot the code cannot read the same
    way (another ``format``) is ignored.
    """

    seq: int
    """The last event folded into it."""
    format: str
    """Which code wrote it: a snapshot is used only by code of the same format."""
    state: dict[str, Any]
    """The folded state as JSON."""


@dataclass(frozen=True)
class RunLog:
    """A run's log with the row's version, read at one instant (see :meth:`Store.load_log`)."""

    version: int
    tenant: str | None
    events: list[Event]
    """The whole log; with a snapshot, only the events after it."""
    snapshot: Snapshot | None = None


@dataclass(frozen=True)
class Holder:
    """The process holding a lease, as its host knows it (see :mod:`tether.stores.holders`).

    On the same host and in the same PID namespace, it tells a dead holder at once: no
    process has its pid, or the one that has it started at another time.
    """

    host: str
    """The host's identity: ``boot:`` its Linux boot id, else ``machine:`` its machine id or ``name:`` its name."""
    pid_namespace: int | None
    """The inode of the process's PID namespace; None where it cannot be read (not Linux)."""
    pid: int
    started: int | None
    """When the process started, in clock ticks since boot; None where it cannot be read."""


@dataclass(frozen=True)
class RunLease:
    """Which process drives a run, until when: the answer of :meth:`Store.claim_run`."""

    run_id: str
    owner: str
    """The holder's id, ``host:pid:token``: unique per drive, readable in messages."""
    expires_at: float
    """Unix time after which the holder, unless it renewed, is presumed gone."""
    claimed_at: float
    """Unix time this holder took the lease (renewals keep it)."""
    holder: Holder | None = None
    """The holder process, as it said when it claimed the lease; None if it did not (tether before schema 5)."""


@dataclass(frozen=True)
class RunQuery:
    """Which runs a paged listing finds (see :meth:`Store.query_runs`): every filter left out matches every run."""

    status: str | None = None
    """The stored status (``awaitingApproval``...)."""
    waiting_retry: bool | None = None
    """True: only runs parked for a tool retry; False: none of those; None: both (as :meth:`Store.list_runs`)."""
    tenant: str | None = None
    agent: str | None = None
    """Part of the name of the run's agent (``spec["agent"]``), any case."""
    model: str | None = None
    """Part of the run's model (``spec["model"]``), any case."""
    created_from: float | None = None
    """Created at or after this Unix time."""
    created_before: float | None = None
    """Created before this Unix time."""
    text: str = ""
    """Part of, in any case (ASCII letters only, on SQLite): the run's id, its prompt, a tool it started or
    waits on (with that call's input), its error or its answer. (A run written before its row kept its
    prompt has its opening messages searched as JSON instead, keys included.)"""
    id_prefix: str | None = None
    """Runs whose id starts with exactly this (case kept): a run named by the start of its id."""
    roots_only: bool = False
    """Leave out child runs (their spec has a ``parent``: see :mod:`tether.core.children`)."""
    longest_waiting_first: bool = False
    """Order by when each parked run's calls were asked (:func:`waiting_since`), oldest first (an inbox),
    instead of newest created first."""


@dataclass(frozen=True)
class RunsFound:
    """One page of the runs a :class:`RunQuery` finds, and how many it finds in all."""

    records: list[RunRecord]
    total: int


class Store(Protocol):
    """Persistence for runs and their events."""

    @property
    def snapshot_every(self) -> int:
        """Events between snapshots of a run's state (see :data:`SNAPSHOT_EVERY`); 0: none are kept."""
        ...

    def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        """Insert a new run with its first events."""
        ...

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        """Atomically add ``events`` and replace the row, if its version is still ``expected_version``.

        Raises:
            StaleRun: another writer advanced the run first; nothing was written.
            StoreError: the database failed; nothing was written, unless a connection dropped
                during the commit (``transient`` errors may pass if the write is tried again).
        """
        ...

    def load_run(self, run_id: str, *, tenant: str | None = None) -> RunRecord:
        """The run's row; :class:`tether.errors.RunNotFound` if absent or another tenant's."""
        ...

    def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """The run's log, oldest first: all of it, or the events whose seq is above ``after`` (a stream's cursor).

        ``limit``: at most this many (the oldest; at least 1). One indexed read, checking the run is
        ``tenant``'s (:class:`tether.errors.RunNotFound` if not, or if absent) in the same statement.
        """
        ...

    def load_log(self, run_id: str, *, tenant: str | None = None, snapshot_format: str | None = None) -> RunLog:
        """The log and the row's version from one consistent read, to continue the run from.

        Read apart, another process could commit a step in between: the version would then
        lag the events, and the next write would fail with a needless StaleRun. With a
        ``snapshot_format``, the run's latest snapshot in that format (if any) comes with only
        the events after it.
        """
        ...

    def save_snapshot(self, run_id: str, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` as the run's latest (replacing an older one); nothing if the run is gone.

        Written after the events it folds were committed, so it never runs ahead of the log.
        """
        ...

    def list_runs(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        waiting_retry: bool | None = None,
    ) -> list[RunRecord]:
        """Newest runs first, optionally filtered.

        ``waiting_retry``: True keeps only runs parked for a tool retry (their summary has a
        ``next_due_at``), False leaves them out, None keeps both. Filtered before ``limit``, so
        asking for the runs shown ``executing_tool`` or ``waiting_retry`` misses none.
        """
        ...

    def query_runs(self, query: RunQuery, *, limit: int = 50, offset: int = 0) -> RunsFound:
        """The runs ``query`` finds, newest first (or longest waiting first): ``limit`` of them from ``offset``.

        With the number found in all, read in the same transaction, so a page and its count agree.
        Filters on the status, tenant and creation time narrow the rows by their indexes first.

        Raises:
            ConfigError: a negative ``limit`` or ``offset``.
        """
        ...

    def list_due(self, now: float, *, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Runs waiting for a tool retry due at or before Unix time ``now``, earliest due first.

        The due time is the row's ``summary["next_due_at"]``; these are the runs a worker or a
        cron job resumes. Child runs (their spec has a ``parent``: see :mod:`tether.core.children`)
        are left out: their root run waits with them and is listed instead, and driving it
        drives them.
        """
        ...

    def delete_runs(
        self,
        *,
        finished_before: float,
        statuses: Collection[str],
        tenant: str | None = None,
        include_retryable: bool = False,
        include_parked: bool = False,
    ) -> int:
        """Delete finished runs (and their events) last updated before a Unix time; return how many.

        Only final statuses may be given (see :func:`check_deletable`): a parked or running
        run is never deleted unless ``include_parked`` (then every run that has not ended,
        :data:`PARKED_STATUSES`, goes too: awaiting a decision, waiting for a retry, or left
        mid-step; but not one whose lease lasts until the cutoff or later: a driver held it
        since), nor, unless ``include_retryable``, a run that failed transiently
        (``summary["retryable"]``): resuming it may still finish it. The conditions hold at
        the moment of deletion, even if another process resumes a run meanwhile. A deleted
        run's lease goes with it.
        """
        ...

    def claim_run(
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
        """Take the lease on driving ``run_id`` until ``now + ttl``, atomically; return the lease in force.

        The lease is taken when nobody holds it, when the holder's expired (``expires_at <=
        now``), when ``owner`` holds it already, when ``replacing`` names its owner (a holder
        found dead), or with ``force``; otherwise the holder's lease comes back unchanged, and
        the caller, seeing another owner, leaves the run alone. ``holder`` is kept with the
        lease (who ``owner`` is). Whether the run exists is not checked.
        """
        ...

    def renew_run(self, run_id: str, owner: str, *, now: float, ttl: float) -> RunLease | None:
        """Extend ``owner``'s lease to ``now + ttl`` if the row still names it; return the lease in force.

        Unlike a claim, a renewal never takes a lease that is free or another's: if its
        owner's lease was taken (and maybe released since), that drive has lost the run.
        None when nobody holds it.
        """
        ...

    def release_run(self, run_id: str, owner: str) -> None:
        """Give up the lease on ``run_id`` if ``owner`` still holds it; otherwise do nothing."""
        ...

    def lease_of(self, run_id: str) -> RunLease | None:
        """The run's lease as stored (an expired one too), without claiming it; None when nobody holds it.

        What a page reads to tell whether someone drives the run now.
        """
        ...

    def cache_get(self, key: str, now: float) -> str | None:
        """The tool result cached under ``key``, or None if absent or expired at Unix time ``now``."""
        ...

    def cache_put(self, key: str, tool: str, value: str, expires_at: float) -> None:
        """Cache a successful tool result until ``expires_at``, replacing any entry for ``key``.

        Shared by every run and process using the store (see :mod:`tether.core.cache`).
        """
        ...

    def cache_purge(self, now: float) -> int:
        """Delete the cache entries expired at Unix time ``now``; return how many."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class AsyncStore(Protocol):
    """:class:`Store`'s contract for an event loop: the same methods, each awaited, none blocking the loop.

    :class:`tether.stores.sql.AsyncSQLStore` is one natively; :func:`tether.stores.awaitable.as_async_store`
    makes any :class:`Store` one. What each method does, raises and guarantees is said on
    :class:`Store`, and one contract suite checks both kinds. One more guarantee: an operation,
    once begun, runs to its end even if the awaiting task is cancelled meanwhile (the
    cancellation is raised after it), so a cancelled drive leaves no write half-made and no
    connection mid-transaction (:func:`tether.stores.awaitable.completed` does this).
    """

    @property
    def snapshot_every(self) -> int:
        """See :attr:`Store.snapshot_every`."""
        ...

    async def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        """See :meth:`Store.create_run`."""
        ...

    async def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        """See :meth:`Store.append`."""
        ...

    async def load_run(self, run_id: str, *, tenant: str | None = None) -> RunRecord:
        """See :meth:`Store.load_run`."""
        ...

    async def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """See :meth:`Store.load_events`."""
        ...

    async def load_log(self, run_id: str, *, tenant: str | None = None, snapshot_format: str | None = None) -> RunLog:
        """See :meth:`Store.load_log`."""
        ...

    async def save_snapshot(self, run_id: str, snapshot: Snapshot) -> None:
        """See :meth:`Store.save_snapshot`."""
        ...

    async def list_runs(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        waiting_retry: bool | None = None,
    ) -> list[RunRecord]:
        """See :meth:`Store.list_runs`."""
        ...

    async def query_runs(self, query: RunQuery, *, limit: int = 50, offset: int = 0) -> RunsFound:
        """See :meth:`Store.query_runs`."""
        ...

    async def list_due(self, now: float, *, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """See :meth:`Store.list_due`."""
        ...

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
        ...

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
        ...

    async def renew_run(self, run_id: str, owner: str, *, now: float, ttl: float) -> RunLease | None:
        """See :meth:`Store.renew_run`."""
        ...

    async def release_run(self, run_id: str, owner: str) -> None:
        """See :meth:`Store.release_run`."""
        ...

    async def lease_of(self, run_id: str) -> RunLease | None:
        """See :meth:`Store.lease_of`."""
        ...

    async def cache_get(self, key: str, now: float) -> str | None:
        """See :meth:`Store.cache_get`."""
        ...

    async def cache_put(self, key: str, tool: str, value: str, expires_at: float) -> None:
        """See :meth:`Store.cache_put`."""
        ...

    async def cache_purge(self, now: float) -> int:
        """See :meth:`Store.cache_purge`."""
        ...

    async def close(self) -> None:
        """See :meth:`Store.close`."""
        ...


PARKED_STATUSES: frozenset[RunStatus] = frozenset(RunStatus) - ENDED
"""Runs that have not ended; ``delete_runs(include_parked=True)`` may delete them once old."""
DUE_KEY = "next_due_at"
"""The summary key holding a parked run's retry due time."""
WAITING_KEY = "waiting_since"
"""The summary key holding when a parked run's calls were asked (see :func:`waiting_since`)."""
PARENT_KEY = "parent"
"""The spec key of a child run's link to its parent (see :mod:`tether.core.children`); a root run has none."""


def waiting_since(record: RunRecord) -> float:
    """Since when a parked run's calls wait: when they were asked, not when the row last changed.

    A decision on one call of a batch moves ``updated_at``; a row written before the summary kept
    :data:`WAITING_KEY` waits since ``updated_at``.
    """
    since = record.summary.get(WAITING_KEY)
    return float(since) if isinstance(since, int | float) and not isinstance(since, bool) else record.updated_at


def deletable(
    record: RunRecord,
    *,
    finished_before: float,
    statuses: Collection[str],
    include_retryable: bool,
    include_parked: bool = False,
    lease: RunLease | None = None,
) -> bool:
    """Whether ``delete_runs`` may delete this run (as the SQL store's WHERE clause says).

    A parked run whose ``lease`` expires at or after the cutoff was driven since: it stays.
    """
    if not record.updated_at < finished_before:
        return False
    if include_parked and record.status in PARKED_STATUSES:
        return lease is None or lease.expires_at < finished_before
    if record.status not in statuses:
        return False
    return include_retryable or not (record.status == RunStatus.failed and record.summary.get("retryable") is True)


def check_deletable(statuses: Collection[str]) -> None:
    """Refuse to delete anything but finished runs."""
    unsafe = set(statuses) - ENDED
    if unsafe or not statuses:
        finals = ", ".join(sorted(ENDED))
        raise ConfigError(f"only finished runs ({finals}) can be deleted, not {sorted(unsafe) or 'nothing'}")


def check_limit(limit: int | None, offset: int = 0, *, least: int = 0) -> None:
    """Refuse a ``limit`` below ``least`` (SQL would read a negative one as "no limit") or a negative ``offset``.

    A None ``limit`` is no limit.
    """
    if limit is not None and limit < least:
        raise ConfigError(f"limit must be >= {least}, not {limit}")
    if offset < 0:
        raise ConfigError(f"offset must be >= 0, not {offset}")


def shown_url(url: str) -> str:
    """``url`` with its password and secret query values as ``***``: the only form in which a URL is printed."""
    if url == "memory://":
        return url
    from tether.stores.sql import redact_url  # SQLAlchemy parses it, loaded only when needed

    return redact_url(url)


def open_store(url: str | None, *, must_exist: bool = False) -> Store:
    """A store for a URL: ``memory://`` or any SQLAlchemy URL (SQLite, PostgreSQL).

    ``must_exist``: refuse a SQLite file that is not there (a command that only reads or decides runs).
    """
    if url == "memory://":
        from tether.stores.memory import MemoryStore

        return MemoryStore()
    from tether.stores.sql import SQLStore

    return SQLStore(url or DEFAULT_URL, must_exist=must_exist)


def open_async_store(url: str | None) -> AsyncStore:
    """An :class:`AsyncStore` for a URL, as :func:`open_store` reads it.

    ``memory://`` is a :class:`~tether.stores.memory.MemoryStore` (it never blocks, so it is
    called directly); a SQLite or PostgreSQL URL is an :class:`~tether.stores.sql.AsyncSQLStore`
    (``sqlite:///runs.db`` on a thread of the store's own, ``postgresql://`` through psycopg 3's async mode).
    """
    if url == "memory://":
        from tether.stores.awaitable import as_async_store
        from tether.stores.memory import MemoryStore

        return as_async_store(MemoryStore())
    from tether.stores.sql import AsyncSQLStore

    return AsyncSQLStore(url or DEFAULT_URL)


DEFAULT_URL = "sqlite:///tether.db"
"""Where runs live when no URL is given (nor ``$TETHER_DB``, for the CLI and the service)."""

__all__ = [
    "DEFAULT_URL",
    "DUE_KEY",
    "PARENT_KEY",
    "PARKED_STATUSES",
    "SCHEMA_VERSION",
    "SNAPSHOT_EVERY",
    "WAITING_KEY",
    "AsyncStore",
    "Holder",
    "RunLease",
    "RunLog",
    "RunQuery",
    "RunRecord",
    "RunsFound",
    "Snapshot",
    "Store",
    "check_deletable",
    "check_limit",
    "deletable",
    "open_async_store",
    "open_store",
    "shown_url",
    "waiting_since",
]
