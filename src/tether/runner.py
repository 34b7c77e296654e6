"""Drivers: perform the engine's actions, feed the outcomes back, persist, repeat.

:class:`Runner` (sync) and :class:`AsyncRunner` share everything but the I/O calls in
:meth:`drive`: loading, persisting, approvals and results live in :class:`_RunnerBase`.
A drive ends when the run is done, failed, cancelled, parked awaiting a decision the
approver (if any) did not give, or parked until a retry is due (``max_wait``): a parked run
holds no thread; :meth:`tether.stores.Store.list_due` finds it again when its retry is due.
A drive holds the run's lease from before its first model call or tool start to its end
(:meth:`_RunnerBase.hold`, see :mod:`tether.leases`): one process drives a run at a time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tether import cache, engine, leases, rules
from tether.agent import Agent
from tether.approvals import ApprovalRequest, Approver, Decision
from tether.compat import check_compatible
from tether.errors import ModelError, RunBusy, StaleRun, StoreError, TetherError
from tether.events import Event, Fact
from tether.history import append_user_text, close_unanswered
from tether.machine import MACHINE_VERSION, STATUS_VALUES
from tether.models import (
    AsyncModelAdapter,
    AsyncStreamingModelAdapter,
    ModelRequest,
    ModelResponse,
    StreamingModelAdapter,
    TextListener,
    Usage,
)
from tether.state import RunState
from tether.stores import SCHEMA_VERSION, RunRecord, Store
from tether.stores.memory import MemoryStore

STORE_RETRY_WAITS = (0.1, 0.5, 2.0)
"""Seconds to wait before each new try of a step's write that failed transiently (see
:attr:`tether.errors.StoreError.transient`): a lock held past SQLite's busy timeout, a dropped
PostgreSQL connection. The step's outcome (a tool's result, a paid model answer) is held
meanwhile; the write is given up only after these."""
STORE_LOG = logging.getLogger("tether.store")

EventListener = Callable[[RunState, Event], None]
Activity = engine.CallModel | engine.RunTool | engine.WaitUntil
ActionListener = Callable[[RunState, Activity], None]
"""Told just before a drive starts slow work (a model call, a tool attempt, a retry wait).

Nothing is persisted yet when it is called, so it is for live displays (a spinner) only;
what happened is told to the :data:`EventListener` s once committed.
"""


@dataclass(frozen=True)
class RunResult:
    """Where a run stands after a drive, in the shape ``--json`` prints."""

    run_id: str
    status: str
    """Snake-case machine state: done, failed, awaiting_approval, cancelled, thinking..."""
    output: str | None
    result: Any
    error: str | None
    steps: int
    tool_calls: int
    usage: Usage
    pending_approvals: list[dict[str, Any]] = field(default_factory=list)
    cost_usd: float | None = None
    """Summed cost of the run's model calls; None when a model's price is unknown."""
    next_due_at: float | None = None
    """Unix time the next tool retry is due, while the run waits for one (status ``waiting_retry``)."""
    model_seconds: float = 0.0
    """Summed latency of the run's model calls."""
    tool_seconds: float = 0.0
    """Summed duration of the run's tool attempts."""

    def to_dict(self) -> dict[str, Any]:
        """The CLI's JSON object: the contract's keys, plus ``next_due_at`` only while a retry waits."""
        data = {
            "run_id": self.run_id,
            "status": self.status,
            "output": self.output,
            "result": self.result,
            "error": self.error,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "usage": self.usage.to_dict(),
            "pending_approvals": self.pending_approvals,
        }
        if self.next_due_at is not None:
            data["next_due_at"] = self.next_due_at
        return data


WAITING_RETRY = "waiting_retry"
"""The status of a run executing tools whose next step is a retry due later (not a machine state:
the run is in ``executing_tool``; a drive with ``max_wait`` parks it there)."""


def shown_status(record: RunRecord) -> str:
    """A stored run's status as :class:`RunResult` says it: the machine's, or waiting_retry."""
    if record.summary.get("next_due_at") is not None:
        return WAITING_RETRY
    return STATUS_VALUES.get(record.status, record.status)


