"""Resuming from snapshots: a run loaded from its latest snapshot and the events after it is the run folded whole.

That every kind of run in the suite folds alike from a snapshot after any of its events is
checked after each test (conftest.snapshots_fold_alike); the stores' side is in
test_store_contract.py. Here: the drivers keep and use snapshots on every store, and a
snapshot from other code is ignored.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import tether
from support import model_reply, opened_store, settled, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, Runner
from tether.core import engine, machine, snapshots
from tether.core.state import RunState
from tether.facts.events import Event, Warned
from tether.stores import Snapshot, sql
from tether.stores.memory import MemoryStore
from tether.stores.sql import AsyncSQLStore, SQLStore
from tether.testing import ScriptedModel

CALLS = 7


def echo(i: int) -> str:
    """Says the number back."""
    return f"echo {i}"


def gate() -> str:
    """Needs a person's approval."""
    return "gated"


def agent() -> Agent:
    """CALLS tool calls one by one, then a gated call (the run parks), then an answer."""

    def answer(request: Any) -> dict[str, Any]:
        n = request.invocation
        if n < CALLS:
            return tool_use_turn(tool_use(f"call_{n}", "echo", {"i": n}))
        if n == CALLS:
            return tool_use_turn(tool_use("call_gate", "gate", {}))
        return model_reply([{"type": "text", "text": "done"}], "end_turn")

    return Agent(model=ScriptedModel(answer), tools=[tether.tool(echo), tether.tool(approval=True)(gate)])


