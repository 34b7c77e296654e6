"""Policy rules and durable "approve for the run": matching, actions, files, and whole runs.

Runs use the scripted model and an in-memory store whose writes are recorded, so a test can
check which events were committed together (a warning travels with the tool's start).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, Approve, AsyncRunner, Deny, Policy, Rule, Runner, RunResult, tool
from tether.core.approvals import DecideLater
from tether.errors import ApprovalError, ConfigError, ToolDefinitionError
from tether.facts.events import ApprovalRequested, Event
from tether.models.scripted import ScriptedModel
from tether.policy.policies import ApprovalContext, ApprovalVerdict
from tether.policy.rules import decide_call
from tether.stores import RunRecord
from tether.stores.memory import MemoryStore
from tether.testing import RecordingApprover
from tether.tools import Tool


# Scripted replies and a store that remembers each write ------------------------------------
def use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def calls(*uses: dict[str, Any]) -> dict[str, Any]:
    return {"content": list(uses), "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1}}


def answer(text: str = "Done.") -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


class WritesStore(MemoryStore):
    """A memory store that keeps the event types of every append, one list per commit."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[list[str]] = []

    def append(self, record: RunRecord, expected_version: int, events: Sequence[Event]) -> None:
        super().append(record, expected_version, events)
        self.writes.append([event.type for event in events])


class Crash(KeyboardInterrupt):
    """Escapes the runner like a killed process (or Ctrl-C): the start is committed, the end never is."""


