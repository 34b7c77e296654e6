"""Pending approvals across runs: listed per tenant and per run from the rows alone, decided
from any process (another store on the same database), and ``tether pending`` on the CLI.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import model_reply, run_tether, tool_use
from tether import Agent, Approve, Deny, Runner, tool
from tether.core.approvals import fingerprint
from tether.errors import ApprovalError, RunNotFound
from tether.facts.events import Event
from tether.models.scripted import ScriptedModel
from tether.stores import Store
from tether.stores.awaitable import as_async_store
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore
from tether.views.pending import PendingApproval, apending_approvals, pending_approvals


@tool(approval=True)
def refund(invoice: str, amount: float) -> str:
    """Refund an invoice."""
    return f"refunded {amount} on {invoice}"


@tool
def lookup(invoice: str) -> str:
    """Look an invoice up."""
    return f"{invoice}: 120.0"


TWO_REFUNDS = [
    model_reply(
        [
            tool_use("c1", "refund", {"invoice": "INV-1", "amount": 10.0}),
            tool_use("c2", "refund", {"invoice": "INV-2", "amount": 20.0}),
        ],
        "tool_use",
    ),
    model_reply([{"type": "text", "text": "Both handled."}], "end_turn"),
]
ONE_REFUND = [
    model_reply([tool_use("c9", "refund", {"invoice": "INV-9", "amount": 90.0})], "tool_use"),
    model_reply([{"type": "text", "text": "Handled."}], "end_turn"),
]
NO_GATE = [
    model_reply([tool_use("l1", "lookup", {"invoice": "INV-3"})], "tool_use"),
    model_reply([{"type": "text", "text": "It is 120."}], "end_turn"),
]


class Clock:
    """Each reading one second later, so runs park in a known order."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def runner(store: Store, script: list[dict[str, Any]], clock: Clock) -> Runner:
    return Runner(Agent(model=ScriptedModel(script), tools=[refund, lookup]), store, clock=clock)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    yield made
    made.close()


@pytest.fixture
def runs(store: Store) -> dict[str, str]:
    """acme parks with two refunds, then globex with one; a third run needs nobody."""
    clock = Clock()
    return {
        "acme": runner(store, TWO_REFUNDS, clock).run("Refund both.", tenant="acme").run_id,
        "globex": runner(store, ONE_REFUND, clock).run("Refund it.", tenant="globex").run_id,
        "done": runner(store, NO_GATE, clock).run("How much?", tenant="acme").run_id,
    }


def keys(pending: list[PendingApproval]) -> list[tuple[str, str]]:
    return [(p.run_id, p.call_id) for p in pending]


def test_lists_every_parked_call_oldest_run_first(store: Store, runs: dict[str, str]) -> None:
    pending = pending_approvals(store)
    assert keys(pending) == [(runs["acme"], "c1"), (runs["acme"], "c2"), (runs["globex"], "c9")]
    first = pending[0]
    assert (first.tool, first.input, first.tenant) == ("refund", {"invoice": "INV-1", "amount": 10.0}, "acme")
    assert first.fingerprint == fingerprint(first.input)
    assert first.reason
    later = pending[2].waiting_since
    assert first.waiting_since is not None
    assert later is not None
    assert first.waiting_since < later
    assert first.to_dict() == {
        "run_id": runs["acme"],
        "call_id": "c1",
        "tool": "refund",
        "input": {"invoice": "INV-1", "amount": 10.0},
        "reason": first.reason,
        "fingerprint": first.fingerprint,
        "tenant": "acme",
        "waiting_since": first.waiting_since,
    }


def test_scoped_to_a_tenant(store: Store, runs: dict[str, str]) -> None:
    assert keys(pending_approvals(store, tenant="acme")) == [(runs["acme"], "c1"), (runs["acme"], "c2")]
    assert keys(pending_approvals(store, tenant="globex")) == [(runs["globex"], "c9")]
    assert pending_approvals(store, tenant="initech") == []


def test_scoped_to_a_run(store: Store, runs: dict[str, str]) -> None:
    assert keys(pending_approvals(store, run_id=runs["globex"])) == [(runs["globex"], "c9")]
    assert keys(pending_approvals(store, run_id=runs["acme"], tenant="acme")) == [
        (runs["acme"], "c1"),
        (runs["acme"], "c2"),
    ]
    assert pending_approvals(store, run_id=runs["done"]) == []
    with pytest.raises(RunNotFound):
        pending_approvals(store, run_id=runs["acme"], tenant="globex")  # another tenant's run is invisible
    with pytest.raises(RunNotFound):
        pending_approvals(store, run_id="run_missing")


def test_limit_caps_the_runs_read_those_waiting_longest(store: Store, runs: dict[str, str]) -> None:
    assert keys(pending_approvals(store, limit=1)) == [(runs["acme"], "c1"), (runs["acme"], "c2")]
    assert len(pending_approvals(store)) == 3  # no limit: every parked run is read


