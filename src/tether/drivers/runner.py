"""Drivers: perform a drive's effects, send the outcomes back, until the drive ends.

What to do and in which order is decided by :class:`tether.core.flow.Flow`, which does no I/O;
:class:`Runner` performs its effects with plain calls and :class:`AsyncRunner` awaits the
slow ones (model, tools, waits). Loading, creating, deciding and cancelling live in
:class:`_RunnerBase`.
A drive ends when the run is done, failed, cancelled, parked awaiting a decision the
approver (if any) did not give, or parked until a retry is due (``max_wait``): a parked run
holds no thread; :meth:`tether.stores.Store.list_due` finds it again when its retry is due.
A drive holds the run's lease from before its first model call or tool start to its end
(:meth:`_RunnerBase.hold`, see :mod:`tether.stores.leases`): one process drives a run at a time.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from tether.agent import Agent
from tether.core import children, engine
from tether.core.approvals import Approver, Decision, Deny, PendingApproval, pending_of
from tether.core.children import DriveChild
from tether.core.compat import check_versions
from tether.core.events import Event
from tether.core.flow import (
    Activity,
    Announce,
    Ask,
    Attempt,
    CheckLease,
    Driven,
    Effect,
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
from tether.core.history import append_user_text, close_unanswered
from tether.core.machine import MACHINE_VERSION
from tether.core.state import RunState
from tether.core.status import AWAITING, ENDED, INITIAL, WAITING_RETRY, RunStatus, status_name
from tether.errors import RunEnded, RunNotFound
from tether.execution import launches
from tether.models import (
    AsyncModelAdapter,
    AsyncStreamingModelAdapter,
    ModelRequest,
    ModelResponse,
    StreamingModelAdapter,
    TextListener,
    Usage,
)
from tether.policy import rules
from tether.stores import SCHEMA_VERSION, RunRecord, Store, leases
from tether.stores.memory import MemoryStore

T = TypeVar("T")
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


def _conversation_spent(parent: RunState) -> dict[str, float]:
    """What a conversation spent up to and including ``parent`` (for conversation budgets)."""
    earlier = parent.spec.get("conversation") or {}
    usage = parent.usage
    tokens = (
        usage.input_tokens + usage.output_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
    )
    return {
        "tokens": float(earlier.get("tokens", 0)) + tokens,
        "cost_usd": float(earlier.get("cost_usd", 0.0)) + parent.cost_usd,
        "model_calls": int(earlier.get("model_calls", 0)) + parent.steps,
        "tool_calls": int(earlier.get("tool_calls", 0)) + parent.tool_calls,
        "started_at": float(earlier.get("started_at", parent.created_at)),
    }


class _RunnerBase:
    """What both drivers share: everything but how the slow effects are performed.

    A drive is a :class:`tether.core.flow.Flow`; this class performs each of its effects with plain
    calls (:meth:`_perform`), which is all :class:`Runner` does; :class:`AsyncRunner` awaits the
    model, the tools and sleeps instead.

    ``approver`` answers gated calls during a drive. ``None`` means nobody will be asked:
    a gated call still parks the run (a later ``decide`` can free it), but a call a crash
    left in doubt reaches the model as interrupted and not re-run. Pass
    :class:`~tether.core.approvals.DecideLater` when a person decides later (a service, the CLI's
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

    def _flow(self, owner: str = "", agent: Agent | None = None) -> Flow:
        """This runner's decisions (or ``agent``'s, for a child run), for a drive by ``owner`` (the lease's)."""
        return Flow(agent or self.agent, owner=owner, can_ask=self.approver is not None, clock=self.clock, rng=self.rng)

    @contextmanager
    def _driving(
        self, run: str | RunState, tenant: str | None, *, force: bool, max_wait: float | None
    ) -> Iterator[Flowing[RunState]]:
        """A drive's flow, while the run's lease is held: claimed before anything else, released at the end."""
        with self.hold(run if isinstance(run, str) else run.id, force=force) as lease:
            yield self._flow(lease.owner).drive(run, tenant, force=force, max_wait=max_wait)

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
        parent: dict[str, Any] | None = None,
    ) -> RunState:
        """Persist a new run (its prompt, spec and any earlier history) without driving it.

        ``parent``: a child run's link to the run and call it serves (see :mod:`tether.core.children`).
        """
        messages: list[dict[str, Any]] = []
        spec = {
            **self.agent.recorded_spec,
            "model": self.agent.model_name,
            "max_steps": self.agent.limits.max_steps,
            "max_tool_calls": self.agent.limits.max_tool_calls,
            "budget": budget.to_dict() if (budget := self.agent.limits.budget) is not None else None,
            "machine_version": MACHINE_VERSION,
            "schema_version": SCHEMA_VERSION,
            "tool_schemas": {tool.name: tool.input_schema() for tool in self.agent.all_tools},
            "tool_settings": {tool.name: tool.settings() for tool in self.agent.all_tools},
        }
        if parent is not None:
            spec["parent"] = parent
        if continue_from is not None:
            earlier = self.load(continue_from, tenant=tenant)
            messages = [dict(m) for m in earlier.messages]
            close_unanswered(messages, f"Not run: the earlier run ended ({earlier.status}) before this call ran.")
            spec["continued_from"] = continue_from
            spec["conversation"] = _conversation_spent(earlier)
        append_user_text(messages, prompt)
        state = RunState(id=run_id or f"run_{uuid.uuid4().hex[:20]}", tenant=tenant)
        produced = engine.start_events(state, spec=spec, messages=messages, now=self.clock())
        self.store.create_run(record_of(state), produced)
        self._notify(state, produced)
        return state

    def _spec(self, tenant: str | None, run_id: str) -> dict[str, Any]:
        return self.store.load_run(run_id, tenant=tenant).spec

    def _child(self, child: DriveChild) -> Any:
        """A runner like this one (store, approver, listeners, clocks) for ``child``'s run, created unless it exists."""
        runner = type(self)(
            child.agent,
            self.store,
            approver=self.approver,
            listeners=self.listeners,
            clock=self.clock,
            rng=self.rng,
            on_action=self.on_action,
            on_text=self.on_text,
            lease_ttl=self.lease_ttl,
        )
        try:
            self.store.load_run(child.run_id, tenant=child.tenant)
        except RunNotFound:  # created once: a resumed parent drives the child it started
            runner.create(child.prompt, tenant=child.tenant, run_id=child.run_id, parent=child.link)
        return runner

    def _notify(self, state: RunState, produced: list[Event]) -> None:
        for listener in self.listeners:
            for event in produced:
                listener(state, event)

    # Approvals ------------------------------------------------------------------------
    def approval_requests(self, state: RunState) -> list[PendingApproval]:
        """The calls of ``state`` waiting for a decision, with their tools' descriptions."""
        return pending_of(state, self.agent)

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
        state = self.load(run_id, tenant=tenant)
        if isinstance(decision, Deny):  # runs nothing: needs no tools (they may be gone or changed)
            check_versions(state.id, state.spec)
            decisions = self._flow()
        else:  # a child run of this agent's tree is decided with the child's agent
            decisions = self._flow(agent=children.agent_for(self.agent, state.spec, partial(self._spec, tenant)))
            self._complete(decisions.load(state, tenant))
        self._complete(decisions.decide(state, call_id, decision, fingerprint))
        return result_of(state)

    def cancel(self, run_id: str, reason: str = "", *, tenant: str | None = None) -> RunResult:
        """Stop a run that has not ended, from any process; a run that failed transiently ends for good.

        Its child runs (see :meth:`tether.Agent.as_tool`) are cancelled with it, after it.
        Needs neither the run's tools nor its model. A tool another process is running is not
        stopped: that driver finds the run changed when it records the result, and stops.

        Raises:
            RunEnded: the run is done, cancelled, or failed for good.
        """
        state = self.load(run_id, tenant=tenant)
        if state.status in ENDED and not (state.status == RunStatus.failed and state.can_retry):
            raise RunEnded(state.id, result_of(state).status, "cancel")
        self._complete(self._flow().commit(state, engine.cancellation(reason)))
        for child in state.children.values():  # then the runs it started, down the tree
            with suppress(RunEnded, RunNotFound):
                self.cancel(child, f"its parent run {state.id} was cancelled", tenant=tenant)
        return result_of(state)

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
        match effect:
            case CheckLease(run_id):
                lease = self._held.get(run_id)
                if lease is not None:
                    lease.check()
            case LoadLog(run_id, tenant):
                return self.store.load_log(run_id, tenant=tenant)
            case LoadRun(run_id, tenant):
                return self.store.load_run(run_id, tenant=tenant)
            case ShownStatus(run_id, tenant):
                return shown_status(self.store.load_run(run_id, tenant=tenant))
            case Persist(state, events):
                self.store.append(record_of(state), state.version - 1, events)
            case Notify(state, events):
                rules.log_warnings(state.id, events)
                self._notify(state, events)
            case Announce(state, activity):
                if self.on_action is not None:
                    self.on_action(state, activity)
            case LookUpCache(key, now):
                return self.store.cache_get(key, now)
            case StoreCache(key, tool, value, expires_at):
                self.store.cache_put(key, tool, value, expires_at)
            case Ask(requests) if self.approver is not None:
                return self.approver.decide(requests)
            case Sleep(seconds):
                time.sleep(seconds)
            case engine.CallModel(request):
                return self._call_model(request)
            case Attempt(action, run_id):
                return action.tool.execute(action.arguments, action.call.call_id, run_id=run_id)
            case Launch(Attempt(action, run_id)):
                return launches.launch(
                    partial(action.tool.execute, action.arguments, action.call.call_id, run_id=run_id)
                )
            case Landed(handles):
                return launches.landed(handles)
            case DriveChild(run_id=run_id, tenant=tenant, max_wait=max_wait):
                return self._child(effect).drive(run_id, tenant=tenant, max_wait=max_wait)
            case _:
                raise TypeError(f"no driver for {effect!r}")
        return None

    def _call_model(self, request: ModelRequest) -> ModelResponse:
        """One model call: streamed only when someone listens to the text and the model can stream."""
        model = self.agent.model
        if self.on_text is not None and isinstance(model, StreamingModelAdapter):
            return model.stream(request, self.on_text)
        return model.complete(request)