class Ran:
    """Tool executions, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []


def make_tools(ran: Ran, *, crash_on: str | None = None) -> list[Tool]:
    crashed: list[bool] = []

    @tool(tags={"mutates", "money"})
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        ran.log.append(("refund", amount))
        return f"refunded {amount:g} on {invoice}"

    @tool(tags={"mutates", "destructive"})
    def delete_file(path: str) -> str:
        """Delete a file."""
        if path == crash_on and not crashed:
            crashed.append(True)
            raise Crash
        ran.log.append(("delete_file", path))
        return f"deleted {path}"

    @tool(tags="network")
    def fetch(url: str) -> str:
        """Fetch a URL."""
        ran.log.append(("fetch", url))
        return f"fetched {url}"

    @tool(approval=True)
    def send(to: str) -> str:
        """Send a message (asks a person unless a policy says otherwise)."""
        ran.log.append(("send", to))
        return f"sent to {to}"

    return [refund, delete_file, fetch, send]


def runner(
    script: list[dict[str, Any]],
    policy: Policy | None = None,
    *,
    ran: Ran | None = None,
    store: MemoryStore | None = None,
    approver: Any = None,
    tools: list[Tool] | None = None,
    name: str | None = None,
) -> Runner:
    agent = Agent(model=ScriptedModel(script), tools=tools or make_tools(ran or Ran()), policy=policy, name=name)
    return Runner(agent, store if store is not None else WritesStore(), approver=approver)


def tool_results(r: Runner, run_id: str) -> dict[str, dict[str, Any]]:
    blocks: dict[str, dict[str, Any]] = {}
    for message in r.load(run_id).messages:
        if message["role"] == "user" and isinstance(message["content"], list):
            blocks.update({b["tool_use_id"]: b for b in message["content"] if b.get("type") == "tool_result"})
    return blocks


def events(r: Runner, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in r.store.load_events(run_id) if e.type == kind]


@pytest.fixture
def ran() -> Ran:
    return Ran()


@pytest.fixture
def tools(ran: Ran) -> dict[str, Tool]:
    return {t.name: t for t in make_tools(ran)}


def decide(policy: Policy, tool: Tool, arguments: dict[str, Any]) -> tuple[str, str | None, list[int]]:
    """(verdict, deciding rule's name, indexes of the warn rules) for one call."""
    context = ApprovalContext(run_id="run_x", tool=tool.name, call_id="toolu_x")
    decided = decide_call(policy, tool, tool.validate(arguments), context)
    return (
        decided.verdict.verdict,
        decided.rule.rule.name if decided.rule else None,
        [w.index for w in decided.warnings],
    )


# Tags on tools --------------------------------------------------------------------------------
def test_tags_are_a_frozenset_on_the_tool(tools: dict[str, Tool]) -> None:
    assert tools["refund"].tags == frozenset({"mutates", "money"})
    assert tools["fetch"].tags == frozenset({"network"})  # one string is one tag, not its letters
    assert tools["send"].tags == frozenset()


def test_an_empty_or_non_string_tag_is_refused() -> None:
    def f(x: int) -> int:
        """Nothing."""
        return x

    with pytest.raises(ToolDefinitionError, match="tags"):
        tool(tags={""})(f)
    with pytest.raises(ToolDefinitionError, match="tags"):
        tool(tags=[1])(f)  # type: ignore[list-item]


# Matching -------------------------------------------------------------------------------------
def test_tool_globs_match_names(tools: dict[str, Tool]) -> None:
    policy = Policy([Rule(tool="delete_*", action="deny", name="no-deletes")])
    assert decide(policy, tools["delete_file"], {"path": "/x"})[:2] == ("deny", "no-deletes")
    assert decide(policy, tools["refund"], {"invoice": "I", "amount": 1})[:2] == ("allow", None)
    several = Policy([Rule(tool=["fetch", "ref?nd"], action="require_approval")])
    assert decide(several, tools["refund"], {"invoice": "I", "amount": 1})[0] == "require_approval"
    assert decide(several, tools["fetch"], {"url": "u"})[0] == "require_approval"
    assert decide(several, tools["delete_file"], {"path": "/x"})[0] == "allow"
    case = Policy([Rule(tool="FETCH", action="deny")])
    assert decide(case, tools["fetch"], {"url": "u"})[0] == "allow"  # names are case-sensitive


def test_tags_match_any_and_tags_all_match_all(tools: dict[str, Tool]) -> None:
    any_of = Policy([Rule(tags={"destructive", "network"}, action="deny")])
    assert decide(any_of, tools["delete_file"], {"path": "/x"})[0] == "deny"
    assert decide(any_of, tools["fetch"], {"url": "u"})[0] == "deny"
    assert decide(any_of, tools["refund"], {"invoice": "I", "amount": 1})[0] == "allow"
    all_of = Policy([Rule(tags_all={"mutates", "money"}, action="deny")])
    assert decide(all_of, tools["refund"], {"invoice": "I", "amount": 1})[0] == "deny"
    assert decide(all_of, tools["delete_file"], {"path": "/x"})[0] == "allow"  # mutates, but not money
    single = Policy([Rule(tags="network", action="deny")])
    assert decide(single, tools["fetch"], {"url": "u"})[0] == "deny"


@pytest.mark.parametrize(
    ("predicate", "matching", "other"),
    [
        ({"equals": "I-1"}, "I-1", "I-2"),
        ({"in": ["I-1", "I-3"]}, "I-3", "I-2"),
        ({"not_in": ["I-1", "I-3"]}, "I-2", "I-1"),
        ({"matches": r"^I-\d$"}, "I-7", "X-I-7"),
        ({"contains": "VIP"}, "I-VIP-1", "I-1"),
    ],
)
def test_string_predicates(tools: dict[str, Tool], predicate: dict[str, Any], matching: str, other: str) -> None:
    policy = Policy([Rule(tool="refund", when={"invoice": predicate}, action="deny")])
    assert decide(policy, tools["refund"], {"invoice": matching, "amount": 1})[0] == "deny"
    assert decide(policy, tools["refund"], {"invoice": other, "amount": 1})[0] == "allow"


@pytest.mark.parametrize(
    ("predicate", "matching", "other"),
    [({"gt": 100}, 100.5, 100), ({"gte": 100}, 100, 99.9), ({"lt": 10}, 9, 10), ({"lte": 10}, 10, 11)],
)
def test_ordering_predicates(tools: dict[str, Tool], predicate: dict[str, Any], matching: float, other: float) -> None:
    policy = Policy([Rule(tool="refund", when={"amount": predicate}, action="deny")])
    assert decide(policy, tools["refund"], {"invoice": "I", "amount": matching})[0] == "deny"
    assert decide(policy, tools["refund"], {"invoice": "I", "amount": other})[0] == "allow"


def test_predicates_never_match_a_missing_field_or_another_type(tools: dict[str, Tool]) -> None:
    policy = Policy(
        [
            Rule(when={"amount": {"gt": 0}}, action="deny", name="amount"),
            Rule(when={"path": {"matches": "x"}, "url": {"gt": 3}}, action="deny", name="mixed"),
        ]
    )
    assert decide(policy, tools["fetch"], {"url": "https://x"})[0] == "allow"  # no amount; url is no number
    assert decide(policy, tools["delete_file"], {"path": "/x"})[0] == "allow"  # has path, lacks url: all must hold


def test_several_conditions_must_all_hold(tools: dict[str, Tool]) -> None:
    policy = Policy([Rule(when={"amount": {"gt": 10, "lte": 100}, "invoice": {"matches": "^EU"}}, action="deny")])
    assert decide(policy, tools["refund"], {"invoice": "EU-1", "amount": 50})[0] == "deny"
    assert decide(policy, tools["refund"], {"invoice": "US-1", "amount": 50})[0] == "allow"
    assert decide(policy, tools["refund"], {"invoice": "EU-1", "amount": 500})[0] == "allow"


def test_a_callable_when_sees_the_validated_input(tools: dict[str, Tool]) -> None:
    seen: list[Mapping[str, Any]] = []

    def large(arguments: Mapping[str, Any]) -> bool:
        seen.append(arguments)
        return float(arguments["amount"]) > 100

    policy = Policy([Rule(tool="refund", when=large, action="require_approval")])
    assert decide(policy, tools["refund"], {"invoice": "I", "amount": "250"})[0] == "require_approval"
    assert seen == [{"invoice": "I", "amount": 250.0}]  # validated: the string became a float
    assert decide(policy, tools["refund"], {"invoice": "I", "amount": 5})[0] == "allow"


def test_first_deciding_match_wins(tools: dict[str, Tool]) -> None:
    refund = tools["refund"]
    allow_first = Policy([Rule(tool="refund", action="allow", name="a"), Rule(tags="money", action="deny", name="b")])
    deny_first = Policy([Rule(tags="money", action="deny", name="b"), Rule(tool="refund", action="allow", name="a")])
    assert decide(allow_first, refund, {"invoice": "I", "amount": 1})[:2] == ("allow", "a")
    assert decide(deny_first, refund, {"invoice": "I", "amount": 1})[:2] == ("deny", "b")


def test_warn_rules_are_collected_and_reading_goes_on(tools: dict[str, Tool]) -> None:
    policy = Policy(
        [
            Rule(tags="money", action="warn", name="w1"),
            Rule(tool="fetch", action="warn", name="w2"),
            Rule(tool="refund", action="deny", name="d"),
            Rule(tool="refund", action="warn", name="w-after"),
        ]
    )
    assert decide(policy, tools["refund"], {"invoice": "I", "amount": 1}) == ("deny", "d", [1])
    assert decide(policy, tools["fetch"], {"url": "u"}) == ("allow", None, [2])


def test_no_deciding_match_leaves_it_to_the_tool(tools: dict[str, Tool]) -> None:
    policy = Policy([Rule(tool="refund", action="deny")])
    assert decide(policy, tools["send"], {"to": "a"}) == ("require_approval", None, [])
    assert decide(Policy([Rule(tool="send", action="allow")]), tools["send"], {"to": "a"})[0] == "allow"


def test_a_catch_all_rule_matches_everything(tools: dict[str, Tool]) -> None:
    policy = Policy([Rule(tool="fetch", action="allow"), Rule(action="require_approval", name="ask")])
    assert decide(policy, tools["fetch"], {"url": "u"})[0] == "allow"
    assert decide(policy, tools["delete_file"], {"path": "/x"})[:2] == ("require_approval", "ask")


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"action": "block"}, "unknown action 'block'"),
        ({"action": "deny", "tool": 3}, "'tool' must be a glob string"),
        ({"action": "deny", "tags": [""]}, "'tags' must be a tag"),
        ({"action": "deny", "when": {"amount": {"near": 1}}}, "unknown predicate 'near'"),
        ({"action": "deny", "when": {"amount": {"matches": "("}}}, "bad regular expression"),
        ({"action": "deny", "when": {"amount": 5}}, "needs a table of predicates"),
        ({"action": "deny", "when": {"amount": {"in": 5}}}, "'in' needs a list"),
        ({"action": "deny", "when": {"amount": {"gt": [1]}}}, "'gt' needs a number or a string"),
        ({"action": "deny", "when": "amount > 5"}, "'when' must be a callable"),
    ],
)
def test_a_bad_python_rule_fails_when_built(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(")):
        Rule(**kwargs)


def test_a_policy_holds_rules_only() -> None:
    with pytest.raises(ConfigError, match="rule 2"):
        Policy([Rule(action="warn"), "deny everything"])  # type: ignore[list-item]


# Whole runs -----------------------------------------------------------------------------------
REFUND_BIG = [calls(use("toolu_1", "refund", {"invoice": "I-9", "amount": 500})), answer()]
LARGE_REFUNDS = Rule(
    tool="refund",
    when={"amount": {"gt": 100}},
    action="deny",
    name="deny-large-refunds",
    message="over 100: ask a manager",
)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_deny_rule_gives_the_model_the_rule_message_and_the_tool_never_runs(ran: Ran, kind: str) -> None:
    policy = Policy([Rule(action="warn", tool="fetch"), LARGE_REFUNDS])
    agent = Agent(model=ScriptedModel(REFUND_BIG), tools=make_tools(ran), policy=policy)
    if kind == "sync":
        sync = Runner(agent, WritesStore())
        result: RunResult = sync.run("Refund I-9.")
        r = sync
    else:
        store = WritesStore()
        result = asyncio.run(AsyncRunner(agent, store).run("Refund I-9."))
        r = Runner(agent, store)
    assert result.status == "done"
    assert ran.log == []
    block = tool_results(r, result.run_id)["toolu_1"]
    assert block["is_error"] is True
    assert "rule 2 (deny-large-refunds): over 100: ask a manager" in block["content"]
    assert events(r, result.run_id, "tool_started") == []
    [finished] = events(r, result.run_id, "tool_finished")
    assert finished["denied_by"] == "policy"


def test_warn_records_a_warning_with_the_start_and_the_call_proceeds(ran: Ran) -> None:
    policy = Policy([Rule(tags="network", action="warn", name="egress", message="leaves the machine")])
    script = [
        calls(use("toolu_1", "fetch", {"url": "https://a"}), use("toolu_2", "refund", {"invoice": "I", "amount": 1})),
        answer(),
    ]
    r = runner(script, policy, ran=ran)
    result = r.run("Go.")
    assert result.status == "done"
    assert ran.log == [("fetch", "https://a"), ("refund", 1.0)]
    [warning] = events(r, result.run_id, "warning")
    assert warning == {
        "message": "rule 1 (egress): leaves the machine",
        "call_id": "toolu_1",
        "tool": "fetch",
        "rule": 1,
        "rule_name": "egress",
    }
    assert isinstance(r.store, WritesStore)
    # one commit (the model's answer asking for the call): the warning is logged before the tool runs
    assert any(w[i : i + 2] == ["warning", "tool_started"] for w in r.store.writes for i in range(len(w)))
    assert "is_error" not in tool_results(r, result.run_id)["toolu_1"]


def test_warn_is_also_logged_on_the_tether_policy_logger_once_committed(
    ran: Ran, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tether.policy")
    policy = Policy([Rule(tags="network", action="warn", name="egress", message="leaves the machine")])
    r = runner([calls(use("toolu_1", "fetch", {"url": "https://a"})), answer()], policy, ran=ran)
    result = r.run("Go.")
    [record] = [rec for rec in caplog.records if rec.name == "tether.policy"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"run {result.run_id}, call toolu_1 (fetch): rule 1 (egress): leaves the machine"
    fields = ("run_id", "call_id", "tool", "rule", "rule_name")
    assert [getattr(record, name) for name in fields] == [result.run_id, "toolu_1", "fetch", 1, "egress"]


def test_warn_is_recorded_once_for_a_retried_call() -> None:
    from tether import RetryLater, RetryPolicy

    attempts: list[int] = []

    @tool(tags="network", retry=RetryPolicy(max_attempts=3, initial_delay=0))
    def flaky(url: str) -> str:
        """Fails once."""
        attempts.append(1)
        if len(attempts) == 1:
            raise RetryLater("try again")
        return "ok"

    policy = Policy([Rule(tags="network", action="warn")])
    r = runner([calls(use("toolu_1", "flaky", {"url": "u"})), answer()], policy, tools=[flaky])
    result = r.run("Go.")
    assert result.status == "done"
    assert len(attempts) == 2
    assert len(events(r, result.run_id, "warning")) == 1


def test_warn_before_a_final_tool_is_committed_with_its_result() -> None:
    @tool(final=True, tags="output")
    def submit(value: int) -> str:
        """The answer."""
        return "ok"

    r = runner(
        [calls(use("toolu_1", "submit", {"value": 3}))], Policy([Rule(tags="output", action="warn")]), tools=[submit]
    )
    result = r.run("Go.")
    assert result.status == "done"
    assert result.result == {"value": 3}
    assert isinstance(r.store, WritesStore)
    assert r.store.writes[1][:2] == ["warning", "tool_finished"]


def test_require_approval_rule_names_the_rule_in_the_pending_reason(ran: Ran) -> None:
    policy = Policy(
        [
            Rule(tool="fetch", action="allow", name="reads"),
            Rule(
                tool="refund",
                when={"amount": {"gt": 100}},
                action="require_approval",
                name="big-refunds",
                message="a manager must approve refunds over 100",
            ),
        ]
    )
    approver = RecordingApprover({})
    r = runner(REFUND_BIG, policy, ran=ran, approver=approver)
    parked = r.run("Refund I-9.")
    assert parked.status == "awaiting_approval"
    [pending] = parked.pending_approvals
    assert pending["reason"] == "rule 2 (big-refunds): a manager must approve refunds over 100"
    assert approver.seen[0][0].reason == pending["reason"]
    assert ran.log == []
    r.decide(parked.run_id, "toolu_1", Approve(actor="manager"))
    assert r.drive(parked.run_id).status == "done"
    assert ran.log == [("refund", 500.0)]


def test_a_rule_and_an_approval_callable_give_the_person_a_note(ran: Ran, tmp_path: Path) -> None:
    """The note (Markdown: what to check, whom to ask) travels with the call into its approval_requested."""
    rules = tmp_path / "rules.toml"
    rules.write_text(
        textwrap.dedent(
            """
            [[rules]]
            tool = "refund"
            action = "require_approval"
            description = "Check the **invoice** in the ledger first."
            """
        )
    )
    r = runner(REFUND_BIG, Policy.from_file(rules), ran=ran)
    parked = r.run("Refund I-9.")
    [asked] = [e.fact for e in r.store.load_events(parked.run_id) if isinstance(e.fact, ApprovalRequested)]
    assert [call.note for call in asked.calls] == ["Check the **invoice** in the ledger first."]
    assert asked.to_json()["calls"][0]["note"] == "Check the **invoice** in the ledger first."

    def gate(arguments: Any, context: ApprovalContext) -> ApprovalVerdict:
        return ApprovalVerdict("require_approval", "big sends", note="Call _the customer_ first.")

    @tool(approval=gate)
    def send(to: str) -> str:
        """Send."""
        return to

    sending = runner([calls(use("toolu_1", "send", {"to": "a"})), answer()], None, tools=[send])
    waiting = sending.run("Go.")
    [asked] = [e.fact for e in sending.store.load_events(waiting.run_id) if isinstance(e.fact, ApprovalRequested)]
    assert [call.note for call in asked.calls] == ["Call _the customer_ first."]
    with pytest.raises(ConfigError, match="'description' must be a string"):
        Rule(action="require_approval", description=3)  # type: ignore[arg-type]


def test_an_allow_rule_overrides_the_tools_own_approval(ran: Ran) -> None:
    r = runner(
        [calls(use("toolu_1", "send", {"to": "a"})), answer()], Policy([Rule(tool="send", action="allow")]), ran=ran
    )
    assert r.run("Go.").status == "done"
    assert ran.log == [("send", "a")]


def test_agents_sharing_tools_hold_different_permissions(ran: Ran) -> None:
    tools = make_tools(ran)
    script = [calls(use("toolu_1", "delete_file", {"path": "/data"})), answer()]
    reader = runner(script, Policy([Rule(tags="mutates", action="deny", name="read-only")]), tools=tools)
    admin = runner(script, Policy([Rule(tags="mutates", action="allow")]), tools=tools)
    denied = reader.run("Clean up.")
    assert "rule 1 (read-only)" in tool_results(reader, denied.run_id)["toolu_1"]["content"]
    assert ran.log == []
    allowed = admin.run("Clean up.")
    assert "is_error" not in tool_results(admin, allowed.run_id)["toolu_1"]
    assert ran.log == [("delete_file", "/data")]


def test_an_approval_callable_sees_the_agents_name(ran: Ran) -> None:
    seen: list[ApprovalContext] = []

    def gate(arguments: Any, context: ApprovalContext) -> ApprovalVerdict:
        seen.append(context)
        return ApprovalVerdict("deny", "not for this agent") if context.agent == "support" else ApprovalVerdict("allow")

    @tool(approval=gate)
    def wipe(disk: str) -> str:
        """Wipe a disk."""
        ran.log.append(("wipe", disk))
        return "wiped"

    script = [calls(use("toolu_1", "wipe", {"disk": "sda"})), answer()]
    support = runner(script, tools=[wipe], name="support")
    result = support.run("Wipe it.")
    assert "not for this agent" in tool_results(support, result.run_id)["toolu_1"]["content"]
    assert seen[0] == ApprovalContext(
        run_id=result.run_id, tool="wipe", call_id="toolu_1", tenant=None, agent="support"
    )
    assert runner(script, tools=[wipe], name="ops").run("Wipe it.").status == "done"
    assert ran.log == [("wipe", "sda")]


# Approve for the rest of the run -------------------------------------------------------------------
def sends(*turns: Sequence[str]) -> list[dict[str, Any]]:
    """One model turn per item, each calling ``send`` once per recipient."""
    script = [calls(*(use(f"toolu_{to}", "send", {"to": to}) for to in turn)) for turn in turns]
    return [*script, answer()]


def test_approve_for_the_run_is_recorded_and_skips_later_gates(ran: Ran) -> None:
    r = runner(sends(["a"], ["b"], ["c"]), ran=ran)
    parked = r.run("Send three.")
    assert parked.status == "awaiting_approval"
    r.decide(parked.run_id, "toolu_a", Approve(actor="alice", remember_for_run=True))
    result = r.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == [("send", "a"), ("send", "b"), ("send", "c")]
    [decided] = events(r, parked.run_id, "approval_decided")
    assert decided["remember_for_run"] is True
    assert decided["actor"] == "alice"
    assert len(events(r, parked.run_id, "approval_requested")) == 1
    assert r.load(parked.run_id).approved_tools == {"send"}


def test_a_plain_approval_is_for_one_call_only(ran: Ran) -> None:
    r = runner(sends(["a"], ["b"]), ran=ran)
    parked = r.run("Send two.")
    r.decide(parked.run_id, "toolu_a", Approve())
    again = r.drive(parked.run_id)
    assert again.status == "awaiting_approval"
    assert [p["call_id"] for p in again.pending_approvals] == ["toolu_b"]
    assert r.load(parked.run_id).approved_tools == set()


def test_approve_for_the_run_survives_a_reload_by_another_runner(ran: Ran) -> None:
    store = MemoryStore()
    first = runner(sends(["a"], ["b"]), ran=ran, store=store)
    parked = first.run("Send two.")
    first.decide(parked.run_id, "toolu_a", Approve(remember_for_run=True))
    fresh = runner(sends(["a"], ["b"]), ran=ran, store=store)  # a new agent and runner, as another process has
    assert fresh.load(parked.run_id).approved_tools == {"send"}
    result = fresh.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == [("send", "a"), ("send", "b")]


def test_approve_for_the_run_also_approves_the_tools_other_pending_calls(ran: Ran) -> None:
    r = runner(
        [
            calls(
                use("toolu_a", "send", {"to": "a"}),
                use("toolu_x", "refund", {"invoice": "I", "amount": 1}),
                use("toolu_b", "send", {"to": "b"}),
            ),
            answer(),
        ],
        Policy([Rule(tool="refund", action="require_approval")]),
        ran=ran,
    )
    parked = r.run("Go.")
    assert [p["call_id"] for p in parked.pending_approvals] == ["toolu_a", "toolu_x", "toolu_b"]
    after = r.decide(parked.run_id, "toolu_a", Approve(actor="alice", remember_for_run=True))
    assert [p["call_id"] for p in after.pending_approvals] == ["toolu_x"]  # another tool: still asked
    decided = {d["call_id"]: d for d in events(r, parked.run_id, "approval_decided")}
    assert decided["toolu_b"]["actor"] == "alice"
    assert decided["toolu_b"]["approved"] is True
    r.decide(parked.run_id, "toolu_x", Deny("no"))
    assert r.drive(parked.run_id).status == "done"
    assert ran.log == [("send", "a"), ("send", "b")]


def test_an_approver_answering_for_the_run_is_not_asked_again(ran: Ran) -> None:
    approver = RecordingApprover({"send": Approve(actor="bot", remember_for_run=True)})
    r = runner(sends(["a", "b"], ["c"]), ran=ran, approver=approver)
    result = r.run("Go.")
    assert result.status == "done"
    assert [[q.call_id for q in batch] for batch in approver.seen] == [["toolu_a", "toolu_b"]]
    assert ran.log == [("send", "a"), ("send", "b"), ("send", "c")]


def test_approve_for_the_run_never_overrides_a_deny_rule(ran: Ran) -> None:
    policy = Policy(
        [
            Rule(tool="send", when={"to": {"matches": "@evil"}}, action="deny", name="no-evil"),
            Rule(tool="send", action="require_approval", name="ask"),
        ]
    )
    r = runner(sends(["a"], ["x@evil"], ["c"]), policy, ran=ran)
    parked = r.run("Go.")
    r.decide(parked.run_id, "toolu_a", Approve(remember_for_run=True))
    result = r.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == [("send", "a"), ("send", "c")]
    assert "rule 1 (no-evil)" in tool_results(r, result.run_id)["toolu_x@evil"]["content"]


def test_an_approved_call_in_doubt_after_a_crash_is_asked_about_again(ran: Ran) -> None:
    tools = make_tools(ran, crash_on="/a")
    policy = Policy([Rule(tool="delete_file", action="require_approval")])
    script = [
        calls(use("toolu_1", "delete_file", {"path": "/a"})),
        calls(use("toolu_2", "delete_file", {"path": "/b"})),
        answer(),
    ]
    store = MemoryStore()
    r = runner(script, policy, tools=tools, store=store)
    parked = r.run("Delete.")
    r.decide(parked.run_id, "toolu_1", Approve(remember_for_run=True))
    with pytest.raises(Crash):
        r.drive(parked.run_id)  # the start is committed; the process "dies" inside the tool
    again = runner(script, policy, tools=tools, store=store, approver=DecideLater()).drive(parked.run_id)
    assert again.status == "awaiting_approval"
    [pending] = again.pending_approvals
    assert pending["call_id"] == "toolu_1"
    assert "may already have run" in pending["reason"]
    r.decide(parked.run_id, "toolu_1", Approve())
    assert r.drive(parked.run_id).status == "done"
    assert ran.log == [("delete_file", "/a"), ("delete_file", "/b")]  # /b: approved for the run, not asked


# Rule files -------------------------------------------------------------------------------------
TOML_RULES = """
[[rules]]
name = "egress"
tags = ["network"]
action = "warn"
message = "leaves the machine"

[[rules]]
name = "deny-large-refunds"
tool = "refund"
when = { amount = { gt = 100 }, invoice = { not_in = ["I-VIP"] } }
action = "deny"
message = "over 100: ask a manager"

[[rules]]
tool = ["delete_*", "send"]
tags_all = ["mutates", "destructive"]
action = "require_approval"
"""

YAML_RULES = """
rules:
  - name: egress
    tags: network
    action: warn
    message: leaves the machine
  - name: deny-large-refunds
    tool: refund
    when:
      amount: {gt: 100}
      invoice: {not_in: [I-VIP]}
    action: deny
    message: "over 100: ask a manager"
  - tool: ["delete_*", send]
    tags_all: [mutates, destructive]
    action: require_approval
"""


def check_loaded(policy: Policy, tools: dict[str, Tool]) -> None:
    assert len(policy.rules) == 3
    assert decide(policy, tools["fetch"], {"url": "u"}) == ("allow", None, [1])
    assert decide(policy, tools["refund"], {"invoice": "I-1", "amount": 500})[:2] == ("deny", "deny-large-refunds")
    assert decide(policy, tools["refund"], {"invoice": "I-VIP", "amount": 500})[0] == "allow"
    assert decide(policy, tools["delete_file"], {"path": "/x"})[0] == "require_approval"


def test_rules_load_from_toml(tmp_path: Path, tools: dict[str, Tool]) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(TOML_RULES)
    policy = Policy.from_file(path)
    assert policy.source == str(path)
    check_loaded(policy, tools)


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_rules_load_from_yaml(tmp_path: Path, tools: dict[str, Tool], suffix: str) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / f"rules{suffix}"
    path.write_text(YAML_RULES)
    check_loaded(Policy.from_file(path), tools)


def test_yaml_without_pyyaml_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    path = tmp_path / "rules.yaml"
    path.write_text(YAML_RULES)
    with pytest.raises(ConfigError, match="pip install pyyaml"):
        Policy.from_file(path)


def rule_file(tmp_path: Path, body: str, suffix: str = ".toml") -> Path:
    path = tmp_path / f"rules{suffix}"
    path.write_text(textwrap.dedent(body))
    return path


OK_RULE = '[[rules]]\ntool = "fetch"\naction = "allow"\n\n'


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('[[rules]]\nname = "r2"\ntool = "x"\naction = "block"\n', "rule 2 (r2): unknown action 'block'"),
        (
            '[[rules]]\nwhen = { amount = { near = 1 } }\naction = "deny"\n',
            "rule 2: 'when': field 'amount': unknown predicate 'near'",
        ),
        (
            '[[rules]]\nwhen = { path = { matches = "(" } }\naction = "deny"\n',
            "rule 2: 'when': field 'path': bad regular expression",
        ),
        ('[[rules]]\ntool = 3\naction = "deny"\n', "rule 2: 'tool' must be a glob string"),
        ('[[rules]]\ntool = ["a", 1]\naction = "deny"\n', "rule 2: 'tool' must be a glob string"),
        ('[[rules]]\ntags = [{ a = 1 }]\naction = "deny"\n', "rule 2: 'tags' must be a tag"),
        (
            '[[rules]]\nwhen = { amount = 5 }\naction = "deny"\n',
            "rule 2: 'when': field 'amount' needs a table of predicates",
        ),
        (
            '[[rules]]\nwhen = { amount = { in = 5 } }\naction = "deny"\n',
            "rule 2: 'when': field 'amount': 'in' needs a list",
        ),
        ('[[rules]]\nwhen = "amount > 5"\naction = "deny"\n', "rule 2: 'when' must be a table"),
        ('[[rules]]\ntool = "x"\n', "rule 2: missing 'action'"),
        ('[[rules]]\ntool = "x"\nacton = "deny"\naction = "deny"\n', "rule 2: unknown key(s) acton"),
        ('[[rules]]\naction = "deny"\nmessage = 5\n', "rule 2: 'message' must be a string"),
    ],
)
def test_an_invalid_rule_file_fails_at_load_naming_file_rule_and_problem(
    tmp_path: Path, body: str, problem: str
) -> None:
    path = rule_file(tmp_path, OK_RULE + body)
    with pytest.raises(ConfigError) as caught:
        Policy.from_file(path)
    message = str(caught.value)
    assert str(path) in message
    assert problem in message, message


@pytest.mark.parametrize(
    ("body", "suffix", "problem"),
    [
        ("rules = 5\n", ".toml", "'rules' must be a list"),
        ('[[rule]]\naction = "deny"\n', ".toml", "expected a top-level 'rules' list"),
        ("rules = []\nextra = 1\n", ".toml", "unknown top-level key(s) extra"),
        ("[[rules]\n", ".toml", "invalid TOML"),
        ("rules = [5]\n", ".toml", "rule 1: expected a table"),
        ("rules:\n  - action: deny\n    when: {path: {matches: '['}}\n", ".yaml", "rule 1: 'when': field 'path'"),
        ("rules: [\n", ".yaml", "invalid YAML"),
        ("", ".yaml", "expected a top-level 'rules' list"),
        ("{}", ".json", "unknown format '.json'"),
    ],
)
def test_an_invalid_file_shape_fails_at_load(tmp_path: Path, body: str, suffix: str, problem: str) -> None:
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = rule_file(tmp_path, body, suffix)
    with pytest.raises(ConfigError) as caught:
        Policy.from_file(path)
    assert str(path) in str(caught.value)
    assert problem in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            "rules:\n  - tool: a\n   action: deny\n",
            ":3:4: invalid YAML: expected <block end>, but found '<block mapping start>' "
            "(while parsing a block collection begun at 2:3)",
        ),
        ("rules:\n\t- x\n", ":2:1: invalid YAML: found character '\\t' that cannot start any token"),
        ("rules: [a, b\n", ":2:1: invalid YAML: expected ',' or ']', but got '<stream end>'"),
    ],
    ids=["indentation", "tab", "unclosed"],
)
def test_a_yaml_syntax_error_is_one_line_at_file_line_column(tmp_path: Path, body: str, said: str) -> None:
    """As compilers say it, so an editor can jump there; PyYAML's own message spans several lines."""
    pytest.importorskip("yaml")
    path = rule_file(tmp_path, body, ".yaml")
    with pytest.raises(ConfigError) as caught:
        Policy.from_file(path)
    assert str(caught.value).startswith(f"policy file {path}{said}"), caught.value
    assert "\n" not in str(caught.value)


