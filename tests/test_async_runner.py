"""AsyncRunner awaits everything: its store, its lease, its approver; and its whole API is awaited.

``create``, ``load``, ``decide``, ``cancel``, ``run``, ``drive`` and ``step`` are coroutines and
``hold`` an async context manager; they perform the same flows as :class:`tether.Runner`. An
async approver is awaited; a sync one runs in a worker thread (it may block, as a terminal
prompt does). A drive's lease heartbeat is a task, not a thread. Runner refuses what only an
event loop can drive.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from support import tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Deny, Runner, tool
from tether.core.approvals import ApprovalRequest, DecideLater, Decision
from tether.errors import ConfigError, RunEnded
from tether.stores import open_async_store
from tether.stores.awaitable import AwaitableStore, as_async_store
from tether.stores.memory import MemoryStore
from tether.stores.sql import AsyncSQLStore, SQLStore
from tether.testing import ScriptedModel

SCRIPT = [
    tool_use_turn(tool_use("toolu_1", "publish", {"text": "hello"})),
    {"content": [{"type": "text", "text": "Published."}], "stop_reason": "end_turn"},
]


def gated_agent() -> Agent:
    @tool(approval=True)
    async def publish(text: str) -> str:
        """Publish a text (gated)."""
        return f"published {text}"

    return Agent(model=ScriptedModel(SCRIPT), tools=[publish])


# The approver --------------------------------------------------------------------------------
class AsyncApproverSeen:
    """Decides after awaiting, as a web form or a chat message would."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        await asyncio.sleep(0)
        self.asked += [r.call_id for r in requests]
        return {r.call_id: Approve(actor="web") for r in requests}


class PromptInAThread:
    """A sync approver that blocks until answered (a terminal prompt); records the thread it ran on."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.thread: int | None = None

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        self.thread = threading.get_ident()
        assert self.answer.wait(10)
        return {r.call_id: Deny("not today", actor="terminal") for r in requests}


async def test_an_async_approver_is_awaited() -> None:
    approver = AsyncApproverSeen()
    result = await AsyncRunner(gated_agent(), approver=approver).run("Publish hello.")
    assert result.status == "done"
    assert approver.asked == ["toolu_1"]


async def test_a_sync_approver_runs_in_a_thread_while_the_loop_goes_on() -> None:
    approver = PromptInAThread()
    runner = AsyncRunner(gated_agent(), approver=approver)
    driving = asyncio.create_task(runner.run("Publish hello."))
    ticks = 0
    while approver.thread is None or ticks < 5:  # the loop keeps turning while the prompt waits
        await asyncio.sleep(0.01)
        ticks += 1
    assert approver.thread != threading.get_ident()
    approver.answer.set()
    result = await driving
    assert result.status == "done"
    assert runner.approval_requests(await runner.load(result.run_id)) == []


def test_runner_refuses_an_async_approver_and_an_async_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="AsyncRunner"):
        Runner(gated_agent(), approver=AsyncApproverSeen())
    store = AsyncSQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    with pytest.raises(ConfigError, match="AsyncSQLStore is an async store: drive its runs with AsyncRunner"):
        Runner(gated_agent(), store)


# The store and the lease ----------------------------------------------------------------------
def test_any_store_is_awaitable_and_memory_stays_on_the_loop(tmp_path: Path) -> None:
    memory = MemoryStore()
    wrapped: object = as_async_store(memory)  # an AsyncStore, compared by identity with the store it wraps
    assert wrapped is not memory
    assert isinstance(as_async_store(memory), AwaitableStore)
    native = AsyncSQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    assert as_async_store(native) is native
    assert isinstance(open_async_store("memory://"), AwaitableStore)
    assert isinstance(open_async_store(f"sqlite:///{tmp_path / 'other.db'}"), AsyncSQLStore)


@pytest.mark.parametrize("scheme", ["sqlite", "sqlite+aiosqlite"])
async def test_async_sqlite_runs_each_operation_whole_on_one_thread_of_its_own(scheme: str, tmp_path: Path) -> None:
    """Not on the loop, and one hop per operation: every statement of every run on the store's one thread."""
    import sqlalchemy as sa  # noqa: TID251 - listening to the store's statements

    store = AsyncSQLStore(f"{scheme}:///{tmp_path / 'runs.db'}")  # a URL naming the former driver still opens
    threads: set[str] = set()
    sa.event.listen(store.engine, "before_cursor_execute", lambda *_: threads.add(threading.current_thread().name))
    runner = AsyncRunner(gated_agent(), store, approver=DecideLater())
    try:
        parked = await asyncio.gather(*(runner.run(f"Publish {n}.") for n in range(4)))
        assert {result.status for result in parked} == {"awaiting_approval"}
        assert len(threads) == 1
        assert threads.pop().startswith("tether-sqlite")
        await store.close()  # the store reconnects if used again, on a thread of its own again
        assert (await runner.load(parked[0].run_id)).status == "awaiting_approval"
        assert len(threads) == 1
        assert threading.current_thread().name not in threads
        assert store._held is not None  # the thread keeps its connection between operations
        store._held.invalidate()  # as an error that loses it would: the next operation reconnects
        assert (await runner.cancel(parked[1].run_id)).status == "cancelled"
        assert (await runner.load(parked[1].run_id)).status == "cancelled"
    finally:
        await store.close()


