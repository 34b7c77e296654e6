"""Who drives a run: a lease row in the store, claimed first and renewed while the drive lasts.

Whether another process is still driving a run is read from the database alone, never
from pids: a pid says nothing across hosts or PID namespaces (a driver in a container on
the same host can share a hostname and reuse a pid). A drive claims the run's lease before
any model call or tool start (:func:`hold`); a heartbeat thread renews it every third of its
time to live, so a long tool, model call or wait keeps it; a process that dies stops
renewing and its lease expires. Whoever holds the lease owns every call in flight: a call
another owner started and never finished was abandoned, and the in-doubt rules resolve it.

A drive that finds its lease taken (an operator's ``--force``, or a renewal that came too
late) stops before its next write (:class:`~tether.errors.RunBusy`). Owner strings are
``host:pid:token``, unique per drive, for messages only.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from tether.errors import RunBusy, StoreError
from tether.stores import RunLease, Store

DEFAULT_TTL = 30.0
"""Seconds a lease lasts unless renewed: how long a killed driver keeps its runs busy."""


def _new_owner() -> str:
    """A new drive's owner id: this host and pid (for people to read), and a random token."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """A run's lease while this process holds it: renewed by a heartbeat, checked before work.

    Get one from :func:`hold`; as a context manager it renews the lease while inside, and
    gives it up on the way out.
    """

    def __init__(self, store: Store, claimed: RunLease, ttl: float) -> None:
        self.store = store
        self.run_id = claimed.run_id
        self.owner = claimed.owner
        self.ttl = ttl
        self.expires_at = claimed.expires_at
        self.lost: str | None = None
        """Who took the run over (``another process`` if it has let the run go since); once set,
        this drive must write nothing more."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name=f"tether-lease-{self.run_id}", daemon=True)

    def check(self) -> None:
        """Raise :class:`RunBusy` unless this drive still holds the lease (before any model call, tool or write).

        Cheap while the heartbeat keeps the lease fresh; when it has not (the process was
        paused, the database unreachable), it is renewed here first.
        """
        if self.lost is None and time.time() > self.expires_at - self.ttl / 3:
            self.renew()
        if self.lost is not None:
            raise RunBusy(self.run_id, self.lost, None, lost=True)

    def renew(self) -> None:
        """Extend the lease; if it was taken meanwhile (and maybe released since), it is lost for good.

        Never re-taken: after ``tether resume --force`` parked a run and let it go, a hung
        old driver must not grab it back.
        """
        with self._lock:
            if self.lost is not None:
                return
            lease = self.store.renew_run(self.run_id, self.owner, now=time.time(), ttl=self.ttl)
            if lease is None:
                self.lost = "another process"
            elif lease.owner == self.owner:
                self.expires_at = lease.expires_at
            else:
                self.lost = lease.owner

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


@contextmanager
def hold(store: Store, run_id: str, *, ttl: float = DEFAULT_TTL, force: bool = False) -> Iterator[Lease]:
    """Claim the run's lease for the duration of a drive; :class:`RunBusy` if another process holds it.

    ``force`` takes it even from a live holder (an operator who knows that holder is gone;
    if it is not, it stops at its next check).
    """
    if ttl <= 0:
        raise ValueError(f"a lease's ttl must be positive, not {ttl}")
    owner = _new_owner()
    claimed = store.claim_run(run_id, owner, now=time.time(), ttl=ttl, force=force)
    if claimed.owner != owner:
        raise RunBusy(run_id, claimed.owner, claimed.expires_at)
    with Lease(store, claimed, ttl) as lease:
        yield lease
