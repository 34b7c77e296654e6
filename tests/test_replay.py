"""Every stored run replays offline: the recording answers the model and stands in for the tools.

A replay of the unchanged agent reaches the same end with the same calls, on SQLite and
PostgreSQL; a changed system prompt, tool schema or setting is refused with a diff naming it;
a tool answering otherwise shows up as a message diff.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, Approve, Deny, Runner, tool
from tether.errors import ConfigError
from tether.models import ModelSettings
from tether.stores.sql import SQLStore
from tether.testing import Recording, RecordingApprover, Replay, ScriptedModel, replay
from tether.testing.export import export_test
from tether.tools import ModelRetry, Tool

SYSTEM = "You help customers with their orders."
PROMPT = "Refund order 42: it arrived broken."
ANSWER = "Order 42 is refunded: 30.0 back to the card."
SCRIPT = [
    tool_use_turn(tool_use("toolu_1", "lookup", {"order_id": "42"})),
    tool_use_turn(tool_use("toolu_2", "refund", {"order_id": "42", "amount": 30.0})),
    model_reply([{"type": "text", "text": ANSWER}], "end_turn"),
]


class Shop:
    """Tools that say when they ran, so a test can tell a stubbed call from a real one."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def tools(self, *, price: float = 30.0) -> list[Tool]:
        @tool
        def lookup(order_id: str) -> dict[str, Any]:
            """Find an order by its id."""
            self.ran.append(f"lookup {order_id}")
            return {"order_id": order_id, "price": price, "status": "delivered"}

        @tool(approval=True)
        def refund(order_id: str, amount: float) -> str:
            """Refund an order, in full or in part."""
            self.ran.append(f"refund {order_id}")
            return f"refunded {amount} for order {order_id}"

        return [lookup, refund]


@pytest.fixture
def store(db_url: str) -> Iterator[SQLStore]:
    opened = SQLStore(db_url)
    yield opened
    opened.close()


def agent(tools: list[Tool], model: Any, **options: Any) -> Agent:
    return Agent(model=model, tools=tools, system=options.pop("system", SYSTEM), **options)


def recorded(store: SQLStore, shop: Shop) -> str:
    """A run that looked an order up, had its refund approved by a person, and answered."""
    approver = RecordingApprover({"refund": Approve(actor="alice")})
    result = Runner(agent(shop.tools(), ScriptedModel(SCRIPT)), store, approver=approver).run(PROMPT)
    assert (result.status, result.output) == ("done", ANSWER)
    return result.run_id


def test_an_unchanged_agent_replays_to_the_same_end_with_the_same_calls_and_no_tool_runs(store: SQLStore) -> None:
    shop = Shop()
    run_id = recorded(store, shop)
    shop.ran.clear()
    again = replay(store, run_id)

    replayed = again.run(again.agent(agent(shop.tools(), model=None)))

    assert replayed.agrees, replayed.report()
    assert [call.shown() for call in replayed.trajectory.calls] == [
        'lookup {"order_id":"42"}',
        'refund {"amount":30.0,"order_id":"42"}',
    ]
    assert (replayed.trajectory.status, replayed.trajectory.answer) == ("done", ANSWER)
    assert shop.ran == []  # every result came from the recording
    assert [request.tool for request in again.approver.seen] == ["refund"]  # decided as alice did


def test_real_tools_that_answer_as_before_agree_too(store: SQLStore) -> None:
    shop = Shop()
    run_id = recorded(store, shop)
    shop.ran.clear()
    again = replay(store, run_id)

    replayed = again.run(again.agent(agent(shop.tools(), model=None), stub_tools=False))

    assert replayed.agrees, replayed.report()
    assert shop.ran == ["lookup 42", "refund 42"]


def test_a_changed_system_prompt_is_refused_with_a_diff(store: SQLStore) -> None:
    shop = Shop()
    again = replay(store, recorded(store, shop))
    changed = agent(shop.tools(), None, system="You help customers. Never refund.")

    replayed = again.run(again.agent(changed))

    assert not replayed.agrees
    assert replayed.trajectory.calls == ()
    assert replayed.result.status == "failed"
    error = replayed.result.error or ""
    assert "model call #1: the request differs from the recorded one" in error
    assert "system prompt changed" in error
    assert "-You help customers with their orders." in error
    assert "+You help customers. Never refund." in error
    assert 'status: expected "done", got "failed"' in replayed.report()