def test_a_rule_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_bytes(b'rules = [{ tool = "x", action = "deny", message = "\xff" }]\n')
    with pytest.raises(ConfigError, match=r"rules\.toml is not UTF-8 text \(byte 0xff at offset \d+\)"):
        Policy.from_file(path)


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_rule_file_nested_absurdly_deep_is_a_config_error(tmp_path: Path, suffix: str) -> None:
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    # The parsers recurse at least twice per level, so this overflows Python's stack; deeper only
    # costs time (PyYAML took 2 s on 30,000 levels that fail just the same).
    levels = 7 * sys.getrecursionlimit() // 10
    deep = "[" * levels + "]" * levels
    path = rule_file(tmp_path, f"rules = {deep}\n" if suffix == ".toml" else f"rules: {deep}\n", suffix)
    with pytest.raises(ConfigError, match="nested too deeply"):
        Policy.from_file(path)


def test_a_missing_rule_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read policy file .*nope\.toml"):
        Policy.from_file(tmp_path / "nope.toml")


def test_an_empty_rules_list_is_a_policy_that_decides_nothing(tmp_path: Path, tools: dict[str, Tool]) -> None:
    policy = Policy.from_file(rule_file(tmp_path, "rules = []\n"))
    assert policy.rules == ()
    assert decide(policy, tools["send"], {"to": "a"})[0] == "require_approval"


