"""Forking a run from one of its steps: a new run with the original's history up to there.

The original is left as it was; the fork links back to it, refuses a step in the middle of a
turn (naming the steps that can be forked) and can have one message's text edited. Both
drivers fork through the same lifecycle flow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import model_reply, tool_use, tool_use_turn
from tether import Agent, AsyncRunner, Handoff, Runner, tool
from tether.core.forks import MessageEdit, fork_points
from tether.errors import ConfigError, InvalidForkPoint, RunNotFound
from tether.models import ModelRequest
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore
from tether.surfaces.cli import main
from tether.testing import ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def answer(text: str) -> dict[str, Any]:
    return model_reply([{"type": "text", "text": text}], "end_turn")


class Script:
    """Answers the original run with a tool call then "5"; any later request with ``later``."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        self.later = answer("forked answer")

    def __call__(self, request: ModelRequest) -> dict[str, Any]:
        self.requests.append(request)
        if len(self.requests) == 1:
            return tool_use_turn(tool_use("toolu_1", "add", {"a": 2, "b": 3}))
        if len(self.requests) == 2:
            return answer("5")
        return self.later


def finished_run(store: MemoryStore) -> tuple[Runner, Script, str]:
    script = Script()
    runner = Runner(Agent(model=ScriptedModel(script), tools=[add]), store)
    result = runner.run("What is 2 + 3?", tenant="acme")
    assert result.status == "done"
    return runner, script, result.run_id


def seq_of(store: MemoryStore, run_id: str, kind: str, nth: int = 0) -> int:
    return [e.seq for e in store.load_events(run_id, tenant="acme") if e.type == kind][nth]


def test_a_fork_after_the_tool_results_asks_the_model_again_with_that_history() -> None:
    store = MemoryStore()
    runner, script, original = finished_run(store)
    before = store.load_events(original, tenant="acme")
    at = seq_of(store, original, "results_returned")

    fork = runner.fork(original, at_event=at, tenant="acme")

    assert fork.id != original
    assert fork.spec["forked_from"] == {"run_id": original, "step": at}
    assert fork.spec["tool_schemas"] == runner.load(original, tenant="acme").spec["tool_schemas"]
    assert fork.status == "thinking"
    assert fork.tenant == "acme"
    result = runner.drive(fork.id, tenant="acme")
    assert (result.status, result.output) == ("done", "forked answer")
    assert script.requests[2].messages == script.requests[1].messages  # the same history the model saw then
    assert store.load_events(original, tenant="acme") == before  # the original is untouched


def test_a_step_in_the_middle_of_a_turn_is_refused_naming_the_nearest_steps() -> None:
    store = MemoryStore()
    runner, _, original = finished_run(store)
    asked = seq_of(store, original, "model_responded")  # the model's tool call has no result yet
    prompt_point, results_point = seq_of(store, original, "transition"), seq_of(store, original, "results_returned")

    with pytest.raises(InvalidForkPoint, match="toolu_1 have no results") as refused:
        runner.fork(original, at_event=asked, tenant="acme")

    assert refused.value.nearest == (prompt_point, results_point)
    assert f"{prompt_point} or {results_point}" in str(refused.value)
    assert [r.id for r in store.list_runs()] == [original]  # nothing was created


def test_the_final_answer_and_steps_out_of_range_are_refused() -> None:
    store = MemoryStore()
    runner, _, original = finished_run(store)
    last = store.load_events(original, tenant="acme")[-1].seq
    with pytest.raises(InvalidForkPoint, match="answer ends the history"):
        runner.fork(original, at_event=last, tenant="acme")
    with pytest.raises(InvalidForkPoint, match=f"has events 0 to {last}"):
        runner.fork(original, at_event=last + 1, tenant="acme")
    with pytest.raises(InvalidForkPoint, match="has events 0 to"):
        runner.fork(original, at_event=-1, tenant="acme")


def test_fork_points_are_where_the_history_ends_with_a_user_turn() -> None:
    store = MemoryStore()
    _, _, original = finished_run(store)
    events = store.load_events(original, tenant="acme")
    results = seq_of(store, original, "results_returned")
    assert fork_points(events) == [0, 1, results, results + 1]


