"""An in-memory store: same contract as the SQL one, for tests and ephemeral runs."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tether.errors import RunNotFound, StaleRun, StoreError
from tether.facts.events import Event, decode
from tether.facts.status import WAITING_RETRY_STATUS
from tether.stores import (
    DUE_KEY,
    PARENT_KEY,
    SNAPSHOT_EVERY,
    Holder,
    RunLease,
    RunLog,
    RunQuery,
    RunRecord,
    RunsFound,
    Snapshot,
    check_deletable,
    check_limit,
    deletable,
    waiting_since,
)


@dataclass(frozen=True)
class _StoredEvent:
    seq: int
    type: str
    data: str
    at: float

    def load(self, run_id: str) -> Event:
        return decode(run_id, self.seq, self.type, json.loads(self.data), self.at)


@dataclass(frozen=True)
class _StoredRun:
    record: RunRecord
    spec: str
    summary: str

    def load(self) -> RunRecord:
        return replace(self.record, spec=json.loads(self.spec), summary=json.loads(self.summary))


def _dump(run_id: str, value: Any) -> str:
    """JSON text, as a SQL store would keep it: callers' later mutations cannot reach it."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as error:
        raise StoreError(f"cannot store run {run_id!r}: {error}") from error


def _dump_events(run_id: str, events: Sequence[Event]) -> list[_StoredEvent]:
    return [_StoredEvent(e.seq, e.type, _dump(run_id, e.data), e.at) for e in events]


def _found(query: RunQuery, record: RunRecord, events: list[_StoredEvent]) -> bool:
    """Whether ``query`` finds the run, as the SQL store's WHERE clause says."""
    spec, summary = record.spec, record.summary
    created = record.created_at
    if (query.status is not None and record.status != query.status) or (
        query.tenant is not None and record.tenant != query.tenant
    ):
        return False
    if (query.created_from is not None and created < query.created_from) or (
        query.created_before is not None and created >= query.created_before
    ):
        return False
    if query.waiting_retry is not None and (summary.get(DUE_KEY) is not None) != query.waiting_retry:
        return False
    if query.roots_only and spec.get(PARENT_KEY) is not None:
        return False
    if query.id_prefix is not None and not record.id.startswith(query.id_prefix):
        return False
    for key, part in (("agent", query.agent), ("model", query.model)):
        if part and part.lower() not in str(spec.get(key) or "").lower():
            return False
    return not query.text or _text_found(query.text, record, events)


def _text_found(text: str, record: RunRecord, events: list[_StoredEvent]) -> bool:
    """Where the SQL store looks for ``text``: the id, prompt, tools, pending calls, error, answer."""
    needle, spelled = text.lower(), json.dumps(text, ensure_ascii=False)[1:-1].lower()
    spec, summary = record.spec, record.summary
    said = [record.id, summary.get("error"), summary.get("output"), spec.get("prompt")]
    said += [json.loads(e.data).get("tool") for e in events if e.type == "tool_started"]
    if any(isinstance(one, str) and needle in one.lower() for one in said):
        return True
    as_json = [json.dumps(summary.get("pending_approvals"), ensure_ascii=False)]
    if spec.get("prompt") is None:  # written before rows kept the prompt: its first event's messages
        as_json += [json.dumps(json.loads(e.data).get("messages"), ensure_ascii=False) for e in events if e.seq == 0]
    return any(spelled in one.lower() for one in as_json)