@pytest.fixture(
    params=["memory", "sqlite", "sqlite-async", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A store kind and its URL."""
    kind = request.param
    if kind == "memory":
        yield kind, "memory://"
    elif kind == "postgres":
        yield kind, request.getfixturevalue("pg_schema").url
    else:
        yield kind, f"sqlite:///{tmp_path / 'tether.db'}"


def open_store(kind: str, url: str, every: int) -> Any:
    if kind == "memory":
        return MemoryStore(snapshot_every=every)
    if kind == "sqlite-async":
        return AsyncSQLStore(url, snapshot_every=every)
    return SQLStore(url, snapshot_every=every)


def runner_for(store: Any) -> Runner | AsyncRunner:
    return AsyncRunner(agent(), store) if isinstance(store, AsyncSQLStore) else Runner(agent(), store)


@pytest.mark.parametrize("every", [1, 4])
async def test_a_parked_run_resumes_from_its_snapshot_as_it_would_from_its_whole_log(
    backend: tuple[str, str], every: int
) -> None:
    kind, url = backend
    store = open_store(kind, url, every)
    try:
        runner = runner_for(store)
        parked = await settled(runner.run("go"))
        assert parked.status == "awaiting_approval"
        log = await settled(store.load_log(parked.run_id, snapshot_format=snapshots.snapshot_format()))
        whole = await settled(store.load_log(parked.run_id))
        assert log.snapshot is not None
        assert len(log.events) < len(whole.events)
        assert log.snapshot.seq == whole.events[-1].seq - len(log.events)
        folded = RunState.rebuild(parked.run_id, whole.events, version=whole.version, tenant=whole.tenant)
        assert await settled(runner.load(parked.run_id)) == folded
        # decided and driven on from the snapshot, the run ends as it would have
        await settled(runner.decide(parked.run_id, "call_gate", Approve(actor="ann")))
        done = await settled(runner.drive(parked.run_id))
        assert (done.status, done.output, done.tool_calls) == ("done", "done", CALLS + 1)
        whole = await settled(store.load_log(parked.run_id))
        folded = RunState.rebuild(parked.run_id, whole.events, version=whole.version, tenant=whole.tenant)
        assert await settled(runner.load(parked.run_id)) == folded
    finally:
        await settled(store.close())


def test_a_snapshot_from_other_code_is_ignored_and_the_whole_log_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore(snapshot_every=2)
    runner = Runner(agent(), store)
    run_id = runner.run("go").run_id
    written_by = snapshots.snapshot_format()
    assert store.load_log(run_id, snapshot_format=written_by).snapshot is not None
    whole = store.load_log(run_id)
    folded = RunState.rebuild(run_id, whole.events, version=whole.version, tenant=whole.tenant)
    # an upgrade that folds differently: its fingerprint differs, so the old snapshot is never read
    monkeypatch.setattr(snapshots, "snapshot_format", lambda: "a newer tether's fold")
    assert store.load_log(run_id, snapshot_format="a newer tether's fold").snapshot is None
    assert runner.load(run_id) == folded
    runner.decide(run_id, "call_gate", Approve(actor="ann"))
    assert runner.drive(run_id).status == "done"  # its commits keep snapshots in the new format
    assert store.load_log(run_id, snapshot_format="a newer tether's fold").snapshot is not None


def test_the_fingerprint_follows_the_machine_version(monkeypatch: pytest.MonkeyPatch) -> None:
    current = snapshots.snapshot_format.__wrapped__()
    assert current == snapshots.snapshot_format()
    monkeypatch.setattr(machine, "MACHINE_VERSION", machine.MACHINE_VERSION + 1)
    assert snapshots.snapshot_format.__wrapped__() != current


def test_no_snapshot_is_kept_when_turned_off() -> None:
    store = MemoryStore(snapshot_every=0)
    run_id = Runner(agent(), store).run("go").run_id
    assert store.load_log(run_id, snapshot_format=snapshots.snapshot_format()).snapshot is None


@pytest.mark.parametrize(
    ("seqs", "every", "due"),
    [
        ([0, 1], 3, False),
        ([1, 2], 3, True),  # after event 2, three events are folded
        ([3, 4], 3, False),
        ([4, 5, 6, 7, 8, 9], 3, True),
        ([5], 1, True),
        ([5], 0, False),
        ([], 3, False),
    ],
)
def test_a_snapshot_is_due_when_a_write_crosses_a_multiple(seqs: list[int], every: int, due: bool) -> None:
    events = [Event(seq, 1.0, Warned("n")) for seq in seqs]
    assert snapshots.due(events, every) is due


def test_snapshots_thin_out_as_a_long_log_grows_keeping_the_tail_under_an_eighth() -> None:
    every, taken, last = 10, [], -1
    for seq in range(5000):
        if snapshots.due([Event(seq, 1.0, Warned("n"))], every):
            taken.append(seq)
            assert seq - last <= max(every, (seq + 1) // snapshots.TAIL_FRACTION)  # the tail a resume folds
            last = seq
    assert taken[:3] == [9, 19, 29]
    assert len(taken) < 80  # ~8 per doubling of the log past 80 events, not 500
    assert [snapshots.spacing(count, every) for count in (1, 79, 80, 159, 160, 320, 5000)] == [
        10,
        10,
        10,
        10,
        20,
        40,
        320,
    ]


def test_a_snapshot_keeps_no_identity_nor_version() -> None:
    state = RunState(id="run_1", tenant="acme", version=9, next_seq=4)
    taken = snapshots.take(state)
    assert taken == Snapshot(3, snapshots.snapshot_format(), taken.state)
    assert not {"id", "tenant", "version", "bound_machine", "pairing_checked"} & set(taken.state)


def test_sqlite_stores_share_their_snapshots(tmp_path: Path) -> None:
    """A snapshot written by the sync store is read by the async one (same table, same JSON)."""
    url = f"sqlite:///{tmp_path / 'tether.db'}"
    sync = SQLStore(url, snapshot_every=4)
    try:
        run_id = Runner(agent(), sync).run("go").run_id
        whole = sync.load_log(run_id)
    finally:
        sync.close()
    with opened_store("async", url) as blocking:
        log = blocking.load_log(run_id, snapshot_format=snapshots.snapshot_format())
    assert log.snapshot is not None
    resumed = snapshots.rebuild(run_id, log)
    assert resumed == RunState.rebuild(run_id, whole.events, version=whole.version, tenant=whole.tenant)


def test_a_resume_from_a_snapshot_checks_only_the_history_the_live_run_had_not() -> None:
    store = MemoryStore(snapshot_every=2)
    runner = Runner(agent(), store)
    run_id = runner.run("go").run_id
    log = store.load_log(run_id, snapshot_format=snapshots.snapshot_format())
    assert log.snapshot is not None
    checked = log.snapshot.state["pairing_checked_messages"]
    assert 0 < checked <= len(snapshots.rebuild(run_id, log).messages)
    assert engine.checked_prefix(snapshots.rebuild(run_id, log)) == checked
    for wrong in (0, 10_000, "3", None):  # nothing the live run could have checked: the whole history is
        bogus = Snapshot(
            log.snapshot.seq, log.snapshot.format, {**log.snapshot.state, "pairing_checked_messages": wrong}
        )
        assert engine.checked_prefix(snapshots.rebuild(run_id, replace(log, snapshot=bogus))) == 0


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_long_snapshot_is_stored_compressed_and_read_back_whole(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Past PACK_ABOVE bytes a snapshot is kept zlib-compressed; one that cannot be unpacked is ignored."""
    path = tmp_path / "tether.db"
    url = request.getfixturevalue("pg_schema").url if kind == "postgres" else f"sqlite:///{path}"
    store = SQLStore(url, snapshot_every=0)
    try:
        run_id = Runner(agent(), store).run("go").run_id
        whole = store.load_log(run_id)
        run = RunState.rebuild(run_id, whole.events, version=whole.version, tenant=whole.tenant)
        run.messages.append({"role": "user", "content": "padding " * 2_000})  # well past PACK_ABOVE
        kept = snapshots.take(run)
        store.save_snapshot(run_id, kept)
        log = store.load_log(run_id, snapshot_format=snapshots.snapshot_format())
        assert log.snapshot is not None
        assert log.snapshot.state == kept.state
        if kind == "postgres":
            return
        with contextlib.closing(sqlite3.connect(path)) as raw, raw:
            [(stored,)] = raw.execute("SELECT state FROM tether_snapshot").fetchall()
            assert list(json.loads(stored)) == [sql._PACKED_KEY]
            assert len(stored) < len(json.dumps(kept.state)) / 10
            raw.execute("UPDATE tether_snapshot SET state = ?", (json.dumps({sql._PACKED_KEY: "not zlib"}),))
        log = store.load_log(run_id, snapshot_format=snapshots.snapshot_format())
        assert log.snapshot is None  # damaged: ignored, the whole log read instead
        assert len(log.events) == len(whole.events)
    finally:
        store.close()
