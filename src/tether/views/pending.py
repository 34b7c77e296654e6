"""Pending approvals across runs, read from the stores' rows alone.

A parked run's row already carries its undecided calls (``summary["pending_approvals"]``,
written in the same transaction as the events), so listing what waits for a person costs
one indexed query and never replays an event log. Decide with
:meth:`tether.Runner.decide` from any process; the run resumes on its next drive.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.core.approvals import PendingApproval
from tether.core.links import chain_of, link_of
from tether.facts.status import AWAITING
from tether.stores import AsyncStore, RunQuery, RunRecord, Store, waiting_since


def pending_approvals(
    store: Store, *, tenant: str | None = None, run_id: str | None = None, limit: int | None = None
) -> list[PendingApproval]:
    """Calls waiting for a person, the longest parked run's first.

    Args:
        store: where the runs live.
        tenant: only this tenant's runs (None: every tenant's, for operators).
        run_id: only this run and the child runs below it (whose calls park it too);
            :class:`~tether.errors.RunNotFound` if it is not visible to ``tenant``. A run
            that is not parked has none.
        limit: at most this many parked runs are read, those waiting longest; None: every one
            (counted first), so a count of what is returned is the count of what waits.
    """
    if run_id is not None:
        record = store.load_run(run_id, tenant=tenant)
        return _pending_in([record, *(store.load_run(below, tenant=tenant) for below in _runs_below(record))])
    parked = _parked(tenant)
    if limit is None:
        limit = store.query_runs(parked, limit=0).total
    return _pending_in(store.query_runs(parked, limit=limit).records)


async def apending_approvals(
    store: AsyncStore, *, tenant: str | None = None, run_id: str | None = None, limit: int | None = None
) -> list[PendingApproval]:
    """:func:`pending_approvals` from an :class:`~tether.stores.AsyncStore` (a service's event loop)."""
    if run_id is not None:
        record = await store.load_run(run_id, tenant=tenant)
        return _pending_in([record, *[await store.load_run(below, tenant=tenant) for below in _runs_below(record)]])
    parked = _parked(tenant)
    if limit is None:
        limit = (await store.query_runs(parked, limit=0)).total
    return _pending_in((await store.query_runs(parked, limit=limit)).records)


def _parked(tenant: str | None) -> RunQuery:
    """The parked runs (of ``tenant``), those waiting longest first."""
    return RunQuery(status=AWAITING, tenant=tenant, longest_waiting_first=True)


def _runs_below(record: RunRecord) -> list[str]:
    """The runs below ``record`` whose calls its row lists as waiting (a child's, a grandchild's...)."""
    items = record.summary.get("pending_approvals") or []
    return sorted({str(item["run_id"]) for item in items if item.get("run_id", record.id) != record.id})


def _pending_in(records: Sequence[RunRecord]) -> list[PendingApproval]:
    """The calls waiting in these rows, oldest parked run first."""
    found: list[PendingApproval] = []
    for record in sorted(records, key=lambda r: (waiting_since(r), r.id)):
        if record.status == AWAITING:
            found.extend(_of(record))
    return found


def _of(record: RunRecord) -> list[PendingApproval]:
    """The row's own undecided calls (a parent's row also names its children's: those are listed from their rows)."""
    chain = tuple(chain_of(record.id, record.spec)) if link_of(record.spec) is not None else ()
    since = waiting_since(record)
    return [
        PendingApproval.from_item(item, run_id=record.id, tenant=record.tenant, waiting_since=since, chain=chain)
        for item in record.summary.get("pending_approvals") or []
        if item.get("run_id", record.id) == record.id
    ]


__all__ = ["PendingApproval", "apending_approvals", "pending_approvals"]
