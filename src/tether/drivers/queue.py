"""Runs dispatched by procrastinate, a PostgreSQL task queue in the same database as the runs.

One job drives one run until it parks or ends. The job's ``lock`` and ``queueing_lock`` are
the run id: procrastinate never runs two jobs of one run at once, nor holds two waiting ones,
and the worker still takes the run's lease (:mod:`tether.stores.leases`), so every
exactly-once rule of a drive holds unchanged. Nothing polls on tether's side:

- :meth:`tether.Runner.submit` creates the run and queues its job in ONE transaction;
- a decision (``tether approve``, the service, the web inbox, ``runner.decide``) that frees a
  submitted run queues its job in the decision's own transaction; a cancellation deletes the
  run's waiting job in its own;
- a drive that parks for a tool retry queues a job scheduled at the retry's due time, in the
  transaction of that step.

Those three ride on the store's :class:`~tether.stores.sql.TransactionHook` (:class:`Dispatch`):
procrastinate's own API defers the job on the store's connection, inside its transaction
(``configure(connection=...)``), so a run is queued exactly when its write commits.

A worker that dies holding a job stops sending procrastinate heartbeats; a periodic job
(``tether.recover_stalled``) sends its stalled jobs back to the queue, and the next worker takes
the run's lease once the dead one's expires, resuming under the in-doubt rules. SIGTERM lets
each job finish its current step, queues the run again and stops.

procrastinate is imported only when a submitted run is written or a worker starts: without the
``worker`` extra nothing here runs.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from tether.core.links import link_of
from tether.errors import ConfigError, RunEnded, StoreError
from tether.facts.status import ENDED, RunStatus, status_name
from tether.redact import scrub
from tether.stores import DUE_KEY, AsyncStore, RunRecord, Store, leases, shown_url
from tether.stores.awaitable import AwaitableStore

if TYPE_CHECKING:
    from procrastinate import App

    from tether.stores.sql import Write

DISPATCH_KEY = "dispatch"
"""The run spec's key saying a run was submitted to a queue (``{"queue": NAME}``): its writes queue it."""
DEFAULT_QUEUE = "tether"
DRIVE_TASK = "tether.drive"
RECOVER_TASK = "tether.recover_stalled"
DEFAULT_STALLED_AFTER = leases.DEFAULT_TTL
"""Seconds without a heartbeat after which a worker is presumed dead (and a run's lease expires)."""
RUNNABLE = frozenset({RunStatus.thinking.value, RunStatus.executing_tool.value})
INSTALL_HINT = "pip install 'tether[worker]'"
log = logging.getLogger(__name__)