class Runner(_RunnerBase):
    """Drives runs synchronously."""

    def run(
        self, prompt: str, *, continue_from: str | None = None, tenant: str | None = None, max_wait: float | None = None
    ) -> RunResult:
        """Start a run and drive it as far as it goes (see :meth:`drive` for ``max_wait``)."""
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
        with self._driving(run, tenant, force=force, max_wait=max_wait) as flow:
            return result_of(self._complete(flow))

    def step(self, state: RunState, *, max_wait: float | None = None) -> bool:
        """Do exactly one unit of work; False when there is nothing left to do now.

        Only inside ``with runner.hold(run_id):`` (the lease says which process may step
        the run). A retry due more than ``max_wait`` seconds from now is left for later (False).
        """
        return self._complete(self._flow(self._lease(state).owner).step(state, max_wait=max_wait))


class AsyncRunner(_RunnerBase):
    """Drives runs inside an event loop: the model, tools and waits are awaited (sync tools in threads).

    The store, the approver, the lease and the listeners are still called as in :class:`Runner`.
    """

    async def run(
        self, prompt: str, *, continue_from: str | None = None, tenant: str | None = None, max_wait: float | None = None
    ) -> RunResult:
        """Start a run and drive it as far as it goes (see :meth:`Runner.drive` for ``max_wait``)."""
        return await self.drive(self.create(prompt, continue_from=continue_from, tenant=tenant), max_wait=max_wait)

    async def drive(
        self, run: str | RunState, *, tenant: str | None = None, max_wait: float | None = None, force: bool = False
    ) -> RunResult:
        """Take steps until the run finishes or parks (``max_wait``, ``force``: see :meth:`Runner.drive`)."""
        with self._driving(run, tenant, force=force, max_wait=max_wait) as flow:
            return result_of(await self._acomplete(flow))

    async def step(self, state: RunState, *, max_wait: float | None = None) -> bool:
        """Do exactly one unit of work; False when there is nothing left to do now (see Runner.step)."""
        return await self._acomplete(self._flow(self._lease(state).owner).step(state, max_wait=max_wait))

    async def _acomplete(self, flow: Flowing[T]) -> T:
        """Run ``flow`` to its end, awaiting the slow effects (see :meth:`_perform` for the rest)."""
        driven = Driven(flow)
        while (effect := driven.next()) is not None:
            with driven.reporting():
                driven.outcome = await self._aperform(effect)
        return driven.result

    async def _aperform(self, effect: Effect) -> Any:
        match effect:
            case Sleep(seconds):
                await asyncio.sleep(seconds)
                return None
            case engine.CallModel(request):
                return await self._acall_model(request)
            case Attempt(action, run_id):
                return await action.tool.aexecute(action.arguments, action.call.call_id, run_id=run_id)
            case Launch(Attempt(action, run_id)):
                return launches.alaunch(action.tool.aexecute(action.arguments, action.call.call_id, run_id=run_id))
            case Landed(handles):
                return await launches.alanded(handles)
            case DriveChild(run_id=run_id, tenant=tenant, max_wait=max_wait):
                return await self._child(effect).drive(run_id, tenant=tenant, max_wait=max_wait)
        return self._perform(effect)

    async def _acall_model(self, request: ModelRequest) -> ModelResponse:
        """One model call (see Runner._call_model), awaited natively when the model can; else in a thread."""
        model, on_text = self.agent.model, self.on_text
        if on_text is not None and isinstance(model, AsyncStreamingModelAdapter):
            return await model.astream(request, on_text)
        if on_text is not None and isinstance(model, StreamingModelAdapter):
            return await asyncio.to_thread(model.stream, request, on_text)
        if isinstance(model, AsyncModelAdapter):
            return await model.acomplete(request)
        return await asyncio.to_thread(model.complete, request)
