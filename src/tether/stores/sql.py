"""The SQL store on sqlmodel: SQLite (WAL) by default, PostgreSQL for many processes.

The only module that imports sqlmodel/SQLAlchemy. Content is JSON on SQLite and JSONB on
PostgreSQL. Tables are created on first use.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from tether.core.events import Event, decode
from tether.core.status import WAITING_RETRY_STATUS, RunStatus
from tether.errors import ConfigError, CorruptData, RunNotFound, StaleRun, StoreError
from tether.redact import MASK, scrub
from tether.stores import (
    DUE_KEY,
    PARKED_STATUSES,
    SCHEMA_VERSION,
    RunLease,
    RunLog,
    RunRecord,
    check_deletable,
    check_limit,
    codec,
)

JSONColumn = sa.JSON().with_variant(JSONB(), "postgresql")


class RunRow(SQLModel, table=True):
    """One run: its status, version (optimistic concurrency) and summary."""

    __tablename__ = "tether_run"

    id: str = Field(primary_key=True, max_length=64)
    tenant: str | None = Field(default=None, index=True, max_length=200)
    status: str = Field(index=True, max_length=32)
    version: int
    spec: dict[str, Any] = Field(default_factory=dict, sa_type=JSONColumn)
    summary: dict[str, Any] = Field(default_factory=dict, sa_type=JSONColumn)
    created_at: float = Field(index=True)
    updated_at: float


class EventRow(SQLModel, table=True):
    """One event of one run; (run_id, seq) is unique, so a duplicate write fails."""

    __tablename__ = "tether_event"

    run_id: str = Field(primary_key=True, foreign_key="tether_run.id", max_length=64)
    seq: int = Field(primary_key=True)
    type: str = Field(max_length=40)
    data: dict[str, Any] = Field(default_factory=dict, sa_type=JSONColumn)
    at: float


class MetaRow(SQLModel, table=True):
    """Facts about the database itself (its tether schema version)."""

    __tablename__ = "tether_meta"

    key: str = Field(primary_key=True, max_length=64)
    value: str


_RUN = RunRow.__table__  # type: ignore[attr-defined]
_EVENT = EventRow.__table__  # type: ignore[attr-defined]
_META = MetaRow.__table__  # type: ignore[attr-defined]


@functools.cache
def _step_update(columns: tuple[str, ...]) -> Any:
    """A step's guarded row update, built once per column set (building it cost more than running it)."""
    return (
        sa.update(_RUN)
        .where(_RUN.c.id == sa.bindparam("b_id"), _RUN.c.version == sa.bindparam("b_expected"))
        .values(**{c: sa.bindparam(f"b_{c}", type_=_RUN.c[c].type) for c in columns})
    )


class ToolCacheRow(SQLModel, table=True):
    """One cached tool result, shared by every process using the database (see tether.core.cache)."""

    __tablename__ = "tether_tool_cache"

    key: str = Field(primary_key=True, max_length=200)
    tool: str = Field(max_length=64)
    value: str = Field(sa_type=sa.Text)
    created_at: float
    expires_at: float = Field(index=True)


_CACHE = ToolCacheRow.__table__  # type: ignore[attr-defined]


class RunLeaseRow(SQLModel, table=True):
    """Which process drives a run, until when (see :meth:`tether.stores.Store.claim_run`).

    No foreign key: a lease outlives nothing it needs, and ``delete_runs`` drops a deleted run's.
    """

    __tablename__ = "tether_run_lease"

    run_id: str = Field(primary_key=True, max_length=64)
    owner: str = Field(max_length=300)
    expires_at: float
    claimed_at: float


_LEASE = RunLeaseRow.__table__  # type: ignore[attr-defined]


