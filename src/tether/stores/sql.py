"""The SQL stores on sqlmodel: SQLite (WAL) by default, PostgreSQL for many processes.

The only module that imports sqlmodel/SQLAlchemy. Content is JSON on SQLite and JSONB on
PostgreSQL. Tables are created on first use. :class:`SQLStore` is called from threads,
:class:`AsyncSQLStore` awaited in an event loop; each operation's statements and the reading of
their results are written once (``_Work``), and each store only says how a connection runs them.

Round trips: a step's commit (:meth:`SQLStore.append`) is one statement on PostgreSQL, run
outside a transaction (atomic alone): one round trip. Connections are not pinged before each
use, only when they sat idle in the pool longer than :data:`IDLE_PING_AFTER` (a server that
restarted meanwhile, a firewall that dropped them); a connection that drops mid-use fails that
operation with a transient :class:`~tether.errors.StoreError`, which a drive tries again.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from urllib.parse import quote, quote_plus

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from tether.errors import ConfigError, CorruptData, NoDatabase, RunNotFound, StaleRun, StoreError
from tether.extras import require
from tether.facts.events import Event, decode
from tether.facts.status import WAITING_RETRY_STATUS, RunStatus, from_stored, to_stored
from tether.redact import MASK, scrub
from tether.stores import (
    DUE_KEY,
    PARENT_KEY,
    PARKED_STATUSES,
    SCHEMA_VERSION,
    SNAPSHOT_EVERY,
    WAITING_KEY,
    Holder,
    RunLease,
    RunLog,
    RunQuery,
    RunRecord,
    RunsFound,
    Snapshot,
    check_deletable,
    check_limit,
    codec,
)
from tether.stores.awaitable import completed
from tether.stores.one_thread import OneThread

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

JSONColumn = sa.JSON().with_variant(JSONB(), "postgresql")
T = TypeVar("T")
_Connect = Callable[[], AbstractContextManager[sa.Connection]]
"""Gives the connection an operation runs on, for the length of a ``with``."""


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


class SnapshotRow(SQLModel, table=True):
    """The latest snapshot of one run's folded state (see :mod:`tether.core.snapshots`): derived from its events."""

    __tablename__ = "tether_snapshot"

    run_id: str = Field(primary_key=True, foreign_key="tether_run.id", max_length=64)
    seq: int
    format: str = Field(max_length=64)
    state: dict[str, Any] = Field(default_factory=dict, sa_type=JSONColumn)


_RUN = RunRow.__table__  # type: ignore[attr-defined]
_EVENT = EventRow.__table__  # type: ignore[attr-defined]
_META = MetaRow.__table__  # type: ignore[attr-defined]
_SNAPSHOT = SnapshotRow.__table__  # type: ignore[attr-defined]


_STEP_UPDATE = (
    sa.update(_RUN)
    .where(_RUN.c.id == sa.bindparam("b_id"), _RUN.c.version == sa.bindparam("b_expected"))
    .values(**{c: sa.bindparam(f"b_{c}", type_=_RUN.c[c].type) for c in ("status", "version", "summary", "updated_at")})
)
"""A step's guarded row update: a step never rewrites what cannot change (spec, tenant, creation)."""
_STEP_ROW = _STEP_UPDATE.returning(_RUN.c.id).cte("step")
_STEP_EVENTS = (
    sa.func.jsonb_to_recordset(sa.cast(sa.bindparam("b_events", type_=sa.Text), JSONB))
    .table_valued(
        sa.column("seq", sa.Integer), sa.column("type", sa.Text), sa.column("data", JSONB), sa.column("at", sa.Float)
    )
    .render_derived(name="e", with_types=True)
)
"""The step's events as ONE JSON text parameter (an array of rows), split by the server: the driver's
dumping of four arrays of texts, escaping each, took 15 % of a PostgreSQL step's CPU."""
_STEP_LOGGED = (
    sa.insert(_EVENT)
    .from_select(
        ["run_id", "seq", "type", "data", "at"],
        sa.select(
            _STEP_ROW.c.id,
            _STEP_EVENTS.c.seq,
            _STEP_EVENTS.c.type,
            _STEP_EVENTS.c.data,
            _STEP_EVENTS.c.at,
        ).select_from(_STEP_ROW.join(_STEP_EVENTS, sa.true())),
    )
    .returning(_EVENT.c.seq)
    .cte("logged")
)
_STEP_POSTGRES = sa.select(sa.select(sa.func.count()).select_from(_STEP_ROW).scalar_subquery()).add_cte(_STEP_LOGGED)
"""A step's commit on PostgreSQL as ONE statement: the version-guarded row update, and the events
inserted only if it matched (data-modifying CTEs run once each, whether read or not). It answers
how many rows the update changed (1, or 0 when another writer advanced the run)."""


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
    holder_host: str | None = Field(default=None, max_length=80)
    """The holder's :class:`~tether.stores.Holder` (schema 5; null in a lease an older tether wrote)."""
    holder_pid_namespace: int | None = Field(default=None, sa_type=sa.BigInteger)
    holder_pid: int | None = None
    holder_started: int | None = Field(default=None, sa_type=sa.BigInteger)


_LEASE = RunLeaseRow.__table__  # type: ignore[attr-defined]

# Statements a run's drive runs once each (its creation, its lease), built once: SQLAlchemy builds a
# statement and its cache key in Python on every call otherwise, more CPU than SQLite's execution.
_INSERT_RUN = sa.insert(_RUN)
_LEASE_OF = sa.select(_LEASE).where(_LEASE.c.run_id == sa.bindparam("b_run_id"))
_RELEASE_LEASE = sa.delete(_LEASE).where(
    _LEASE.c.run_id == sa.bindparam("b_run_id"), _LEASE.c.owner == sa.bindparam("b_owner")
)
_RENEW_LEASE = (
    sa.update(_LEASE)
    .where(_LEASE.c.run_id == sa.bindparam("b_run_id"), _LEASE.c.owner == sa.bindparam("b_owner"))
    .values(expires_at=sa.bindparam("b_expires_at", type_=sa.Float))
    .returning(*_LEASE.c)
)


IDLE_PING_AFTER = 10.0
"""Seconds a pooled connection may sit unused before its next use pings the server first: a
dead one is then replaced unseen. A connection in steady use is never pinged (a step stays one
round trip); one that drops mid-use fails that use with a transient StoreError."""


READ_RETRIES = 2
"""Times a read that found its pooled connection dropped (a server restart, an idle connection the
network or an administrator cut) is run again on a new one. A read after a run's last commit (the
result ``tether run`` prints) then reports what is stored, instead of failing a finished run."""


def _ping_when_idle(engine: sa.Engine) -> None:
    """Ping a connection on checkout only after it sat idle :data:`IDLE_PING_AFTER` seconds (not per step)."""

    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["tether_idle_since"] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("tether_idle_since", None)
        if since is None or time.monotonic() - since <= IDLE_PING_AFTER:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise sa.exc.DisconnectionError(f"a pooled connection went away while idle: {error}") from error

    sa.event.listen(engine, "checkin", checked_in)
    sa.event.listen(engine, "checkout", checked_out)


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


_MISSING_DATABASE = re.compile(r'database "[^"]*" does not exist')
"""What PostgreSQL says when the URL names a database it does not have (at connect: no SQLSTATE)."""