def result_of(state: RunState) -> RunResult:
    """Summarise a run state."""
    due = state.next_due_at
    status = STATUS_VALUES.get(state.status or "", state.status or "unknown")
    return RunResult(
        run_id=state.id,
        status=WAITING_RETRY if due is not None else status,
        output=state.output if state.status == "done" else None,
        result=state.result if state.has_final_result else None,
        error=state.error,
        steps=state.steps,
        tool_calls=state.tool_calls,
        usage=state.usage,
        cost_usd=None if state.cost_unknown else round(state.cost_usd, 8),
        next_due_at=due,
        model_seconds=round(state.model_seconds, 6),
        tool_seconds=round(state.tool_seconds, 6),
        pending_approvals=[
            {
                "call_id": c.call_id,
                "tool": c.tool,
                "input": state.input_to_run(c),
                "reason": state.approval_reasons.get(c.call_id, ""),
                "fingerprint": engine.fingerprint(state.input_to_run(c)),
            }
            for c in state.pending_approvals()
        ],
    )


def record_of(state: RunState) -> RunRecord:
    """The store row for a state (small: never the history)."""
    result = result_of(state)
    summary = result.to_dict()
    summary.pop("run_id")
    summary.pop("status")
    summary["cost_usd"] = result.cost_usd
    summary["retryable"] = state.status == "failed" and state.can_retry  # kept by `tether gc`
    return RunRecord(
        id=state.id,
        status=state.status or "thinking",
        version=state.version,
        tenant=state.tenant,
        spec=state.spec,
        summary=summary,
        created_at=state.created_at,
        updated_at=state.updated_at,
    )


def _conversation_spent(parent: RunState) -> dict[str, float]:
    """What a conversation spent up to and including ``parent`` (for conversation budgets)."""
    earlier = parent.spec.get("conversation") or {}
    usage = parent.usage
    tokens = (usage.input_tokens + usage.output_tokens + usage.cache_creation_input_tokens
              + usage.cache_read_input_tokens)
    return {
        "tokens": float(earlier.get("tokens", 0)) + tokens,
        "cost_usd": float(earlier.get("cost_usd", 0.0)) + parent.cost_usd,
        "model_calls": int(earlier.get("model_calls", 0)) + parent.steps,
        "tool_calls": int(earlier.get("tool_calls", 0)) + parent.tool_calls,
        "started_at": float(earlier.get("started_at", parent.created_at)),
    }


def _append(store: Store, record: RunRecord, expected_version: int, events: list[Event]) -> None:
    """``store.append``, tried again while its failure is transient (see :data:`STORE_RETRY_WAITS`).

    A connection that dropped at the commit leaves the write's outcome unknown: a retry that
    then finds the run advanced checks whether it was this very write that landed.
    """
    failed = False
    for wait in (*STORE_RETRY_WAITS, None):
        try:
            store.append(record, expected_version, events)
            return
        except StaleRun:
            if failed and _landed(store, record, events):
                return
            raise
        except StoreError as error:
            if not error.transient or wait is None:
                raise
            failed = True
            STORE_LOG.warning("run %s: saving a step failed (%s); trying again in %g s", record.id, error, wait)
            time.sleep(wait)


def _landed(store: Store, record: RunRecord, events: list[Event]) -> bool:
    """Whether the store holds exactly this write: the row at its version, each event (seq, type, time)."""
    try:
        log = store.load_log(record.id, tenant=record.tenant)
    except StoreError:
        return False
    stored = {event.seq: (event.type, event.at) for event in log.events}
    return log.version == record.version and all(stored.get(e.seq) == (e.type, e.at) for e in events)


