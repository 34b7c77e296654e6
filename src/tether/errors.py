"""Errors tether raises, each carrying the context a caller needs.

The tree::

    TetherError
    ├── ToolDefinitionError      a function cannot become a tool (bad name, bad hints)
    ├── ModelError               the model call failed (API status, message, retryable?)
    ├── RunError                 about one run (.run_id)
    │   ├── RunNotFound          no such run (or another tenant's)
    │   ├── StaleRun             another process advanced the run first
    │   │   └── RunBusy          another live process is running one of its tool calls
    │   ├── InvalidHistory       the history would break the Messages API pairing rules
    │   ├── IncompatibleRun      the run's tools or machine changed incompatibly since it started
    │   └── ApprovalError        a decision that cannot apply (unknown/decided call, bad input)
    ├── StoreError               the database could not be read or written (.transient: may pass)
    │   └── CorruptData          a stored value cannot be read (.run_id, .where): changed outside tether
    └── ConfigError              bad CLI/agent configuration (tools spec, model name, db url)

Signals are not errors: a denial is data, and a tool that wants a retry raises
:class:`tether.tools.RetryLater`, which is not a TetherError.
"""

from __future__ import annotations


class TetherError(Exception):
    """Base class of every error tether raises on purpose."""


class ToolDefinitionError(TetherError):
    """A function cannot be turned into a tool."""

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


class ConfigError(TetherError):
    """Configuration given by a user (CLI flags, tool specs, model names) is invalid."""


class ModelError(TetherError):
    """A model invocation failed after the SDK's own retries.

    Attributes:
        status: the HTTP status, when the API answered.
        retryable: whether trying again later may succeed (429/5xx/529, connection).
        retry_waits: seconds the adapter waited before each of its retries of this call.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_waits: tuple[float, ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_waits = retry_waits


class StoreError(TetherError):
    """The store could not read or write (locked, unreachable, full).

    Attributes:
        transient: the failure may pass by itself (a SQLite lock held past the busy timeout,
            a dropped PostgreSQL connection): the same write may succeed if tried again.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class CorruptData(StoreError):
    """A run's stored row or event cannot be read: changed outside tether, or the database is damaged.

    Attributes:
        run_id: the run the value belongs to.
        where: which value (``summary``, ``event 3``...) and what is wrong with it.
    """

    def __init__(self, run_id: str, where: str) -> None:
        super().__init__(
            f"run {run_id!r} cannot be read: {where} (the database was changed outside tether, or is damaged)"
        )
        self.run_id = run_id
        self.where = where


class RunError(TetherError):
    """An error about one run."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunNotFound(RunError):
    """No run with this id is visible (it does not exist or belongs to another tenant)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} not found", run_id=run_id)


class StaleRun(RunError):
    """Another writer advanced the run since it was loaded; reload and decide again."""

    def __init__(self, run_id: str, expected_version: int) -> None:
        super().__init__(
            f"run {run_id!r} was changed by another process (expected version "
            f"{expected_version}); reload it and try again",
            run_id=run_id,
        )
        self.expected_version = expected_version


class RunBusy(StaleRun):
    """Another live driver is executing a tool call of this run; leave the run to it."""

    def __init__(self, run_id: str, call_id: str, owner: str) -> None:
        RunError.__init__(
            self,
            f"run {run_id!r} is being driven by {owner} (tool call {call_id} in progress); only if you know "
            f"that process is gone, take the run over with `tether resume {run_id} --force` (drive(force=True))",
            run_id=run_id,
        )
        self.expected_version = -1
        self.call_id = call_id
        self.owner = owner


class InvalidHistory(RunError):
    """The history would violate the Messages API rules (a bug, never sent)."""


class IncompatibleRun(RunError):
    """The run was started with a machine or tools this code cannot continue."""


class ApprovalError(RunError):
    """A decision on a pending tool call that cannot be applied."""

    def __init__(self, message: str, *, run_id: str, call_id: str) -> None:
        super().__init__(message, run_id=run_id)
        self.call_id = call_id
