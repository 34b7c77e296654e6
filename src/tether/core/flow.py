"""One drive as a flow: a generator that yields effects and takes their outcomes back.

Like httpx's ``Auth.auth_flow``, :class:`Flow` decides and does no I/O: it yields an
effect (call the model, run a tool attempt, persist these events, ask the approver, sleep,
read the store...), the driver performs it and sends the outcome back with ``send`` (or
raises what performing it raised into the flow with ``throw``), until the flow returns.
:class:`~tether.drivers.runner.Runner` performs effects with plain calls and
:class:`~tether.drivers.runner.AsyncRunner` awaits the slow ones; an async store is just another
shell awaiting :class:`Persist`. What the flow decides per step comes from
:mod:`tether.core.engine`; the flow adds the order of work around it (the lease checked before
deciding, a tool's start committed before it runs, a cache looked up first, transient store
errors tried again) and the few clock readings it needs, from the injected clocks.

Effects and what performing one gives back:

====================== ==========================================================
:class:`CheckLease`    None; raises :class:`~tether.errors.RunBusy` if the lease was lost
:class:`LoadLog`       the run's :class:`~tether.stores.RunLog`
:class:`LoadRun`       the run's :class:`~tether.stores.RunRecord`
:class:`ShownStatus`   the stored run's status as a result shows it (a ``str``)
:class:`CreateRun`     None, once the new run's row and first events are committed
:class:`Persist`       None, once the events and the run's row are committed
:class:`Notify`        None, once listeners were told of committed events
:class:`Announce`      None, once the action listener was told of slow work ahead
:class:`LookUpCache`   the cached tool result (a ``str``) or None
:class:`StoreCache`    None
:class:`Ask`           the approver's decisions, by call id
:class:`DecidedElsewhere` None, once the approver was told which of its answers were not recorded
:class:`Sleep`         None, after the time passed
``engine.CallModel``   the :class:`~tether.models.ModelResponse`; raises ModelError
:class:`Attempt`       the tool's serialised result; raises what the tool raised
:class:`Launch`        a handle for the attempt, started and not waited for
:class:`Landed`        ``(handle, result or what the tool raised)`` of each ended attempt
:class:`DriveRun`      the other run's :class:`RunReport` (a :class:`~tether.RunResult`), once created and driven
====================== ==========================================================

Concurrent calls (tools that :meth:`~tether.Agent.runs_concurrently`) are the one place a step
has several attempts under way: see :meth:`Flow._run_batch`.

The flow tells one agent's story: ask the model, run the calls, ask people, commit. What goes
beyond it plugs in beside it through its one extension point, :class:`Extension`, at named
moments: which agent drives a stored run, which agent is in charge of it now, a step due before
the engine decides, and calls served by the extension instead of run as functions (a call that
drives another run). Agents as tools (:mod:`tether.core.children`) and handoffs
(:mod:`tether.core.handoffs`) are such extensions; the flow names none of them, and a driver
chooses which it gives a flow.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from tether.agent import Agent
from tether.core import cache, engine, snapshots
from tether.core.approvals import Decision, PendingApproval, overruled, pending_of
from tether.core.compat import check_compatible
from tether.core.state import RunState
from tether.errors import IncompatibleRun, ModelError, RunBusy, StaleRun, StoreError, TetherError
from tether.facts.events import Event, Fact
from tether.facts.status import AWAITING, ENDED, RunStatus, stored_status
from tether.facts.usage import Usage
from tether.models import ModelResponse
from tether.stores import RunLog, RunRecord
from tether.tools import Tool

STORE_RETRY_WAITS = (0.1, 0.5, 2.0)
"""Seconds to wait before each new try of a step's write that failed transiently (see
:attr:`tether.errors.StoreError.transient`): a lock held past SQLite's busy timeout, a dropped
PostgreSQL connection. The step's outcome (a tool's result, a paid model answer) is held
meanwhile; the write is given up only after these."""
STORE_LOG = logging.getLogger("tether.store")
DECISION_TRIES = 5
"""How many times decisions are written on a run other processes keep changing meanwhile: a drive's
approver's answers, or one decision from anywhere (:func:`tether.core.lifecycle.decide`)."""

T = TypeVar("T")


class _Unsaved(StaleRun):
    """A step's write refused because another process changed the run: what the step had done is lost."""

    def __init__(self, error: StaleRun, happened: str, on_resume: str) -> None:
        super().__init__(error.run_id, error.expected_version, detail=str(error))
        self.happened = happened
        self.on_resume = on_resume


