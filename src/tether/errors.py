"""Errors tether raises, each carrying the context a caller needs.

The tree::

    TetherError
    ├── ToolDefinitionError      a function cannot become a tool (bad name, bad hints)
    ├── ModelError               the model call failed (API status, message, retryable?)
    ├── RunError                 about one run (.run_id)
    │   ├── RunNotFound          no such run (or another tenant's)
    │   ├── RunEnded             the run has ended: nothing can change it (e.g. cancel it)
    │   ├── UnknownCursor        a stream asked to go on after an event the run's log lacks (.cursor)
    │   ├── StaleRun             another process advanced the run first
    │   │   └── RunBusy          another process holds the run's lease (it drives the run)
    │   ├── InvalidHistory       the history would break the Messages API pairing rules
    │   ├── IncompatibleRun      the run's tools or machine changed incompatibly since it started
    │   ├── InvalidForkPoint     a fork cannot start there (.event, .nearest): mid-turn, out of range
    │   └── ApprovalError        a decision that cannot apply (.call_id)
    │       ├── AlreadyDecided       the call was decided before (.actor, .approved)
    │       ├── UnknownCall          the model never asked for this call in the run
    │       ├── NotAwaitingApproval  the run is not parked, or not on this call (.status)
    │       ├── StaleFingerprint     the arguments differ from those shown (.expected, .shown)
    │       ├── DeniedByPolicy       a rule (or the tool's gate) denies the edited input (.reason)
    │       └── InvalidEditedInput   the tool's schema rejects the edited input (.tool, .problems)
    ├── StoreError               the database could not be read or written (.transient: may pass)
    │   └── CorruptData          a stored value cannot be read (.run_id, .where): changed outside tether
    ├── ConfigError              bad configuration: CLI flags, tool specs, model names, policy
    │   │                        values (also a ValueError, as Python's own bad-value errors are)
    │   ├── AmbiguousRunId       the start of an id that several runs' ids start with (.candidates)
    │   ├── NoDatabase           the database a URL names is not there (a SQLite file, a PostgreSQL database)
    │   └── ToolsetError         an MCP server or OpenAPI service gives no tools: unreachable,
    │                            invalid spec (.path), a credential's variable unset (.toolset)
    └── MissingExtra             an optional dependency is not installed (.extra to install);
                                 also an ImportError, which is what Python code expects

Signals are not errors: a denial is data, and a tool that wants a retry raises
:class:`tether.tools.RetryLater`, which is not a TetherError.
"""

from __future__ import annotations

import time
from collections.abc import Mapping


class TetherError(Exception):
    """Base class of every error tether raises on purpose."""


class ToolDefinitionError(TetherError):
    """A function cannot be turned into a tool."""

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


class ConfigError(TetherError, ValueError):
    """Configuration given by a user (CLI flags, tool specs, model names, policy values) is invalid.

    Also a :class:`ValueError`: a bad value passed to a constructor (``RetryPolicy(max_attempts=0)``)
    is what Python code expects ``except ValueError`` to catch, and callers that did keep working.
    """


class NoDatabase(ConfigError):
    """The database a URL names is not there: nothing was created.

    A PostgreSQL database is made with ``createdb``; a SQLite file by the first run, never by a
    command that only reads or decides.
    """


class ToolsetError(ConfigError):
    """A toolset cannot give its tools: its server is unreachable, its spec invalid, a credential unset.

    Attributes:
        toolset: the toolset, in words (``MCP server 'python server.py'``, ``OpenAPI spec api.yaml``).
        path: where in its spec the problem is (``paths./pets.get.parameters.0``), when it is in one.
    """

    def __init__(self, message: str, *, toolset: str, path: str | None = None) -> None:
        where = f" at {path}" if path else ""
        super().__init__(f"{toolset}{where}: {message}")
        self.toolset = toolset
        self.path = path


class AmbiguousRunId(ConfigError):
    """Several runs' ids start with what was given as a run's id: which one is meant is not known.

    Attributes:
        prefix: what was given.
        candidates: the ids of the newest runs it could name (at most a few).
        total: how many runs' ids start with it.
    """

    def __init__(self, prefix: str, candidates: list[str], total: int) -> None:
        more = f" and {total - len(candidates)} more" if total > len(candidates) else ""
        super().__init__(
            f"{prefix!r} is the start of {total} runs' ids: {', '.join(candidates)}{more}; give more of the id"
        )
        self.prefix = prefix
        self.candidates = candidates
        self.total = total


class MissingExtra(TetherError, ImportError):
    """A feature needs an optional extra that is not installed: one line saying which to install.

    Also an :class:`ImportError` (``name`` is the missing module), so code that imports a
    feature inside ``try: ... except ImportError`` keeps working.

    Attributes:
        feature: what was asked for, in words (``tether ui``, ``an MCP toolset``).
        extra: the extra that brings what it needs (``pip install 'tether[EXTRA]'``).
    """

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(f"{feature} needs: pip install 'tether[{extra}]' ({module} is not installed)", name=module)
        self.feature = feature
        self.extra = extra