class _RunnerBase:
    """What both drivers share.

    ``approver`` answers gated calls during a drive. ``None`` means nobody will be asked:
    a gated call still parks the run (a later ``decide`` can free it), but a call a crash
    left in doubt reaches the model as interrupted and not re-run. Pass
    :class:`~tether.approvals.DecideLater` when a person decides later (a service, the CLI's
    ``tether approve``): then calls in doubt park for them too.

    ``lease_ttl``: seconds the run's lease lasts unless renewed (a heartbeat renews it every
    third of that while a drive works), so how long a killed driver keeps its run busy.
    """

    def __init__(
        self,
        agent: Agent,
        store: Store | None = None,
        *,
        approver: Approver | None = None,
        listeners: Sequence[EventListener] = (),
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        on_action: ActionListener | None = None,
        on_text: TextListener | None = None,
        lease_ttl: float = leases.DEFAULT_TTL,
    ) -> None:
        self.agent = agent
        self.store: Store = store if store is not None else MemoryStore()
        self.approver = approver
        self.listeners = list(listeners)
        self.on_action = on_action
        self.on_text = on_text
        """Told the answer's text as it arrives, when the model can stream (a live view); never persisted."""
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        """Draws retry jitter; pass ``random.Random(seed)`` for a schedule that repeats."""
        self.lease_ttl = lease_ttl
        self._held: dict[str, leases.Lease] = {}
        """The leases this runner holds now, by run id: every write to those runs checks its lease."""

    # Leases -------------------------------------------------------------------------------
    @contextmanager
    def hold(self, run_id: str, *, force: bool = False) -> Iterator[leases.Lease]:
        """Hold the run's lease while the block lasts: what :meth:`Runner.step` needs (``drive`` does it).

        Raises :class:`~tether.errors.RunBusy` if another process holds it, unless ``force``.
        """
        with leases.hold(self.store, run_id, ttl=self.lease_ttl, force=force) as lease:
            self._held[run_id] = lease
            try:
                yield lease
            finally:
                del self._held[run_id]

    def _lease(self, state: RunState) -> leases.Lease:
        lease = self._held.get(state.id)
        if lease is None:
            raise RuntimeError(f"step() needs the run's lease: call it inside `with runner.hold({state.id!r}):`")
        return lease

    @contextmanager
    def _driving(self, run: str | RunState, tenant: str | None, *, force: bool) -> Iterator[RunState]:
        """The run, held for a drive: its lease is claimed before anything else and released at the end."""
        with self.hold(run if isinstance(run, str) else run.id, force=force) as lease:
            state = self._start_drive(run, tenant, force=force, owner=lease.owner)
            try:
                yield state
            except RunBusy:
                raise
            except StaleRun as error:  # a decision or a cancel from another process, written meanwhile
                raise self._changed_meanwhile(state, error) from error

    def _changed_meanwhile(self, state: RunState, error: StaleRun) -> StaleRun:
        try:
            now = f"it is now {shown_status(self.store.load_run(state.id, tenant=state.tenant))}"
        except TetherError:
            now = "it could not be read again"
        return StaleRun(
            state.id,
            error.expected_version,
            detail=f"run {state.id!r} was changed by another process while this one drove it ({now}): this "
            "process stopped and did not record its last step (a model answer or a tool result; a tool call it "
            "ran is in doubt until the run resumes)",
        )

    # Loading and persisting ---------------------------------------------------------
    def load(self, run_id: str, *, tenant: str | None = None) -> RunState:
        """Rebuild a run from its events (read with its version, in one consistent read)."""
        log = self.store.load_log(run_id, tenant=tenant)
        return RunState.rebuild(run_id, log.events, version=log.version, tenant=log.tenant)

    def create(
        self,
        prompt: str,
        *,
        continue_from: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
    ) -> RunState:
        """Persist a new run (its prompt, spec and any earlier history) without driving it."""
        messages: list[dict[str, Any]] = []
        spec = {
            **self.agent.spec,
            "model": self.agent.model_name,
            "max_steps": self.agent.limits.max_steps,
            "max_tool_calls": self.agent.limits.max_tool_calls,
            "budget": budget.to_dict() if (budget := self.agent.limits.budget) is not None else None,
            "machine_version": MACHINE_VERSION,
            "schema_version": SCHEMA_VERSION,
            "tool_schemas": {tool.name: tool.input_schema() for tool in self.agent.tools},
        }
        if continue_from is not None:
            parent = self.load(continue_from, tenant=tenant)
            messages = [dict(m) for m in parent.messages]
            close_unanswered(messages, f"Not run: the earlier run ended ({parent.status}) before this call ran.")
            spec["continued_from"] = continue_from
            spec["conversation"] = _conversation_spent(parent)
        append_user_text(messages, prompt)
        state = RunState(id=run_id or f"run_{uuid.uuid4().hex[:20]}", tenant=tenant)
        produced = engine.start_events(state, spec=spec, messages=messages, now=self.clock())
        self.store.create_run(record_of(state), produced)
        self._notify(state, produced)
        return state

    def _persist(self, state: RunState, produced: list[Event]) -> None:
        lease = self._held.get(state.id)
        if lease is not None:
            lease.check()  # a drive that lost the run writes nothing more
        _append(self.store, record_of(state), state.version - 1, produced)
        rules.log_warnings(state.id, produced)
        self._notify(state, produced)

    def _commit(self, state: RunState, step: engine.Step) -> None:
        self._persist(state, engine.commit(state, step, now=self.clock()))

    def _record_start(self, state: RunState, action: engine.RunTool) -> None:
        records: list[Fact] = [*action.warnings, engine.tool_started(action, owner=self._lease(state).owner)]
        if action.tool.cache_ttl is not None:  # the lookup just missed: say so in the same write
            records.insert(0, cache.miss_record(action, cache.key_for(action, tenant=state.tenant)))
        self._record(state, records)

    def _record(self, state: RunState, records: Sequence[Fact]) -> None:
        """Commit facts that need no transition (a tool's start, an operator's override)."""
        now = self.clock()
        produced = []
        for fact in records:
            event = Event(state.next_seq, now, fact)
            state.apply(event)
            produced.append(event)
        state.version += 1
        self._persist(state, produced)

    def _start_drive(self, run: str | RunState, tenant: str | None, *, force: bool, owner: str) -> RunState:
        """Load and check the run; with ``force``, first declare its in-flight calls abandoned.

        A state loaded before the lease was claimed may be behind: StaleRun now, before any model call.
        """
        state = self._state(run, tenant)
        if isinstance(run, RunState) and self.store.load_run(run.id, tenant=run.tenant).version != run.version:
            raise StaleRun(run.id, run.version)
        if force:
            records = engine.abandon_in_flight(state, by=owner, reason="forced: the operator says its driver is gone")
            if records:
                self._record(state, records)
        self._retry_if_resumable(state)
        return state

    def _answered_from_cache(self, state: RunState, action: engine.RunTool) -> bool:
        """Commit a stored result of the same tool and input, if one is live; the tool does not run."""
        if action.tool.cache_ttl is None:
            return False
        key = cache.key_for(action, tenant=state.tenant)
        value = self.store.cache_get(key, self.clock())
        if value is None:
            return False
        self._commit(state, engine.on_cache_hit(action, value, key=key))
        return True

    def _announce(self, state: RunState, action: engine.Action) -> None:
        if self.on_action is not None and isinstance(action, engine.CallModel | engine.RunTool | engine.WaitUntil):
            self.on_action(state, action)

    def _notify(self, state: RunState, produced: list[Event]) -> None:
        for listener in self.listeners:
            for event in produced:
                listener(state, event)

    # Approvals ------------------------------------------------------------------------
    def approval_requests(self, state: RunState) -> list[ApprovalRequest]:
        """The calls of ``state`` waiting for a decision."""
        requests = []
        for call in state.pending_approvals():
            tool = self.agent.tool_index.get(call.tool)
            requests.append(
                ApprovalRequest(
                    run_id=state.id,
                    call_id=call.call_id,
                    tool=call.tool,
                    input=state.input_to_run(call),
                    reason=state.approval_reasons.get(call.call_id, ""),
                    description=tool.description if tool else "",
                    fingerprint=engine.fingerprint(state.input_to_run(call)),
                    tenant=state.tenant,
                )
            )
        return requests

    def _apply_decisions(self, state: RunState, decisions: Mapping[str, Decision]) -> bool:
        applied = False
        for request in self.approval_requests(state):
            decision = decisions.get(request.call_id)
            if decision is None or request.call_id in state.decisions:  # decided with a remember_for_run sibling
                continue
            self._decide(state, request.call_id, decision, request.fingerprint)
            applied = True
        return applied

    def _decide(self, state: RunState, call_id: str, decision: Decision, fingerprint: str | None) -> None:
        step = engine.on_decision(state, self.agent, call_id, decision, expected_fingerprint=fingerprint)
        self._commit(state, step)

    def decide(
        self,
        run_id: str,
        call_id: str,
        decision: Decision,
        *,
        fingerprint: str | None = None,
        tenant: str | None = None,
    ) -> RunResult:
        """Record one decision from anywhere (another process included); does not drive.

        Exactly one decision ever applies: a second one, or two racing processes, get
        :class:`~tether.errors.ApprovalError` or :class:`~tether.errors.StaleRun`.
        """
        state = self._state(run_id, tenant)
        self._decide(state, call_id, decision, fingerprint)
        return result_of(state)

    def cancel(self, run_id: str, reason: str = "", *, tenant: str | None = None) -> RunResult:
        """Stop a run that has not finished."""
        state = self.load(run_id, tenant=tenant)
        self._commit(state, engine.cancellation(reason))
        return result_of(state)

    def _state(self, run: str | RunState, tenant: str | None) -> RunState:
        state = run if isinstance(run, RunState) else self.load(run, tenant=tenant)
        check_compatible(state.id, state.spec, self.agent.tool_index)
        return state

    def _retry_if_resumable(self, state: RunState) -> None:
        """A drive of a run that failed transiently starts by trying again."""
        if state.status == "failed" and state.can_retry:
            self._commit(state, engine.retry_after_failure())

    def _next(self, state: RunState) -> engine.Action:
        """The next action, once sure this drive still holds the run's lease.

        Holding the lease, this drive owns the run: a call in flight that another owner
        started was abandoned by its driver, and the engine treats it as in doubt.
        """
        self._lease(state).check()
        return engine.next_action(state, self.agent, now=self.clock(), can_ask=self.approver is not None)

    def _parks(self, wait: engine.WaitUntil, max_wait: float | None) -> bool:
        """Whether a drive allowed to sleep ``max_wait`` seconds leaves this wait for later."""
        return max_wait is not None and wait.due_at - self.clock() > max_wait

    def _model_step(self, state: RunState, response: ModelResponse | ModelError, started: float) -> None:
        if isinstance(response, ModelError):
            self._commit(state, engine.on_model_error(response))
        else:
            now = self.clock()
            step = engine.on_model_response(state, self.agent, response, latency=now - started, now=now)
            self._save(state, step, "the model answered", "resuming the run asks the model again (one more call)")

    def _save(self, state: RunState, step: engine.Step, happened: str, on_resume: str) -> None:
        """Commit a step whose outcome cannot be had again for free; if even the retries fail, say so."""
        try:
            self._commit(state, step)
        except StoreError as error:  # never leave the user with "nothing was changed"
            raise StoreError(
                f"run {state.id}: {happened}, but its result could not be saved: {error}; {on_resume}",
                transient=error.transient,
            ) from error

    def _tool_step(self, state: RunState, action: engine.RunTool, outcome: str | BaseException, started: float) -> None:
        duration = time.perf_counter() - started
        if isinstance(outcome, BaseException):
            step = engine.on_tool_error(action, outcome, now=self.clock(), duration=duration, rng=self.rng.random)
        else:
            step = engine.on_tool_success(action, outcome, duration=duration)
        self._save(
            state,
            step,
            f"tool {action.tool.name!r} (call {action.call.call_id}) ran, so whatever it does has happened",
            "resuming the run treats the call as in doubt (run again only if the tool is idempotent, else asked about)",
        )
        if not isinstance(outcome, BaseException) and action.tool.cache_ttl is not None:
            # Stored once the result is committed (a crash in between costs a miss, never a
            # wrong hit); errors are never stored. The full value, not the model's cut.
            key = cache.key_for(action, tenant=state.tenant)
            self.store.cache_put(key, action.tool.name, outcome, self.clock() + action.tool.cache_ttl)