# Effects: what a driver performs for the flow ---------------------------------------------
@dataclass(frozen=True)
class CheckLease:
    """Make sure this driver still holds the run's lease, if it holds it (before deciding or writing)."""

    run_id: str


@dataclass(frozen=True)
class _Read:
    """A read of one run from the store."""

    run_id: str
    tenant: str | None


@dataclass(frozen=True)
class LoadLog(_Read):
    """Read the run's events and version in one consistent read: from its latest snapshot unless ``whole``."""

    whole: bool = False


class LoadRun(_Read):
    """Read the run's row (its version and summary)."""


class ShownStatus(_Read):
    """Read the run's status as it is stored now, in a result's words (for a message)."""


@dataclass(frozen=True)
class Persist:
    """Commit ``events`` and the row of ``state`` (whose version they advanced by one), in one write."""

    state: RunState
    events: list[Event]


@dataclass(frozen=True)
class CreateRun:
    """Insert the new run ``state`` (its row) with its first ``events``, in one write."""

    state: RunState
    events: list[Event]


@dataclass(frozen=True)
class Notify:
    """Tell the event listeners (and the policy log) what was just committed."""

    state: RunState
    events: list[Event]


@dataclass(frozen=True)
class RunningTools:
    """Concurrent calls of one turn under way at once, in the order they were launched."""

    calls: tuple[engine.RunTool, ...]


Activity = engine.CallModel | engine.RunTool | engine.WaitUntil | RunningTools
"""Slow work a drive is about to start: a model call, a tool attempt (or several at once), a wait for a retry."""


@dataclass(frozen=True)
class Announce:
    """Tell the action listener slow work is about to start (nothing is persisted yet)."""

    state: RunState
    activity: Activity


@dataclass(frozen=True)
class LookUpCache:
    """Read a live cached result for ``key``."""

    key: str
    now: float


@dataclass(frozen=True)
class StoreCache:
    """Keep a tool's result for later calls with the same input, until ``expires_at``."""

    key: str
    tool: str
    value: str
    expires_at: float


@dataclass(frozen=True)
class Ask:
    """Ask the approver about these calls (only yielded when the driver has one)."""

    requests: list[PendingApproval]


@dataclass(frozen=True)
class DecidedElsewhere:
    """Tell the approver that answers it gave were not recorded: those calls were decided by another process.

    ``notes`` holds ``(call id, what happened to it)``, e.g. ``("toolu_1", "approved by bob")``.
    """

    state: RunState
    notes: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sleep:
    """Let ``seconds`` pass (a tool retry's schedule, or a pause before writing again)."""

    seconds: float


@dataclass(frozen=True)
class Attempt:
    """Run one attempt of a tool call whose start is committed already."""

    action: engine.RunTool
    run_id: str


@dataclass(frozen=True)
class Launch:
    """Start an attempt whose start is committed, without waiting for it; gives back a handle for :class:`Landed`."""

    attempt: Attempt


@dataclass(frozen=True)
class Landed:
    """Wait until at least one of these launched attempts has ended.

    Gives back every one that has, in the order given: ``(handle, its serialised result or
    the exception it raised)``.
    """

    handles: tuple[Any, ...]


@dataclass(frozen=True)
class DriveRun:
    """Create a run (unless it exists) and drive it as far as it goes; gives back its :class:`RunReport`.

    What an extension yields for a call that drives another run (a child run serving an agent
    tool's call): the run is created with ``prompt``, ``link`` as its spec's ``parent`` entry and
    the id ``run_id``, and driven with ``agent`` (exactly that agent: see ``resolves_agent`` of
    :class:`Flow`), this driver's store and approver.
    """

    agent: Agent
    run_id: str
    prompt: str
    link: dict[str, Any]
    tenant: str | None
    max_wait: float | None


class RunReport(Protocol):
    """Where a driven run stands after a drive (a :class:`tether.RunResult`)."""

    @property
    def status(self) -> str: ...  # noqa: D102 - the fields of RunResult
    @property
    def output(self) -> str | None: ...  # noqa: D102
    @property
    def result(self) -> Any: ...  # noqa: D102
    @property
    def error(self) -> str | None: ...  # noqa: D102
    @property
    def usage(self) -> Usage: ...  # noqa: D102
    @property
    def cost_usd(self) -> float | None: ...  # noqa: D102
    @property
    def tool_calls(self) -> int: ...  # noqa: D102
    @property
    def pending_approvals(self) -> list[dict[str, Any]]: ...  # noqa: D102
    @property
    def next_due_at(self) -> float | None: ...  # noqa: D102