def test_a_changed_tool_schema_is_refused_naming_the_tool_and_the_field(store: SQLStore) -> None:
    shop = Shop()
    again = replay(store, recorded(store, shop))

    @tool
    def lookup(order_id: int) -> str:
        """Find an order by its id."""
        return "unused"

    replayed = again.run(again.agent(agent([lookup, shop.tools()[1]], None)))

    error = replayed.result.error or ""
    assert "tool 'lookup': input schema changed" in error
    assert '-      "type": "string"' in error
    assert '+      "type": "integer"' in error


def test_changed_settings_and_a_tool_no_longer_offered_are_named(store: SQLStore) -> None:
    shop = Shop()
    again = replay(store, recorded(store, shop))
    changed = agent(shop.tools()[:1], None, settings=ModelSettings(stop_sequences=("END",)))

    error = again.run(again.agent(changed)).result.error or ""

    assert "tool 'refund' is no longer offered" in error
    assert 'setting stop_sequences: recorded null, now ["END"]' in error


def test_a_tool_that_now_answers_otherwise_shows_as_a_message_diff(store: SQLStore) -> None:
    shop = Shop()
    again = replay(store, recorded(store, shop))

    replayed = again.run(again.agent(agent(shop.tools(price=99.0), None), stub_tools=False))

    error = replayed.result.error or ""
    assert "model call #2: the messages differ from the recorded ones" in error
    assert "first difference at message 2" in error
    changed = [line.split('"content": ')[-1] for line in error.splitlines() if line.startswith(("-", "+"))]
    assert changed[-2:] == [
        '"{\\"order_id\\": \\"42\\", \\"price\\": 30.0, \\"status\\": \\"delivered\\"}",',
        '"{\\"order_id\\": \\"42\\", \\"price\\": 99.0, \\"status\\": \\"delivered\\"}",',
    ]
    assert replayed.differences[-3:] == [
        'call 2: expected refund {"amount":30.0,"order_id":"42"}, got (no call)',
        'status: expected "done", got "failed"',
        f'answer: expected "{ANSWER}", got null',
    ]


def test_not_strict_the_recorded_model_answers_a_changed_prompt_by_turn_and_says_what_it_let_through(
    store: SQLStore,
) -> None:
    shop = Shop()
    again = replay(store, recorded(store, shop), strict=False)

    replayed = again.run(again.agent(agent(shop.tools(), None, system="Be brief.")))

    assert replayed.agrees, replayed.report()
    assert again.model.ignored == [
        "call #1: system prompt changed",
        "call #2: system prompt changed",
        "call #3: system prompt changed",
    ]


def test_gated_unmatched_calls_park_the_replay_instead_of_running(store: SQLStore) -> None:
    shop = Shop()
    again = replay(store, recorded(store, shop))
    other = ScriptedModel(
        [
            tool_use_turn(tool_use("toolu_9", "lookup", {"order_id": "42"})),
            # the recorded refund's call id, with another amount: alice's approval was not for this
            tool_use_turn(tool_use("toolu_2", "refund", {"order_id": "42", "amount": 300.0})),
        ]
    )
    changed = Agent(model=other, tools=again.tools(shop.tools(), unmatched="ask"), system=SYSTEM)

    replayed = again.run(changed)

    assert shop.ran == ["lookup 42", "refund 42"]  # only the recorded run (above) ran them
    assert replayed.result.status == "awaiting_approval"
    assert [p["input"] for p in replayed.result.pending_approvals] == [{"order_id": "42", "amount": 300.0}]
    assert replayed.differences[0] == (
        'call 2: expected refund {"amount":30.0,"order_id":"42"}, got refund {"amount":300.0,"order_id":"42"}'
    )