def test_approve_for_the_run_never_skips_an_in_doubt_rerun(ran: Ran) -> None:
    tools = make_tools(ran, crash_on="/b")
    policy = Policy([Rule(tool="delete_file", action="require_approval")])
    script = [
        calls(use("toolu_1", "delete_file", {"path": "/a"})),
        calls(use("toolu_2", "delete_file", {"path": "/b"})),
        answer(),
    ]
    store = MemoryStore()
    r = runner(script, policy, tools=tools, store=store)
    parked = r.run("Delete.")
    r.decide(parked.run_id, "toolu_1", Approve(remember_for_run=True))
    with pytest.raises(Crash):
        r.drive(parked.run_id)  # /a ran; /b was not asked about (approved for the run) and "crashed"
    assert ran.log == [("delete_file", "/a")]
    again = runner(script, policy, tools=tools, store=store, approver=DecideLater()).drive(parked.run_id)
    assert again.status == "awaiting_approval"
    [pending] = again.pending_approvals
    assert pending["call_id"] == "toolu_2"
    assert "may already have run" in pending["reason"]
    r.decide(parked.run_id, "toolu_2", Deny("it probably ran"))
    assert r.drive(parked.run_id).status == "done"
    assert ran.log == [("delete_file", "/a")]


# Edited input is judged by the rules too -----------------------------------------------------------
ASK_FOR_REFUNDS = Rule(tool="refund", action="require_approval", name="ask-refunds")
REFUND_SMALL = [calls(use("toolu_1", "refund", {"invoice": "I-9", "amount": 5})), answer()]