class ModelError(TetherError):
    """A model invocation failed after the SDK's own retries.

    Attributes:
        status: the HTTP status, when the API answered.
        retryable: whether trying again later may succeed (429/5xx/529, connection, a missing API key).
        retry_waits: seconds the adapter waited before each of its retries of this call.
        context_exceeded: the conversation no longer fits the model's context (an agent with
            history processors compacts it and asks again).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_waits: tuple[float, ...] = (),
        context_exceeded: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_waits = retry_waits
        self.context_exceeded = context_exceeded


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


class RunEnded(RunError):
    """The run is done, cancelled, or failed for good: an action that needs it going cannot apply."""

    def __init__(self, run_id: str, status: str, action: str) -> None:
        super().__init__(f"run {run_id} has already ended ({status}): nothing to {action}", run_id=run_id)
        self.status = status


class UnknownCursor(RunError):
    """A stream was asked to go on after an event the run's log does not hold (a cursor of another run, or made up).

    Attributes:
        cursor: the cursor given (an event's ``seq``).
    """

    def __init__(self, run_id: str, cursor: int) -> None:
        super().__init__(
            f"run {run_id!r} has no event {cursor}: a cursor is the seq of an event the run's stream gave",
            run_id=run_id,
        )
        self.cursor = cursor


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
        situation: the message without how to take the run over (a surface says that its own way).
    """

    def __init__(self, run_id: str, owner: str, expires_at: float | None, *, lost: bool = False) -> None:
        if lost:
            message = (
                f"this process lost run {run_id!r} to {owner} (it took the run's lease over, forced or after "
                "this process stopped renewing it): it stopped and wrote nothing more; the run is theirs now"
            )
            self.situation = message
        else:
            until = "?" if expires_at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires_at))
            self.situation = (
                f"another process is driving run {run_id!r}: {owner} holds its lease until {until} and renews "
                "it while it works. Leave the run to it"
            )
            message = (
                f"{self.situation}; only if you know that process is gone, take the run over with "
                f"`tether resume {run_id} --force` (drive(force=True))"
            )
        super().__init__(run_id, -1, detail=message)
        self.owner = owner
        self.expires_at = expires_at
        self.lost = lost


class InvalidHistory(RunError):
    """The history would violate the Messages API rules (a bug, never sent)."""


class IncompatibleRun(RunError):
    """The run was started with a machine or tools this code cannot continue."""


class InvalidForkPoint(RunError):
    """A run cannot be forked as asked: no such event, an event mid-turn, or an edit that does not apply.

    Attributes:
        event: the event (its seq, the ``#`` of ``tether show --events``) asked for; None when the edit
            is the problem. ``step`` is the same, by its former name.
        nearest: the nearest events before and after ``event`` that can be forked (None: there is none).
    """

    def __init__(
        self, run_id: str, event: int | None, why: str, nearest: tuple[int | None, int | None] = (None, None)
    ) -> None:
        where = f"at event {event}" if event is not None else "with that edit"
        message = f"run {run_id} cannot be forked {where}: {why}"
        choices = [str(seq) for seq in nearest if seq is not None]
        if choices:
            message += f"; the nearest events that can be forked: {' or '.join(choices)}"
        super().__init__(message, run_id=run_id)
        self.event = self.step = event
        self.nearest = nearest


class ApprovalError(RunError):
    """A decision on a pending tool call that cannot be applied."""

    def __init__(self, message: str, *, run_id: str, call_id: str) -> None:
        super().__init__(message, run_id=run_id)
        self.call_id = call_id


class AlreadyDecided(ApprovalError):
    """The call has its decision; exactly one decision ever applies."""

    def __init__(self, *, run_id: str, call_id: str, actor: str, approved: bool) -> None:
        verdict = "approved" if approved else "denied"
        super().__init__(f"call {call_id!r} was already decided ({verdict} by {actor})", run_id=run_id, call_id=call_id)
        self.actor = actor
        """Who made the decision that stands."""
        self.approved = approved
        """What they decided."""


class UnknownCall(ApprovalError):
    """The model never asked for a call with this id in the run."""

    def __init__(self, *, run_id: str, call_id: str) -> None:
        super().__init__(f"run {run_id} has no tool call {call_id!r}", run_id=run_id, call_id=call_id)


class NotAwaitingApproval(ApprovalError):
    """The call exists but is not waiting for a decision: the run is not parked, or not on it."""

    def __init__(self, *, run_id: str, call_id: str, status: str | None, run_waits: bool) -> None:
        message = (
            f"call {call_id!r} is not pending approval in run {run_id}"
            if run_waits
            else f"run {run_id} is not awaiting approval (status {status})"
        )
        super().__init__(message, run_id=run_id, call_id=call_id)
        self.status = status
        """The run's status when the decision came."""


class StaleFingerprint(ApprovalError):
    """The decision was made on other arguments than the call has (what the person saw changed)."""

    def __init__(self, *, run_id: str, call_id: str, expected: str, shown: str) -> None:
        super().__init__(
            f"call {call_id!r}: the arguments differ from those shown (fingerprint {expected} != {shown})",
            run_id=run_id,
            call_id=call_id,
        )
        self.expected = expected
        """The fingerprint the decision was made on."""
        self.shown = shown
        """The fingerprint of the call's arguments now."""


class DeniedByPolicy(ApprovalError):
    """The edited input would be denied: a policy rule or the tool's approval gate forbids it."""

    def __init__(self, *, run_id: str, call_id: str, reason: str) -> None:
        super().__init__(
            f"call {call_id!r}: the edited input is denied by policy ({reason}); nothing was recorded",
            run_id=run_id,
            call_id=call_id,
        )
        self.reason = reason
        """Why, as the model would be told (``rule 2 (no-root): never /``)."""


class InvalidEditedInput(ApprovalError):
    """The edited input does not validate against the tool's input schema."""

    def __init__(
        self,
        *,
        run_id: str,
        call_id: str,
        tool: str,
        problems: str,
        details: str,
        by_field: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"edited input is invalid for tool {tool!r}: {problems}", run_id=run_id, call_id=call_id)
        self.tool = tool
        self.problems = problems
        """What is wrong, in plain words: ``recursive: Input should be a valid boolean``."""
        self.details = details
        """The validator's own report (pydantic's, with its documentation links): the message says ``problems``."""
        self.by_field = dict(by_field or {})
        """The same problems by top-level field of the input (``""``: the input as a whole), for a form
        that shows each beside its field."""