def _sqlite_pragmas(busy_timeout_ms: int, *, read_only: bool) -> Any:
    def on_connect(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        if not read_only:  # a reader never switches the file's journal mode
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.close()

    return on_connect


def _dump_json(value: Any) -> str:
    """Content to JSON text; what JSON cannot hold is a :class:`StoreError`, on every driver."""
    try:
        return codec.dump_json(value)
    except (TypeError, ValueError) as error:
        raise StoreError(f"cannot store content that is not JSON: {error}") from error


class _Unreadable:
    """A stored JSON value that is not JSON: kept as this, so the row it is in can be named."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _load_json(data: str | bytes) -> Any:
    """JSON text read back (see :func:`codec.load_json`); text that is not JSON is :class:`_Unreadable`."""
    try:
        return codec.load_json(data)
    except (ValueError, RecursionError) as error:
        return _Unreadable(error)


_SECRET_PARAM = r"[^=&#;?]*(?:pass|pwd|secret|token|key|auth|credential)[^=&#;]*"
"""A query parameter whose name says it holds a secret: password, sslpassword, api_key, token..."""
_PASSWORD_IN_URL = re.compile(r"(://[^/?#@:]*:)[^/?#@]*@")
_SECRET_IN_QUERY = re.compile(rf"([?&;]{_SECRET_PARAM}=)[^&#;]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` as it may be shown (messages, hints): its password and secret query values as ``***``."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):  # not a URL SQLAlchemy reads (ValueError: a bad port)
        return _SECRET_IN_QUERY.sub(rf"\1{MASK}", _PASSWORD_IN_URL.sub(rf"\1{MASK}@", url))
    query = {key: MASK if _is_secret_param(key) else value for key, value in parsed.query.items()}
    shown = parsed.set(query=query).render_as_string(hide_password=True)
    return shown.replace(quote_plus(MASK), MASK)  # readable: password=***


def url_secrets(url: str) -> list[str]:
    """The secret values in ``url`` (password, secret query values), to scrub from a driver's messages."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return []
    secrets = [str(parsed.password)] if parsed.password else []
    for key, value in parsed.query.items():
        if _is_secret_param(key):
            secrets += [value] if isinstance(value, str) else list(value)  # a repeated key: a tuple
    return secrets


def _is_secret_param(name: str) -> bool:
    return re.fullmatch(_SECRET_PARAM, name, re.IGNORECASE) is not None


def _check_sqlite_path(url: sa.engine.URL) -> None:
    """A missing directory is a configuration mistake: say so now, not at the first write."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    directory = Path(database).parent
    if not directory.is_dir():
        shown = redact_url(url.render_as_string(hide_password=False))
        raise ConfigError(
            f"cannot use database {shown!r}: directory {str(directory)!r} does not exist (create it first)"
        )


def _read_only_sqlite(url: sa.engine.URL) -> sa.engine.URL | None:
    """A URL that reads an existing database this process cannot write; None when it can write.

    In WAL mode SQLite needs the ``-wal`` and ``-shm`` files beside the database: in a directory
    it cannot write it cannot create them, and so could not even read. ``immutable=1`` reads the
    file alone, which is exact only while no ``-wal`` file holds committed pages (and no writer
    starts meanwhile); when one exists, plain ``mode=ro`` reads through it and the ``-shm``.
    """
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:") or not Path(database).is_file():
        return None
    path = Path(database).resolve()
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    directory_writable = os.access(path.parent, os.W_OK)
    if os.access(path, os.W_OK) and (directory_writable or (os.access(wal, os.W_OK) and os.access(shm, os.W_OK))):
        return None
    query = {"mode": "ro", "uri": "true"}
    if not directory_writable and not wal.exists():
        query["immutable"] = "1"
    return url.set(database=f"file:{quote(str(path))}", query=query)


class SQLStore:
    """Runs and events in a relational database reached by a SQLAlchemy URL.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://...``).
        busy_timeout: SQLite only: seconds to wait for another connection's write lock
            before failing with :class:`tether.errors.StoreError`.
        connect_timeout: PostgreSQL only: seconds to wait for the server to accept a
            connection (a ``connect_timeout`` in the URL's query wins).

    Call :meth:`close` when done, to release the connection pool.
    """

    def __init__(self, url: str, *, busy_timeout: float = 10.0, connect_timeout: int = 10) -> None:
        self.url = url
        self.busy_timeout = busy_timeout
        try:
            parsed = sa.engine.make_url(url)
        except (sa.exc.ArgumentError, ValueError) as error:  # ValueError: a port that is not a number
            raise ConfigError(f"invalid database URL {redact_url(url)!r}: {error}") from error
        self._sqlite = parsed.get_backend_name() == "sqlite"
        self._read_only = False
        """SQLite only: the file or its directory cannot be written here, so it is opened read-only."""
        options: dict[str, Any] = {"json_serializer": _dump_json, "json_deserializer": _load_json}
        if self._sqlite:
            _check_sqlite_path(parsed)
            reader = _read_only_sqlite(parsed)
            self._read_only = reader is not None
            parsed = reader or parsed
            options["connect_args"] = {"timeout": busy_timeout, "check_same_thread": False}
        else:
            options["pool_pre_ping"] = True
            libpq = parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in {
                "psycopg",
                "psycopg2",
            }
            if libpq and "connect_timeout" not in parsed.query:
                options["connect_args"] = {"connect_timeout": connect_timeout}
        try:
            self.engine = sa.create_engine(parsed, **options)
        except (sa.exc.ArgumentError, ImportError) as error:
            hint = " (install tether[postgres] for PostgreSQL)" if "psycopg" in str(error) else ""
            raise ConfigError(f"cannot use database {self._where()!r}: {error}{hint}") from error
        if self._sqlite:
            pragmas = _sqlite_pragmas(round(busy_timeout * 1000), read_only=self._read_only)
            sa.event.listen(self.engine, "connect", pragmas)
        self._ready = False
        self._ready_lock = threading.Lock()

    def close(self) -> None:
        """Close the pooled connections (the store reconnects if used again)."""
        self.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[sa.Connection]:
        self._ensure_schema()
        try:
            with self.engine.begin() as connection:
                yield connection
        except sa.exc.IntegrityError:
            raise  # the caller knows what a constraint violation means for its write
        except sa.exc.DBAPIError as error:
            raise self._store_error(error) from error
        except sa.exc.StatementError as error:  # parameters failed before reaching the database
            raise StoreError(f"cannot write to database ({self._where()}): {error.orig}") from error

    def _store_error(self, error: sa.exc.DBAPIError, doing: str = "database error") -> StoreError:
        """The database's error as a StoreError, saying whether it may pass (see ``StoreError.transient``)."""
        text = scrub(str(error.orig).strip(), url_secrets(self.url))
        if self._sqlite and ("locked" in text or "busy" in text):
            return StoreError(
                f"database {self._where()!r} is locked: another connection kept it busy longer "
                f"than the busy timeout ({self.busy_timeout:g} s); this write was not made",
                transient=True,
            )
        if self._read_only and "readonly" in text:
            return StoreError(
                f"database {self._where()!r} is read-only here (its file or directory cannot be written): "
                f"commands that only read it work, this one writes ({text})"
            )
        # PostgreSQL: a dropped connection, a server restarting, a serialization conflict
        transient = error.connection_invalidated or (not self._sqlite and isinstance(error, sa.exc.OperationalError))
        return StoreError(f"{doing} ({self._where()}): {text}", transient=transient)

    def _where(self) -> str:
        return redact_url(self.url)

    def _ensure_schema(self) -> None:
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            try:
                if self._read_only:  # nothing can be created or migrated: only read what is there
                    with self.engine.connect() as connection:
                        self._check_schema(connection)
                else:
                    with self._schema_transaction() as connection:
                        _migrate(connection)
            except sa.exc.DBAPIError as error:
                raise self._store_error(error, "cannot open database") from error
            self._ready = True

    def _check_schema(self, connection: sa.Connection) -> None:
        """A read-only database must already be in this tether's layout."""
        stored = _stored_version(connection)
        if stored is None or stored < SCHEMA_VERSION:
            layout = "has no tether tables" if stored is None else f"uses tether schema {stored}, not {SCHEMA_VERSION}"
            raise StoreError(
                f"database {self._where()!r} is read-only here and {layout}: open it once where it can be "
                "written, so tether can set it up"
            )
        _refuse_newer(stored)

    @contextmanager
    def _schema_transaction(self) -> Iterator[sa.Connection]:
        """A transaction no other process setting up the same database runs at the same time.

        SQLite: ``BEGIN IMMEDIATE`` (the write lock, taken before reading the version);
        PostgreSQL: a transaction-scoped advisory lock for the schema in use. Tables,
        migrations and the version are then written together or not at all.
        """
        if not self._sqlite:
            with self.engine.begin() as connection:
                if connection.dialect.name == "postgresql":
                    connection.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.tether'))"))
                yield connection
            return
        with self.engine.connect() as raw:
            connection = raw.execution_options(isolation_level="AUTOCOMMIT")  # pysqlite must not BEGIN itself
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.exec_driver_sql("ROLLBACK")
                raise
            connection.exec_driver_sql("COMMIT")

    def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        """Insert a new run with its first events."""
        try:
            with self._transaction() as connection:
                connection.execute(sa.insert(_RUN).values(**_row(record)))
                _insert_events(connection, record.id, events)
        except sa.exc.IntegrityError as error:
            raise StoreError(f"run {record.id!r} already exists") from error

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        """Add events and replace the row in one transaction, if the version still matches."""
        try:
            with self._transaction() as connection:
                changing = _row(record, changing_only=True)
                updated = connection.execute(
                    _step_update(tuple(changing)),
                    {"b_id": record.id, "b_expected": expected_version, **{f"b_{k}": v for k, v in changing.items()}},
                )
                if updated.rowcount != 1:
                    exists = connection.execute(sa.select(_RUN.c.id).where(_RUN.c.id == record.id)).first()
                    raise RunNotFound(record.id) if exists is None else StaleRun(record.id, expected_version)
                _insert_events(connection, record.id, events)
        except sa.exc.IntegrityError as error:
            raise StaleRun(record.id, expected_version) from error

    def load_run(self, run_id: str, *, tenant: str | None = None) -> RunRecord:
        """The row, if visible to ``tenant``."""
        query = sa.select(_RUN).where(_RUN.c.id == run_id)
        if tenant is not None:
            query = query.where(_RUN.c.tenant == tenant)
        with self._transaction() as connection:
            row = connection.execute(query).mappings().first()
        if row is None:
            raise RunNotFound(run_id)
        return _record(row, strict=True)

    def load_events(self, run_id: str, *, tenant: str | None = None) -> list[Event]:
        """The whole log, oldest first."""
        visible = sa.select(_RUN.c.id).where(_RUN.c.id == run_id)
        if tenant is not None:
            visible = visible.where(_RUN.c.tenant == tenant)
        query = sa.select(_EVENT).where(_EVENT.c.run_id == run_id).order_by(_EVENT.c.seq)
        with self._transaction() as connection:  # one transaction for the check and the log
            if connection.execute(visible).first() is None:
                raise RunNotFound(run_id)
            rows = connection.execute(query).mappings().all()
        return [_event(run_id, r) for r in rows]

    def load_log(self, run_id: str, *, tenant: str | None = None) -> RunLog:
        """The log and the row's version in ONE statement, so one snapshot (on both databases)."""
        query = (
            sa.select(_RUN.c.version, _RUN.c.tenant, _EVENT.c.seq, _EVENT.c.type, _EVENT.c.data, _EVENT.c.at)
            .select_from(_RUN.outerjoin(_EVENT, _EVENT.c.run_id == _RUN.c.id))
            .where(_RUN.c.id == run_id)
            .order_by(_EVENT.c.seq)
        )
        if tenant is not None:
            query = query.where(_RUN.c.tenant == tenant)
        with self._transaction() as connection:
            rows = connection.execute(query).mappings().all()
        if not rows:
            raise RunNotFound(run_id)
        events = [_event(run_id, r) for r in rows if r["seq"] is not None]
        return RunLog(rows[0]["version"], rows[0]["tenant"], events)

    def list_runs(self, *, status: str | None = None, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Newest first."""
        check_limit(limit)
        query = sa.select(_RUN).order_by(_RUN.c.created_at.desc(), _RUN.c.id.desc()).limit(limit)
        if status is not None:
            query = query.where(_RUN.c.status == status)
        if tenant is not None:
            query = query.where(_RUN.c.tenant == tenant)
        with self._transaction() as connection:
            rows = connection.execute(query).mappings().all()
        return [_record(r, strict=False) for r in rows]

    def list_due(self, now: float, *, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Runs whose retry is due at ``now``, earliest first (the status index narrows the scan)."""
        check_limit(limit)
        due_at = _RUN.c.summary[DUE_KEY].as_float()
        query = (
            sa.select(_RUN)
            .where(_RUN.c.status == WAITING_RETRY_STATUS.value, due_at <= now)
            .order_by(due_at, _RUN.c.id)
            .limit(limit)
        )
        if tenant is not None:
            query = query.where(_RUN.c.tenant == tenant)
        with self._transaction() as connection:
            rows = connection.execute(query).mappings().all()
        return [_record(r, strict=False) for r in rows]

    def claim_run(self, run_id: str, owner: str, *, now: float, ttl: float, force: bool = False) -> RunLease:
        """Take or renew the run's lease in one upsert guarded by a WHERE, then read what holds.

        On PostgreSQL the upsert locks the lease row even when its WHERE refuses the update,
        so the row read after it in the same transaction is the lease in force.
        """
        dialect = sqlite if self._sqlite else postgresql
        insert = dialect.insert(_LEASE).values(run_id=run_id, owner=owner, expires_at=now + ttl, claimed_at=now)
        mine = _LEASE.c.owner == insert.excluded.owner
        claim = insert.on_conflict_do_update(
            index_elements=[_LEASE.c.run_id],
            set_={
                "owner": insert.excluded.owner,
                "expires_at": insert.excluded.expires_at,
                "claimed_at": sa.case((mine, _LEASE.c.claimed_at), else_=insert.excluded.claimed_at),
            },
            where=None if force else mine | (_LEASE.c.expires_at <= now),
        )
        with self._transaction() as connection:
            connection.execute(claim)
            row = connection.execute(sa.select(_LEASE).where(_LEASE.c.run_id == run_id)).mappings().one()
        return _lease(row)

    def renew_run(self, run_id: str, owner: str, *, now: float, ttl: float) -> RunLease | None:
        """Extend ``owner``'s lease if the row names it, then read what holds."""
        mine = (_LEASE.c.run_id == run_id) & (_LEASE.c.owner == owner)
        with self._transaction() as connection:
            connection.execute(sa.update(_LEASE).where(mine).values(expires_at=now + ttl))
            row = connection.execute(sa.select(_LEASE).where(_LEASE.c.run_id == run_id)).mappings().first()
        return None if row is None else _lease(row)

    def release_run(self, run_id: str, owner: str) -> None:
        """Delete the run's lease if ``owner`` holds it."""
        with self._transaction() as connection:
            connection.execute(sa.delete(_LEASE).where(_LEASE.c.run_id == run_id, _LEASE.c.owner == owner))

    def cache_get(self, key: str, now: float) -> str | None:
        """The cached value, if present and not expired at ``now``."""
        query = sa.select(_CACHE.c.value).where(_CACHE.c.key == key, _CACHE.c.expires_at > now)
        with self._transaction() as connection:
            value = connection.execute(query).scalar()
        return None if value is None else codec.decode_text(str(value))

    def cache_put(self, key: str, tool: str, value: str, expires_at: float) -> None:
        """Store (or replace) a cached tool result, in one transaction."""
        stored = codec.encode_text(value)  # PostgreSQL text holds no NUL nor lone surrogate
        row = {"key": key, "tool": tool, "value": stored, "created_at": time.time(), "expires_at": expires_at}
        try:
            with self._transaction() as connection:
                connection.execute(sa.delete(_CACHE).where(_CACHE.c.key == key))
                connection.execute(sa.insert(_CACHE).values(**row))
        except sa.exc.IntegrityError:
            pass  # another process cached the same call at the same moment: its value is as good

    def cache_purge(self, now: float) -> int:
        """Delete expired cache entries (the ``expires_at`` index finds them)."""
        with self._transaction() as connection:
            deleted = connection.execute(sa.delete(_CACHE).where(_CACHE.c.expires_at <= now))
        return int(deleted.rowcount)

    def delete_runs(
        self,
        *,
        finished_before: float,
        statuses: Collection[str],
        tenant: str | None = None,
        include_retryable: bool = False,
        include_parked: bool = False,
    ) -> int:
        """Delete finished (or, if asked, parked) runs last updated before ``finished_before``, with their events.

        A failed or parked run can still change (resuming it moves it on), so the rows are
        locked as they are chosen (``FOR UPDATE`` on PostgreSQL; SQLite has one writer) and
        every DELETE repeats the conditions: a run another process resumed meanwhile is left
        whole, never deleted, never stripped of its events (nor of its lease).
        """
        check_deletable(statuses)
        chosen = _RUN.c.status.in_(sorted(statuses))
        if not include_retryable:  # a transient failure may still be resumed: keep it
            retryable = sa.func.coalesce(_RUN.c.summary["retryable"].as_boolean(), sa.false())
            chosen &= (_RUN.c.status != RunStatus.failed.value) | sa.not_(retryable)
        if include_parked:  # unless a driver held its lease since the cutoff
            driven = sa.exists().where(_LEASE.c.run_id == _RUN.c.id, _LEASE.c.expires_at >= finished_before)
            chosen |= _RUN.c.status.in_(sorted(PARKED_STATUSES)) & sa.not_(driven)
        doomed = chosen & (_RUN.c.updated_at < finished_before)
        if tenant is not None:
            doomed &= _RUN.c.tenant == tenant
        deleted = 0
        with self._transaction() as connection:
            ids = [row[0] for row in connection.execute(sa.select(_RUN.c.id).where(doomed).with_for_update())]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                still = sa.select(_RUN.c.id).where(_RUN.c.id.in_(chunk), doomed)
                connection.execute(sa.delete(_EVENT).where(_EVENT.c.run_id.in_(still)))
                deleted += connection.execute(sa.delete(_RUN).where(_RUN.c.id.in_(chunk), doomed)).rowcount
                kept = sa.select(_RUN.c.id).where(_RUN.c.id.in_(chunk))
                connection.execute(sa.delete(_LEASE).where(_LEASE.c.run_id.in_(chunk), _LEASE.c.run_id.not_in(kept)))
        return deleted


# Schema versions -----------------------------------------------------------------------
def _to_v2(connection: sa.Connection) -> None:
    """Version 1 to 2: the tool-result cache table; failed runs say if they were transient.

    Some version 1 databases have the cache table already. Whether a failed run can be
    retried is read from its log's ``run_finished``, so ``tether gc`` keeps those runs.
    """
    _CACHE.create(connection, checkfirst=True)
    is_failed = _RUN.c.status == RunStatus.failed.value
    failed = connection.execute(sa.select(_RUN.c.id, _RUN.c.summary).where(is_failed)).all()
    for run_id, summary in failed:
        finished = connection.execute(
            sa.select(_EVENT.c.data)
            .where(_EVENT.c.run_id == run_id, _EVENT.c.type == "run_finished")
            .order_by(_EVENT.c.seq.desc())
            .limit(1)
        ).scalar()
        retryable = bool((finished or {}).get("retryable"))
        connection.execute(
            sa.update(_RUN).where(_RUN.c.id == run_id).values(summary={**(summary or {}), "retryable": retryable})
        )


def _to_v3(connection: sa.Connection) -> None:
    """Version 2 to 3: the run-lease table (which process drives a run); it starts empty."""
    _LEASE.create(connection, checkfirst=True)


MIGRATIONS: tuple[tuple[int, Callable[[sa.Connection], None]], ...] = ((1, _to_v2), (2, _to_v3))
"""(from version, step to the next), in order. A step only adds (tables, columns, facts
derived from the log): it never drops or rewrites what runs recorded. Plain steps rather
than alembic: a few small additive changes, applied on first use with no extra tool."""


def _stored_version(connection: sa.Connection) -> int | None:
    """The tether schema the database is in; None before any tether table exists."""
    inspector = sa.inspect(connection)
    if inspector.has_table(_META.name):
        found = connection.execute(sa.select(_META.c.value).where(_META.c.key == "schema_version")).scalar()
        if found is not None:
            return int(found)
    return 1 if inspector.has_table(_RUN.name) else None  # tables written before the version was: the first layout


def _refuse_newer(stored: int) -> None:
    if stored > SCHEMA_VERSION:
        raise StoreError(
            f"the database uses tether schema {stored}, newer than this tether ({SCHEMA_VERSION}); upgrade tether"
        )


def _migrate(connection: sa.Connection) -> None:
    """Create the tables on first use, or bring an older database up to :data:`SCHEMA_VERSION`."""
    stored = _stored_version(connection)
    if stored == SCHEMA_VERSION:
        return
    if stored is None:
        SQLModel.metadata.create_all(connection, tables=[_RUN, _EVENT, _META, _CACHE, _LEASE])
    else:
        _refuse_newer(stored)
        _META.create(connection, checkfirst=True)
        for from_version, step in MIGRATIONS:
            if from_version >= stored:
                step(connection)
    connection.execute(sa.delete(_META).where(_META.c.key == "schema_version"))
    connection.execute(sa.insert(_META).values(key="schema_version", value=str(SCHEMA_VERSION)))


def _row(record: RunRecord, *, changing_only: bool = False) -> dict[str, Any]:
    if changing_only:  # a step never rewrites what cannot change (spec, tenant, creation)
        return {
            "status": record.status,
            "version": record.version,
            "summary": record.summary,
            "updated_at": record.updated_at,
        }
    return {
        "id": record.id,
        "tenant": record.tenant,
        "status": record.status,
        "version": record.version,
        "spec": record.spec,
        "summary": record.summary,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def _record(row: Any, *, strict: bool) -> RunRecord:
    """The row as a record; a spec or summary that cannot be read raises if ``strict``, else marks it."""
    problems = [p for p in (_problem(row["spec"], "spec"), _problem(row["summary"], "summary")) if p]
    if problems and strict:
        raise CorruptData(row["id"], "; ".join(problems))
    return RunRecord(
        id=row["id"],
        status=row["status"],
        version=row["version"],
        tenant=row["tenant"],
        spec=row["spec"] if isinstance(row["spec"], dict) else {},
        summary=row["summary"] if isinstance(row["summary"], dict) else {},
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        unreadable="; ".join(problems) or None,
    )


def _event(run_id: str, row: Any) -> Event:
    problem = _problem(row["data"], f"event {row['seq']}", absent=True)
    if problem:
        raise CorruptData(run_id, problem)
    return decode(run_id, row["seq"], row["type"], row["data"], row["at"])


def _problem(value: Any, what: str, *, absent: bool = False) -> str | None:
    """What is wrong with a stored JSON value that must be an object (None: nothing; ``absent``: null is wrong too)."""
    if isinstance(value, _Unreadable):
        return f"its stored {what} is not valid JSON ({value.error})"
    if (value is None and absent) or not isinstance(value, dict | None):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        return f"its stored {what} is {kind}, not a JSON object"
    return None


def _lease(row: Any) -> RunLease:
    return RunLease(row["run_id"], row["owner"], row["expires_at"], row["claimed_at"])


def _insert_events(connection: sa.Connection, run_id: str, events: Sequence[Event]) -> None:
    if events:
        connection.execute(
            sa.insert(_EVENT),
            [{"run_id": run_id, "seq": e.seq, "type": e.type, "data": e.data, "at": e.at} for e in events],
        )