@pytest.mark.parametrize("for_run", [False, True])
def test_an_edit_a_deny_rule_forbids_is_refused_and_nothing_is_recorded(ran: Ran, for_run: bool) -> None:
    r = runner(REFUND_SMALL, Policy([LARGE_REFUNDS, ASK_FOR_REFUNDS]), ran=ran)
    parked = r.run("Refund I-9.")
    assert [p["call_id"] for p in parked.pending_approvals] == ["toolu_1"]
    edit = Approve(input={"invoice": "I-9", "amount": 5000}, actor="mallory", remember_for_run=for_run)
    with pytest.raises(ApprovalError, match=r"rule 1 \(deny-large-refunds\): over 100: ask a manager") as raised:
        r.decide(parked.run_id, "toolu_1", edit)
    assert "nothing was recorded" in str(raised.value)
    assert (raised.value.run_id, raised.value.call_id) == (parked.run_id, "toolu_1")
    assert events(r, parked.run_id, "approval_decided") == []
    assert r.drive(parked.run_id).status == "awaiting_approval"  # still pending, still parked
    assert ran.log == []

    r.decide(parked.run_id, "toolu_1", Approve(input={"invoice": "I-9", "amount": 50}, actor="alice"))
    assert r.drive(parked.run_id).status == "done"
    assert ran.log == [("refund", 50)]


