"""Errors tether raises, each carrying the context a caller needs.

The tree::

    TetherError
    ├── ToolDefinitionError      a function cannot become a tool (bad name, bad hints)
    ├── ModelError               the model call failed (API status, message, retryable?)
    ├── RunError                 about one run (.run_id)
    │   ├── RunNotFound          no such run (or another tenant's)
    │   ├── StaleRun             another process advanced the run first
    │   │   └── RunBusy          another process holds the run's lease (it drives the run)
    │   ├── InvalidHistory       the history would break the Messages API pairing rules
    │   ├── IncompatibleRun      the run's tools or machine changed incompatibly since it started
    │   └── ApprovalError        a decision that cannot apply (unknown/decided call, bad input)
    ├── StoreError               the database could not be read or written
    └── ConfigError              bad CLI/agent configuration (tools spec, model name, db url)

Signals are not errors: a denial is data, and a tool that wants a retry raises
:class:`tether.tools.RetryLater`, which is not a TetherError.
"""

from __future__ import annotations

import time


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
    """The store could not read or write (locked, unreachable, full)."""


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

    def __init__(self, run_id: str, expected_version: int, *, detail: str | None = None) -> None:
        super().__init__(
            detail
            or f"run {run_id!r} was changed by another process (expected version {expected_version}); "
            "reload it and try again",
            run_id=run_id,
        )
        self.expected_version = expected_version


class RunBusy(StaleRun):
    """Another process holds the run's lease: it drives the run, so leave the run to it.

    Attributes:
        owner: the holder, ``host:pid:token`` (for people: liveness comes from the lease alone).
        expires_at: Unix time the holder's lease ends unless it renews it (None when ``lost``).
        lost: this process held the lease and another took it over (it stopped writing).
    """

    def __init__(self, run_id: str, owner: str, expires_at: float | None, *, lost: bool = False) -> None:
        if lost:
            message = (
                f"this process lost run {run_id!r} to {owner} (it took the run's lease over, forced or after "
                "this process stopped renewing it): it stopped and wrote nothing more; the run is theirs now"
            )
        else:
            until = "?" if expires_at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires_at))
            message = (
                f"another process is driving run {run_id!r}: {owner} holds its lease until {until} and renews "
                f"it while it works. Leave the run to it; only if you know that process is gone, take the run "
                f"over with `tether resume {run_id} --force` (drive(force=True))"
            )
        super().__init__(run_id, -1, detail=message)
        self.owner = owner
        self.expires_at = expires_at
        self.lost = lost


class InvalidHistory(RunError):
    """The history would violate the Messages API rules (a bug, never sent)."""


class IncompatibleRun(RunError):
    """The run was started with a machine or tools this code cannot continue."""


class ApprovalError(RunError):
    """A decision on a pending tool call that cannot be applied."""

    def __init__(self, message: str, *, run_id: str, call_id: str) -> None:
        super().__init__(message, run_id=run_id)
        self.call_id = call_id