def test_an_edited_prompt_is_what_the_fork_sends() -> None:
    store = MemoryStore()
    runner, script, original = finished_run(store)

    fork = runner.fork(original, at_event=1, edit=MessageEdit(0, "What is 4 + 4?"), tenant="acme")
    runner.drive(fork.id, tenant="acme")

    assert script.requests[-1].messages[0]["content"][0]["text"] == "What is 4 + 4?"
    assert runner.load(original, tenant="acme").messages[0]["content"][0]["text"] == "What is 2 + 3?"


def test_an_edit_of_a_message_without_text_or_out_of_range_is_refused() -> None:
    store = MemoryStore()
    runner, _, original = finished_run(store)
    at = seq_of(store, original, "results_returned")
    with pytest.raises(InvalidForkPoint, match="message 2 holds no text to edit \\(only tool_result\\)"):
        runner.fork(original, at_event=at, edit=MessageEdit(-1, "hi"), tenant="acme")
    with pytest.raises(InvalidForkPoint, match="has messages 0 to 2, not 3"):
        runner.fork(original, at_event=at, edit=MessageEdit(3, "hi"), tenant="acme")
    with pytest.raises(InvalidForkPoint, match="edited text is empty"):
        runner.fork(original, at_event=at, edit=MessageEdit(0, "  "), tenant="acme")
    assert [r.id for r in store.list_runs()] == [original]
    prompt = runner.fork(original, at_event=at, edit=MessageEdit(None, "Add 4 and 4."), tenant="acme")
    assert prompt.messages[0]["content"] == [{"type": "text", "text": "Add 4 and 4."}]  # None: the last user text


def test_another_tenants_run_cannot_be_forked() -> None:
    store = MemoryStore()
    runner, _, original = finished_run(store)
    with pytest.raises(RunNotFound):
        runner.fork(original, at_event=1, tenant="other")


async def test_the_async_runner_forks_the_same_way() -> None:
    store = MemoryStore()
    script = Script()
    runner = AsyncRunner(Agent(model=ScriptedModel(script), tools=[add]), store)
    original = (await runner.run("What is 2 + 3?", tenant="acme")).run_id

    fork = await runner.fork(original, at_event=seq_of(store, original, "results_returned"), tenant="acme")
    result = await runner.drive(fork.id, tenant="acme")

    assert fork.spec["forked_from"]["run_id"] == original
    assert result.output == "forked answer"
    assert script.requests[2].messages == script.requests[1].messages


def sql_run(tmp_path: Path) -> tuple[str, str]:
    """A finished run in a SQLite file, for the CLI: (database URL, run id)."""
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SQLStore(db)
    try:
        return db, Runner(Agent(model=ScriptedModel(Script()), tools=[add]), store).run("What is 2 + 3?").run_id
    finally:
        store.close()