def _check_sqlite_path(url: sa.engine.URL, *, must_exist: bool) -> None:
    """A missing directory is a configuration mistake: say so now, not at the first write.

    With ``must_exist``, so is a missing file: a command that only uses runs must not create an
    empty database where a mistyped path points (and then say the run is not found).
    """
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    shown = redact_url(url.render_as_string(hide_password=False))
    directory = Path(database).parent
    if not directory.is_dir():
        raise ConfigError(
            f"cannot use database {shown!r}: directory {str(directory)!r} does not exist (create it first)"
        )
    if Path(database).is_dir():
        raise ConfigError(f"cannot use database {shown!r}: {database!r} is a directory, not a database file")
    if must_exist and not Path(database).exists():
        raise NoDatabase(
            f"there is no database at {str(Path(database).resolve())!r} ({shown!r}): nothing was created; "
            "check the URL (a run creates its database)"
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


@dataclass(frozen=True)
class Write:
    """A run's write as a :class:`TransactionHook` sees it, before its transaction commits."""

    record: RunRecord
    """The run's row as written (with its spec, which says how the run is dispatched)."""
    events: Sequence[Event]
    created: bool
    """The write created the run (else it recorded a step, a decision, a cancellation)."""


class TransactionHook(Protocol):
    """Adds its own statements to a run's write, inside the write's transaction: both commit or neither.

    How a task queue on the same PostgreSQL database (:mod:`tether.drivers.queue`) queues a run in
    the very transaction that created or freed it. The store knows nothing of what is added: it
    asks :meth:`wants` (no I/O; most writes are not wanted, and those keep their one round trip),
    then hands the hook the driver's own connection, in the open transaction.
    """

    def wants(self, write: Write) -> bool:
        """Whether this write needs the hook's statements."""
        ...

    def run(self, write: Write, connection: Any) -> None:
        """Add the statements on a sync driver connection (psycopg's ``Connection``)."""
        ...

    async def arun(self, write: Write, connection: Any) -> None:
        """Add the statements on an async driver connection (psycopg's ``AsyncConnection``)."""
        ...


def _wanted(hooks: Sequence[TransactionHook], write: Write) -> list[TransactionHook]:
    return [hook for hook in hooks if hook.wants(write)]


def _call_hooks(connection: sa.Connection, hooks: Sequence[TransactionHook], write: Write) -> None:
    """Run ``hooks`` in ``connection``'s open transaction, on the driver's connection (awaited, for an async one)."""
    if not hooks:
        return
    dbapi = connection.connection.dbapi_connection
    for hook in hooks:
        if isinstance(dbapi, sa.engine.AdaptedConnection):  # asyncio: SQLAlchemy's documented way to await
            dbapi.run_async(functools.partial(hook.arun, write))
        else:
            hook.run(write, connection.connection.driver_connection)


@dataclass(frozen=True)
class _Work(Generic[T]):
    """One store operation: what it runs on a connection, shared by :class:`SQLStore` and :class:`AsyncSQLStore`.

    Each store only opens the connection and runs ``run`` on it (the async one in
    SQLAlchemy's greenlet, through ``run_sync``): statements and the reading of their results
    are written once.
    """

    run: Callable[[sa.Connection], T]
    single: bool = False
    """One statement, atomic alone: on PostgreSQL it runs outside a transaction, saving the
    round trips of BEGIN and COMMIT (a step's commit is then one round trip)."""
    on_conflict: Callable[[sa.exc.IntegrityError], T] | None = None
    """What a constraint violation means for this write (raise the right error, or an answer)."""
    reads_only: bool = False
    """It writes nothing: on a connection found dropped it is run again on a new one (see
    :data:`READ_RETRIES`). A write is not: it may have committed before the connection dropped."""


class _SQLBase:
    """What both SQL stores share: the URL read once, the schema set up once, errors said one way."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float,
        connect_timeout: int,
        snapshot_every: int,
        drivers: Mapping[str, str] | None = None,
        must_exist: bool = False,
        extra: str = "postgres",
    ) -> None:
        """``drivers``: the driver for each backend when the URL names none (None: SQLAlchemy's defaults).

        ``must_exist``: SQLite only, refuse a database file that is not there yet (instead of creating it).
        ``extra``: the one to install for a PostgreSQL URL (psycopg, and what else this store needs with it).
        """
        self.url = url
        self.busy_timeout = busy_timeout
        self.snapshot_every = snapshot_every
        try:
            parsed = sa.engine.make_url(url)
        except (sa.exc.ArgumentError, ValueError) as error:  # ValueError: a port that is not a number
            raise ConfigError(f"invalid database URL {redact_url(url)!r}: {error}") from error
        self._sqlite = parsed.get_backend_name() == "sqlite"
        self._read_only = False
        """SQLite only: the file or its directory cannot be written here, so it is opened read-only."""
        options: dict[str, Any] = {"json_serializer": _dump_json, "json_deserializer": _load_json}
        if self._sqlite:
            _check_sqlite_path(parsed, must_exist=must_exist)
            reader = _read_only_sqlite(parsed)
            self._read_only = reader is not None
            parsed = reader or parsed
            options["connect_args"] = {"timeout": busy_timeout, "check_same_thread": False}
        else:
            libpq = parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in {
                "psycopg",
                "psycopg2",
            }
            if libpq and "connect_timeout" not in parsed.query:
                options["connect_args"] = {"connect_timeout": connect_timeout}
        backend = parsed.get_backend_name()
        if drivers and backend in drivers and "+" not in parsed.drivername:
            parsed = parsed.set(drivername=f"{backend}+{drivers[backend]}")
        if backend == "postgresql" and parsed.get_driver_name() == "psycopg":
            require(extra, f"the database {redact_url(url)!r}")
        self._parsed = parsed
        self._options = options
        self._ready = False
        self._ready_lock = threading.Lock()
        self.hooks: list[TransactionHook] = []
        """Told of each run write in its transaction (see :class:`TransactionHook`)."""

    def _configure(self, engine: sa.Engine) -> None:
        """Set up a new (sync) engine, or an async engine's sync side: SQLite's pragmas, idle pings."""
        if self._sqlite:
            pragmas = _sqlite_pragmas(round(self.busy_timeout * 1000), read_only=self._read_only)
            sa.event.listen(engine, "connect", pragmas)
        else:
            _ping_when_idle(engine)

    def _sync_engine(self, options: dict[str, Any]) -> sa.Engine:
        """A sync engine for the URL, configured (see :meth:`_configure`)."""
        try:
            engine = sa.create_engine(self._parsed, **options)
        except (sa.exc.ArgumentError, ImportError) as error:
            raise self._cannot_use(error) from error
        self._configure(engine)
        return engine

    def _run_on(self, engine: sa.Engine, work: _Work[T], connect: _Connect | None = None) -> T:
        """Do ``work`` on a connection of a sync engine (a pooled one unless ``connect`` gives another).

        The schema is set up first, once, on a pooled connection of its own.
        """
        if not self._ready:
            try:
                with self._ready_lock, engine.connect() as raw:
                    self._set_up(raw)
            except sa.exc.DBAPIError as error:
                raise self._store_error(error, "cannot open database") from error
        for attempt in range(READ_RETRIES + 1):
            try:
                with (connect or engine.connect)() as raw:
                    return self._perform(raw, work)
            except (sa.exc.StatementError, sa.exc.DBAPIError) as error:
                if not self._read_again(work, error, attempt):
                    return self._failed(work, error)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _cannot_use(self, error: Exception) -> ConfigError:
        return ConfigError(f"cannot use database {self._where()!r}: {error}")

    # Performing work (inside the connection: plain calls on both stores) ---------------
    def _perform(self, raw: sa.Connection, work: _Work[T]) -> T:
        """Run ``work`` on a connection fresh from the pool: in a transaction, or alone (see ``_Work.single``)."""
        if work.single and raw.dialect.name == "postgresql":
            return work.run(raw.execution_options(isolation_level="AUTOCOMMIT"))
        with raw.begin():
            return work.run(raw)

    def _read_again(self, work: _Work[T], error: Exception, attempt: int) -> bool:
        """Whether ``work`` failed only because its connection had dropped, and may run again on a new one."""
        dropped = isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated
        return work.reads_only and dropped and attempt < READ_RETRIES

    def _failed(self, work: _Work[T], error: Exception) -> T:
        """The error ``work`` raised, said as the store's contract says it (or the answer a conflict means)."""
        if isinstance(error, sa.exc.IntegrityError) and work.on_conflict is not None:
            return work.on_conflict(error)
        if isinstance(error, sa.exc.DBAPIError):
            raise self._store_error(error) from error
        if isinstance(error, sa.exc.StatementError):  # parameters failed before reaching the database
            raise StoreError(f"cannot write to database ({self._where()}): {error.orig}") from error
        raise error

    def _store_error(self, error: sa.exc.DBAPIError, doing: str = "database error") -> StoreError | NoDatabase:
        """The database's error as a StoreError, saying whether it may pass (see ``StoreError.transient``).

        A PostgreSQL database that is not there is a :class:`NoDatabase`, as a missing SQLite file is.
        """
        text = scrub(str(error.orig).strip(), url_secrets(self.url))
        if not self._sqlite and _MISSING_DATABASE.search(text):
            return NoDatabase(
                f"there is no database {self._where()!r}: nothing was created; check the URL "
                "(a PostgreSQL database is made with createdb)"
            )
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

    # The schema --------------------------------------------------------------------------
    def _set_up(self, raw: sa.Connection) -> None:
        """Create or migrate the tables on a connection of their own (or, read-only, check them), once.

        The version is read first without the write lock, so opening a database another connection
        is writing to (SQLite's lock held) waits for nothing unless there is something to create or
        migrate: ``tether runs`` reads at once.
        """
        if self._ready:
            return
        try:
            stored = _stored_version(raw)
        finally:
            raw.rollback()  # end the read before the schema's own transaction begins
        if stored is not None:
            _refuse_newer(stored)
        if stored != SCHEMA_VERSION:
            if self._read_only:  # nothing can be created or migrated: only read what is there
                layout = (
                    "has no tether tables" if stored is None else f"uses tether schema {stored}, not {SCHEMA_VERSION}"
                )
                raise StoreError(
                    f"database {self._where()!r} is read-only here and {layout}: open it once where it can be "
                    "written, so tether can set it up"
                )
            with self._schema_transaction(raw) as connection:
                _migrate(connection)
        self._ready = True

    @contextmanager
    def _schema_transaction(self, raw: sa.Connection) -> Iterator[sa.Connection]:
        """A transaction no other process setting up the same database runs at the same time.

        SQLite: ``BEGIN IMMEDIATE`` (the write lock, taken before reading the version);
        PostgreSQL: a transaction-scoped advisory lock for the schema in use. Tables,
        migrations and the version are then written together or not at all.
        """
        if not self._sqlite:
            with raw.begin():
                if raw.dialect.name == "postgresql":
                    raw.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.tether'))"))
                yield raw
            return
        connection = raw.execution_options(isolation_level="AUTOCOMMIT")  # pysqlite must not BEGIN itself
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            connection.exec_driver_sql("ROLLBACK")
            raise
        connection.exec_driver_sql("COMMIT")


class SQLStore(_SQLBase):
    """Runs and events in a relational database reached by a SQLAlchemy URL.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://...``).
        busy_timeout: SQLite only: seconds to wait for another connection's write lock
            before failing with :class:`tether.errors.StoreError`.
        connect_timeout: PostgreSQL only: seconds to wait for the server to accept a
            connection (a ``connect_timeout`` in the URL's query wins).
        snapshot_every: events between snapshots of a run's folded state (0: none); see
            :data:`tether.stores.SNAPSHOT_EVERY`.

    Call :meth:`close` when done, to release the connection pool. :class:`AsyncSQLStore` is
    the same store for an event loop.
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 10.0,
        connect_timeout: int = 10,
        snapshot_every: int = SNAPSHOT_EVERY,
        must_exist: bool = False,
    ) -> None:
        super().__init__(
            url,
            busy_timeout=busy_timeout,
            connect_timeout=connect_timeout,
            snapshot_every=snapshot_every,
            must_exist=must_exist,
        )
        self.engine = self._sync_engine(self._options)
        self._pins = threading.local()
        """Per thread, inside :meth:`pinned`: ``depth``, ``kept`` (a pool slot is this thread's) and ``connection``."""
        self._pins_left = self.engine.pool.size() if self._sqlite and isinstance(self.engine.pool, sa.QueuePool) else 0
        """Threads that may still keep a connection: at most the pool's size, so its overflow serves the rest."""
        self._pins_lock = threading.Lock()

    def close(self) -> None:
        """Close the pooled connections (the store reconnects if used again)."""
        self.engine.dispose()

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Inside the block, this thread's operations share one connection instead of taking the pool's each time.

        A drive holds its run in one (:meth:`tether.Runner.hold`): its steps skip the pool's checkout
        and return, about a tenth of a SQLite step's CPU. Nested blocks share the outer one's. Only
        on a SQLite file, and for as many threads at once as the pool keeps connections (its
        overflow serves the others as before); PostgreSQL's connections are taken from the pool
        each time, so one that sat idle is pinged first (see :data:`IDLE_PING_AFTER`).
        """
        pins = self._pins
        depth = getattr(pins, "depth", 0)
        if depth == 0:
            with self._pins_lock:
                pins.kept, self._pins_left = self._pins_left > 0, max(0, self._pins_left - 1)
            pins.connection = None
        pins.depth = depth + 1
        try:
            yield
        finally:
            pins.depth = depth
            if depth == 0 and pins.kept:
                connection, pins.connection, pins.kept = pins.connection, None, False
                try:
                    if connection is not None:
                        connection.close()
                finally:
                    with self._pins_lock:
                        self._pins_left += 1

    @contextmanager
    def _pinned_connection(self) -> Iterator[sa.Connection]:
        """This thread's kept connection, opened on first use (one an error invalidated reconnects by itself)."""
        connection = self._pins.connection
        if connection is None or connection.closed:
            connection = self._pins.connection = self.engine.connect()
        try:
            yield connection
        except BaseException:
            _roll_back(connection)
            raise

    def _run(self, work: _Work[T]) -> T:
        kept = getattr(self._pins, "kept", False)
        return self._run_on(self.engine, work, self._pinned_connection if kept else None)

    def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        """Insert a new run with its first events."""
        return self._run(_create_run(record, events, self.hooks))

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        """Add events and replace the row in one transaction (one statement on PostgreSQL), if the version matches."""
        return self._run(_append(record, expected_version, events, self.hooks))

    def load_run(self, run_id: str, *, tenant: str | None = None) -> RunRecord:
        """The row, if visible to ``tenant``."""
        return self._run(_load_run(run_id, tenant))

    def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """The log (or its events after ``after``, at most ``limit``), oldest first (see :func:`_load_events`)."""
        return self._run(_load_events(run_id, tenant, after, limit))

    def load_log(self, run_id: str, *, tenant: str | None = None, snapshot_format: str | None = None) -> RunLog:
        """The log and the row's version in one consistent read (see :func:`_load_log`)."""
        return self._run(_load_log(run_id, tenant, snapshot_format))

    def save_snapshot(self, run_id: str, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` as the run's latest (see :func:`_save_snapshot`)."""
        return self._run(_save_snapshot(run_id, snapshot))

    def list_runs(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        waiting_retry: bool | None = None,
    ) -> list[RunRecord]:
        """Newest first (see :meth:`tether.stores.Store.list_runs`)."""
        return self._run(_list_runs(status, tenant, limit, waiting_retry))

    def query_runs(self, query: RunQuery, *, limit: int = 50, offset: int = 0) -> RunsFound:
        """One page of the runs ``query`` finds, and how many (see :meth:`tether.stores.Store.query_runs`)."""
        return self._run(_query_runs(query, limit, offset))

    def list_due(self, now: float, *, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Runs whose retry is due at ``now``, earliest first (the status index narrows the scan)."""
        return self._run(_list_due(now, tenant, limit))

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
        """Take or renew the run's lease (see :func:`_claim_run`)."""
        return self._run(_claim_run(run_id, owner, now=now, ttl=ttl, force=force, holder=holder, replacing=replacing))

    def renew_run(self, run_id: str, owner: str, *, now: float, ttl: float) -> RunLease | None:
        """Extend ``owner``'s lease if the row names it, then read what holds."""
        return self._run(_renew_run(run_id, owner, now, ttl))

    def release_run(self, run_id: str, owner: str) -> None:
        """Delete the run's lease if ``owner`` holds it."""
        return self._run(_release_run(run_id, owner))

    def lease_of(self, run_id: str) -> RunLease | None:
        """The run's lease row, if any."""
        return self._run(_lease_of(run_id))

    def cache_get(self, key: str, now: float) -> str | None:
        """The cached value, if present and not expired at ``now``."""
        return self._run(_cache_get(key, now))

    def cache_put(self, key: str, tool: str, value: str, expires_at: float) -> None:
        """Store (or replace) a cached tool result, in one transaction."""
        return self._run(_cache_put(key, tool, value, expires_at))

    def cache_purge(self, now: float) -> int:
        """Delete expired cache entries (the ``expires_at`` index finds them)."""
        return self._run(_cache_purge(now))

    def delete_runs(
        self,
        *,
        finished_before: float,
        statuses: Collection[str],
        tenant: str | None = None,
        include_retryable: bool = False,
        include_parked: bool = False,
    ) -> int:
        """Delete old finished (or, if asked, parked) runs with their events (see :func:`_delete_runs`)."""
        return self._run(_delete_runs(finished_before, statuses, tenant, include_retryable, include_parked))


SQLITE_ONE_WRITER: dict[str, Any] = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 3600.0}
"""AsyncSQLStore on a SQLite file: one connection, used by the store's one thread, which every run's
operations take in turn. SQLite has one writer at a time anyway; 15 pooled connections contending for
its lock sleep in its busy handler instead (fewer steps per second at K >= 16 concurrent runs, see the
benchmarks' history, docs/benchmarks/history.md)."""


def _in_memory(url: sa.engine.URL) -> bool:
    """A ``:memory:`` SQLite database: SQLAlchemy gives it a pool of its own (one connection per thread)."""
    return url.database in (None, "", ":memory:") or "mode=memory" in str(url)


class AsyncSQLStore(_SQLBase):
    """:class:`SQLStore` for an event loop (an :class:`~tether.stores.AsyncStore`): nothing it does blocks the loop.

    The same tables, statements, errors and arguments. A PostgreSQL URL is reached through
    SQLAlchemy's asyncio support and psycopg 3's async mode (the ``async`` extra: ``pip install
    'tether[async]'``). A SQLite URL is reached through the standard
    library's driver on one thread of the store's own: each operation runs there whole, one hop
    from the loop, on one connection (SQLite has one writer anyway). Through aiosqlite every
    statement was a hop of its own: a step cost about 1.5 times as much (see the benchmarks'
    history, docs/benchmarks/history.md). Await :meth:`close` when done.

    ``pool_size``: PostgreSQL connections kept open (SQLAlchemy's default, 5, when None). Size it
    to the runs driven at once: each connection above it is opened for one use and closed again.
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 10.0,
        connect_timeout: int = 10,
        pool_size: int | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        super().__init__(
            url,
            busy_timeout=busy_timeout,
            connect_timeout=connect_timeout,
            snapshot_every=snapshot_every,
            drivers={"postgresql": "psycopg"},
            extra="async",
        )
        self._sqlite_thread = OneThread("tether-sqlite")
        """SQLite only: the one thread every operation runs on (started on first use, ended by close)."""
        self._held: sa.Connection | None = None
        """SQLite only: that thread's connection, kept between operations (no pool checkout per step)."""
        if self._sqlite:
            if self._parsed.get_driver_name() == "aiosqlite":  # a URL written for the former driver
                self._parsed = self._parsed.set(drivername="sqlite")
            one_writer = {} if _in_memory(self._parsed) else SQLITE_ONE_WRITER
            self.engine: sa.Engine | AsyncEngine = self._sync_engine({**self._options, **one_writer})
            return
        options = dict(self._options)
        if pool_size is not None:
            options["pool_size"] = pool_size
        try:
            from sqlalchemy.ext.asyncio import create_async_engine

            self.engine = create_async_engine(self._parsed, **options)
        except (sa.exc.ArgumentError, sa.exc.InvalidRequestError, ImportError) as error:
            raise self._cannot_use(error) from error
        self._configure(self.engine.sync_engine)

    async def close(self) -> None:
        """Close the pooled connections (the store reconnects if used again)."""
        if not isinstance(self.engine, sa.Engine):
            await self.engine.dispose()
            return
        await self._sqlite_thread.call(self._let_go)  # after the work queued there
        self._sqlite_thread.stop()

    async def _run(self, work: _Work[T]) -> T:
        if isinstance(self.engine, sa.Engine):  # SQLite: whole, on the store's thread
            ran = self._sqlite_thread.call(functools.partial(self._run_on, self.engine, work, self._held_connection))
            return await completed(ran)  # see AsyncStore: begun, an operation runs to its end
        return await completed(self._started(work))

    @contextmanager
    def _held_connection(self) -> Iterator[sa.Connection]:
        """On the SQLite thread: its connection, opened on first use.

        One an error invalidated is usable again: SQLAlchemy opens a new driver connection for it.
        """
        assert isinstance(self.engine, sa.Engine)
        held = self._held
        if held is None or held.closed:
            held = self._held = self.engine.connect()
        yield held

    def _let_go(self) -> None:
        """On the SQLite thread: close its connection and the pool."""
        held, self._held = self._held, None
        if held is not None:
            held.close()
        assert isinstance(self.engine, sa.Engine)
        self.engine.dispose()

    async def _started(self, work: _Work[T]) -> T:
        assert not isinstance(self.engine, sa.Engine)
        if not self._ready:  # two first uses at once both set up: it is idempotent
            try:
                async with self.engine.connect() as raw:
                    await raw.run_sync(self._set_up)
            except sa.exc.DBAPIError as error:
                raise self._store_error(error, "cannot open database") from error
        for attempt in range(READ_RETRIES + 1):
            try:
                async with self.engine.connect() as raw:
                    return await raw.run_sync(self._perform, work)
            except (sa.exc.StatementError, sa.exc.DBAPIError) as error:
                if not self._read_again(work, error, attempt):
                    return self._failed(work, error)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def create_run(self, record: RunRecord, events: Sequence[Event]) -> None:
        """See :meth:`SQLStore.create_run`."""
        return await self._run(_create_run(record, events, self.hooks))

    async def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        """See :meth:`SQLStore.append`."""
        return await self._run(_append(record, expected_version, events, self.hooks))

    async def load_run(self, run_id: str, *, tenant: str | None = None) -> RunRecord:
        """See :meth:`SQLStore.load_run`."""
        return await self._run(_load_run(run_id, tenant))

    async def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """See :meth:`SQLStore.load_events`."""
        return await self._run(_load_events(run_id, tenant, after, limit))

    async def load_log(self, run_id: str, *, tenant: str | None = None, snapshot_format: str | None = None) -> RunLog:
        """See :meth:`SQLStore.load_log`."""
        return await self._run(_load_log(run_id, tenant, snapshot_format))

    async def save_snapshot(self, run_id: str, snapshot: Snapshot) -> None:
        """See :meth:`SQLStore.save_snapshot`."""
        return await self._run(_save_snapshot(run_id, snapshot))

    async def list_runs(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        waiting_retry: bool | None = None,
    ) -> list[RunRecord]:
        """See :meth:`SQLStore.list_runs`."""
        return await self._run(_list_runs(status, tenant, limit, waiting_retry))

    async def query_runs(self, query: RunQuery, *, limit: int = 50, offset: int = 0) -> RunsFound:
        """See :meth:`SQLStore.query_runs`."""
        return await self._run(_query_runs(query, limit, offset))

    async def list_due(self, now: float, *, tenant: str | None = None, limit: int = 100) -> list[RunRecord]:
        """See :meth:`SQLStore.list_due`."""
        return await self._run(_list_due(now, tenant, limit))

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
        """See :meth:`SQLStore.claim_run`."""
        return await self._run(
            _claim_run(run_id, owner, now=now, ttl=ttl, force=force, holder=holder, replacing=replacing)
        )

    async def renew_run(self, run_id: str, owner: str, *, now: float, ttl: float) -> RunLease | None:
        """See :meth:`SQLStore.renew_run`."""
        return await self._run(_renew_run(run_id, owner, now, ttl))

    async def release_run(self, run_id: str, owner: str) -> None:
        """See :meth:`SQLStore.release_run`."""
        return await self._run(_release_run(run_id, owner))

    async def lease_of(self, run_id: str) -> RunLease | None:
        """See :meth:`SQLStore.lease_of`."""
        return await self._run(_lease_of(run_id))

    async def cache_get(self, key: str, now: float) -> str | None:
        """See :meth:`SQLStore.cache_get`."""
        return await self._run(_cache_get(key, now))

    async def cache_put(self, key: str, tool: str, value: str, expires_at: float) -> None:
        """See :meth:`SQLStore.cache_put`."""
        return await self._run(_cache_put(key, tool, value, expires_at))

    async def cache_purge(self, now: float) -> int:
        """See :meth:`SQLStore.cache_purge`."""
        return await self._run(_cache_purge(now))

    async def delete_runs(
        self,
        *,
        finished_before: float,
        statuses: Collection[str],
        tenant: str | None = None,
        include_retryable: bool = False,
        include_parked: bool = False,
    ) -> int:
        """See :meth:`SQLStore.delete_runs`."""
        return await self._run(_delete_runs(finished_before, statuses, tenant, include_retryable, include_parked))


# The work of each operation, for both stores ---------------------------------------------
def _create_run(record: RunRecord, events: Sequence[Event], hooks: Sequence[TransactionHook] = ()) -> _Work[None]:
    write = Write(record, events, created=True)
    wanted = _wanted(hooks, write)

    def run(connection: sa.Connection) -> None:
        connection.execute(_INSERT_RUN, _row(record))
        _insert_events(connection, record.id, events)
        _call_hooks(connection, wanted, write)

    def exists(error: sa.exc.IntegrityError) -> None:
        raise StoreError(f"run {record.id!r} already exists") from error

    return _Work(run, on_conflict=exists)


def _append(
    record: RunRecord, expected_version: int, events: Sequence[Event], hooks: Sequence[TransactionHook] = ()
) -> _Work[None]:
    """The row's guarded update and the step's events: one statement on PostgreSQL, two in a transaction elsewhere.

    A row not updated is a run another writer advanced (StaleRun) or that is gone (RunNotFound);
    an event whose seq is taken fails the unique (run, seq), which is the same lost race. A hook
    that wants the write adds its statements to the same transaction (then not one statement alone).
    """
    write = Write(record, events, created=False)
    wanted = _wanted(hooks, write)
    changing = _row(record, changing_only=True)
    values = {"b_id": record.id, "b_expected": expected_version, **{f"b_{k}": v for k, v in changing.items()}}

    def run(connection: sa.Connection) -> None:
        if connection.dialect.name == "postgresql":
            logged = _dump_json([{"seq": e.seq, "type": e.type, "data": _stored_data(e), "at": e.at} for e in events])
            updated = connection.execute(_STEP_POSTGRES, {**values, "b_events": logged}).scalar_one()
        else:
            updated = _sqlite_step(connection, values, record.id, events)
        if updated != 1:
            exists = connection.execute(sa.select(_RUN.c.id).where(_RUN.c.id == record.id)).first()
            raise RunNotFound(record.id) if exists is None else StaleRun(record.id, expected_version)
        _call_hooks(connection, wanted, write)

    def lost(error: sa.exc.IntegrityError) -> None:
        raise StaleRun(record.id, expected_version) from error

    return _Work(run, single=not wanted, on_conflict=lost)


_LOAD_RUN = sa.select(_RUN).where(_RUN.c.id == sa.bindparam("b_id"))
_LOAD_TENANTS_RUN = _LOAD_RUN.where(_RUN.c.tenant == sa.bindparam("b_tenant"))


def _load_run(run_id: str, tenant: str | None) -> _Work[RunRecord]:
    query = _LOAD_RUN if tenant is None else _LOAD_TENANTS_RUN
    values = {"b_id": run_id, "b_tenant": tenant}

    def run(connection: sa.Connection) -> RunRecord:
        row = connection.execute(query, values).mappings().first()
        if row is None:
            raise RunNotFound(run_id)
        return _record(row, strict=True)

    return _Work(run, single=True, reads_only=True)


def _load_events(run_id: str, tenant: str | None, after: int | None, limit: int | None) -> _Work[list[Event]]:
    """The run's events above seq ``after`` (None: all), at most ``limit``, in one statement checking the tenant.

    The run's row is joined outer, so a run with no event after the cursor still answers (a
    row of nulls): what a follower polling an idle run reads, by primary key, each time.
    """
    events = (_EVENT.c.run_id == _RUN.c.id) & (_EVENT.c.seq > (-1 if after is None else after))
    query = (
        sa.select(_EVENT.c.seq, _EVENT.c.type, _EVENT.c.data, _EVENT.c.at)
        .select_from(_RUN.outerjoin(_EVENT, events))
        .where(_RUN.c.id == run_id)
        .order_by(_EVENT.c.seq)
    )
    if tenant is not None:
        query = query.where(_RUN.c.tenant == tenant)
    check_limit(limit, least=1)
    if limit is not None:
        query = query.limit(limit)

    def run(connection: sa.Connection) -> list[Event]:
        rows = connection.execute(query).mappings().all()
        if not rows:
            raise RunNotFound(run_id)
        return [_event(run_id, r) for r in rows if r["seq"] is not None]

    return _Work(run, single=True, reads_only=True)


def _load_log(run_id: str, tenant: str | None, snapshot_format: str | None) -> _Work[RunLog]:
    """The row's version with the events, in one statement; first the run's snapshot in ``snapshot_format``, if asked.

    The snapshot may be read a moment before the rest: it folds events up to its seq, which
    never change, so it and the events after it (read with the version) are still one log.
    A snapshot that cannot be read is ignored: the whole log is read instead.
    """
    after = sa.bindparam("after", type_=sa.Integer)
    query = (
        sa.select(_RUN.c.version, _RUN.c.tenant, _EVENT.c.seq, _EVENT.c.type, _EVENT.c.data, _EVENT.c.at)
        .select_from(_RUN.outerjoin(_EVENT, (_EVENT.c.run_id == _RUN.c.id) & (_EVENT.c.seq > after)))
        .where(_RUN.c.id == run_id)
        .order_by(_EVENT.c.seq)
    )
    if tenant is not None:
        query = query.where(_RUN.c.tenant == tenant)
    kept = sa.select(_SNAPSHOT.c.seq, sa.cast(_SNAPSHOT.c.state, sa.Text)).where(
        _SNAPSHOT.c.run_id == run_id, _SNAPSHOT.c.format == snapshot_format
    )  # as text, parsed here: the driver's JSONB reader took 4x the CPU for a long run's snapshot

    def run(connection: sa.Connection) -> RunLog:
        snapshot = None
        if snapshot_format is not None:
            found = connection.execute(kept).first()
            state = None if found is None else _unpacked(_load_json(found[1]))
            if found is not None and isinstance(state, dict):
                snapshot = Snapshot(found.seq, snapshot_format, state)
        rows = connection.execute(query, {"after": -1 if snapshot is None else snapshot.seq}).mappings().all()
        if not rows:
            raise RunNotFound(run_id)
        events = [_event(run_id, r) for r in rows if r["seq"] is not None]
        return RunLog(rows[0]["version"], rows[0]["tenant"], events, snapshot)

    return _Work(run, single=True, reads_only=True)


def _save_snapshot(run_id: str, snapshot: Snapshot) -> _Work[None]:
    """Upsert the run's snapshot; an older one (lower seq, same format) never replaces a newer one."""

    def run(connection: sa.Connection) -> None:
        values = {"run_id": run_id, "seq": snapshot.seq, "format": snapshot.format, "state": _packed(snapshot.state)}
        connection.execute(_snapshot_upsert(connection.dialect.name), values)

    def gone(error: sa.exc.IntegrityError) -> None:
        """The run was deleted meanwhile (its foreign key): nothing to keep."""

    return _Work(run, single=True, on_conflict=gone)


@functools.cache
def _snapshot_upsert(dialect_name: str) -> Any:
    """The upsert of :func:`_save_snapshot`, built once per dialect (building it was a third of a snapshot's write)."""
    insert = _bound_insert(dialect_name, _SNAPSHOT)
    newer = (_SNAPSHOT.c.seq <= insert.excluded.seq) | (_SNAPSHOT.c.format != insert.excluded.format)
    return insert.on_conflict_do_update(
        index_elements=[_SNAPSHOT.c.run_id],
        set_={"seq": insert.excluded.seq, "format": insert.excluded.format, "state": insert.excluded.state},
        where=newer,
    )


def _bound_insert(dialect_name: str, table: sa.Table) -> Any:
    """The dialect's INSERT of a whole row of ``table``, each value bound at execution by its column's name."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    return dialect.insert(table).values(
        {column.name: sa.bindparam(column.name, type_=column.type) for column in table.c}
    )


PACK_ABOVE = 4096
"""A snapshot whose JSON is longer than this (bytes) is stored zlib-compressed: it holds the
whole history, so a long run's snapshots were most of the bytes its log wrote (about 115 KB at
1000 steps, 7 KB compressed, 0.24 ms to compress)."""
_PACKED_KEY = "tether_zlib_base64"


def _packed(state: dict[str, Any]) -> dict[str, Any]:
    """The snapshot's state as stored: as is, or its JSON compressed under one key (still a JSON object)."""
    text = _dump_json(state)
    if len(text) <= PACK_ABOVE:
        return state
    return {_PACKED_KEY: base64.b64encode(zlib.compress(text.encode(), 1)).decode("ascii")}


def _unpacked(stored: Any) -> Any:
    """A stored snapshot's state (see :func:`_packed`); what cannot be unpacked is None (the log is read whole)."""
    if not (isinstance(stored, dict) and len(stored) == 1 and isinstance(stored.get(_PACKED_KEY), str)):
        return stored
    try:
        return _load_json(zlib.decompress(base64.b64decode(stored[_PACKED_KEY], validate=True)))
    except (ValueError, zlib.error):
        return None


def _list_runs(
    status: str | None, tenant: str | None, limit: int, waiting_retry: bool | None
) -> _Work[list[RunRecord]]:
    check_limit(limit)
    query = sa.select(_RUN).order_by(_RUN.c.created_at.desc(), _RUN.c.id.desc()).limit(limit)
    if status is not None:
        query = query.where(_RUN.c.status == to_stored(status))
    if waiting_retry is not None:
        due_at = _RUN.c.summary[DUE_KEY].as_float()
        query = query.where(due_at.is_not(None) if waiting_retry else due_at.is_(None))
    if tenant is not None:
        query = query.where(_RUN.c.tenant == tenant)
    return _Work(functools.partial(_records, query), single=True, reads_only=True)


def _query_runs(query: RunQuery, limit: int, offset: int) -> _Work[RunsFound]:
    """A page of the runs found and their number, in one transaction: the indexed filters come first."""
    check_limit(limit, offset)
    where = _found_by(query)
    counted = sa.select(sa.func.count()).select_from(_RUN).where(*where)
    if query.longest_waiting_first:
        since = sa.func.coalesce(_RUN.c.summary[WAITING_KEY].as_float(), _RUN.c.updated_at)  # see waiting_since
        order = (since.asc(), _RUN.c.id.asc())
    else:
        order = (_RUN.c.created_at.desc(), _RUN.c.id.desc())
    page = sa.select(_RUN).where(*where).order_by(*order).limit(limit).offset(offset)

    def run(connection: sa.Connection) -> RunsFound:
        total = int(connection.execute(counted).scalar_one())
        return RunsFound(_records(page, connection) if limit and offset < total else [], total)

    return _Work(run, reads_only=True)


def _found_by(query: RunQuery) -> list[Any]:
    """The WHERE clauses of a :class:`RunQuery`: indexed columns (status, tenant, created_at), then the rest."""
    where: list[Any] = []
    if query.status is not None:
        where.append(_RUN.c.status == to_stored(query.status))
    if query.tenant is not None:
        where.append(_RUN.c.tenant == query.tenant)
    if query.created_from is not None:
        where.append(_RUN.c.created_at >= query.created_from)
    if query.created_before is not None:
        where.append(_RUN.c.created_at < query.created_before)
    if query.waiting_retry is not None:
        due_at = _RUN.c.summary[DUE_KEY].as_float()
        where.append(due_at.is_not(None) if query.waiting_retry else due_at.is_(None))
    if query.id_prefix is not None:  # LIKE ignores ASCII case on SQLite: the exact test follows it
        where.append(_RUN.c.id.startswith(query.id_prefix, autoescape=True))
        where.append(sa.func.substr(_RUN.c.id, 1, len(query.id_prefix)) == query.id_prefix)
    if query.roots_only:
        where.append(_RUN.c.spec[PARENT_KEY].as_string().is_(None))
    for key, part in (("agent", query.agent), ("model", query.model)):
        if part:
            where.append(_RUN.c.spec[key].as_string().icontains(part, autoescape=True))
    if query.text:
        where.append(_text_found(query.text))
    return where


def _text_found(text: str) -> Any:
    """Where ``text`` is part of a run's id, prompt, tools, pending calls, error or answer (any case).

    The prompt is the row's (``spec["prompt"]``); a run written before rows kept it is searched in
    its first event's messages. JSON kept as text is searched for ``text`` as JSON spells it.
    """
    spelled = json.dumps(text, ensure_ascii=False)[1:-1]

    def in_json(value: Any) -> Any:
        return sa.cast(value, sa.Text).icontains(spelled, autoescape=True)

    prompt = _RUN.c.spec["prompt"].as_string()
    first_event = sa.select(_EVENT.c.seq).where(_EVENT.c.run_id == _RUN.c.id, _EVENT.c.seq == 0)
    tool_started = sa.select(_EVENT.c.seq).where(_EVENT.c.run_id == _RUN.c.id, _EVENT.c.type == "tool_started")
    return sa.or_(
        _RUN.c.id.icontains(text, autoescape=True),
        prompt.icontains(text, autoescape=True),
        sa.and_(prompt.is_(None), first_event.where(in_json(_EVENT.c.data["messages"])).exists()),
        tool_started.where(_EVENT.c.data["tool"].as_string().icontains(text, autoescape=True)).exists(),
        in_json(_RUN.c.summary["pending_approvals"]),
        _RUN.c.summary["error"].as_string().icontains(text, autoescape=True),
        _RUN.c.summary["output"].as_string().icontains(text, autoescape=True),
    )


def _list_due(now: float, tenant: str | None, limit: int) -> _Work[list[RunRecord]]:
    check_limit(limit)
    due_at = _RUN.c.summary[DUE_KEY].as_float()
    query = (
        sa.select(_RUN)
        .where(_RUN.c.status == to_stored(WAITING_RETRY_STATUS), due_at <= now)
        .where(_RUN.c.spec[PARENT_KEY].as_string().is_(None))  # a child is driven by its root, listed instead
        .order_by(due_at, _RUN.c.id)
        .limit(limit)
    )
    if tenant is not None:
        query = query.where(_RUN.c.tenant == tenant)
    return _Work(functools.partial(_records, query), single=True, reads_only=True)


def _records(query: Any, connection: sa.Connection) -> list[RunRecord]:
    return [_record(r, strict=False) for r in connection.execute(query).mappings().all()]


def _claim_run(
    run_id: str, owner: str, *, now: float, ttl: float, force: bool, holder: Holder | None, replacing: str | None
) -> _Work[RunLease]:
    """Take or renew the run's lease in one upsert guarded by a WHERE: one round trip when it is taken.

    The upsert answers the lease it wrote; when its WHERE refuses (another owner holds an
    unexpired lease, not the dead one it replaces), the lease in force is read after it.
    """
    values = {"run_id": run_id, "owner": owner, "expires_at": now + ttl, "claimed_at": now, **_holder_row(holder)}
    values.update(now=now, replacing=replacing)
    kind = "any" if force else "free" if replacing is None else "free or replacing"

    def run(connection: sa.Connection) -> RunLease:
        return _written_or_held(connection, run_id, _claim_statement(connection.dialect.name, kind), values)

    return _Work(run, single=True)


@functools.cache
def _claim_statement(dialect_name: str, kind: str) -> Any:
    """The lease upsert of :func:`_claim_run`, built once per dialect and ``kind`` of claim.

    Its values are bound at execution (``now`` and ``replacing`` too): building it per claim was
    most of a claim's CPU (about a tenth of a 10-call run's).
    """
    insert = _bound_insert(dialect_name, _LEASE)
    mine = _LEASE.c.owner == insert.excluded.owner
    free = mine | (_LEASE.c.expires_at <= sa.bindparam("now", type_=sa.Float))
    where = {"any": None, "free": free, "free or replacing": free | (_LEASE.c.owner == sa.bindparam("replacing"))}
    return insert.on_conflict_do_update(
        index_elements=[_LEASE.c.run_id],
        set_={
            **{c.name: insert.excluded[c.name] for c in _LEASE.c if c.name not in ("run_id", "claimed_at")},
            "claimed_at": sa.case((mine, _LEASE.c.claimed_at), else_=insert.excluded.claimed_at),
        },
        where=where[kind],
    ).returning(*_LEASE.c)


def _renew_run(run_id: str, owner: str, now: float, ttl: float) -> _Work[RunLease | None]:
    """Extend the owner's lease: the lease in force after it (another owner's if it was taken), None if gone."""
    values = {"b_run_id": run_id, "b_owner": owner, "b_expires_at": now + ttl}

    def run(connection: sa.Connection) -> RunLease | None:
        renewed = connection.execute(_RENEW_LEASE, values).mappings().first()
        return _lease(renewed) if renewed is not None else _held(connection, run_id)

    return _Work(run, single=True)


def _written_or_held(connection: sa.Connection, run_id: str, write: Any, values: Mapping[str, Any]) -> RunLease:
    """The lease ``write`` (an upsert answering its row, given ``values``) wrote, else the one in force."""
    for _ in range(3):  # the holder that refused it may release it before it is read: then write again
        written = connection.execute(write, values).mappings().first()
        lease = _lease(written) if written is not None else _held(connection, run_id)
        if lease is not None:
            return lease
    raise StoreError(f"run {run_id}: its lease kept changing hands while this process claimed it", transient=True)


def _held(connection: sa.Connection, run_id: str) -> RunLease | None:
    row = connection.execute(_LEASE_OF, {"b_run_id": run_id}).mappings().first()
    return None if row is None else _lease(row)


def _lease_of(run_id: str) -> _Work[RunLease | None]:
    return _Work(functools.partial(_held, run_id=run_id), single=True, reads_only=True)


def _release_run(run_id: str, owner: str) -> _Work[None]:
    def run(connection: sa.Connection) -> None:
        connection.execute(_RELEASE_LEASE, {"b_run_id": run_id, "b_owner": owner})

    return _Work(run, single=True)


def _cache_get(key: str, now: float) -> _Work[str | None]:
    query = sa.select(_CACHE.c.value).where(_CACHE.c.key == key, _CACHE.c.expires_at > now)

    def run(connection: sa.Connection) -> str | None:
        value = connection.execute(query).scalar()
        return None if value is None else codec.decode_text(str(value))

    return _Work(run, single=True, reads_only=True)


def _cache_put(key: str, tool: str, value: str, expires_at: float) -> _Work[None]:
    stored = codec.encode_text(value)  # PostgreSQL text holds no NUL nor lone surrogate
    row = {"key": key, "tool": tool, "value": stored, "created_at": time.time(), "expires_at": expires_at}

    def run(connection: sa.Connection) -> None:
        connection.execute(sa.delete(_CACHE).where(_CACHE.c.key == key))
        connection.execute(sa.insert(_CACHE).values(**row))

    def cached_meanwhile(error: sa.exc.IntegrityError) -> None:
        """Another process cached the same call at the same moment: its value is as good."""

    return _Work(run, on_conflict=cached_meanwhile)


def _cache_purge(now: float) -> _Work[int]:
    def run(connection: sa.Connection) -> int:
        return int(connection.execute(sa.delete(_CACHE).where(_CACHE.c.expires_at <= now)).rowcount)

    return _Work(run, single=True)


def _delete_runs(
    finished_before: float, statuses: Collection[str], tenant: str | None, include_retryable: bool, include_parked: bool
) -> _Work[int]:
    """Delete finished (or, if asked, parked) runs last updated before ``finished_before``, with their events.

    A failed or parked run can still change (resuming it moves it on), so the rows are
    locked as they are chosen (``FOR UPDATE`` on PostgreSQL; SQLite has one writer) and
    every DELETE repeats the conditions: a run another process resumed meanwhile is left
    whole, never deleted, never stripped of its events (nor of its lease).
    """
    check_deletable(statuses)
    chosen = _RUN.c.status.in_(sorted(to_stored(status) for status in statuses))
    if not include_retryable:  # a transient failure may still be resumed: keep it
        retryable = sa.func.coalesce(_RUN.c.summary["retryable"].as_boolean(), sa.false())
        chosen &= (_RUN.c.status != RunStatus.failed.value) | sa.not_(retryable)
    if include_parked:  # unless a driver held its lease since the cutoff
        driven = sa.exists().where(_LEASE.c.run_id == _RUN.c.id, _LEASE.c.expires_at >= finished_before)
        chosen |= _RUN.c.status.in_(sorted(to_stored(status) for status in PARKED_STATUSES)) & sa.not_(driven)
    doomed = chosen & (_RUN.c.updated_at < finished_before)
    if tenant is not None:
        doomed &= _RUN.c.tenant == tenant

    def run(connection: sa.Connection) -> int:
        deleted = 0
        ids = [row[0] for row in connection.execute(sa.select(_RUN.c.id).where(doomed).with_for_update())]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            still = sa.select(_RUN.c.id).where(_RUN.c.id.in_(chunk), doomed)
            connection.execute(sa.delete(_SNAPSHOT).where(_SNAPSHOT.c.run_id.in_(still)))
            connection.execute(sa.delete(_EVENT).where(_EVENT.c.run_id.in_(still)))
            deleted += connection.execute(sa.delete(_RUN).where(_RUN.c.id.in_(chunk), doomed)).rowcount
            kept = sa.select(_RUN.c.id).where(_RUN.c.id.in_(chunk))
            connection.execute(sa.delete(_LEASE).where(_LEASE.c.run_id.in_(chunk), _LEASE.c.run_id.not_in(kept)))
        return deleted

    return _Work(run)


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


def _to_v4(connection: sa.Connection) -> None:
    """Version 3 to 4: the snapshot table (see :mod:`tether.core.snapshots`); it starts empty, runs load whole."""
    _SNAPSHOT.create(connection, checkfirst=True)


def _to_v5(connection: sa.Connection) -> None:
    """Version 4 to 5: a lease names its holder process; leases held now keep null there (their ttl rules)."""
    present = {column["name"] for column in sa.inspect(connection).get_columns(_LEASE.name)}
    for column in _LEASE.c:
        if column.name not in present:
            kind = column.type.compile(dialect=connection.dialect)
            connection.execute(sa.text(f"ALTER TABLE {_LEASE.name} ADD COLUMN {column.name} {kind}"))


MIGRATIONS: tuple[tuple[int, Callable[[sa.Connection], None]], ...] = (
    (1, _to_v2),
    (2, _to_v3),
    (3, _to_v4),
    (4, _to_v5),
)
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
        SQLModel.metadata.create_all(connection, tables=[_RUN, _EVENT, _META, _CACHE, _LEASE, _SNAPSHOT])
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
            "status": to_stored(record.status),
            "version": record.version,
            "summary": record.summary,
            "updated_at": record.updated_at,
        }
    return {
        "id": record.id,
        "tenant": record.tenant,
        "status": to_stored(record.status),
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
        status=from_stored(row["status"]),
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
    data = row["data"]
    if row["type"] == "transition":  # the statuses as the rest of tether spells them (a damaged row: as it is)
        data = {**data, **{k: from_stored(v) for k in ("source", "target") if isinstance(v := data.get(k), str)}}
    return decode(run_id, row["seq"], row["type"], data, row["at"])


def _stored_data(event: Event) -> dict[str, Any]:
    """An event's payload as the database keeps it: a transition's statuses in the stored spelling."""
    data = event.data
    if event.type == "transition":
        source, target = data["source"], data["target"]
        data = {**data, "source": source and to_stored(source), "target": to_stored(target)}
    return data


def _problem(value: Any, what: str, *, absent: bool = False) -> str | None:
    """What is wrong with a stored JSON value that must be an object (None: nothing; ``absent``: null is wrong too)."""
    if isinstance(value, _Unreadable):
        return f"its stored {what} is not valid JSON ({value.error})"
    if (value is None and absent) or not isinstance(value, dict | None):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        return f"its stored {what} is {kind}, not a JSON object"
    return None


def _lease(row: Any) -> RunLease:
    holder = None
    if row["holder_host"] is not None and row["holder_pid"] is not None:
        holder = Holder(row["holder_host"], row["holder_pid_namespace"], row["holder_pid"], row["holder_started"])
    return RunLease(row["run_id"], row["owner"], row["expires_at"], row["claimed_at"], holder)


def _holder_row(holder: Holder | None) -> dict[str, Any]:
    """The lease row's holder columns for ``holder`` (all null: unknown)."""
    return {
        "holder_host": holder and holder.host,
        "holder_pid_namespace": holder and holder.pid_namespace,
        "holder_pid": holder and holder.pid,
        "holder_started": holder and holder.started,
    }


_INSERT_EVENTS = sa.insert(_EVENT)
"""Built once: building it per step cost about 1 % of a step."""


@dataclass(frozen=True)
class _Compiled:
    """A statement compiled for SQLite once, to run on the driver's cursor."""

    text: str
    params: tuple[tuple[str, bool], ...]
    """Each ``?`` parameter in order: its name, and whether it is JSON (dumped as the column would)."""

    @classmethod
    def of(cls, statement: Any, columns: Sequence[str] | None = None) -> _Compiled:
        compiled = statement.compile(dialect=sqlite.dialect(), column_keys=columns)
        names = compiled.positiontup or ()
        return cls(str(compiled), tuple((n, isinstance(compiled.binds[n].type, sa.JSON)) for n in names))

    def bind(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The driver's parameters from ``values`` (by name), JSON content dumped."""
        return tuple(_dump_json(values[name]) if is_json else values[name] for name, is_json in self.params)


_SQLITE_STEP_ROW = _Compiled.of(_STEP_UPDATE)
_SQLITE_STEP_EVENTS = _Compiled.of(_INSERT_EVENTS, ("run_id", "seq", "type", "data", "at"))
if _SQLITE_STEP_EVENTS.params != (("run_id", False), ("seq", False), ("type", False), ("data", True), ("at", False)):
    raise AssertionError(f"_sqlite_step binds an event's values in another order: {_SQLITE_STEP_EVENTS.params}")


def _sqlite_step(connection: sa.Connection, values: Mapping[str, Any], run_id: str, events: Sequence[Event]) -> int:
    """A step's row update and events on SQLite: rows the update changed (1, or 0 for a lost race).

    The statements are compiled once (above) and run on the driver's cursor, in the transaction
    the connection opened: SQLAlchemy's per-execution work was over half of this write's time
    (about 270 µs against 150 µs per step, measured). Errors come out as SQLAlchemy's, as from
    ``connection.execute``, so the store says them one way.
    """
    dbapi = connection.dialect.loaded_dbapi
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    params: Any = _SQLITE_STEP_ROW.bind(values)
    text = _SQLITE_STEP_ROW.text
    try:
        cursor.execute(text, params)
        if cursor.rowcount != 1 or not events:
            return int(cursor.rowcount)
        # Each event's values in the statement's order (checked above), with no row dict to bind by name.
        params = [(run_id, e.seq, e.type, _dump_json(_stored_data(e)), e.at) for e in events]
        text = _SQLITE_STEP_EVENTS.text
        cursor.executemany(text, params)
        return 1
    except dbapi.Error as error:
        raise sa.exc.DBAPIError.instance(text, params, error, dbapi.Error, dialect=connection.dialect) from error
    finally:
        cursor.close()


def _roll_back(raw: sa.Connection) -> None:
    """End what a failed operation left open, in SQLAlchemy and at the driver.

    A failed COMMIT leaves SQLite's transaction open, and a kept connection has no return to the
    pool to reset it.
    """
    if raw.invalidated:
        return
    try:
        if raw.in_transaction():
            raw.rollback()
        driver = raw.connection.dbapi_connection
        if driver is not None:
            driver.rollback()
    except (sa.exc.DBAPIError, raw.dialect.loaded_dbapi.Error):
        raw.invalidate()  # never reuse a connection whose transaction is in doubt


def _event_rows(run_id: str, events: Sequence[Event]) -> list[dict[str, Any]]:
    """The event table's rows for ``events`` of one run."""
    return [{"run_id": run_id, "seq": e.seq, "type": e.type, "data": _stored_data(e), "at": e.at} for e in events]


def _insert_events(connection: sa.Connection, run_id: str, events: Sequence[Event]) -> None:
    if events:
        connection.execute(_INSERT_EVENTS, _event_rows(run_id, events))