def queue_of(spec: Mapping[str, Any]) -> str | None:
    """The queue a run was submitted to; None for a run driven in-process."""
    dispatch = spec.get(DISPATCH_KEY)
    return str(dispatch["queue"]) if isinstance(dispatch, dict) and dispatch.get("queue") else None


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (``postgresql+psycopg://...``) as libpq reads it (``postgresql://...``)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme="postgresql"))


def is_postgres(url: str) -> bool:
    """Whether a store URL names PostgreSQL (the only database a queue can live in)."""
    return urlsplit(url).scheme.split("+")[0] in {"postgresql", "postgres"}


def procrastinate_module() -> Any:
    """The procrastinate package, or a one-line error naming the extra that brings it."""
    try:
        import procrastinate
    except ImportError as error:
        raise ConfigError(f"queued runs need procrastinate: {INSTALL_HINT} ({error})") from error
    return procrastinate


def _sql_store(store: Store | AsyncStore) -> Any:
    """The SQL store behind ``store`` (through :func:`~tether.stores.awaitable.as_async_store`), or None."""
    inner = store.store if isinstance(store, AwaitableStore) else store
    # Duck-typed, so a memory-only program never imports SQLAlchemy; a wrapper that forwards
    # attributes (its ``url`` a method) is not a SQL store.
    sql = isinstance(getattr(inner, "url", None), str) and isinstance(getattr(inner, "hooks", None), list)
    return inner if sql else None


def attach(store: Store | AsyncStore) -> None:
    """Let ``store``'s writes of submitted runs queue them (once per store; nothing else is changed)."""
    sql = _sql_store(store)
    if sql is not None and is_postgres(sql.url) and not any(isinstance(h, Dispatch) for h in sql.hooks):
        sql.hooks.append(Dispatch(sql))


def check_can_queue(store: Store | AsyncStore) -> str:
    """The store's URL, after checking it can hold a queue (PostgreSQL, the extra installed)."""
    sql = _sql_store(store)
    if sql is None or not is_postgres(sql.url):
        where = shown_url(sql.url) if sql is not None else type(store).__name__
        raise ConfigError(
            f"queued runs need PostgreSQL and a `tether worker`: {where} cannot hold a queue "
            "(use --db postgresql+psycopg://... ; without --detach the run is driven here)"
        )
    procrastinate_module()
    attach(store)
    return str(sql.url)


_READY: set[str] = set()


def ensure_schema(url: str) -> None:
    """Create procrastinate's tables in the store's database (its current schema) unless there: on first use.

    Taken under an advisory lock, so workers and submitters starting together create it once.
    """
    key = libpq_url(url)
    if key in _READY:
        return
    procrastinate = procrastinate_module()
    import psycopg

    try:
        with psycopg.connect(key) as connection, connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.procrastinate'))")
            found = connection.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
            if found is None or found[0] is None:
                connection.execute(procrastinate.schema.SchemaManager.get_schema())
    except psycopg.Error as error:
        from tether.stores.sql import url_secrets

        said = scrub(str(error), url_secrets(url))
        raise StoreError(f"cannot set up the queue's tables ({shown_url(url)}): {said}", transient=True) from error
    _READY.add(key)


def drive_job(app: App, run_id: str, queue: str, at: float | None, connection: Any = None) -> Any:
    """The deferrer of a run's drive job: locked by the run id, due now or at Unix time ``at``."""
    when = None if at is None else datetime.datetime.fromtimestamp(at, tz=datetime.UTC)
    options: dict[str, Any] = {"lock": run_id, "queueing_lock": run_id, "queue": queue, "schedule_at": when}
    if connection is not None:
        options["connection"] = connection
    return app.configure_task(DRIVE_TASK, **options)


def requeue(store: Store | AsyncStore, run_id: str) -> bool:
    """Queue a submitted run that has not ended again (its job failed: a missing module or key on the worker).

    False when a job of the run waits already. Not in a run write's transaction: nothing of the
    run changes, and a second job is refused by the run's queueing lock.

    Raises:
        ConfigError: the run was not submitted to a queue (drive it with ``tether resume``).
        RunEnded: the run is done, cancelled, or failed for good.
    """
    url = check_can_queue(store)
    sql = _sql_store(store)
    record = sql.load_run(run_id)
    queue = queue_of(record.spec)
    if queue is None:
        raise ConfigError(f"run {run_id!r} was not submitted to a queue: resume it here, without --detach")
    if record.status in ENDED and not record.summary.get("retryable"):
        raise RunEnded(run_id, status_name(record.status), "queue")
    ensure_schema(url)
    procrastinate = procrastinate_module()
    import psycopg

    with psycopg.connect(libpq_url(url)) as connection:
        try:
            drive_job(Dispatch(sql).app, run_id, queue, None, connection).defer(run_id=run_id)
        except procrastinate.exceptions.AlreadyEnqueued:
            return False
    return True


_WAITING_JOBS = {
    "id": None,
    "queue_name": None,
    "task_name": DRIVE_TASK,
    "status": "todo",
    "lock": None,
    "worker_id": None,
}
"""procrastinate's ``list_jobs`` filter for a run's jobs not yet picked up (its status ``todo``)."""


class Dispatch:
    """Queues a submitted run in the transaction of the write that makes it need a driver (a TransactionHook).

    - created (by :meth:`tether.Runner.submit`): a job now;
    - a step of a drive that parks for a tool retry: a job at the retry's due time;
    - from outside a drive (a decision, a cancellation): a job now if the run can go on, or
      its waiting job deleted if it was cancelled. A drive's other steps need nothing.

    A child run (see :mod:`tether.core.children`) is driven by its root's drive: what frees a
    child of a submitted root, or parks it for a retry, queues the root.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        """The SQL store it is attached to: a child's root run is read through it."""
        self._app: App | None = None

    @property
    def app(self) -> App:
        """A procrastinate app that only defers, on connections it is given (never opened)."""
        if self._app is None:
            procrastinate = procrastinate_module()
            self._app = procrastinate.App(connector=procrastinate.PsycopgConnector())
        return self._app

    def wants(self, write: Write) -> bool:
        """Whether this write of a submitted run (or of a child run) must queue it (or unqueue it)."""
        spec = write.record.spec
        if queue_of(spec) is None and link_of(spec) is None:
            return False
        if write.created:
            return queue_of(spec) is not None
        if leases.held_here(write.record.id):
            return write.record.summary.get(DUE_KEY) is not None
        return write.record.status in RUNNABLE or write.record.status == RunStatus.cancelled.value

    def _target(self, write: Write, root: RunRecord) -> tuple[str, str, str, float | None] | None:
        """(``defer`` or ``remove``, the run whose job it is, its queue, when); None: nothing to queue."""
        queue = queue_of(root.spec)
        if queue is None:
            return None
        due = write.record.summary.get(DUE_KEY)
        at = None if due is None else float(due)
        if root.id != write.record.id:  # a child's: its root goes on (unless the root itself ended)
            return None if root.status in ENDED else ("defer", root.id, queue, at)
        if write.record.status == RunStatus.cancelled.value:
            return "remove", root.id, queue, None
        return "defer", root.id, queue, at

    def _root(self, record: RunRecord) -> RunRecord:
        while (link := link_of(record.spec)) is not None:
            record = self.store.load_run(str(link["run_id"]), tenant=record.tenant)
        return record

    async def _aroot(self, record: RunRecord) -> RunRecord:
        while (link := link_of(record.spec)) is not None:
            record = await self.store.load_run(str(link["run_id"]), tenant=record.tenant)
        return record

    def run(self, write: Write, connection: Any) -> None:
        """Defer (or delete) the run's job on psycopg's connection, in the write's transaction."""
        target = self._target(write, self._root(write.record))
        if target is None:
            return
        action, run_id, queue, at = target
        procrastinate = procrastinate_module()
        if action == "remove":
            for job in self._waiting_jobs(connection, run_id):
                self.app.job_manager.cancel_job_by_id(job["id"], delete_job=True, connection=connection)
            return
        with suppress(procrastinate.exceptions.AlreadyEnqueued), connection.transaction():  # a savepoint
            drive_job(self.app, run_id, queue, at, connection).defer(run_id=run_id)

    async def arun(self, write: Write, connection: Any) -> None:
        """:meth:`run` on psycopg's async connection."""
        target = self._target(write, await self._aroot(write.record))
        if target is None:
            return
        action, run_id, queue, at = target
        procrastinate = procrastinate_module()
        if action == "remove":
            for job in await self._await_waiting_jobs(connection, run_id):
                await self.app.job_manager.cancel_job_by_id_async(job["id"], delete_job=True, connection=connection)
            return
        with suppress(procrastinate.exceptions.AlreadyEnqueued):
            async with connection.transaction():  # a savepoint
                await drive_job(self.app, run_id, queue, at, connection).defer_async(run_id=run_id)

    def _waiting_jobs(self, connection: Any, run_id: str) -> list[dict[str, Any]]:
        sql = procrastinate_module().sql.queries["list_jobs"]
        sync = self.app.connector.get_sync_connector()
        found: list[dict[str, Any]] = sync.execute_query_all_with_connection(
            connection, query=sql, **_WAITING_JOBS, queueing_lock=run_id
        )
        return found

    async def _await_waiting_jobs(self, connection: Any, run_id: str) -> list[dict[str, Any]]:
        sql = procrastinate_module().sql.queries["list_jobs"]
        found: list[dict[str, Any]] = await self.app.connector.execute_query_all_async_with_connection(
            connection, query=sql, **_WAITING_JOBS, queueing_lock=run_id
        )
        return found
