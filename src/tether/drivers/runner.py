"""Drivers: perform a drive's effects, send the outcomes back, until the drive ends.

What to do and in which order is decided by :class:`tether.core.flow.Flow` (a drive) and
:mod:`tether.core.lifecycle` (creating, loading, deciding, cancelling), which do no I/O;
:class:`Runner` performs their effects with plain calls and :class:`AsyncRunner` awaits every
one that waits (the store, the lease, the approver, the model, tools, sleeps), so an event
loop driving many runs is never blocked by one.
A drive ends when the run is done, failed, cancelled, parked awaiting a decision the
approver (if any) did not give, or parked until a retry is due (``max_wait``): a parked run
holds no thread; :meth:`tether.stores.Store.list_due` finds it again when its retry is due.
A drive holds the run's lease from before its first model call or tool start to its end
(:meth:`_RunnerBase.hold`, see :mod:`tether.stores.leases`): one process drives a run at a time.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import inspect
import random
import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Self, TypedDict, TypeVar, Unpack, cast

from pydantic import BaseModel

from tether import heap
from tether.agent import Agent
from tether.core import engine, lifecycle, snapshots
from tether.core.approvals import (
    Approver,
    AsyncApprover,
    Decision,
    PendingApproval,
    is_async_approver,
    pending_of,
)
from tether.core.children import AgentTools
from tether.core.flow import (
    STORE_LOG,
    Activity,
    Announce,
    Ask,
    Attempt,
    CheckLease,
    CreateRun,
    DecidedElsewhere,
    Driven,
    DriveRun,
    Effect,
    Extension,
    Flow,
    Flowing,
    Landed,
    Launch,
    LoadLog,
    LoadRun,
    LookUpCache,
    Notify,
    Persist,
    ShownStatus,
    Sleep,
    StoreCache,
)
from tether.core.forks import MessageEdit
from tether.core.handoffs import Handoffs, in_charge
from tether.core.state import RunState
from tether.drivers import busy
from tether.drivers import queue as queues
from tether.drivers import stream as streams
from tether.drivers.telemetry import Telemetry
from tether.errors import ConfigError, IncompatibleRun, StoreError
from tether.execution import launches
from tether.facts.events import Event
from tether.facts.status import AWAITING, INITIAL, WAITING_RETRY, RunStatus, status_name
from tether.facts.stream import StreamEvent
from tether.models import (
    AsyncModelAdapter,
    AsyncStreamingModelAdapter,
    ModelResponse,
    StreamingModelAdapter,
    TextListener,
    Usage,
)
from tether.policy import rules
from tether.stores import WAITING_KEY, AsyncStore, RunRecord, Snapshot, Store, leases
from tether.stores.awaitable import as_async_store, is_async_store
from tether.stores.memory import MemoryStore
from tether.tools.output import typed_result

T = TypeVar("T")
S = TypeVar("S", Store, AsyncStore)
L = TypeVar("L", leases.Lease, leases.AsyncLease)
EventListener = Callable[[RunState, Event], None]
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
            "result": self.result.model_dump(mode="json") if isinstance(self.result, BaseModel) else self.result,
            "error": self.error,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "usage": self.usage.to_dict(),
            "pending_approvals": self.pending_approvals,
        }
        if self.next_due_at is not None:
            data["next_due_at"] = self.next_due_at
        return data


def fork_event(at_event: int | None, at_step: int | None) -> int:
    """The event a fork starts at, given by ``at_event`` or by its deprecated name ``at_step`` (warned about)."""
    if at_step is not None:
        if at_event is not None:
            raise ConfigError("fork takes at_event (at_step is its deprecated name), not both")
        warnings.warn(
            "fork(at_step=...) is deprecated: it is an event's seq, not a step (a model invocation); pass at_event=",
            DeprecationWarning,
            stacklevel=3,
        )
        return at_step
    if at_event is None:
        raise ConfigError("fork needs at_event: the seq of the event to fork at (`tether show --events`)")
    return at_event


def shown_status(record: RunRecord) -> str:
    """A stored run's status as :class:`RunResult` says it: the machine's, or waiting_retry."""
    if record.summary.get("next_due_at") is not None:
        return WAITING_RETRY
    return status_name(record.status)


def result_of(state: RunState) -> RunResult:
    """Summarise a run state."""
    due = state.next_due_at
    status = status_name(state.status)
    return RunResult(
        run_id=state.id,
        status=WAITING_RETRY if due is not None else status,
        output=state.output if state.status == RunStatus.done else None,
        result=state.result if state.has_final_result else None,
        error=state.error,
        steps=state.steps,
        tool_calls=state.tool_calls,
        usage=state.usage,
        cost_usd=None if state.cost_unknown else round(state.cost_usd, 8),
        next_due_at=due,
        model_seconds=round(state.model_seconds, 6),
        tool_seconds=round(state.tool_seconds, 6),
        # a run cancelled or failed at its gate waits for no one
        pending_approvals=[*(pending.item() for pending in pending_of(state)), *state.child_pending]
        if state.status == AWAITING
        else [],
    )


def record_of(state: RunState) -> RunRecord:
    """The store row for a state (small: never the history)."""
    result = result_of(state)
    summary = result.to_dict()
    summary.pop("run_id")
    summary.pop("status")
    summary["cost_usd"] = result.cost_usd
    summary["retryable"] = state.status == RunStatus.failed and state.can_retry  # kept by `tether gc`
    if state.status == AWAITING:  # since the calls were asked: a decision on one of them moves updated_at
        summary[WAITING_KEY] = state.awaiting_since
    return RunRecord(
        id=state.id,
        status=state.status or INITIAL.value,
        version=state.version,
        tenant=state.tenant,
        spec=state.spec,
        summary=summary,
        created_at=state.created_at,
        updated_at=state.updated_at,
    )


class RunnerOptions(TypedDict, total=False):
    """The keyword options every runner takes (what each means: :class:`_RunnerBase`)."""

    approver: Approver | AsyncApprover | None
    listeners: Sequence[EventListener]
    clock: Callable[[], float]
    rng: random.Random | None
    on_action: ActionListener | None
    on_text: TextListener | None
    lease_ttl: float
    telemetry: Telemetry | None
    extensions: Sequence[Extension]


EXTENSIONS: tuple[Extension, ...] = (AgentTools(), Handoffs())
"""What plugs into every flow a runner drives, beside the one-agent story: agents as tools, handoffs."""


class _RunnerBase(abc.ABC, Generic[S, L]):
    """What both drivers share: everything but how effects are performed (called, or awaited).

    Every operation is a flow (:class:`tether.core.flow.Flow`, :mod:`tether.core.lifecycle`);
    :class:`Runner` performs each of its effects with plain calls, :class:`AsyncRunner` awaits them.

    ``approver`` answers gated calls during a drive. ``None`` means nobody will be asked:
    a gated call still parks the run (a later ``decide`` can free it), but a call a crash
    left in doubt reaches the model as interrupted and not re-run. Pass
    :class:`~tether.core.approvals.DecideLater` when a person decides later (a service, the CLI's
    ``tether approve``): then calls in doubt park for them too.

    ``lease_ttl``: seconds the run's lease lasts unless renewed (a heartbeat renews it every
    third of that while a drive works), so how long a killed driver keeps its run busy.

    ``telemetry``: told every run created, drive, model call, tool call and decision, to trace
    them (:class:`tether.drivers.otel.OpenTelemetry`, ``pip install 'tether[otel]'``).

    ``extensions``: what plugs into every flow beside the one-agent story (see
    :class:`tether.core.flow.Extension`); by default :data:`EXTENSIONS`, agents as tools and handoffs.
    """

    store: S

    def __init__(
        self,
        agent: Agent,
        store: Store | AsyncStore | None = None,
        *,
        approver: Approver | AsyncApprover | None = None,
        listeners: Sequence[EventListener] = (),
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        on_action: ActionListener | None = None,
        on_text: TextListener | None = None,
        lease_ttl: float = leases.DEFAULT_TTL,
        telemetry: Telemetry | None = None,
        extensions: Sequence[Extension] = EXTENSIONS,
    ) -> None:
        self.agent = agent
        self.extensions = tuple(extensions)
        self.approver = approver
        self.store = self._store_for(store if store is not None else MemoryStore())
        self.listeners = list(listeners)
        self.on_action = on_action
        self.on_text = on_text
        """Told the answer's text as it arrives, when the model can stream (a live view); never persisted."""
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        """Draws retry jitter; pass ``random.Random(seed)`` for a schedule that repeats."""
        self.lease_ttl = lease_ttl
        self.telemetry = telemetry
        """Traces what this runner does (:class:`tether.drivers.otel.OpenTelemetry`); None: nothing is traced."""
        queues.attach(self.store)  # a submitted run's decisions and cancellations reach its queue
        self._stream_key = streams.store_key(self.store)
        """How :data:`tether.drivers.stream.HUB` names this runner's store: its commits wake the followers here."""
        self._held: dict[str, L] = {}
        """The leases this runner holds now, by run id: every write to those runs checks its lease."""
        self._resolves_agent = True
        """False for a runner made to drive one other run with exactly its agent (see :class:`DriveRun`)."""

    @abc.abstractmethod
    def _store_for(self, store: Store | AsyncStore) -> S:
        """The store as this driver calls it."""
        raise NotImplementedError

    def _lease(self, state: RunState) -> L:
        lease = self._held.get(state.id)
        if lease is None:
            raise RuntimeError(f"step() needs the run's lease: call it inside `runner.hold({state.id!r})`")
        return lease

    def _flow(self, owner: str = "", agent: Agent | None = None) -> Flow:
        """This runner's decisions (or ``agent``'s, for a child run), for a drive by ``owner`` (the lease's)."""
        return Flow(
            agent or self.agent,
            owner=owner,
            can_ask=self.approver is not None,
            clock=self.clock,
            rng=self.rng,
            extensions=self.extensions,
            resolves_agent=self._resolves_agent,
        )

    def _child_runner(self, child: DriveRun) -> Self:
        """A runner like this one (store, approver, listeners, clocks) for ``child``'s run and agent."""
        runner = self._like(
            child.agent,
            approver=self.approver,
            listeners=self.listeners,
            clock=self.clock,
            rng=self.rng,
            on_action=self.on_action,
            on_text=self.on_text,
            lease_ttl=self.lease_ttl,
            telemetry=self.telemetry,
            extensions=self.extensions,
        )
        runner._resolves_agent = False  # the child is driven with exactly its agent (limits capped by its parent)
        return runner

    def _like(self, agent: Agent, **options: Unpack[RunnerOptions]) -> Self:
        """A runner of this kind on this store, with ``options`` (and this driver's own, shared)."""
        return type(self)(agent, self.store, **options)

    def _run_trace(self, forked_from: str | None = None) -> AbstractContextManager[dict[str, Any] | None]:
        """While a run is created (and driven, by ``run``): gives the trace context to store in its spec.

        Re-entered (``create`` inside ``run``), the open run span is the one used.
        """
        if self.telemetry is None:
            return nullcontext(None)
        return self.telemetry.run(self.agent, forked_from=forked_from)

    def _create_flow(
        self,
        prompt: str,
        *,
        continue_from: str | None,
        tenant: str | None,
        run_id: str | None,
        parent: dict[str, Any] | None,
        dispatch: dict[str, Any] | None = None,
    ) -> Flowing[RunState]:
        """Creating a run (see :meth:`Runner.create`, :meth:`Runner.submit`), traced while it lasts."""
        with self._run_trace() as trace:
            flow = lifecycle.create(
                self._flow(),
                prompt,
                continue_from=continue_from,
                tenant=tenant,
                run_id=run_id,
                parent=parent,
                trace=trace,
                dispatch=dispatch,
            )
            return (yield from flow)

    def _fork_flow(
        self, run_id: str, at_event: int, *, edit: MessageEdit | None, tenant: str | None, new_run_id: str | None
    ) -> Flowing[RunState]:
        """Forking a run (see :meth:`Runner.fork`), traced while it lasts."""
        with self._run_trace(forked_from=run_id) as trace:
            flow = lifecycle.fork(
                self._flow(), run_id, at_event, edit=edit, tenant=tenant, new_run_id=new_run_id, trace=trace
            )
            return (yield from flow)

    def _drive_trace(self, run_id: str) -> AbstractContextManager[None]:
        return nullcontext() if self.telemetry is None else self.telemetry.drive(run_id, self.agent)

    def _performing(self, effect: engine.CallModel | Attempt) -> AbstractContextManager[None]:
        return nullcontext() if self.telemetry is None else self.telemetry.performing(effect)

    def _child_trace(self, child: DriveRun) -> dict[str, Any] | None:
        return None if self.telemetry is None else self.telemetry.child_trace(child.link)

    def approval_requests(self, state: RunState) -> list[PendingApproval]:
        """The calls of ``state`` waiting for a decision, with their tools' descriptions."""
        return pending_of(state, self._in_charge(state))

    def result(self, state: RunState) -> RunResult:
        """Where ``state`` stands, its result an instance of the in-charge agent's ``output_type``, if it has one."""
        result = result_of(state)
        output_type = self._in_charge(state).output_type
        if output_type is None or result.result is None:
            return result
        return replace(result, result=typed_result(output_type, result.result, run_id=state.id))

    def _in_charge(self, state: RunState) -> Agent:
        """The agent in charge of ``state`` after any handoff; this runner's own if it cannot reach that one."""
        try:
            return in_charge(self.agent, state)
        except IncompatibleRun:  # a reader (cancelling, listing) needs no agent of the run's
            return self.agent

    # Performing what both drivers perform alike -----------------------------------------
    def _store_work(self, effect: Effect) -> Callable[[], Any] | None:
        """The store call performing ``effect`` (its outcome, or an awaitable of it); None for other effects."""
        store = self.store
        match effect:
            case LoadLog(run_id, tenant, whole):
                snapshot_format = None if whole else snapshots.snapshot_format()
                return functools.partial(store.load_log, run_id, tenant=tenant, snapshot_format=snapshot_format)
            case LoadRun(run_id, tenant):
                return functools.partial(store.load_run, run_id, tenant=tenant)
            case CreateRun(state, events):
                return functools.partial(store.create_run, record_of(state), events)
            case Persist(state, events):
                return functools.partial(store.append, record_of(state), state.version - 1, events)
            case LookUpCache(key, now):
                return functools.partial(store.cache_get, key, now)
            case StoreCache(key, tool, value, expires_at):
                return functools.partial(store.cache_put, key, tool, value, expires_at)
        return None

    def _snapshot_due(self, effect: Effect) -> tuple[str, Snapshot] | None:
        """The run and snapshot to keep once ``effect``, a step's commit, is done (see :mod:`tether.core.snapshots`)."""
        every = getattr(self.store, "snapshot_every", 0)  # a wrapper that does not say keeps none
        if isinstance(effect, Persist) and isinstance(every, int) and snapshots.due(effect.events, every):
            return effect.state.id, snapshots.take(effect.state)
        return None

    def _text_listener(self, call: engine.CallModel) -> TextListener | None:
        """Who is told the answer's text as it arrives: ``on_text`` and the run's followers (a summary's: no one)."""
        followers = (
            None if call.summary is not None else streams.HUB.text_listener(self._stream_key, call.run_id, call.cursor)
        )
        if followers is None or self.on_text is None:
            return followers or self.on_text
        on_text = self.on_text

        def both(text: str) -> None:
            on_text(text)
            followers(text)

        return both

    def _overruled(self, effect: DecidedElsewhere) -> None:
        """Tell the approver which of its answers were not recorded, if it listens (``decided_elsewhere``)."""
        told = getattr(self.approver, "decided_elsewhere", None)
        if callable(told):
            told(effect.notes)

    def _tell(self, effect: Notify | Announce) -> None:
        """Tell the listeners (plain callbacks, on both drivers: for displays, they must not block)."""
        if isinstance(effect, Notify):
            streams.HUB.committed(self._stream_key, effect.state.id)
            rules.log_warnings(effect.state.id, effect.events)
            for listener in self.listeners:
                for event in effect.events:
                    listener(effect.state, event)
            if self.telemetry is not None:
                self.telemetry.committed(effect.state, effect.events)
            return
        if self.on_action is not None:
            self.on_action(effect.state, effect.activity)
        if self.telemetry is not None:
            self.telemetry.announced(effect.state, effect.activity)