def test_tool_errors_and_denials_are_reproduced_exactly(store: SQLStore) -> None:
    @tool
    def lookup(order_id: str) -> str:
        """Find an order by its id."""
        if order_id == "x":
            raise ModelRetry("order ids are digits")
        raise KeyError(order_id)

    @tool(approval=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order, in full or in part."""
        return "refunded"

    script = [
        tool_use_turn(
            tool_use("toolu_1", "lookup", {"order_id": "x"}), tool_use("toolu_2", "lookup", {"order_id": "7"})
        ),
        tool_use_turn(tool_use("toolu_3", "refund", {"order_id": "7", "amount": 1.0})),
        model_reply([{"type": "text", "text": "I could not refund it."}], "end_turn"),
    ]
    approver = RecordingApprover({"refund": Deny("not without a receipt")})
    run_id = Runner(agent([lookup, refund], ScriptedModel(script)), store, approver=approver).run(PROMPT).run_id
    again = replay(store, run_id)

    replayed = again.run(again.agent(agent([lookup, refund], None)))

    assert replayed.agrees, replayed.report()
    assert replayed.result.status == "done"


class Verdict(pydantic.BaseModel):
    refund: bool
    reason: str


def test_a_typed_result_replays_and_is_compared(store: SQLStore) -> None:
    script = [tool_use_turn(tool_use("toolu_1", "final_result", {"refund": True, "reason": "broken"}))]
    made = agent([], ScriptedModel(script), output_type=Verdict)
    run_id = Runner(made, store).run(PROMPT).run_id
    again = replay(store, run_id)

    replayed = again.run(again.agent(made))

    assert replayed.agrees, replayed.report()
    assert replayed.trajectory.result == {"refund": True, "reason": "broken"}


def test_a_recording_round_trips_through_json_each_history_written_once(store: SQLStore) -> None:
    shop = Shop()
    run_id = recorded(store, shop)
    recording = replay(store, run_id).recording

    written = json.loads(json.dumps(recording.to_json()))
    again = Replay(Recording.from_json(written))

    assert again.recording == recording
    histories = [exchange["messages"] for exchange in written["exchanges"]]
    assert histories[0] == [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    added = [[message["role"] for message in history["after_previous"]] for history in histories[1:]]
    assert added == [["assistant", "user"], ["assistant", "user"]]  # a call and its result, each time
    assert again.run(again.agent(agent(shop.tools(), None))).agrees


def test_one_replay_runs_as_often_as_asked(store: SQLStore) -> None:
    shop = Shop()
    again = replay(store, recorded(store, shop))

    first = again.run(again.agent(agent(shop.tools(), None)))
    second = again.run(again.agent(agent(shop.tools(), None)))

    assert first.agrees, first.report()
    assert second.agrees, second.report()
    assert first.result.run_id != second.result.run_id


def test_concurrent_calls_of_one_turn_replay_alike(store: SQLStore) -> None:
    shop = Shop()
    orders = [tool_use(f"toolu_{n}", "lookup", {"order_id": str(n)}) for n in range(1, 6)]
    script = [tool_use_turn(*orders), model_reply([{"type": "text", "text": "Five orders."}], "end_turn")]
    made = agent(shop.tools(), ScriptedModel(script), concurrent_tools=True)
    run_id = Runner(made, store).run("Look up orders 1 to 5.").run_id
    shop.ran.clear()
    again = replay(store, run_id)

    replayed = again.run(again.agent(agent(shop.tools(), None, concurrent_tools=True)))

    assert replayed.agrees, replayed.report()
    assert len(replayed.trajectory.calls) == 5
    assert shop.ran == []


def test_a_continued_conversation_is_refused_in_one_line(store: SQLStore) -> None:
    shop = Shop()
    first = recorded(store, shop)
    later = Runner(agent(shop.tools(), ScriptedModel(SCRIPT[2:])), store).run("Thanks!", continue_from=first)

    with pytest.raises(ConfigError, match=r"opens with 7 messages: it continues a conversation or is a fork"):
        replay(store, later.run_id)


def test_a_run_handed_to_another_agent_is_not_replayed_with_that_agents_tools_running(store: SQLStore) -> None:
    shop = Shop()
    model = ScriptedModel(  # one script: both agents' calls count as the run's model calls
        [
            tool_use_turn(tool_use("toolu_1", "transfer_to_billing", {})),
            model_reply([{"type": "text", "text": "Billing here."}], "end_turn"),
        ]
    )
    billing = Agent(model, tools=shop.tools()[1:], name="billing")
    front = Agent(model, tools=shop.tools()[:1], name="front", handoffs=[billing])
    run_id = Runner(front, store).run(PROMPT).run_id
    again = replay(store, run_id)

    assert again.recording.handed_off
    with pytest.raises(ConfigError, match="handed off to another agent, whose tools a replay does not stub"):
        again.agent(front)
    assert again.run(again.agent(front, stub_tools=False)).agrees


def test_a_run_started_from_python_exports_only_naming_its_agent(store: SQLStore, tmp_path: Path) -> None:
    run_id = recorded(store, Shop())
    recording = replay(store, run_id).recording

    with pytest.raises(ConfigError, match=r"started from Python, .* name the agent under test with --agent"):
        export_test(recording, tmp_path / "test_refund.py")
    test, data = export_test(recording, tmp_path / "test_refund.py", agent="shop_agents:support")

    assert 'AGENT = "shop_agents:support"' in test.read_text()
    assert Recording.load(data) == recording