async def test_a_drive_s_lease_is_renewed_by_a_task_not_a_thread() -> None:
    @tool
    async def slow(seconds: float) -> str:
        """Wait a little (longer than a third of the lease's time to live)."""
        await asyncio.sleep(seconds)
        return "waited"

    store = MemoryStore()
    script = [tool_use_turn(tool_use("t1", "slow", {"seconds": 0.4})), SCRIPT[1]]
    runner = AsyncRunner(Agent(model=ScriptedModel(script), tools=[slow]), store, lease_ttl=0.3)
    threads_before = {t.name for t in threading.enumerate()}
    driving = asyncio.create_task(runner.run("Wait."))
    while not runner._held:
        await asyncio.sleep(0.005)
    (lease,) = runner._held.values()
    first_expiry = lease.expires_at
    while lease.expires_at == first_expiry:  # renewed while the tool waits
        await asyncio.sleep(0.02)
    assert not {t.name for t in threading.enumerate()} - threads_before  # no heartbeat thread
    assert (await driving).status == "done"
    assert store.claim_run((await driving).run_id, "next:1:x", now=time.time(), ttl=1).owner == "next:1:x"


# The whole API, awaited, on the native async store ------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_create_load_decide_drive_and_cancel_are_awaited(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite" else request.getfixturevalue("pg_schema").url
    store = AsyncSQLStore(url)
    try:
        runner = AsyncRunner(gated_agent(), store, approver=DecideLater())
        state = await runner.create("Publish hello.", tenant="acme")
        parked = await runner.drive(state.id, tenant="acme")
        assert parked.status == "awaiting_approval"
        [pending] = runner.approval_requests(await runner.load(state.id, tenant="acme"))
        decided = await runner.decide(state.id, "toolu_1", Approve(), fingerprint=pending.fingerprint, tenant="acme")
        assert decided.status == "executing_tool"
        assert (await runner.drive(state.id, tenant="acme")).status == "done"

        second = await runner.create("Publish it again.", continue_from=state.id, tenant="acme")
        assert len((await runner.load(second.id)).messages) == 5  # the whole first run, then the new prompt
        cancelled = await runner.cancel(second.id, "changed my mind", tenant="acme")
        assert cancelled.status == "cancelled"
        with pytest.raises(RunEnded):
            await runner.cancel(second.id)

        async with runner.hold(state.id) as lease:  # step() needs the lease, as with Runner
            assert lease.owner in {held.owner for held in runner._held.values()}
            assert await runner.step(await runner.load(state.id)) is False  # done: nothing left
        reader = SQLStore(url)  # the same rows, read by the sync store
        assert [r.id for r in reader.list_runs(tenant="acme")] == [second.id, state.id]
        reader.close()
    finally:
        await store.close()
