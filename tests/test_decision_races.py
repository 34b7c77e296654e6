"""Two decisions written on one run at once: on two calls of a batch both land; on one call, one does.

A store that lets another decision in just before a write stands in for a second process
(``tether approve``, the inspector, a service) deciding at the same moment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, Runner, tool
from tether.core.approvals import Approve, Deny
from tether.errors import AlreadyDecided
from tether.facts.events import ApprovalDecided, Event
from tether.stores import RunRecord
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel


@tool(approval=True)
def delete(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


class Interleaving(MemoryStore):
    """Runs ``before`` once, just before the next write of a run it is armed for."""

    before: Callable[[], object] | None = None

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        cut_in, self.before = self.before, None
        if cut_in is not None:
            cut_in()
        super().append(record, expected_version, events)


def batch_of_two(store: MemoryStore) -> tuple[Runner, str]:
    turn = tool_use_turn(tool_use("toolu_a", "delete", {"path": "a"}), tool_use("toolu_b", "delete", {"path": "b"}))
    agent = Agent(
        model=ScriptedModel([turn, model_reply([{"type": "text", "text": "ok"}], "end_turn")]), tools=[delete]
    )
    result = Runner(agent, store).run("clean up")
    assert result.status == "awaiting_approval"
    return Runner(agent, store), result.run_id


def decided(store: MemoryStore, run_id: str) -> dict[str, tuple[bool, str]]:
    facts = [e.fact for e in store.load_events(run_id) if isinstance(e.fact, ApprovalDecided)]
    return {fact.call_id: (fact.approved, fact.actor) for fact in facts}


def test_two_people_deciding_two_calls_of_a_batch_at_once_both_land() -> None:
    store = Interleaving()
    runner, run_id = batch_of_two(store)
    other = Runner(runner.agent, store)
    store.before = lambda: other.decide(run_id, "toolu_b", Deny("not b", actor="bob"))

    runner.decide(run_id, "toolu_a", Approve(actor="alice"))  # its first write is refused: bob's came first

    assert decided(store, run_id) == {"toolu_a": (True, "alice"), "toolu_b": (False, "bob")}


@pytest.mark.parametrize("second", [Approve(actor="alice"), Deny("no", actor="alice")])
def test_two_people_deciding_one_call_at_once_one_wins_and_the_other_is_told_who(second: Approve | Deny) -> None:
    store = Interleaving()
    runner, run_id = batch_of_two(store)
    other = Runner(runner.agent, store)
    store.before = lambda: other.decide(run_id, "toolu_a", Approve(actor="bob"))

    with pytest.raises(AlreadyDecided, match=r"approved by bob"):
        runner.decide(run_id, "toolu_a", second)

    assert decided(store, run_id) == {"toolu_a": (True, "bob")}