Effect = (
    CheckLease
    | LoadLog
    | LoadRun
    | ShownStatus
    | CreateRun
    | Persist
    | Notify
    | Announce
    | LookUpCache
    | StoreCache
    | Ask
    | DecidedElsewhere
    | Sleep
    | engine.CallModel
    | Attempt
    | Launch
    | Landed
    | DriveRun
)
Flowing = Generator[Effect, Any, T]
"""A flow that yields effects, is sent their outcomes and returns a ``T``."""


class Driven(Generic[T]):
    """A flow as a driver moves it: ``next()`` hands back the last outcome and gives the next effect.

    A driver's loop is then ``while (effect := driven.next()) is not None: with driven.reporting():
    driven.outcome = perform(effect)``, the same whether ``perform`` is awaited or not.
    """

    def __init__(self, flow: Flowing[T]) -> None:
        self._flow = flow
        self.outcome: Any = None
        """What performing the last effect gave back."""
        self._error: BaseException | None = None
        self.result: T

    def next(self) -> Effect | None:
        """The next effect to perform, or None once the flow returned (its value is :attr:`result`)."""
        error, self._error = self._error, None
        try:
            if error is not None:
                return self._flow.throw(error)
            return self._flow.send(self.outcome)
        except StopIteration as stop:
            self.result = stop.value
            return None

    def reporting(self) -> _Reporting:
        """A block whose exception is not raised here but raised into the flow, where the effect was yielded."""
        return _Reporting(self)


class _Reporting:
    def __init__(self, driven: Driven[Any]) -> None:
        self._driven = driven

    def __enter__(self) -> None:
        self._driven.outcome = None

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> bool:
        self._driven._error = error
        return error is not None


class Extension:
    """A capability beside the one-agent story, plugged into the flow at its named moments.

    Each moment's default leaves the story as it is, so an extension implements only its own.
    The moments a flow consults, in each extension's order:

    - :meth:`agent_of_run`: a stored run is driven by another agent of this flow's tree;
    - :meth:`agent_in_charge`: another agent is in charge of a run now (and :meth:`check` that it
      can go on with the run);
    - :meth:`step_due`: a step of the extension's own comes before the engine decides;
    - :meth:`serves` / :meth:`serve`: the extension serves a call itself, instead of running a
      function (it may yield :class:`DriveRun` to drive another run for it).
    """

    def agent_of_run(self, flow: Flow, state: RunState, tenant: str | None) -> Flowing[Agent] | None:
        """The agent that drives the stored run ``state`` when it is not ``flow``'s; None: not this one's concern."""
        return None

    def agent_in_charge(self, root: Agent, state: RunState) -> Agent | None:
        """The agent in charge of ``state`` now, when it is not the run's own agent ``root``; None: no change."""
        return None

    def check(self, root: Agent, state: RunState) -> None:
        """Raise :class:`~tether.errors.IncompatibleRun` if ``root``'s agents cannot go on with the loaded run."""

    def step_due(self, flow: Flow, state: RunState, max_wait: float | None) -> Flowing[bool] | None:
        """A step of this extension's to take before the engine decides (as :meth:`Flow.step`); None: none due."""
        return None

    def serves(self, tool: Tool) -> bool:
        """Whether this extension serves calls of ``tool`` (they are never run as functions)."""
        return False

    def serve(self, flow: Flow, state: RunState, action: engine.RunTool, max_wait: float | None) -> Flowing[bool]:
        """Serve ``action``'s call (one it :meth:`serves`), as :meth:`Flow.step`: False if nothing more can be done."""
        raise TypeError(f"{type(self).__name__} serves no calls (tool {action.tool.name!r})")