def test_an_edit_the_tools_own_approval_callable_denies_is_refused(ran: Ran) -> None:
    def gate(arguments: Any, context: ApprovalContext) -> ApprovalVerdict:
        if arguments.amount > 100:
            return ApprovalVerdict("deny", "refunds over 100 need a manager")
        return ApprovalVerdict("require_approval", "refunds need a person")

    @tool(approval=gate)
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        ran.log.append(("refund", amount))
        return "refunded"

    r = runner(REFUND_SMALL, tools=[refund])
    parked = r.run("Refund I-9.")
    assert parked.pending_approvals[0]["reason"] == "refunds need a person"
    with pytest.raises(ApprovalError, match="refunds over 100 need a manager"):
        r.decide(parked.run_id, "toolu_1", Approve(input={"invoice": "I-9", "amount": 5000}))
    assert events(r, parked.run_id, "approval_decided") == []
    r.decide(parked.run_id, "toolu_1", Deny("no"))
    assert r.drive(parked.run_id).status == "done"
    assert ran.log == []


@pytest.mark.parametrize(
    "decision",
    [
        Approve(actor="alice"),
        Approve(actor="alice", remember_for_run=True),
        Approve(input={"invoice": "I-9", "amount": 500}, actor="alice"),
    ],
    ids=["plain", "for-run", "edited"],
)
def test_a_deny_rule_added_after_any_approval_stops_the_call_when_it_would_run(ran: Ran, decision: Approve) -> None:
    store = MemoryStore()
    script = [calls(use("toolu_1", "refund", {"invoice": "I-9", "amount": 500})), answer()]
    lenient = runner(script, Policy([ASK_FOR_REFUNDS]), ran=ran, store=store)
    parked = lenient.run("Refund I-9.")
    lenient.decide(parked.run_id, "toolu_1", decision)
    strict = runner(script, Policy([LARGE_REFUNDS, ASK_FOR_REFUNDS]), ran=ran, store=store)
    result = strict.drive(parked.run_id)
    assert result.status == "done"
    assert ran.log == []
    block = tool_results(strict, parked.run_id)["toolu_1"]
    assert block["is_error"] is True
    assert "denied by policy: rule 1 (deny-large-refunds): over 100: ask a manager" in block["content"]
    [finished] = events(strict, parked.run_id, "tool_finished")
    assert finished["denied_by"] == "policy"