class Runner(_RunnerBase):
    """Drives runs synchronously."""

    def run(
        self,
        prompt: str,
        *,
        continue_from: str | None = None,
        tenant: str | None = None,
        max_wait: float | None = None,
    ) -> RunResult:
        """Start a run and drive it as far as it goes (see :meth:`drive` for ``max_wait``)."""
        return self.drive(self.create(prompt, continue_from=continue_from, tenant=tenant), max_wait=max_wait)

    def drive(
        self,
        run: str | RunState,
        *,
        tenant: str | None = None,
        max_wait: float | None = None,
        force: bool = False,
    ) -> RunResult:
        """Take steps until the run finishes or parks.

        ``max_wait`` bounds how long the drive sleeps for a tool retry: a retry due later
        parks the run (status ``waiting_retry``, ``next_due_at`` set, no thread held) for a
        later drive; ``0`` never sleeps, None (the default) waits however long.

        The run's lease is claimed first (:class:`~tether.errors.RunBusy` if another
        process holds it) and held until the drive ends. ``force`` takes it even from a
        live holder and records that every call now in flight was abandoned by its driver,
        so each is handled as a call a crash left in doubt. Only for an operator who knows
        that driver is gone: if it still runs, it stops at its next write, but a call it
        was running may run twice.
        """
        with self._driving(run, tenant, force=force) as state:
            while self.step(state, max_wait=max_wait):
                pass
        return result_of(state)

    def step(self, state: RunState, *, max_wait: float | None = None) -> bool:
        """Do exactly one unit of work; False when there is nothing left to do now.

        Only inside ``with runner.hold(run_id):`` (the lease says which process may step
        the run). A retry due more than ``max_wait`` seconds from now is left for later (False).
        """
        action = self._next(state)
        if isinstance(action, engine.Stop):
            if state.status != "awaitingApproval" or self.approver is None:
                return False
            return self._apply_decisions(state, self.approver.decide(self.approval_requests(state)))
        if isinstance(action, engine.WaitUntil) and self._parks(action, max_wait):
            return False
        self._announce(state, action)
        if isinstance(action, engine.WaitUntil):
            time.sleep(max(0.0, action.due_at - self.clock()))
        elif isinstance(action, engine.Commit):
            self._commit(state, action.step)
        elif isinstance(action, engine.CallModel):
            started = self.clock()
            response: ModelResponse | ModelError
            try:
                response = self._call_model(action.request)
            except ModelError as error:
                response = error
            self._model_step(state, response, started)
        elif not self._answered_from_cache(state, action):
            self._record_start(state, action)
            began = time.perf_counter()
            outcome: str | BaseException
            try:
                outcome = action.tool.execute(action.arguments, action.call.call_id, run_id=state.id)
            except Exception as error:  # noqa: BLE001 - any tool failure becomes data for the model
                outcome = error
            self._tool_step(state, action, outcome, began)
        return True

    def _call_model(self, request: ModelRequest) -> ModelResponse:
        """One model call: streamed only when someone listens to the text and the model can stream."""
        model = self.agent.model
        if self.on_text is not None and isinstance(model, StreamingModelAdapter):
            return model.stream(request, self.on_text)
        return model.complete(request)