def test_tether_fork_makes_the_fork_and_show_names_its_origin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, original = sql_run(tmp_path)

    assert main(["fork", original, "--at", "0", "--text", "What is 4 + 4?", "--json", "--db", db]) == 0
    fork = json.loads(capsys.readouterr().out)
    assert fork["status"] == "thinking"
    assert fork["forked_from"] == {"run_id": original, "step": 0}

    assert main(["show", fork["run_id"], "--json", "--db", db]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["forked_from"] == {"run_id": original, "step": 0}
    assert shown["messages"] == [{"role": "user", "content": [{"type": "text", "text": "What is 4 + 4?"}]}]
    assert main(["show", fork["run_id"], "--db", db]) == 0
    assert f"forked from run {original} at event 0" in capsys.readouterr().out


def test_tether_fork_refuses_a_bad_step_or_edit_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, original = sql_run(tmp_path)
    assert main(["fork", original, "--at-event", "2", "--db", db]) == 2
    assert "have no results there yet; the nearest events that can be forked: 1 or 6" in capsys.readouterr().err
    assert main(["fork", original, "--at", "1", "--edit-message", "0", "--db", db]) == 2
    assert "--edit-message K needs --text" in capsys.readouterr().err
    assert main(["runs", "--json", "--db", db]) == 0
    assert [run["run_id"] for run in json.loads(capsys.readouterr().out)["runs"]] == [original]


def test_a_fork_after_a_handoff_is_driven_by_the_agent_then_in_charge() -> None:
    def team() -> tuple[Agent, ScriptedModel, ScriptedModel]:
        transfer = tool_use_turn(tool_use("toolu_t1", "transfer_to_billing", {}))
        billing_model = ScriptedModel(lambda request: answer("billing here"))
        triage_model = ScriptedModel(lambda request: transfer)
        billing = Agent(billing_model, name="billing")
        return Agent(triage_model, name="triage", handoffs=[Handoff(billing)]), triage_model, billing_model

    store = MemoryStore()
    triage, _, _ = team()
    original = Runner(triage, store).run("I was charged twice").run_id
    results = next(e.seq for e in store.load_events(original) if e.type == "results_returned")

    triage, triage_model, billing_model = team()  # a fresh process
    runner = Runner(triage, store)
    handed = runner.fork(original, at_event=results)
    from_the_start = runner.fork(original, at_event=1)

    assert handed.spec["handed_to"] == "billing"
    assert "handed_to" not in from_the_start.spec
    assert runner.drive(handed.id).output == "billing here"
    assert (len(triage_model.requests), len(billing_model.requests)) == (0, 1)
    runner.drive(from_the_start.id)
    assert len(triage_model.requests) == 1  # triage asked first, as in the original


def _review_team(child_replies: list[Any], parent_replies: list[Any]) -> Agent:
    reviewer = Agent(ScriptedModel(child_replies), tools=[add], name="reviewer")
    review = reviewer.as_tool("review", "Have the reviewer check a sum.")
    return Agent(ScriptedModel(parent_replies), tools=[review], name="writer")


REVIEW = tool_use_turn(tool_use("toolu_review", "review", {"task": "check 2 + 3"}))


def test_a_fork_of_a_child_run_is_a_root_run_driven_with_the_childs_agent() -> None:
    from tether.core.children import child_run_id
    from tether.core.links import link_of

    store = MemoryStore()
    sums = tool_use_turn(tool_use("toolu_add", "add", {"a": 2, "b": 3}))
    runner = Runner(_review_team([sums, answer("5")], [REVIEW, answer("ok")]), store)
    parent = runner.run("write").run_id
    child = child_run_id(parent, "toolu_review", 1)
    at = next(e.seq for e in store.load_events(child) if e.type == "results_returned")

    fork = runner.fork(child, at_event=at)

    assert link_of(fork.spec) is None  # a root run: listed, resumed and retried as one
    assert fork.spec["forked_from"]["agent_of"] == store.load_run(child).spec["parent"]
    assert [r.id for r in store.list_runs()].count(fork.id) == 1
    again = runner.fork(child, at_event=at)
    result = runner.drive(fork.id)  # the root's runner drives it with the reviewer's model and tools
    assert (result.status, result.output) == ("done", "5")
    reviewer = Agent(ScriptedModel([sums, answer("5")]), tools=[add], name="reviewer")  # as `tether resume` builds it
    assert Runner(reviewer, store).drive(again.id).output == "5"
    assert runner.load(parent).status == "done"


def test_a_fork_of_a_parent_calls_its_agent_tool_with_a_child_of_its_own() -> None:
    from tether.core.children import child_run_id

    store = MemoryStore()
    runner = Runner(_review_team([answer("looks right")], [REVIEW, answer("ok"), REVIEW, answer("ok again")]), store)
    original = runner.run("write").run_id
    first_child = child_run_id(original, "toolu_review", 1)
    before = store.load_events(first_child)
    at = 1  # before the review: the fork's model calls the tool again, with the same call id

    fork = runner.fork(original, at_event=at)
    result = runner.drive(fork.id)

    assert result.status == "done"
    own = child_run_id(fork.id, "toolu_review", 1)
    assert runner.load(fork.id).children == {"toolu_review": own}
    assert store.load_run(own).spec["parent"]["run_id"] == fork.id
    assert store.load_events(first_child) == before  # the original's child is neither adopted nor driven


def test_at_step_is_the_deprecated_name_of_at_event(tmp_path: Path) -> None:
    """A step is a model invocation; a fork starts at an event: the old keyword still works, and says so."""
    done = model_reply([{"type": "text", "text": "hello"}], "end_turn")
    runner = Runner(Agent(model=ScriptedModel([done]), tools=[]), MemoryStore())
    run_id = runner.run("hi").run_id
    with pytest.warns(DeprecationWarning, match="pass at_event="):
        fork = runner.fork(run_id, at_step=0)
    assert fork.spec["forked_from"] == {"run_id": run_id, "step": 0}
    with pytest.raises(ConfigError, match="not both"):
        runner.fork(run_id, at_event=0, at_step=0)