class MemoryStore:
    """Keeps runs in dictionaries; thread-safe; gone when the process ends.

    Content is kept as JSON text, so what comes back is what a SQL store would return
    (tuples become lists, and mutating a loaded or written object changes nothing stored).
    """

    def __init__(self, *, snapshot_every: int = SNAPSHOT_EVERY) -> None:
        """``snapshot_every``: see :attr:`tether.stores.Store.snapshot_every`."""
        self.snapshot_every = snapshot_every
        self._rows: dict[str, _StoredRun] = {}
        self._events: dict[str, dict[int, _StoredEvent]] = {}
        self._snapshots: dict[str, tuple[int, str, str]] = {}
        """The latest snapshot of each run: (seq, format, state as JSON text)."""
        self._cache: dict[str, tuple[str, float]] = {}
        """Tool-result cache: key -> (value, expires_at)."""
        self._leases: dict[str, RunLease] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Nothing to release; for symmetry with the SQL store."""

    def cache_get(self, key: str, now: float) -> str | None:
        """The cached value, if present and not expired at ``now``."""
        with self._lock:
            entry = self._cache.get(key)
        if entry is None or entry[1] <= now:
            return None
        return entry[0]

    def cache_put(self, key: str, tool: str, value: str, expires_at: float) -> None:
        """Store (or replace) a cached tool result."""
        with self._lock:
            self._cache[key] = (value, expires_at)

    def cache_purge(self, now: float) -> int:
        """Delete expired cache entries."""
        with self._lock:
            expired = [key for key, (_, expires_at) in self._cache.items() if expires_at <= now]
            for key in expired:
                del self._cache[key]
        return len(expired)

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
        """Take or renew the run's lease, unless another owner's is live (see :meth:`Store.claim_run`)."""
        with self._lock:
            held = self._leases.get(run_id)
            free = held is None or held.owner in (owner, replacing) or held.expires_at <= now
            if held is not None and not free and not force:
                return held
            claimed_at = held.claimed_at if held is not None and held.owner == owner else now
            lease = self._leases[run_id] = RunLease(run_id, owner, now + ttl, claimed_at, holder)
        return lease

    def renew_run(self, run_id: str, owner: str, *, now: float, ttl: float) -> RunLease | None:
        """Extend ``owner``'s lease if it still holds it; return the lease in force."""
        with self._lock:
            held = self._leases.get(run_id)
            if held is not None and held.owner == owner:
                held = self._leases[run_id] = RunLease(run_id, owner, now + ttl, held.claimed_at, held.holder)
        return held

    def release_run(self, run_id: str, owner: str) -> None:
        """Drop the run's lease if ``owner`` holds it."""
        with self._lock:
            held = self._leases.get(run_id)
            if held is not None and held.owner == owner:
                del self._leases[run_id]

    def lease_of(self, run_id: str) -> RunLease | None:
        """The run's lease, if any (see :meth:`Store.lease_of`)."""
        with self._lock:
            return self._leases.get(run_id)

    def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        """Insert a new run."""
        stored = _StoredRun(
            replace(record, spec={}, summary={}),
            _dump(record.id, record.spec),
            _dump(record.id, record.summary),
        )
        log = _dump_events(record.id, events)
        by_seq = {e.seq: e for e in log}
        with self._lock:
            if record.id in self._rows:
                raise StoreError(f"run {record.id!r} already exists")
            if len(by_seq) != len(log):
                raise StoreError(f"run {record.id!r}: duplicate event seq in its first events")
            self._rows[record.id] = stored
            self._events[record.id] = by_seq

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        """Add events and replace the row if nobody else advanced it."""
        summary = _dump(record.id, record.summary)
        log = _dump_events(record.id, events)
        with self._lock:
            current = self._rows.get(record.id)
            if current is None:
                raise RunNotFound(record.id)
            if current.record.version != expected_version:
                raise StaleRun(record.id, expected_version)
            existing = self._events[record.id]
            seqs = {e.seq for e in log}
            # keys().isdisjoint iterates the (small) new set; set.isdisjoint(dict) walks the whole log.
            if len(seqs) != len(log) or not existing.keys().isdisjoint(seqs):
                raise StaleRun(record.id, expected_version)  # as SQL: the unique (run, seq)
            # A step never rewrites what cannot change (id, tenant, spec, creation time).
            row = replace(
                current.record,
                status=record.status,
                version=record.version,
                updated_at=record.updated_at,
            )
            self._rows[record.id] = _StoredRun(row, current.spec, summary)
            existing.update((e.seq, e) for e in log)

    def load_run(self, run_id: str, *, tenant: str | None = None) -> RunRecord:
        """The row, if visible to ``tenant``."""
        with self._lock:
            stored = self._rows.get(run_id)
        if stored is None or (tenant is not None and stored.record.tenant != tenant):
            raise RunNotFound(run_id)
        return stored.load()

    def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """The log (or its events after seq ``after``, at most ``limit``), oldest first."""
        check_limit(limit, least=1)
        with self._lock:
            stored = self._rows.get(run_id)
            if stored is None or (tenant is not None and stored.record.tenant != tenant):
                raise RunNotFound(run_id)
            cursor = -1 if after is None else after
            log = sorted((e for e in self._events[run_id].values() if e.seq > cursor), key=lambda e: e.seq)
        return [e.load(run_id) for e in log[:limit]]

    def load_log(self, run_id: str, *, tenant: str | None = None, snapshot_format: str | None = None) -> RunLog:
        """The log and the row's version, read under one lock (from the snapshot in ``snapshot_format``, if any)."""
        with self._lock:
            stored = self._rows.get(run_id)
            if stored is None or (tenant is not None and stored.record.tenant != tenant):
                raise RunNotFound(run_id)
            kept = self._snapshots.get(run_id)
            if kept is None or kept[1] != snapshot_format:
                kept = None
            after = -1 if kept is None else kept[0]
            log = sorted((e for e in self._events[run_id].values() if e.seq > after), key=lambda e: e.seq)
        snapshot = None if kept is None else Snapshot(kept[0], kept[1], json.loads(kept[2]))
        return RunLog(stored.record.version, stored.record.tenant, [e.load(run_id) for e in log], snapshot)

    def save_snapshot(self, run_id: str, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` as the run's latest, unless the run is gone or holds a newer one of the same format."""
        text = _dump(run_id, snapshot.state)
        with self._lock:
            kept = self._snapshots.get(run_id)
            if run_id in self._rows and (kept is None or kept[1] != snapshot.format or kept[0] <= snapshot.seq):
                self._snapshots[run_id] = (snapshot.seq, snapshot.format, text)

    def delete_runs(
        self,
        *,
        finished_before: float,
        statuses: Collection[str],
        tenant: str | None = None,
        include_retryable: bool = False,
        include_parked: bool = False,
    ) -> int:
        """Delete finished (or parked) runs last updated before ``finished_before`` (see :meth:`Store.delete_runs`)."""
        check_deletable(statuses)
        with self._lock:
            doomed = [
                run_id
                for run_id, stored in self._rows.items()
                if (tenant is None or stored.record.tenant == tenant)
                and deletable(
                    stored.load(),
                    finished_before=finished_before,
                    statuses=statuses,
                    include_retryable=include_retryable,
                    include_parked=include_parked,
                    lease=self._leases.get(run_id),
                )
            ]
            for run_id in doomed:
                del self._rows[run_id]
                del self._events[run_id]
                self._snapshots.pop(run_id, None)
                self._leases.pop(run_id, None)
        return len(doomed)

    def list_due(self, now: float, *, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Runs whose retry is due at ``now``, earliest first."""
        check_limit(limit)
        with self._lock:
            rows = [r.load() for r in self._rows.values() if r.record.status == WAITING_RETRY_STATUS]
        due = [
            r
            for r in rows
            if isinstance(r.summary.get(DUE_KEY), int | float)
            and r.summary[DUE_KEY] <= now
            and (tenant is None or r.tenant == tenant)
            and r.spec.get(PARENT_KEY) is None  # a child is driven by its root, listed instead
        ]
        due.sort(key=lambda r: (r.summary[DUE_KEY], r.id))
        return due[:limit]

    def list_runs(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        waiting_retry: bool | None = None,
    ) -> list[RunRecord]:
        """Newest first (see :meth:`tether.stores.Store.list_runs`)."""
        check_limit(limit)
        with self._lock:
            rows = list(self._rows.values())
        rows = [
            r
            for r in rows
            if (status is None or r.record.status == status) and (tenant is None or r.record.tenant == tenant)
        ]
        rows.sort(key=lambda r: (r.record.created_at, r.record.id), reverse=True)
        loaded = (r.load() for r in rows)
        if waiting_retry is not None:
            loaded = (r for r in loaded if (r.summary.get(DUE_KEY) is not None) == waiting_retry)
        return list(itertools.islice(loaded, limit))

    def query_runs(self, query: RunQuery, *, limit: int = 50, offset: int = 0) -> RunsFound:
        """One page of the runs ``query`` finds, and how many (see :meth:`tether.stores.Store.query_runs`)."""
        check_limit(limit, offset)
        with self._lock:
            rows = [(r.load(), list(self._events.get(r.record.id, {}).values())) for r in self._rows.values()]
        found = [record for record, events in rows if _found(query, record, events)]
        if query.longest_waiting_first:
            found.sort(key=lambda r: (waiting_since(r), r.id))
        else:
            found.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return RunsFound(found[offset : offset + limit], len(found))