class AsyncRunner(_RunnerBase):
    """Drives runs inside an event loop; sync tools run in threads."""

    async def run(
        self,
        prompt: str,
        *,
        continue_from: str | None = None,
        tenant: str | None = None,
        max_wait: float | None = None,
    ) -> RunResult:
        """Start a run and drive it as far as it goes (see :meth:`Runner.drive` for ``max_wait``)."""
        return await self.drive(self.create(prompt, continue_from=continue_from, tenant=tenant), max_wait=max_wait)

    async def drive(
        self,
        run: str | RunState,
        *,
        tenant: str | None = None,
        max_wait: float | None = None,
        force: bool = False,
    ) -> RunResult:
        """Take steps until the run finishes or parks (``max_wait``, ``force``: see :meth:`Runner.drive`)."""
        with self._driving(run, tenant, force=force) as state:
            while await self.step(state, max_wait=max_wait):
                pass
        return result_of(state)

    async def step(self, state: RunState, *, max_wait: float | None = None) -> bool:
        """Do exactly one unit of work; False when there is nothing left to do now (see Runner.step)."""
        action = self._next(state)
        if isinstance(action, engine.Stop):
            if state.status != "awaitingApproval" or self.approver is None:
                return False
            return self._apply_decisions(state, self.approver.decide(self.approval_requests(state)))
        if isinstance(action, engine.WaitUntil) and self._parks(action, max_wait):
            return False
        self._announce(state, action)
        if isinstance(action, engine.WaitUntil):
            await asyncio.sleep(max(0.0, action.due_at - self.clock()))
        elif isinstance(action, engine.Commit):
            self._commit(state, action.step)
        elif isinstance(action, engine.CallModel):
            started = self.clock()
            response: ModelResponse | ModelError
            try:
                response = await self._call_model(action.request)
            except ModelError as error:
                response = error
            self._model_step(state, response, started)
        elif not self._answered_from_cache(state, action):
            self._record_start(state, action)
            began = time.perf_counter()
            outcome: str | BaseException
            try:
                outcome = await action.tool.aexecute(action.arguments, action.call.call_id, run_id=state.id)
            except Exception as error:  # noqa: BLE001 - any tool failure becomes data for the model
                outcome = error
            self._tool_step(state, action, outcome, began)
        return True

    async def _call_model(self, request: ModelRequest) -> ModelResponse:
        """One model call (see Runner._call_model), awaited natively when the model can; else in a thread."""
        model, on_text = self.agent.model, self.on_text
        if on_text is not None and isinstance(model, AsyncStreamingModelAdapter):
            return await model.astream(request, on_text)
        if on_text is not None and isinstance(model, StreamingModelAdapter):
            return await asyncio.to_thread(model.stream, request, on_text)
        if isinstance(model, AsyncModelAdapter):
            return await model.acomplete(request)
        return await asyncio.to_thread(model.complete, request)