@contextmanager
def _keeping_snapshot(run_id: str) -> Iterator[None]:
    """A snapshot that could not be written is logged, not raised: it is only a shortcut, the step is committed."""
    try:
        yield
    except StoreError as error:
        STORE_LOG.warning("run %s: keeping a snapshot of its state failed (%s)", run_id, error)


class Runner(_RunnerBase[Store, leases.Lease]):
    """Drives runs synchronously: every effect is a plain call."""

    def _store_for(self, store: Store | AsyncStore) -> Store:
        if is_async_store(store):
            raise ConfigError(f"{type(store).__name__} is an async store: drive its runs with AsyncRunner")
        if self.approver is not None and is_async_approver(self.approver):
            raise ConfigError(f"{type(self.approver).__name__} decides asynchronously: use it with AsyncRunner")
        return cast(Store, store)

    # Leases -------------------------------------------------------------------------------
    @contextmanager
    def hold(self, run_id: str, *, force: bool = False) -> Iterator[leases.Lease]:
        """Hold the run's lease while the block lasts: what :meth:`step` needs (``drive`` does it).

        Raises :class:`~tether.errors.RunBusy` if another process holds it, unless ``force``.
        """
        pinned = getattr(self.store, "pinned", None)  # SQLStore: the drive's operations share one connection
        with (
            pinned() if pinned is not None else nullcontext(),
            leases.hold(self.store, run_id, ttl=self.lease_ttl, force=force) as lease,
        ):
            self._held[run_id] = lease
            try:
                yield lease
            finally:
                del self._held[run_id]

    # Runs ---------------------------------------------------------------------------------
    def load(self, run_id: str, *, tenant: str | None = None) -> RunState:
        """Rebuild a run from its events (read with its version, in one consistent read)."""
        return self._complete(lifecycle.read(run_id, tenant))

    def create(
        self,
        prompt: str,
        *,
        continue_from: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
        parent: dict[str, Any] | None = None,
    ) -> RunState:
        """Persist a new run (its prompt, spec and any earlier history) without driving it.

        ``parent``: a child run's link to the run and call it serves (see :mod:`tether.core.children`).
        """
        flow = self._create_flow(prompt, continue_from=continue_from, tenant=tenant, run_id=run_id, parent=parent)
        return self._complete(flow)

    def fork(
        self,
        run_id: str,
        *,
        at_event: int | None = None,
        edit: MessageEdit | None = None,
        tenant: str | None = None,
        new_run_id: str | None = None,
        at_step: int | None = None,
    ) -> RunState:
        """Persist a new run whose history is ``run_id``'s once event ``at_event`` was recorded, without driving it.

        ``at_event`` is an event's seq (the ``#`` of ``tether show --events`` and the inspector's
        timeline); the history there must end with a user turn (see :mod:`tether.core.forks`).
        ``edit`` replaces one message's text. The original is untouched; the fork's spec says
        ``forked_from``. Drive the fork like any run. ``at_step`` is ``at_event``'s deprecated name
        (a step is a model invocation, not an event).

        Raises:
            InvalidForkPoint: no such event, an event mid-turn (naming the nearest that can be
                forked), or an edit that does not apply.
        """
        at = fork_event(at_event, at_step)
        return self._complete(self._fork_flow(run_id, at, edit=edit, tenant=tenant, new_run_id=new_run_id))

    def submit(
        self,
        prompt: str,
        *,
        queue: str = queues.DEFAULT_QUEUE,
        continue_from: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """Create a run and queue it for a ``tether worker`` in ONE transaction; its id (:mod:`tether.drivers.queue`).

        Needs a PostgreSQL store and the ``worker`` extra (:class:`~tether.errors.ConfigError`
        otherwise); the queue's tables are created on first use. The worker rebuilds the agent
        from the run's spec (its tools module and model), unless it was given one.
        """
        queues.ensure_schema(queues.check_can_queue(self.store))
        dispatch = {"queue": queue}
        flow = self._create_flow(
            prompt, continue_from=continue_from, tenant=tenant, run_id=run_id, parent=None, dispatch=dispatch
        )
        return self._complete(flow).id

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
        flow = lifecycle.decide(self._flow(), run_id, call_id, decision, fingerprint=fingerprint, tenant=tenant)
        return self.result(self._complete(flow))

    def cancel(self, run_id: str, reason: str = "", *, tenant: str | None = None) -> RunResult:
        """Stop a run that has not ended, from any process; a run that failed transiently ends for good.

        Its child runs (see :meth:`tether.Agent.as_tool`) are cancelled with it, after it.
        Needs neither the run's tools nor its model. A tool another process is running is not
        stopped: that driver finds the run changed when it records the result, and stops.

        Raises:
            RunEnded: the run is done, cancelled, or failed for good.
        """
        return self.result(self._complete(lifecycle.cancel(self._flow(), run_id, reason, tenant)))

    def run(
        self, prompt: str, *, continue_from: str | None = None, tenant: str | None = None, max_wait: float | None = None
    ) -> RunResult:
        """Start a run and drive it as far as it goes (see :meth:`drive` for ``max_wait``)."""
        with self._run_trace():  # the run's span lasts the first drive too
            return self.drive(self.create(prompt, continue_from=continue_from, tenant=tenant), max_wait=max_wait)

    def drive(
        self, run: str | RunState, *, tenant: str | None = None, max_wait: float | None = None, force: bool = False
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
        run_id = run if isinstance(run, str) else run.id
        with self.hold(run_id, force=force) as lease, self._drive_trace(run_id):
            flow = self._flow(lease.owner).drive(run, tenant, force=force, max_wait=max_wait)
            return self.result(self._complete(flow))

    def step(self, state: RunState, *, max_wait: float | None = None) -> bool:
        """Do exactly one unit of work; False when there is nothing left to do now.

        Only inside ``with runner.hold(run_id):`` (the lease says which process may step
        the run). A retry due more than ``max_wait`` seconds from now is left for later (False).
        """
        return self._complete(self._flow(self._lease(state).owner).step(state, max_wait=max_wait))

    def stream(
        self, run_id: str, *, after: int | None = None, tenant: str | None = None, poll: float = streams.POLL
    ) -> Iterator[StreamEvent]:
        """The run's events as they are recorded, from the first (or the one after cursor ``after``) to its end.

        Whoever drives the run: another thread (its model's text arrives too, as
        :class:`~tether.facts.stream.TextDelta`), or another process, whose commits are seen by
        reading the log every ``poll`` seconds. Each event but a text delta carries its
        ``cursor``: called again with ``after=`` the last one seen, the stream goes on with
        nothing missed and nothing twice. It ends after :class:`~tether.facts.stream.RunEnded`
        (a run parked for a person keeps it open; break out of it when you will).

        Raises:
            RunNotFound: no such run (or another tenant's), or it was deleted meanwhile.
            UnknownCursor: the run has no event ``after``.
        """
        for batch in streams.follow(self.store, run_id, tenant=tenant, after=after, poll=poll):
            yield from batch

    # Performing a flow's effects ------------------------------------------------------
    def _complete(self, flow: Flowing[T]) -> T:
        """Run ``flow`` to its end, performing each effect with plain calls."""
        driven = Driven(flow)
        while (effect := driven.next()) is not None:
            with driven.reporting():
                driven.outcome = self._perform(effect)
        return driven.result

    def _perform(self, effect: Effect) -> Any:
        """Do what ``effect`` says, here and now, and give back its outcome (see :mod:`tether.core.flow`)."""
        if (work := self._store_work(effect)) is not None:
            outcome = work()
            if (due := self._snapshot_due(effect)) is not None:
                with _keeping_snapshot(due[0]):
                    self.store.save_snapshot(*due)
            return outcome
        match effect:
            case CheckLease(run_id):
                lease = self._held.get(run_id)
                if lease is not None:
                    lease.check()
            case ShownStatus(run_id, tenant):
                return shown_status(self.store.load_run(run_id, tenant=tenant))
            case Notify() | Announce():
                self._tell(effect)
            case DecidedElsewhere():
                self._overruled(effect)
            case Ask(requests) if self.approver is not None:
                return self.approver.decide(requests)
            case Sleep(seconds):
                time.sleep(seconds)
            case engine.CallModel():
                with self._performing(effect):
                    return self._call_model(effect)
            case Attempt(action, run_id):
                with self._performing(effect):
                    return action.tool.execute(action.arguments, action.call.call_id, run_id=run_id)
            case Launch(Attempt(action, run_id)):
                with self._performing(effect.attempt):  # the thread starts in the call's span
                    return launches.launch(
                        functools.partial(action.tool.execute, action.arguments, action.call.call_id, run_id=run_id)
                    )
            case Landed(handles):
                return launches.landed(handles)
            case DriveRun(run_id=run_id, tenant=tenant, max_wait=max_wait):
                runner = self._child_runner(effect)
                runner._complete(lifecycle.create_child(runner._flow(), effect, self._child_trace(effect)))
                return runner.drive(run_id, tenant=tenant, max_wait=max_wait)
            case _:
                raise TypeError(f"no driver for {effect!r}")
        return None

    def _call_model(self, call: engine.CallModel) -> ModelResponse:
        """One model call: streamed only when someone listens to the text and the model can stream."""
        request, model, on_text = call.request, call.model or self.agent.model, self._text_listener(call)
        if on_text is not None and isinstance(model, StreamingModelAdapter):
            return model.stream(request, on_text)
        return model.complete(request)


_WAITS_ELSEWHERE = (engine.CallModel, Attempt, Landed, Sleep, Ask, DriveRun)
"""Effects that wait for something outside tether: an AsyncRunner's run gives up its busy place meanwhile."""


class AsyncRunner(_RunnerBase[AsyncStore, leases.AsyncLease]):
    """Drives runs inside an event loop: every effect that waits is awaited, so the loop is never blocked.

    The store is an :class:`~tether.stores.AsyncStore` (:class:`~tether.stores.sql.AsyncSQLStore`);
    a sync one is made awaitable (:func:`~tether.stores.awaitable.as_async_store`: a SQL store's
    calls run in worker threads, a memory store's directly). The lease's heartbeat is a task, the
    model and tools are awaited (sync ones in threads), an async approver is awaited and a sync one
    runs in a thread (it may block: a terminal prompt). Listeners are plain calls (keep them quick).

    Cancelling the task driving a run stops the drive at its next wait: a write in progress is
    finished first, the lease is given up, and a later drive continues the run (a tool call it
    had started is then in doubt, handled as after a crash).
    """

    def __init__(
        self,
        agent: Agent,
        store: Store | AsyncStore | None = None,
        *,
        max_busy_runs: int | busy.BusyRuns | None = busy.SHARED,
        freeze_heap: bool = True,
        **options: Unpack[RunnerOptions],
    ) -> None:
        """The options are :class:`Runner`'s, but for ``max_busy_runs`` and ``freeze_heap``, this runner's own.

        ``max_busy_runs``: how many runs at once may be deciding or writing a step; the rest queue,
        so the event loop stays responsive (see :mod:`tether.drivers.busy`). By default 32 per event
        loop, shared by every runner that does not say otherwise (a service making a runner per
        request is still limited); a number: this runner's own limit; a
        :class:`~tether.drivers.busy.BusyRuns`: the limit of whoever shares it; None: no limit.

        ``freeze_heap``: the first runner made with it in a process collects and freezes the heap
        (:func:`tether.freeze_startup_heap`), so the garbage collector's full passes stop traversing
        the imported modules and SDKs: without it they stall the loop 150-400 ms each. False leaves
        the collector alone (a host that freezes at a moment of its own choosing).
        """
        super().__init__(agent, store, **options)
        self._busy = busy.of(max_busy_runs)
        if freeze_heap:
            heap.freeze_once()

    def _like(self, agent: Agent, **options: Unpack[RunnerOptions]) -> Self:
        """A child's runner: one busy limit for the whole run tree; the heap was frozen, or not, by its root."""
        return type(self)(agent, self.store, max_busy_runs=self._busy, freeze_heap=False, **options)

    def _store_for(self, store: Store | AsyncStore) -> AsyncStore:
        return as_async_store(store)

    # Leases -------------------------------------------------------------------------------
    @asynccontextmanager
    async def hold(self, run_id: str, *, force: bool = False) -> AsyncIterator[leases.AsyncLease]:
        """Hold the run's lease while the block lasts (``async with runner.hold(run_id):``); see :meth:`Runner.hold`."""
        async with leases.ahold(self.store, run_id, ttl=self.lease_ttl, force=force) as lease:
            self._held[run_id] = lease
            try:
                yield lease
            finally:
                del self._held[run_id]

    # Runs ---------------------------------------------------------------------------------
    async def load(self, run_id: str, *, tenant: str | None = None) -> RunState:
        """See :meth:`Runner.load`."""
        return await self._acomplete(lifecycle.read(run_id, tenant))

    async def create(
        self,
        prompt: str,
        *,
        continue_from: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
        parent: dict[str, Any] | None = None,
    ) -> RunState:
        """See :meth:`Runner.create`."""
        flow = self._create_flow(prompt, continue_from=continue_from, tenant=tenant, run_id=run_id, parent=parent)
        return await self._acomplete(flow)

    async def fork(
        self,
        run_id: str,
        *,
        at_event: int | None = None,
        edit: MessageEdit | None = None,
        tenant: str | None = None,
        new_run_id: str | None = None,
        at_step: int | None = None,
    ) -> RunState:
        """See :meth:`Runner.fork`."""
        at = fork_event(at_event, at_step)
        return await self._acomplete(self._fork_flow(run_id, at, edit=edit, tenant=tenant, new_run_id=new_run_id))

    async def submit(
        self,
        prompt: str,
        *,
        queue: str = queues.DEFAULT_QUEUE,
        continue_from: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """See :meth:`Runner.submit`."""
        await asyncio.to_thread(queues.ensure_schema, queues.check_can_queue(self.store))
        dispatch = {"queue": queue}
        flow = self._create_flow(
            prompt, continue_from=continue_from, tenant=tenant, run_id=run_id, parent=None, dispatch=dispatch
        )
        return (await self._acomplete(flow)).id

    async def decide(
        self,
        run_id: str,
        call_id: str,
        decision: Decision,
        *,
        fingerprint: str | None = None,
        tenant: str | None = None,
    ) -> RunResult:
        """See :meth:`Runner.decide`."""
        flow = lifecycle.decide(self._flow(), run_id, call_id, decision, fingerprint=fingerprint, tenant=tenant)
        return self.result(await self._acomplete(flow))

    async def cancel(self, run_id: str, reason: str = "", *, tenant: str | None = None) -> RunResult:
        """See :meth:`Runner.cancel`."""
        return self.result(await self._acomplete(lifecycle.cancel(self._flow(), run_id, reason, tenant)))

    async def run(
        self, prompt: str, *, continue_from: str | None = None, tenant: str | None = None, max_wait: float | None = None
    ) -> RunResult:
        """Start a run and drive it as far as it goes (see :meth:`Runner.drive` for ``max_wait``)."""
        with self._run_trace():  # the run's span lasts the first drive too
            state = await self.create(prompt, continue_from=continue_from, tenant=tenant)
            return await self.drive(state, max_wait=max_wait)

    async def drive(
        self,
        run: str | RunState,
        *,
        tenant: str | None = None,
        max_wait: float | None = None,
        force: bool = False,
        until: Callable[[], bool] | None = None,
    ) -> RunResult:
        """Take steps until the run finishes or parks (``max_wait``, ``force``: see :meth:`Runner.drive`).

        ``until``: asked between steps; True stops the drive there, its step finished (a worker's SIGTERM).
        """
        run_id = run if isinstance(run, str) else run.id
        async with self.hold(run_id, force=force) as lease:
            with self._drive_trace(run_id):
                flow = self._flow(lease.owner).drive(run, tenant, force=force, max_wait=max_wait, until=until)
                return self.result(await self._acomplete(flow))

    async def step(self, state: RunState, *, max_wait: float | None = None) -> bool:
        """Do exactly one unit of work (inside ``async with runner.hold(run_id):``); see :meth:`Runner.step`."""
        return await self._acomplete(self._flow(self._lease(state).owner).step(state, max_wait=max_wait))

    async def stream(
        self,
        run_id: str,
        *,
        after: int | None = None,
        tenant: str | None = None,
        drive: bool = False,
        poll: float = streams.POLL,
    ) -> AsyncGenerator[StreamEvent, None]:
        """The run's events as they are recorded, from the first or after cursor ``after`` (see :meth:`Runner.stream`).

        ``drive``: drive the run here meanwhile (as :meth:`drive`, in a task); the stream then ends
        when the drive does, parked or ended, with every event it recorded, and raises what the
        drive raised (:class:`~tether.errors.RunBusy`: another process drives it). Leaving the
        loop early stops that drive at its next wait, as cancelling one does; drive it again later.
        Without ``drive`` it follows whoever drives the run, here or in another process, to the run's end.
        """
        driving = asyncio.ensure_future(self.drive(run_id, tenant=tenant)) if drive else None
        try:
            batches = streams.afollow(self.store, run_id, tenant=tenant, after=after, poll=poll, until=driving)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    for event in batch:
                        yield event
            if driving is not None:
                await driving  # what the drive raised
        finally:
            if driving is not None and not driving.done():
                driving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await driving

    # Performing a flow's effects ------------------------------------------------------
    async def _acomplete(self, flow: Flowing[T]) -> T:
        """Run ``flow`` to its end, awaiting each effect, in a place among the busy runs (:mod:`.busy`)."""
        driven = Driven(flow)
        async with self._busy.place() as place:
            while (effect := driven.next()) is not None:
                with driven.reporting():
                    if isinstance(effect, _WAITS_ELSEWHERE):
                        async with place.away():
                            driven.outcome = await self._aperform(effect)
                    else:
                        driven.outcome = await self._aperform(effect)
            return driven.result

    async def _aperform(self, effect: Effect) -> Any:
        """Do what ``effect`` says without blocking the loop (see :meth:`Runner._perform`)."""
        if (work := self._store_work(effect)) is not None:
            outcome = await work()  # begun, it ends whole even if the drive is cancelled (see AsyncStore)
            if (due := self._snapshot_due(effect)) is not None:
                with _keeping_snapshot(due[0]):
                    await self.store.save_snapshot(*due)
            return outcome
        match effect:
            case CheckLease(run_id):
                lease = self._held.get(run_id)
                if lease is not None:
                    await lease.check()
            case ShownStatus(run_id, tenant):
                return shown_status(await self.store.load_run(run_id, tenant=tenant))
            case Notify() | Announce():
                self._tell(effect)
            case DecidedElsewhere():
                self._overruled(effect)
            case Ask(requests) if self.approver is not None:
                return await self._ask(self.approver, requests)
            case Sleep(seconds):
                await asyncio.sleep(seconds)
            case engine.CallModel():
                with self._performing(effect):
                    return await self._acall_model(effect)
            case Attempt(action, run_id):
                with self._performing(effect):
                    return await action.tool.aexecute(action.arguments, action.call.call_id, run_id=run_id)
            case Launch(Attempt(action, run_id)):
                with self._performing(effect.attempt):  # the task starts in the call's span
                    return launches.alaunch(action.tool.aexecute(action.arguments, action.call.call_id, run_id=run_id))
            case Landed(handles):
                return await launches.alanded(handles)
            case DriveRun(run_id=run_id, tenant=tenant, max_wait=max_wait):
                runner = self._child_runner(effect)
                await runner._acomplete(lifecycle.create_child(runner._flow(), effect, self._child_trace(effect)))
                return await runner.drive(run_id, tenant=tenant, max_wait=max_wait)
            case _:
                raise TypeError(f"no driver for {effect!r}")
        return None

    async def _ask(self, approver: Approver | AsyncApprover, requests: list[PendingApproval]) -> Any:
        """The approver's decisions: awaited if it is async; a sync one in a thread, as it may block (a prompt)."""
        if is_async_approver(approver):
            answer: Any = approver.decide(requests)
        else:
            answer = await asyncio.to_thread(approver.decide, requests)
        if inspect.isawaitable(answer):
            answer = await answer
        decisions: Mapping[str, Decision] = answer
        return decisions

    async def _acall_model(self, call: engine.CallModel) -> ModelResponse:
        """One model call (see Runner._call_model), awaited natively when the model can; else in a thread."""
        request, model, on_text = call.request, call.model or self.agent.model, self._text_listener(call)
        if on_text is not None and isinstance(model, AsyncStreamingModelAdapter):
            return await model.astream(request, on_text)
        if on_text is not None and isinstance(model, StreamingModelAdapter):
            return await asyncio.to_thread(model.stream, request, on_text)
        if isinstance(model, AsyncModelAdapter):
            return await model.acomplete(request)
        return await asyncio.to_thread(model.complete, request)