class Flow:
    """The decisions and the order of work of driving one agent's runs; performs nothing.

    ``owner`` names the driver in the tool starts it records (its lease's owner); ``can_ask``
    says whether it has an approver. ``clock`` gives the time events are stamped with and
    schedules are read against; ``timer`` measures tool attempts; ``rng`` draws retry jitter.
    ``root``: the runs' own agent when ``agent`` is one a handoff handed them to (see :meth:`in_charge`).
    ``extensions``: what plugs into the story beside it (see :class:`Extension`). ``resolves_agent``:
    whether a run given by id is driven by the agent an extension names for it (a child run's);
    False for a flow made to drive one run with exactly its ``agent`` (a :class:`DriveRun`).
    """

    def __init__(
        self,
        agent: Agent,
        *,
        owner: str = "",
        can_ask: bool = False,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        rng: random.Random | None = None,
        root: Agent | None = None,
        extensions: Sequence[Extension] = (),
        resolves_agent: bool = True,
    ) -> None:
        self.agent = agent
        self.root = root or agent
        self.extensions = tuple(extensions)
        self.resolves_agent = resolves_agent
        self.owner = owner
        self.can_ask = can_ask
        self.clock = clock
        self.timer = timer
        self.rng = rng if rng is not None else random.Random()
        self.starts_ahead = False
        """Commit a tool's start with the write before it (see :meth:`commit`): only in :meth:`drive`,
        which takes the next step at once; a caller stepping by hand gets each start in a write of its own."""

    def for_agent(self, agent: Agent) -> Flow:
        """The same driver's decisions for ``agent`` (a child run's, in this agent's tree)."""
        return self if agent is self.agent else self._driving(agent, root=agent)

    def for_run(self, state: RunState, tenant: str | None) -> Flowing[Flow]:
        """The flow for a run of this agent's tree: this one, or the one of the agent an extension says drives it."""
        for extension in self.extensions:
            found = extension.agent_of_run(self, state, tenant)
            if found is not None:
                return self.for_agent((yield from found))
        return self

    def in_charge(self, state: RunState) -> Flow:
        """The decisions for ``state`` by the agent in charge of it: this flow's, or another an extension names.

        Raises:
            IncompatibleRun: the run was handed to an agent this flow's agents do not reach.
        """
        agent = self.root
        for extension in self.extensions:
            agent = extension.agent_in_charge(self.root, state) or agent
        return self if agent is self.agent else self._driving(agent, root=self.root)

    def _driving(self, agent: Agent, *, root: Agent) -> Flow:
        flow = Flow(
            agent,
            owner=self.owner,
            can_ask=self.can_ask,
            clock=self.clock,
            timer=self.timer,
            rng=self.rng,
            root=root,
            extensions=self.extensions,
        )
        flow.starts_ahead = self.starts_ahead
        return flow

    # A whole drive ------------------------------------------------------------------------
    def drive(
        self,
        run: str | RunState,
        tenant: str | None,
        *,
        force: bool,
        max_wait: float | None,
        until: Callable[[], bool] | None = None,
    ) -> Flowing[RunState]:
        """Take steps until the run finishes or parks, or ``until()`` says stop; the caller holds the lease.

        A write refused because another process changed the run meanwhile (a decision, a
        cancel) ends the drive with a :class:`StaleRun` saying what the run is now.
        """
        flow, state = self, None
        if isinstance(run, str):  # read once: an extension may name the agent that drives it
            state = yield from self._rebuild(run, tenant)
            if self.resolves_agent:
                flow = yield from self.for_run(state, tenant)
        state = yield from flow._start(state or run, tenant, force=force, read=state is not None)
        flow.starts_ahead = True
        try:
            while not (until is not None and state.started_here is None and until()) and (
                yield from flow.step(state, max_wait=max_wait)
            ):
                pass
        except RunBusy:
            raise
        except StaleRun as error:
            raise (yield from flow._changed_meanwhile(state, error)) from error
        return state

    def _start(self, run: str | RunState, tenant: str | None, *, force: bool, read: bool = False) -> Flowing[RunState]:
        """Load and check the run; with ``force``, first declare its in-flight calls abandoned.

        A state loaded before the lease was claimed may be behind (unless just ``read`` under it):
        StaleRun now, before any model call.
        """
        state = yield from self.load(run, tenant)
        if isinstance(run, RunState) and not read:
            record: RunRecord = yield LoadRun(run.id, run.tenant)
            if record.version != run.version:
                raise StaleRun(run.id, run.version)
        if force:
            reason = "forced: the operator says its driver is gone"
            records = engine.abandon_in_flight(state, by=self.owner, reason=reason)
            if records:
                yield from self.record(state, records)
        if state.status == RunStatus.failed and state.can_retry:  # a run that failed transiently: try again
            yield from self.commit(state, engine.retry_after_failure())
        return state

    def _changed_meanwhile(self, state: RunState, error: StaleRun) -> Flowing[StaleRun]:
        """What a drive stopped by another process's write says: what the run is now, and what this drive lost."""
        status: str | None
        try:
            status = yield ShownStatus(state.id, state.tenant)
            now = f"it is now {status}"
        except TetherError:
            status, now = None, "it could not be read again"
        ended = status is not None and stored_status(status) in ENDED
        if isinstance(error, _Unsaved):
            if ended:
                what = f"{error.happened}, but its outcome was discarded: a run that has ended records nothing more"
            else:
                what = f"{error.happened}, but this process could not record its outcome; {error.on_resume}"
        else:
            what = "this process stopped and recorded nothing more" + ("" if ended else "; resume the run to go on")
        return StaleRun(
            state.id,
            error.expected_version,
            detail=f"run {state.id!r} was changed by another process while this one drove it ({now}): {what}",
        )

    def load(self, run: str | RunState, tenant: str | None) -> Flowing[RunState]:
        """The run (loaded by id, or as given), checked against this agent's tools."""
        state = run if isinstance(run, RunState) else (yield from self._rebuild(run, tenant))
        check_compatible(state.id, state.spec, self.root.tool_index)
        self.in_charge(state)  # a run handed to an agent out of reach is refused before any step
        for extension in self.extensions:
            extension.check(self.root, state)
        return state

    def fits(self, state: RunState) -> bool:
        """Whether this agent's tools are the run's."""
        try:
            check_compatible(state.id, state.spec, self.root.tool_index)
        except IncompatibleRun:
            return False
        return True

    def _rebuild(self, run_id: str, tenant: str | None) -> Flowing[RunState]:
        log: RunLog = yield LoadLog(run_id, tenant)
        return snapshots.rebuild(run_id, log)

    # One step -----------------------------------------------------------------------------
    def step(self, state: RunState, *, max_wait: float | None = None) -> Flowing[bool]:
        """Do exactly one unit of work; False when there is nothing left to do now.

        The unit is one model call, one tool attempt, one decided step, or one batch: the
        concurrent calls of the turn that can run now, run at once (see :meth:`_run_batch`).

        Holding the lease, this drive owns the run: a call in flight that another owner
        started was abandoned by its driver, and the engine treats it as in doubt. A retry
        due more than ``max_wait`` seconds from now is left for later (False).
        """
        flow = self.in_charge(state)
        if flow is not self:  # handed off: the other agent's prompt, tools, policy, model and limits
            return (yield from flow.step(state, max_wait=max_wait))
        yield CheckLease(state.id)
        started = self._started_here(state)
        if started is not None:
            yield Announce(state, started)
            yield from self._attempt(state, started)
            return True
        for extension in self.extensions:
            due = extension.step_due(self, state, max_wait)
            if due is not None:
                return (yield from due)
        action = engine.next_action(state, self.agent, now=self.clock(), can_ask=self.can_ask)
        if isinstance(action, engine.Stop):
            if state.status != AWAITING or not self.can_ask:
                return False
            asked = pending_of(state, self.agent)
            decisions: Mapping[str, Decision] = yield Ask(asked)
            return (yield from self._apply_decisions(state, decisions, asked))
        if isinstance(action, engine.WaitUntil) and max_wait is not None and action.due_at - self.clock() > max_wait:
            return False  # parked: a later drive runs the retry
        if not isinstance(action, engine.Commit):
            yield Announce(state, action)
        if isinstance(action, engine.WaitUntil):
            yield Sleep(max(0.0, action.due_at - self.clock()))
        elif isinstance(action, engine.Commit):
            yield from self.commit(state, action.step)
        elif isinstance(action, engine.CallModel):
            yield from self._call_model(state, action)
        elif (server := self._server_of(action.tool)) is not None:
            return (yield from server.serve(self, state, action, max_wait))
        elif self._runs_beside_others(state, action):
            yield from self._run_batch(state, action)
        elif not (yield from self._answered_from_cache(state, action)):
            yield from self._run_tool(state, action)
        return True

    def _server_of(self, tool: Tool) -> Extension | None:
        """The extension that serves calls of ``tool`` itself, if one does."""
        return next((extension for extension in self.extensions if extension.serves(tool)), None)

    def _call_model(self, state: RunState, action: engine.CallModel) -> Flowing[None]:
        started = self.clock()
        try:
            response: ModelResponse = yield action
        except ModelError as error:
            yield from self.commit(state, engine.on_model_failure(state, self.agent, error))
            return
        now = self.clock()
        if action.summary is not None:  # the history processors' summary, not the agent's turn
            step = engine.on_summary(state, self.agent, action.summary, response, latency=now - started)
        else:
            step = engine.on_model_response(state, self.agent, response, latency=now - started, now=now)
        on_resume = "resuming the run asks the model again (one more call)"
        yield from self._save(state, step, "the model answered", on_resume, start_next=True)

    def _answered_from_cache(self, state: RunState, action: engine.RunTool) -> Flowing[bool]:
        """Commit a stored result of the same tool and input, if one is live; the tool does not run."""
        if action.tool.cache_ttl is None:
            return False
        key = cache.key_for(action, tenant=state.tenant)
        value: str | None = yield LookUpCache(key, self.clock())
        if value is None:
            return False
        yield from self.commit(state, engine.on_cache_hit(action, value, key=key))
        return True

    def _run_tool(self, state: RunState, action: engine.RunTool) -> Flowing[None]:
        """Commit the attempt's start, run it, commit its outcome, and keep a fresh result in the cache."""
        yield from self.record(state, self.start_of(state, action))
        yield from self._attempt(state, action)

    def _attempt(self, state: RunState, action: engine.RunTool) -> Flowing[None]:
        """Run an attempt whose start is committed; commit its outcome (and the next call's start with it)."""
        began = self.timer()
        outcome: str | Exception
        try:
            outcome = yield Attempt(action, state.id)
        except Exception as error:  # noqa: BLE001 - any tool failure becomes data for the model
            outcome = error
        step = self.outcome_step(action, outcome, self.timer() - began)
        yield from self.finish(state, action, step, outcome, start_next=True)

    def _runs_beside_others(self, state: RunState, action: engine.RunTool) -> bool:
        """Whether ``action`` opens a batch: its tool runs concurrently and another concurrent call can start now."""
        return self.agent.runs_concurrently(action.tool) and self._next_beside(state, {action.call.call_id}) is not None

    def _next_beside(self, state: RunState, busy: Collection[str]) -> engine.RunTool | None:
        return engine.next_concurrent(state, self.agent, now=self.clock(), busy=busy, can_ask=self.can_ask)

    def _run_batch(self, state: RunState, first: engine.RunTool) -> Flowing[None]:
        """Run the turn's concurrent calls at once, at most ``agent.max_concurrent_tools`` at a time.

        Each call's start is committed before it is launched (a cached result answers it
        without one); each outcome is committed as it lands, so a slow call never holds back
        the others' results, and the next ready call is launched in its place. An outcome that
        moves the run on (a failure, an escalation) is held back: nothing more is launched, and
        it is committed once the calls under way have landed (see :func:`engine.settle`). The
        results go back to the model in one message, in the model's order, when the last
        call of the turn has its result.
        """
        running: dict[Any, tuple[engine.RunTool, float]] = {}  # by handle, in launch order
        held: dict[str, engine.Step] = {}  # by call id
        up_next: engine.RunTool | None = first
        while True:
            while up_next is not None and len(running) < self.agent.max_concurrent_tools:
                if not (yield from self._answered_from_cache(state, up_next)):
                    yield from self.record(state, self.start_of(state, up_next))
                    handle = yield Launch(Attempt(up_next, state.id))
                    running[handle] = (up_next, self.timer())
                up_next = self._next_beside(state, self._busy(running, held))
            if not running:
                break
            yield Announce(state, RunningTools(tuple(action for action, _ in running.values())))
            landed: list[tuple[Any, str | BaseException]] = yield Landed(tuple(running))
            ended = self.timer()
            for handle, outcome in landed:
                action, began = running.pop(handle)
                if not isinstance(outcome, str | Exception):
                    raise outcome  # not the tool's failure: a KeyboardInterrupt, a cancellation
                step = self.outcome_step(action, outcome, ended - began)
                if engine.held_back(step):
                    held[action.call.call_id] = step
                else:
                    yield from self.finish(state, action, step, outcome)
            up_next = None if held else self._next_beside(state, self._busy(running, held))
        for step in engine.settle([held[call.call_id] for call in state.batch if call.call_id in held]):
            yield from self._save(
                state,
                step,
                "concurrent tool calls ran, so whatever they do has happened",
                "resuming the run treats the calls without a recorded result as in doubt",
            )

    @staticmethod
    def _busy(running: Mapping[Any, tuple[engine.RunTool, float]], held: Mapping[str, engine.Step]) -> set[str]:
        """Calls of a batch launched whose outcome is not committed: none of them is started again."""
        return {action.call.call_id for action, _ in running.values()} | set(held)

    def start_of(self, state: RunState, action: engine.RunTool) -> list[Fact]:
        """What an attempt's start commits: its warnings, its start and, for a cached tool, the miss just seen."""
        records: list[Fact] = [*action.warnings, engine.tool_started(action, owner=self.owner)]
        if action.tool.cache_ttl is not None:  # the lookup just missed: say so in the same write
            records.insert(0, cache.miss_record(action, cache.key_for(action, tenant=state.tenant)))
        return records

    def outcome_step(self, action: engine.RunTool, outcome: str | Exception, duration: float) -> engine.Step:
        """The step an attempt's outcome (its result, or what it raised) makes, after ``duration`` seconds."""
        if isinstance(outcome, Exception):
            return engine.on_tool_error(action, outcome, now=self.clock(), duration=duration, rng=self.rng.random)
        return engine.on_tool_success(action, outcome, duration=duration)

    def finish(
        self,
        state: RunState,
        action: engine.RunTool,
        step: engine.Step,
        outcome: str | Exception,
        *,
        start_next: bool = False,
    ) -> Flowing[None]:
        """Commit an attempt's outcome (``start_next``: see :meth:`commit`); keep a fresh result in the cache."""
        yield from self._save(
            state,
            step,
            f"tool {action.tool.name!r} (call {action.call.call_id}) ran, so whatever it does has happened",
            "resuming the run treats the call as in doubt (run again only if the tool is idempotent, else asked about)",
            start_next=start_next,
        )
        if not isinstance(outcome, Exception) and action.tool.cache_ttl is not None:
            # Stored once the result is committed (a crash in between costs a miss, never a
            # wrong hit); errors are never stored. The full value, not the model's cut.
            key = cache.key_for(action, tenant=state.tenant)
            yield StoreCache(key, action.tool.name, outcome, self.clock() + action.tool.cache_ttl)

    # Decisions ----------------------------------------------------------------------------
    def _apply_decisions(
        self, state: RunState, decisions: Mapping[str, Decision], asked: Sequence[PendingApproval]
    ) -> Flowing[bool]:
        """Commit the approver's answers, each bound to the arguments it was shown.

        Another process may decide some of these calls (``tether approve``, a service) or
        cancel the run while the approver takes its time: the write is then refused
        (:class:`StaleRun`). The run is read again, the answers for calls still waiting with
        the same arguments are committed on it, and the approver is told of the others
        (:class:`DecidedElsewhere`): an answer nobody else gave is never lost to another's.
        """
        shown = {request.call_id: request.fingerprint for request in asked}
        remaining = {call_id: decision for call_id, decision in decisions.items() if call_id in shown}
        applied = False
        for _ in range(DECISION_TRIES):
            try:
                for request in self._waiting(state):
                    decision = remaining.get(request.call_id)
                    if decision is None:
                        continue
                    if request.call_id in state.decisions:  # decided here with a for-run sibling
                        del remaining[request.call_id]
                        continue
                    yield from self.decide(state, request.call_id, decision, shown[request.call_id], start_next=True)
                    del remaining[request.call_id]
                    applied = True
                return applied
            except RunBusy:
                raise
            except StaleRun:
                yield from self._reload(state)
            notes = tuple((call_id, why) for call_id in remaining if (why := overruled(state, call_id, shown[call_id])))
            if notes:
                yield DecidedElsewhere(state, notes)
            remaining = {call_id: decision for call_id, decision in remaining.items() if call_id not in dict(notes)}
            applied = True  # the run changed: the drive looks at it again
        raise StaleRun(state.id, state.version)

    def _waiting(self, state: RunState) -> list[PendingApproval]:
        """The calls of ``state`` a decision can be given for now (none once it stopped waiting: cancelled)."""
        return pending_of(state, self.agent) if state.status == AWAITING else []

    def _reload(self, state: RunState) -> Flowing[None]:
        """Make ``state`` the run as stored now (another process changed it), in place: its holder keeps it."""
        fresh = yield from self._rebuild(state.id, state.tenant)
        for kept in dataclasses.fields(RunState):
            setattr(state, kept.name, getattr(fresh, kept.name))

    def decide(
        self, state: RunState, call_id: str, decision: Decision, fingerprint: str | None, *, start_next: bool = False
    ) -> Flowing[None]:
        """Commit one decision, refused unless exactly that call waits (see :func:`engine.on_decision`).

        ``start_next``: decided inside a drive, which goes on (see :meth:`commit`).
        """
        step = engine.on_decision(state, self.agent, call_id, decision, expected_fingerprint=fingerprint)
        yield from self.commit(state, step, start_next=start_next)

    # Committing ---------------------------------------------------------------------------
    def commit(self, state: RunState, step: engine.Step, *, start_next: bool = False) -> Flowing[None]:
        """Apply ``step`` to ``state`` and persist what it produced.

        ``start_next`` (a drive's own steps, see :attr:`starts_ahead`): when the run's next step
        would be a plain attempt of one call, its start is committed in the same write (a round
        trip and a commit fewer) and the next step runs it (see :meth:`_starting_now`). A crash
        between the two leaves that call in doubt, as a crash while it runs would.
        """
        produced = engine.commit(state, step, now=self.clock())
        starting = self._starting_now(state) if start_next and self.starts_ahead else None
        if starting is not None:
            produced += self._facts(state, self.start_of(state, starting))
        yield from self._persist(state, produced)
        state.started_here = starting

    def _starting_now(self, state: RunState) -> engine.RunTool | None:
        """The attempt :meth:`step` would start next, if it is one call run alone and nothing comes first.

        Not a call an extension serves (its step differs), not a call that runs beside others, not a
        cached tool (the cache is looked up first), not under another agent or after an extension's step due.
        """
        if state.status != RunStatus.executing_tool or self.in_charge(state) is not self or self._step_due(state):
            return None
        action = engine.next_action(state, self.agent, now=self.clock(), can_ask=self.can_ask)
        if not isinstance(action, engine.RunTool) or action.tool.cache_ttl is not None:
            return None
        served = self._server_of(action.tool) is not None
        return None if served or self._runs_beside_others(state, action) else action

    def _step_due(self, state: RunState) -> bool:
        """Whether an extension has a step of its own due before the engine decides (not taken here)."""
        return any(extension.step_due(self, state, None) is not None for extension in self.extensions)

    def _started_here(self, state: RunState) -> engine.RunTool | None:
        """The attempt this drive committed the start of with its last write and has yet to run (taken once)."""
        started, state.started_here = state.started_here, None
        if not isinstance(started, engine.RunTool):
            return None
        flight = state.in_flight.get(started.call.call_id)
        if flight is None or flight.owner != self.owner or flight.abandoned:
            return None  # written over meanwhile: the engine decides again
        return started

    def _save(
        self, state: RunState, step: engine.Step, happened: str, on_resume: str, *, start_next: bool = False
    ) -> Flowing[None]:
        """Commit a step whose outcome cannot be had again for free; if even the retries fail, say so."""
        try:
            yield from self.commit(state, step, start_next=start_next)
        except RunBusy:
            raise
        except StaleRun as error:  # another process changed the run (a cancel): say what this write held
            raise _Unsaved(error, happened, on_resume) from error
        except StoreError as error:  # never leave the user with "nothing was changed"
            raise StoreError(
                f"run {state.id}: {happened}, but its result could not be saved: {error}; {on_resume}",
                transient=error.transient,
            ) from error

    def record(self, state: RunState, records: Sequence[Fact]) -> Flowing[None]:
        """Commit facts that need no transition (a tool's start, an operator's override)."""
        produced = self._facts(state, records)
        state.version += 1
        yield from self._persist(state, produced)

    def _facts(self, state: RunState, records: Sequence[Fact]) -> list[Event]:
        """Fold ``records`` into ``state`` as events (to persist in the write being built)."""
        now = self.clock()
        produced = []
        for fact in records:
            event = Event(state.next_seq, now, fact)
            state.apply(event)
            produced.append(event)
        return produced

    def _persist(self, state: RunState, produced: list[Event]) -> Flowing[None]:
        yield CheckLease(state.id)  # a drive that lost the run writes nothing more
        yield from self._append(state, produced)
        yield Notify(state, produced)

    def _append(self, state: RunState, events: list[Event]) -> Flowing[None]:
        """Persist, tried again while its failure is transient (see :data:`STORE_RETRY_WAITS`).

        A connection that dropped at the commit leaves the write's outcome unknown: a retry that
        then finds the run advanced checks whether it was this very write that landed.
        """
        failed = False
        for wait in (*STORE_RETRY_WAITS, None):
            try:
                yield Persist(state, events)
                return
            except StaleRun:
                if failed and (yield from self._landed(state, events)):
                    return
                raise
            except StoreError as error:
                if not error.transient or wait is None:
                    raise
                failed = True
                STORE_LOG.warning("run %s: saving a step failed (%s); trying again in %g s", state.id, error, wait)
                yield Sleep(wait)

    def _landed(self, state: RunState, events: list[Event]) -> Flowing[bool]:
        """Whether the store holds exactly this write: the row at its version, each event (seq, type, time)."""
        try:
            log: RunLog = yield LoadLog(state.id, state.tenant, whole=True)
        except StoreError:
            return False
        stored = {event.seq: (event.type, event.at) for event in log.events}
        return log.version == state.version and all(stored.get(e.seq) == (e.type, e.at) for e in events)