async def test_from_an_async_store_alike(store: Store, runs: dict[str, str]) -> None:
    awaitable = as_async_store(store)
    assert keys(await apending_approvals(awaitable)) == keys(pending_approvals(store))
    assert keys(await apending_approvals(awaitable, limit=1)) == [(runs["acme"], "c1"), (runs["acme"], "c2")]
    assert keys(await apending_approvals(awaitable, tenant="globex")) == [(runs["globex"], "c9")]


def test_cli_listings_are_cut_only_when_asked_and_say_so(tmp_path: Path) -> None:
    """``runs`` and ``pending`` show 100 unless --limit or --all; a cut listing says on stderr how much
    there is and how to see it, and the pending footer counts every call waiting."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store, clock = SQLStore(url), Clock()
    made = [runner(store, ONE_REFUND, clock).run(f"Refund number {n}.").run_id for n in range(5)]
    store.close()

    def tether(*args: str) -> Any:
        return run_tether(tmp_path, *args, "--db", url)

    cut = tether("runs", "--limit", "2", "--json")
    assert [row["run_id"] for row in cut.data["runs"]] == made[:2:-1][:2]  # the newest first
    assert cut.data["total"] == 5
    assert [row["prompt"] for row in cut.data["runs"]] == ["Refund number 4.", "Refund number 3."]
    assert "showing the newest 2 of 5 runs; --limit N or --all for more" in cut.stderr
    parked = tether("runs", "--status", "awaiting_approval", "--limit", "4")
    assert "showing the newest 4 of 5 runs" in parked.stderr
    assert "Refund number 4." in parked.stdout
    for whole in (tether("runs", "--all", "--json"), tether("runs", "--json")):
        assert len(whole.data["runs"]) == whole.data["total"] == 5
        assert whole.stderr == ""

    calls = tether("pending", "--limit", "2", "--json")
    assert [call["run_id"] for call in calls.data["pending"]] == made[:2]  # the longest waiting first
    assert calls.data["total"] == 5
    assert "showing the longest waiting 2 of 5 calls; --limit N or --all for more" in calls.stderr
    shown = tether("pending", "--limit", "2")
    assert "5 call(s) waiting (2 shown). Decide with" in " ".join(shown.stdout.split())
    every = tether("pending", "--all", "--json")
    assert len(every.data["pending"]) == every.data["total"] == 5
    assert every.stderr == ""

    for bad in (["runs", "--limit", "0"], ["pending", "--limit", "2", "--all"]):
        refused = tether(*bad)
        assert refused.returncode == 2, refused


class NoReplayStore(MemoryStore):
    """A memory store whose event log cannot be read: listing must not need it."""

    def load_events(
        self, run_id: str, *, tenant: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[Event]:
        raise AssertionError("pending_approvals replayed an event log")


def test_a_call_waits_since_it_was_asked_whatever_was_decided_beside_it(store: Store, runs: dict[str, str]) -> None:
    [c1, c2, _] = pending_approvals(store)
    later = Clock()
    later.now += 3600.0  # an hour on: a decision moves the row's updated_at, not when c2 was asked
    decided_after = later.now
    runner(store, TWO_REFUNDS, later).decide(runs["acme"], c1.call_id, Approve(actor="alice"))
    assert keys(pending_approvals(store)) == [(runs["acme"], "c2"), (runs["globex"], "c9")]  # acme still first
    [still] = pending_approvals(store, run_id=runs["acme"])
    assert (still.call_id, still.waiting_since) == ("c2", c2.waiting_since)
    assert store.load_run(runs["acme"]).updated_at > decided_after


def test_listing_reads_rows_only() -> None:
    store = NoReplayStore()
    agent = Agent(model=ScriptedModel(ONE_REFUND), tools=[refund, lookup])
    Runner(agent, store).drive(Runner(agent, store).create("Refund it."))
    assert [p.call_id for p in pending_approvals(store)] == ["c9"]


def test_decisions_from_another_process_shrink_the_list_and_the_run_resumes_on_the_next_drive(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    service, approver_side = SQLStore(url), SQLStore(url)  # two connections: as two processes
    try:
        run_id = runner(service, TWO_REFUNDS, Clock()).run("Refund both.", tenant="acme").run_id
        deciding = runner(approver_side, TWO_REFUNDS, Clock())

        [c1, c2] = pending_approvals(approver_side, tenant="acme")
        deciding.decide(run_id, c1.call_id, Approve(actor="alice"), fingerprint=c1.fingerprint, tenant="acme")
        assert [p.call_id for p in pending_approvals(service)] == ["c2"]  # the batch stays parked
        with pytest.raises(ApprovalError):
            deciding.decide(run_id, c1.call_id, Deny("changed my mind"), tenant="acme")
        deciding.decide(run_id, c2.call_id, Deny("not this one", actor="bob"), fingerprint=c2.fingerprint)
        assert pending_approvals(service) == []
        assert service.load_run(run_id).status == "executing_tool"  # decided, not driven yet

        result = runner(service, TWO_REFUNDS, Clock()).drive(run_id)
        assert (result.status, result.output, result.tool_calls) == ("done", "Both handled.", 1)  # c2 was denied
    finally:
        service.close()
        approver_side.close()


# The CLI -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_pending_lists_then_empties_after_a_decision(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    parked = run_tether(tmp_path, "demo", "--workspace", str(tmp_path / "ws"), "--db", db, "--json")
    assert parked.returncode == 3, parked.stderr
    run_id = json.loads(parked.stdout)["run_id"]

    listed = run_tether(tmp_path, "pending", "--json", "--db", db)
    assert listed.returncode == 0, listed.stderr
    payload = json.loads(listed.stdout)  # exactly one object
    assert list(payload) == ["pending", "total"]
    [call] = payload["pending"]
    assert (call["run_id"], call["call_id"], call["tool"], call["input"]) == (
        run_id,
        "toolu_demo_run",
        "run_python",
        {"path": "fib.py"},
    )
    assert call["fingerprint"] == fingerprint({"path": "fib.py"})
    assert call["reason"]

    human = run_tether(tmp_path, "pending", "--db", db)
    assert human.returncode == 0, human.stderr
    for text in (run_id, "toolu_demo_run", "run_python", "fib.py", call["fingerprint"], "tether approve"):
        assert text in human.stdout
    assert "\x1b[" not in human.stdout

    approved = run_tether(tmp_path, "approve", run_id, "toolu_demo_run", "--db", db)
    assert approved.returncode == 0, approved.stderr
    assert json.loads(run_tether(tmp_path, "pending", "--json", "--db", db).stdout) == {"pending": [], "total": 0}
    empty = run_tether(tmp_path, "pending", "--db", db)
    assert "No tool calls are waiting for approval." in empty.stdout


@pytest.mark.parametrize("user", [None, "alice"], ids=["no USER", "USER"])
def test_a_cli_decision_names_who_made_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str | None) -> None:
    for name in ("USER", "LOGNAME", "LNAME", "USERNAME"):  # as in a container or a cron job
        monkeypatch.delenv(name, raising=False)
    if user is not None:
        monkeypatch.setenv("USER", user)
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    parked = run_tether(tmp_path, "demo", "--workspace", str(tmp_path / "ws"), "--db", db, "--json")
    run_id = json.loads(parked.stdout)["run_id"]

    assert run_tether(tmp_path, "deny", run_id, "toolu_demo_run", "--db", db).returncode == 0
    entries = json.loads(run_tether(tmp_path, "audit", "--json", "--db", db).stdout)["entries"]
    [entry] = [entry for entry in entries if entry["call_id"] == "toolu_demo_run"]
    assert entry["decision"]["by"] == (user or pwd.getpwuid(os.getuid()).pw_name)  # not "cli"


def test_the_pending_footer_names_the_command_this_tether_was_started_by() -> None:
    import io

    from rich.console import Console  # noqa: TID251 - the footer is read off a rich console writing to a buffer

    from tether.surfaces.terminal import render_pending

    call = PendingApproval(
        run_id="run_1", call_id="toolu_1", tool="refund", input={"amount": 5}, reason="gated", fingerprint="f"
    )
    out = io.StringIO()
    render_pending(Console(file=out, width=200, color_system=None), [call], command=".venv/bin/tether")
    footer = out.getvalue().strip().splitlines()[-5:]
    assert footer == [  # a command a line, never wrapped inside a sentence
        "1 call(s) waiting. Decide with:",
        "  .venv/bin/tether approve RUN CALL",
        "  .venv/bin/tether deny RUN CALL",
        "then go on with:",
        "  .venv/bin/tether resume RUN",
    ]


def test_the_pending_footer_says_a_queued_run_goes_on_by_itself() -> None:
    import io

    from rich.console import Console  # noqa: TID251 - the footer is read off a rich console writing to a buffer

    from tether.surfaces.terminal import render_pending

    queued = PendingApproval(
        run_id="run_q", call_id="toolu_1", tool="refund", input={}, reason="gated", fingerprint="f"
    )
    child = PendingApproval(
        run_id="run_c",
        call_id="toolu_2",
        tool="refund",
        input={},
        reason="gated",
        fingerprint="f",
        chain=("run_q", "run_c"),
    )
    local = PendingApproval(run_id="run_l", call_id="toolu_3", tool="refund", input={}, reason="gated", fingerprint="f")

    def shown(calls: list[PendingApproval]) -> list[str]:
        out = io.StringIO()
        render_pending(Console(file=out, width=200, color_system=None), calls, queues={"run_q": "default"})
        return out.getvalue().strip().splitlines()

    both = shown([queued, child])
    assert both.count("  then   queued for `tether worker` (queue default): it goes on by itself") == 2
    assert both[-4:] == [
        "2 call(s) waiting. Decide with:",
        "  tether approve RUN CALL",
        "  tether deny RUN CALL",
        "Each run's worker goes on by itself.",
    ]
    mixed = shown([queued, local])
    assert mixed[-3:] == ["then go on with:", "  tether resume RUN", "(a queued run's worker goes on by itself)"]