# Verdicts are checked ------------------------------------------------------------------------------
def test_a_mistyped_verdict_is_an_error_listing_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'denied'.*'allow', 'require_approval', 'deny'"):
        ApprovalVerdict("denied", "typo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="reason must be a string"):
        ApprovalVerdict("deny", None)  # type: ignore[arg-type]


def test_a_gate_raising_on_a_mistyped_verdict_stops_the_drive_and_never_runs_the_tool(ran: Ran) -> None:
    @tool(approval=lambda arguments, context: ApprovalVerdict("denied", "typo"))  # type: ignore[arg-type]
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        ran.log.append(("refund", amount))
        return "refunded"

    r = runner(REFUND_SMALL, tools=[refund])
    with pytest.raises(ConfigError, match="unknown approval verdict 'denied'"):
        r.run("Refund I-9.")
    assert ran.log == []


@pytest.mark.parametrize(
    ("answer_", "shown"),
    [(None, "None"), ("deny", "'deny'"), ("allow", "'allow'"), (0, "0"), ({"x": "y" * 99}, "a dict")],
)
def test_a_gate_answering_neither_a_verdict_nor_a_bool_asks_a_person(ran: Ran, answer_: Any, shown: str) -> None:
    @tool(approval=lambda arguments, context: answer_)
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        ran.log.append(("refund", amount))
        return "refunded"

    r = runner(REFUND_SMALL, tools=[refund])
    parked = r.run("Refund I-9.")
    assert parked.status == "awaiting_approval"
    [pending] = parked.pending_approvals
    assert pending["reason"] == f"the approval gate of 'refund' returned {shown}, not an ApprovalVerdict or a bool"
    assert ran.log == []


@pytest.mark.parametrize(("answer_", "status"), [(True, "awaiting_approval"), (False, "done")])
def test_a_gate_answering_a_bool_asks_on_true_and_allows_on_false(ran: Ran, answer_: bool, status: str) -> None:
    @tool(approval=lambda arguments, context: answer_)
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        ran.log.append(("refund", amount))
        return "refunded"

    assert runner(REFUND_SMALL, tools=[refund]).run("Refund I-9.").status == status
