"""Context management: history processors keep a long run within the model's context.

Each compaction is a step of its own (the machine's ``compacted``) recording the new history
whole, so a resume rebuilds exactly what the model is sent; a summary is a model call of its
own; pairing is never broken; an overflow is compacted and asked again, once.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tether import Runner, tool
from tether.agent import Agent
from tether.errors import ConfigError, ModelError
from tether.facts import events as ev
from tether.facts.events import Event
from tether.facts.history import check_pairing
from tether.models import ModelRequest, ModelResponse, Usage
from tether.models.scripted import ScriptedModel
from tether.policy.compaction import (
    DROPPED_RESULT,
    SUMMARY_HEADER,
    DropToolResults,
    HistoryProcessor,
    KeepLastTurns,
    Summarise,
    rounds,
)
from tether.stores.memory import MemoryStore

Message = dict[str, Any]


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def prompt(text: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def asks(*keys: str, prefix: str = "c") -> Message:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": f"{prefix}_{k}", "name": "lookup", "input": {"key": k}} for k in keys],
    }


def results(*keys: str, prefix: str = "c") -> Message:
    blocks = [{"type": "tool_result", "tool_use_id": f"{prefix}_{k}", "content": f"value of {k}"} for k in keys]
    return {"role": "user", "content": blocks}


def tool_rounds(count: int) -> list[Message]:
    history = [prompt("Look everything up.")]
    for n in range(count):
        history += [asks(str(n)), results(str(n))]
    return history


def call(key: str) -> dict[str, Any]:
    block = {"type": "tool_use", "id": f"toolu_{key}", "name": "lookup", "input": {"key": key}}
    return {"content": [block], "stop_reason": "tool_use"}


def answer(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}


def kinds(runner: Runner, run_id: str) -> list[str]:
    return [event.type for event in runner.store.load_events(run_id)]


# The processors alone ------------------------------------------------------------------------
def test_keep_last_turns_keeps_the_task_and_the_last_rounds() -> None:
    history = tool_rounds(5)

    kept = KeepLastTurns(2).compact(history, forced=False)

    assert kept == [history[0], *history[-4:]]
    assert KeepLastTurns(5).compact(history, forced=False) is None
    assert KeepLastTurns(2).compact(kept or [], forced=False) is None  # nothing more to do


def test_drop_tool_results_keeps_every_call_but_old_bodies() -> None:
    history = tool_rounds(3)
    history[2]["content"][0]["is_error"] = True

    dropped = DropToolResults(keep_last=1).compact(history, forced=False)

    assert dropped is not None
    assert [b["content"] for m in dropped[2:5:2] for b in m["content"]] == [DROPPED_RESULT, DROPPED_RESULT]
    assert dropped[2]["content"][0]["is_error"] is True
    assert dropped[-1] == history[-1]  # the latest results: the model has not read them yet
    assert DropToolResults(keep_last=1).compact(dropped, forced=False) is None


@pytest.mark.parametrize("seed", range(30))
def test_no_processor_ever_breaks_the_pairing(seed: int) -> None:
    rng = random.Random(seed)
    history = [prompt("task")]
    for n in range(rng.randint(0, 9)):
        keys = [f"{n}{i}" for i in range(rng.randint(1, 3))]
        history += [asks(*keys), results(*keys)]
        if rng.random() < 0.3:  # a continued conversation: a prompt after the results
            history[-1] = {"role": "user", "content": [*history[-1]["content"], prompt("and then?")["content"][0]]}
        if rng.random() < 0.2:
            history += [{"role": "assistant", "content": [{"type": "text", "text": "Noted."}]}, prompt("go on")]
    processors: list[HistoryProcessor] = [KeepLastTurns(rng.randint(1, 4)), DropToolResults(rng.randint(1, 3))]
    summarise = Summarise(keep_last=rng.randint(1, 3), when_over=4)

    for processor in processors:
        compacted = processor.compact(history, forced=False)
        if compacted is not None:
            check_pairing(compacted, run_id="fuzz")
            assert compacted[0] == history[0]
    plan = summarise.plan(history, forced=True)
    if plan is not None:
        check_pairing(plan.apply(history, "what happened"), run_id="fuzz")


def test_summarise_plans_a_transcript_of_the_rounds_it_replaces() -> None:
    history = tool_rounds(4)

    assert Summarise(keep_last=1, when_over=4).plan(history, forced=False) is None  # not over the threshold
    plan = Summarise(keep_last=1, when_over=3).plan(history, forced=False)

    assert plan is not None
    assert 'assistant called lookup {"key": "0"}' in plan.transcript
    assert "tool result: value of 2" in plan.transcript
    assert "value of 3" not in plan.transcript  # the kept round
    summarised = plan.apply(history, "Keys 0-2 were looked up.")
    assert summarised[0]["content"][-1]["text"] == f"{SUMMARY_HEADER}\nKeys 0-2 were looked up."
    assert summarised[1:] == history[-2:]
    assert Summarise(keep_last=1, when_over=9).plan(history, forced=True) is not None  # forced: below the threshold


def test_bad_processors_are_refused() -> None:
    with pytest.raises(ConfigError):
        KeepLastTurns(0)
    with pytest.raises(ConfigError):
        DropToolResults(keep_last=0)
    with pytest.raises(ConfigError):
        Summarise(keep_last=3, when_over=2)
    with pytest.raises(ConfigError, match="is not a history processor"):
        Agent(model=ScriptedModel([]), history_processors=[3])  # type: ignore[list-item]


# In a run ------------------------------------------------------------------------------------
def test_a_compaction_is_a_step_of_its_own_and_a_resume_rebuilds_it_exactly() -> None:
    model = ScriptedModel([call(str(n)) for n in range(4)] + [answer("All found.")])
    store = MemoryStore()
    runner = Runner(Agent(model=model, tools=[lookup], history_processors=[KeepLastTurns(2)]), store)

    result = runner.run("Look four keys up.")

    assert result.status == "done", result.error
    assert [len(rounds(r.messages)) for r in model.requests] == [0, 1, 2, 2, 2]
    assert model.requests[-1].messages[0] == prompt("Look four keys up.")
    assert kinds(runner, result.run_id).count(ev.HistoryCompacted.kind) == 2
    compactions = [e.fact for e in store.load_events(result.run_id) if isinstance(e.fact, ev.HistoryCompacted)]
    assert [(c.processor, c.removed, c.forced) for c in compactions] == [("keep_last_turns", 2, False)] * 2
    rebuilt = runner.load(result.run_id).messages
    assert rebuilt[:-1] == model.requests[-1].messages  # what the model was last sent, exactly
    assert result.steps == 5  # compactions are not model calls


def test_a_summary_is_a_model_call_recorded_with_its_usage() -> None:
    looked: list[str] = []

    def script(request: ModelRequest) -> ModelResponse | dict[str, Any]:
        if not request.tools:  # the summary call: no tools, the transcript
            usage = {"input_tokens": 50, "output_tokens": 9}
            return {"content": [{"type": "text", "text": "Keys 0 and 1 were looked up."}], "usage": usage}
        looked.append(str(len(looked)))
        return call(looked[-1]) if len(looked) <= 3 else answer("Done.")

    model = ScriptedModel(script)
    agent = Agent(model=model, tools=[lookup], history_processors=[Summarise(keep_last=1, when_over=2)])
    runner = Runner(agent)

    result = runner.run("Look keys up.")

    assert result.status == "done", result.error
    summary_calls = [r for r in model.requests if not r.tools]
    assert len(summary_calls) == 1
    assert "assistant called lookup" in summary_calls[0].messages[0]["content"][0]["text"]
    after = model.requests[model.requests.index(summary_calls[0]) + 1]
    assert after.messages[0]["content"][-1]["text"] == f"{SUMMARY_HEADER}\nKeys 0 and 1 were looked up."
    check_pairing(after.messages, run_id=result.run_id)
    (compacted,) = [e.fact for e in runner.store.load_events(result.run_id) if isinstance(e.fact, ev.HistoryCompacted)]
    assert compacted.summary == "Keys 0 and 1 were looked up."
    assert compacted.usage is not None
    assert compacted.usage.input_tokens == 50
    assert result.steps == len(model.requests)  # the summary counts as a model call
    assert result.usage.input_tokens >= 50


@pytest.mark.parametrize("overflow", ["error", "stop_reason"])
def test_an_overflow_is_compacted_forced_and_asked_again(overflow: str) -> None:
    too_long: Any = (
        ModelError("context window exceeded: prompt is too long", status=400, context_exceeded=True)
        if overflow == "error"
        else {"content": [], "stop_reason": "model_context_window_exceeded"}
    )
    replies = iter(
        [call("0"), call("1"), too_long, {"content": [{"type": "text", "text": "Summary."}]}, answer("Done.")]
    )
    model = ScriptedModel(lambda _: next(replies))  # in turn: a failed call takes no place of its own in a list
    agent = Agent(model=model, tools=[lookup], history_processors=[Summarise(keep_last=1, when_over=50)])
    runner = Runner(agent)

    result = runner.run("Look keys up.")

    assert result.status == "done", result.error
    events = [e.fact for e in runner.store.load_events(result.run_id)]
    assert [type(f).__name__ for f in events if isinstance(f, ev.ContextExceeded | ev.HistoryCompacted)] == [
        "ContextExceeded",
        "HistoryCompacted",
    ]
    compacted = next(f for f in events if isinstance(f, ev.HistoryCompacted))
    assert compacted.forced


def test_a_second_overflow_fails_the_run_saying_compaction_did_not_help() -> None:
    overflow = ModelError("context window exceeded: prompt is too long", status=400, context_exceeded=True)
    agent = Agent(
        model=ScriptedModel([call("0"), call("1"), overflow, overflow]),
        tools=[lookup],
        history_processors=[KeepLastTurns(1)],
    )

    result = Runner(agent).run("Look keys up.")

    assert result.status == "failed"
    assert result.error == (
        "model call failed: context window exceeded: prompt is too long "
        "(even after the history processors compacted it)"
    )


def test_without_processors_an_overflow_fails_as_before() -> None:
    overflow = ModelError("context window exceeded: prompt is too long", status=400, context_exceeded=True)

    result = Runner(Agent(model=ScriptedModel([overflow]))).run("Hi")

    assert result.status == "failed"
    assert result.error == "model call failed: context window exceeded: prompt is too long"


def test_show_counts_a_summarys_tokens_and_cost_on_its_event() -> None:
    import io

    from rich.console import Console  # noqa: TID251 - reads what the terminal layer prints

    from tether.surfaces.terminal import render_events

    summary = ev.HistoryCompacted("summarise", [prompt("task")], 4, False, "sum", Usage(50, 9), 0.0012, "m", 0.25)
    out = io.StringIO()

    render_events(Console(file=out, width=200), [Event(7, 1.0, summary)])

    assert "50/9/0/0" in out.getvalue()
    assert "0.001200" in out.getvalue()
