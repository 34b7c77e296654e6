"""A run named by the start of its id, as git names a commit by the start of its hash.

Every ``tether`` command that takes a run accepts any start of its id that no other run's id
shares; one query by prefix (:attr:`tether.stores.RunQuery.id_prefix`) answers, on every store.
"""

from __future__ import annotations

from tether.errors import AmbiguousRunId, RunNotFound
from tether.stores import RunQuery, Store

CANDIDATES_SHOWN = 5
"""How many of the runs an ambiguous start could name are listed (the newest)."""


def resolve_run_id(store: Store, given: str, *, tenant: str | None = None) -> str:
    """The id of the one run whose id starts with ``given``; ``given`` itself when a run has that id.

    Raises:
        RunNotFound: no run's id (visible to ``tenant``) starts with ``given``.
        AmbiguousRunId: several do, and none is ``given`` whole.
    """
    found = store.query_runs(RunQuery(id_prefix=given, tenant=tenant), limit=CANDIDATES_SHOWN)
    ids = [record.id for record in found.records]
    if found.total == 1 or given in ids:
        return given if given in ids else ids[0]
    if found.total == 0:
        raise RunNotFound(given)
    try:  # a whole id that is also the start of longer ones, beyond the candidates read
        return store.load_run(given, tenant=tenant).id
    except RunNotFound:
        raise AmbiguousRunId(given, ids, found.total) from None
