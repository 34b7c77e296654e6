"""Whole runs through each provider's real client and adapter, against its strict fake API.

Every scenario runs four times: Claude's adapter against FakeMessagesAPI and the OpenAI adapter
against FakeChatCompletionsAPI, each driven by :class:`tether.Runner` and
:class:`tether.AsyncRunner` (the ``h`` fixture, in conftest.py). Turns are scripted and
requests read back in tether's own terms (see wires.py); each fake refuses what its API
refuses (broken pairing, roles, order), so a scenario passing on both means the same engine
and the same machine speak both APIs exactly. Claude-only behaviour (pause_turn, prompt
caching, the SDK's param types) is in test_anthropic_scenarios.py.
"""

from __future__ import annotations

import pydantic
import pytest

from support import closed_port, settled, token_usage
from tether import Approve, AsyncRunner, Deny, Limits
from tether.core.approvals import DecideLater
from tether.facts import events as ev
from tether.facts.history import check_pairing
from tether.models import Usage
from tether.policy.compaction import DROPPED_RESULT, SUMMARY_HEADER, DropToolResults, HistoryProcessor, Summarise
from tether.stores.memory import MemoryStore
from tether.tools import Tool
from tether.tools.output import OUTPUT_TOOL
from wires import Calls, Harness, event_types, user_text


# Answers and tool calls ----------------------------------------------------------------------
async def test_text_only_answer(h: Harness) -> None:
    h.api.reply_text("Hello there.", usage=token_usage(120, 7, created=100, read=20))
    runner = h.runner(system="Be brief.")

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert result.output == "Hello there."
    assert result.error is None
    assert (result.steps, result.tool_calls) == (1, 0)
    assert result.usage == Usage(120, 7, 100, 20)
    h.api.assert_valid(expected=1)
    assert h.api.sent(0) == [user_text("Hi")]
    assert h.api.sent_system(0) == "Be brief."
    assert h.api.sent_tools(0) == []
    assert h.api.sent_max_tokens(0) == Limits().max_tokens
    history = (await settled(runner.load(result.run_id))).messages
    assert history[-1] == {"role": "assistant", "content": [{"type": "text", "text": "Hello there."}]}


async def test_a_streamed_run_tells_the_text_and_records_the_same_turn(h: Harness) -> None:
    h.api.reply_text("It is sunny in Oslo today.")
    told: list[str] = []
    runner = h.runner()
    runner.on_text = told.append

    result = await h.run(runner, "Weather?")

    assert result.status == "done", result.error
    assert "".join(told) == "It is sunny in Oslo today."
    assert len(told) > 1
    assert h.api.requests[0]["stream"] is True
    h.api.assert_valid(expected=1)


async def test_one_tool_call_then_answer(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    call_id = h.api.reply_tool_use(
        "get_weather", {"city": "Paris"}, text="Let me check.", usage=token_usage(50, 10, created=40)
    )
    h.api.reply_text("It is 21 degrees in Paris.", usage=token_usage(70, 9, read=40))
    runner = h.runner([tools["get_weather"]])

    result = await h.run(runner, "Weather in Paris?")

    assert result.status == "done", result.error
    assert result.output == "It is 21 degrees in Paris."
    assert (result.steps, result.tool_calls) == (2, 1)
    assert result.usage == Usage(120, 19, 40, 40)
    assert calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    h.api.assert_valid(expected=2)
    assert h.api.sent_tools(0) == h.api.sent_tools(1) == ["get_weather"]
    assert h.api.sent(1) == [
        user_text("Weather in Paris?"),
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "Paris: 21 degrees celsius"}],
        },
    ]


async def test_three_parallel_calls_answered_in_one_message_in_call_order(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    ids = ["toolu_c", "toolu_a", "toolu_b"]  # not sorted: order must follow the calls
    h.api.reply(
        {
            "content": [
                {"type": "text", "text": "Three lookups."},
                *({"type": "tool_use", "id": i, "name": "lookup", "input": {"key": i[-1]}} for i in ids),
            ]
        }
    )
    h.api.reply_text("c, a and b found.")
    runner = h.runner([tools["lookup"]])

    result = await h.run(runner, "Look up c, a, b")

    assert result.status == "done", result.error
    assert result.tool_calls == 3
    assert [c[1]["key"] for c in calls] == ["c", "a", "b"]
    h.api.assert_valid(expected=2)
    messages = h.api.sent(1)
    assert len(messages) == 3
    results = messages[2]["content"]
    assert messages[2]["role"] == "user"
    assert [b["type"] for b in results] == ["tool_result"] * 3
    assert [b["tool_use_id"] for b in results] == ids
    assert [b["content"] for b in results] == ["value of c", "value of a", "value of b"]
    assert all("is_error" not in b for b in results)


async def test_null_tool_arguments_survive_the_round_trip(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    call_id = h.api.reply_tool_use("search", {"query": "q", "limit": None})
    h.api.reply_text("Done.")
    runner = h.runner([tools["search"]])

    result = await h.run(runner, "Search q")

    assert result.status == "done", result.error
    assert calls == [("search", {"query": "q", "limit": None})]
    h.api.assert_valid(expected=2)
    replayed = h.api.sent(1)[1]["content"][0]
    assert replayed["id"] == call_id
    assert replayed["input"] == {"query": "q", "limit": None}  # what the model sent, exactly


async def test_final_tool_ends_the_run_with_the_validated_input(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply_tool_use("submit_answer", {"answer": "42", "confidence": "0.9"})
    h.api.reply_text("never requested")
    runner = h.runner([tools["submit_answer"], tools["lookup"]])

    result = await h.run(runner, "Answer")

    assert result.status == "done", result.error
    assert result.result == {"answer": "42", "confidence": 0.9}
    assert result.steps == 1
    assert calls == []  # a final tool's input is the result; its function is not run
    assert h.api.pending == 1
    h.api.assert_valid(expected=1)


class Invoice(pydantic.BaseModel):
    """An invoice."""

    invoice_id: str
    amount: float


async def test_a_typed_result_asked_again_with_its_tool_forced_after_prose(h: Harness) -> None:
    h.api.reply_text("INV-7 is 120 dollars.")
    h.api.reply_tool_use(OUTPUT_TOOL, {"invoice_id": "INV-7", "amount": 120})
    runner = h.runner(output_type=Invoice)

    result = await h.run(runner, "How much is INV-7?")

    assert result.status == "done", result.error
    assert result.result == Invoice(invoice_id="INV-7", amount=120)
    h.api.assert_valid(expected=2)
    assert h.api.sent_tools(0) == [OUTPUT_TOOL]
    assert [h.api.sent_tool_choice(i) for i in range(2)] == [None, OUTPUT_TOOL]
    assert [m["role"] for m in h.api.sent(1)] == ["user", "assistant", "user"]


async def test_a_compacted_history_is_sent_and_taken_by_each_api(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    for n in range(3):
        h.api.reply_tool_use("lookup", {"key": str(n)})
    h.api.reply_text("Keys 0 and 1 were looked up.")  # the summary call
    h.api.reply_text("All three found.")
    processors: list[HistoryProcessor] = [DropToolResults(keep_last=1), Summarise(keep_last=1, when_over=2)]
    runner = h.runner([tools["lookup"]], history_processors=processors)

    result = await h.run(runner, "Look up 0, 1 and 2")

    assert result.status == "done", result.error
    assert len(calls) == 3
    h.api.assert_valid(expected=5)
    assert h.api.sent_tools(3) == []  # the summary call
    assert [b["content"] for b in h.api.sent(2)[2]["content"]] == [DROPPED_RESULT]  # an old body, dropped
    summarised = h.api.sent(4)
    assert summarised[0]["content"][-1]["text"] == f"{SUMMARY_HEADER}\nKeys 0 and 1 were looked up."
    assert [m["role"] for m in summarised] == ["user", "assistant", "user"]
    assert (await settled(runner.load(result.run_id))).messages[:-1] == summarised


# Errors the model can read -------------------------------------------------------------------
async def test_raising_tool_gives_is_error_with_message_verbatim(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    call_id = h.api.reply_tool_use("query", {"sql": "select 1"})
    h.api.reply_text("The database is locked.")
    runner = h.runner([tools["query"]])

    result = await h.run(runner, "Query it")

    assert result.status == "done", result.error
    assert result.output == "The database is locked."
    assert calls == [("query", {"sql": "select 1"})]
    h.api.assert_valid(expected=2)
    (block,) = h.api.sent(1)[2]["content"]
    assert block["tool_use_id"] == call_id
    assert block["is_error"] is True
    assert (
        block["content"]
        == "Error (retryable): tool 'query' raised RuntimeError: database is locked (code 5): 'main.db'"
    )


async def test_unknown_tool_and_invalid_arguments_are_is_error_results(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply(
        {
            "content": [
                {"type": "tool_use", "id": "toolu_unknown", "name": "launch_rockets", "input": {"n": 3}},
                {"type": "tool_use", "id": "toolu_bad", "name": "get_weather", "input": {"town": "Paris"}},
            ]
        }
    )
    h.api.reply_text("Sorry.")
    weather = tools["get_weather"]
    runner = h.runner([weather, tools["lookup"]])
    with pytest.raises(pydantic.ValidationError) as invalid:
        weather.validate({"town": "Paris"})

    result = await h.run(runner, "Go")

    assert result.status == "done", result.error
    assert calls == []
    assert result.tool_calls == 0
    h.api.assert_valid(expected=2)
    unknown, bad = h.api.sent(1)[2]["content"]
    assert unknown["tool_use_id"] == "toolu_unknown"
    assert unknown["is_error"] is True
    assert "unknown tool 'launch_rockets'" in unknown["content"]
    assert "get_weather" in unknown["content"]
    assert "lookup" in unknown["content"]
    assert bad["tool_use_id"] == "toolu_bad"
    assert bad["is_error"] is True
    assert bad["content"] == f"Error: invalid arguments for tool 'get_weather': {invalid.value}"


async def test_max_steps_stops_a_model_that_keeps_calling_tools(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    for n in range(3):
        h.api.reply_tool_use("lookup", {"key": str(n)})
    runner = h.runner([tools["lookup"]], limits=Limits(max_steps=2))

    result = await h.run(runner, "Loop")

    assert result.status == "failed"
    assert result.error is not None
    assert "max_steps limit reached: 2" in result.error
    assert result.steps == 2
    assert len(calls) == 2
    assert h.api.pending == 1
    h.api.assert_valid(expected=2)
    history = (await settled(runner.load(result.run_id))).messages
    assert history[-1]["role"] == "user"  # the last results are kept, ready to continue
    check_pairing(history, run_id=result.run_id)


# Stop reasons --------------------------------------------------------------------------------
async def test_tool_use_cut_off_at_max_tokens_is_not_run_and_asked_again_with_more(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply(
        {
            "content": [
                {"type": "text", "text": "Writing the file."},
                {"type": "tool_use", "id": "toolu_cut", "name": "write_file", "input": {"path": "a.txt"}},
            ],
            "stop_reason": "max_tokens",
            "usage": token_usage(30, 4096),
        }
    )
    call_id = h.api.reply_tool_use("write_file", {"path": "a.txt", "content": "x" * 10}, usage=token_usage(30, 5000))
    h.api.reply_text("Done writing.", usage=token_usage(40, 4))
    runner = h.runner([tools["write_file"]], limits=Limits(max_tokens=4096))

    result = await h.run(runner, "Write a.txt")

    assert result.status == "done", result.error
    assert calls == [("write_file", {"path": "a.txt", "content": "x" * 10})]
    assert result.steps == 3
    assert result.usage == Usage(100, 9100)
    h.api.assert_valid(expected=3)
    assert [h.api.sent_max_tokens(i) for i in range(3)] == [4096, 8192, 8192]
    assert h.api.sent(1) == [user_text("Write a.txt")]  # the cut turn is dropped
    history = (await settled(runner.load(result.run_id))).messages
    assert "toolu_cut" not in repr(history)
    assert history[1]["content"][0]["id"] == call_id
    assert ev.Warned.kind in await event_types(runner, result.run_id)


async def test_tool_use_cut_off_at_the_ceiling_fails(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    cut = {
        "content": [{"type": "tool_use", "id": "toolu_cut", "name": "write_file", "input": {"path": "a"}}],
        "stop_reason": "max_tokens",
    }
    h.api.reply(cut)
    h.api.reply(cut)
    runner = h.runner([tools["write_file"]], limits=Limits(max_tokens=1000, max_tokens_ceiling=2000))

    result = await h.run(runner, "Write")

    assert result.status == "failed"
    assert result.error is not None
    assert "max_tokens=2000" in result.error
    assert "not run" in result.error
    assert calls == []
    assert [h.api.sent_max_tokens(i) for i in range(2)] == [1000, 2000]
    h.api.assert_valid(expected=2)


async def test_refusal_with_text_fails_with_the_text(h: Harness) -> None:
    h.api.reply({"content": [{"type": "text", "text": "I can't help with that."}], "stop_reason": "refusal"})
    runner = h.runner()

    result = await h.run(runner, "Bad idea")

    assert result.status == "failed"
    assert result.error == "the model refused: I can't help with that."


# API errors ----------------------------------------------------------------------------------
async def test_429_is_retried_by_the_sdk_within_one_step(h: Harness) -> None:
    h.api.fail(429, "Number of request tokens has exceeded your rate limit.")
    h.api.reply_text("Made it.", usage=token_usage(11, 3))
    runner = h.runner(model=h.model(max_retries=2))

    result = await h.run(runner, "Hi")

    assert result.status == "done", result.error
    assert result.output == "Made it."
    assert result.steps == 1
    assert result.usage == Usage(11, 3)
    assert h.api.requests[0] == h.api.requests[1]
    h.api.assert_valid(expected=2)


async def test_400_fails_the_run_with_history_intact(h: Harness, tools: dict[str, Tool]) -> None:
    h.api.reply_tool_use("lookup", {"key": "k"})
    h.api.fail(400, "messages.2.content.0: something the API disliked")
    runner = h.runner([tools["lookup"]])
    state = await settled(runner.create("Look k up"))

    result = await h.drive(runner, state)

    assert result.status == "failed"
    assert (
        result.error == f"model call failed: {h.api.error_prefix} 400: messages.2.content.0: something the API disliked"
    )
    assert result.steps == 1
    h.api.assert_valid(expected=2)
    loaded = await settled(runner.load(result.run_id))
    assert loaded.messages == h.api.sent(1)  # unchanged from before the failed call
    assert loaded.messages == state.messages
    assert [m["role"] for m in loaded.messages] == ["user", "assistant", "user"]
    types = await event_types(runner, result.run_id)
    assert types.count(ev.ModelResponded.kind) == 1
    assert types[-1] == ev.RunFinished.kind


async def test_400_on_the_first_call_leaves_only_the_prompt(h: Harness) -> None:
    h.api.fail(400, "max_tokens: too large for this model")
    runner = h.runner()

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error == f"model call failed: {h.api.error_prefix} 400: max_tokens: too large for this model"
    assert (await settled(runner.load(result.run_id))).messages == [user_text("Hi")]
    assert result.steps == 0


async def test_5xx_exhausting_retries_fails_resumably_and_a_resume_tries_again(h: Harness) -> None:
    for _ in range(3):
        h.api.fail(500, "Internal server error")
    h.api.reply_text("back")
    runner = h.runner(model=h.model(max_retries=2))

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error == (
        f"model call failed: {h.api.error_prefix} 500: Internal server error (transient: resume the run to try again)"
    )
    resumed = await h.drive(runner, result.run_id)
    assert resumed.status == "done", resumed.error
    assert resumed.output == "back"
    h.api.assert_valid(expected=4)


async def test_unreachable_api_fails_with_cannot_reach(h: Harness) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}" + ("/v1" if h.api.provider == "openai" else "")
    runner = h.runner(model=h.model(base_url=url, max_retries=0))

    result = await h.run(runner, "Hi")

    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith(f"model call failed: {h.api.unreachable}")
    assert h.api.requests == []
    assert (await settled(runner.load(result.run_id))).messages == [user_text("Hi")]


# Approvals, crash and resume -----------------------------------------------------------------
async def test_a_gated_call_parks_the_run_and_runs_once_approved(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    call_id = h.api.reply_tool_use("delete_file", {"path": "old.log"}, text="Deleting it.")
    h.api.reply_text("Deleted.")
    runner = h.runner([tools["delete_file"]], approver=DecideLater())

    parked = await h.run(runner, "Delete old.log")
    assert parked.status == "awaiting_approval"
    assert calls == []
    (await settled(runner.decide(parked.run_id, call_id, Approve(actor="alice"))))
    result = await h.drive(runner, parked.run_id)

    assert result.status == "done", result.error
    assert calls == [("delete_file", {"path": "old.log"})]
    h.api.assert_valid(expected=2)
    assert h.api.sent(1)[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "deleted"}],
    }


async def test_a_denied_call_reaches_the_model_as_an_error_it_can_read(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    call_id = h.api.reply_tool_use("delete_file", {"path": "/etc"})
    h.api.reply_text("Understood.")
    runner = h.runner([tools["delete_file"]], approver=DecideLater())
    parked = await h.run(runner, "Delete /etc")

    (await settled(runner.decide(parked.run_id, call_id, Deny(reason="never /etc", actor="bob"))))
    result = await h.drive(runner, parked.run_id)

    assert result.status == "done", result.error
    assert calls == []
    (denied,) = h.api.sent(1)[2]["content"]
    assert denied["is_error"] is True
    assert denied["content"] == "Error: the call was denied by bob: never /etc"


async def test_a_new_process_resumes_from_the_last_committed_step(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    call_id = h.api.reply_tool_use("lookup", {"key": "k"})
    h.api.reply_text("Found it.")
    store = MemoryStore()
    first = h.runner([tools["lookup"]], store=store)
    state = await settled(first.create("Look k up"))
    if isinstance(first, AsyncRunner):  # the model's turn is committed, then the process "dies"
        async with first.hold(state.id):
            await first.step(state)
    else:
        with first.hold(state.id):
            first.step(state)

    result = await h.drive(h.runner([tools["lookup"]], store=store), state.id)

    assert result.status == "done", result.error
    assert calls == [("lookup", {"key": "k"})]
    assert result.steps == 2
    h.api.assert_valid(expected=2)
    assert h.api.sent(1)[1]["content"] == [{"type": "tool_use", "id": call_id, "name": "lookup", "input": {"key": "k"}}]


# Conversations (--continue) ------------------------------------------------------------------
async def test_continue_sends_the_whole_history_and_the_new_prompt(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply_tool_use("get_weather", {"city": "Oslo"}, text="Checking.")
    h.api.reply_text("Oslo is at 21 degrees.")
    h.api.reply_text("Bring a light jacket.")
    runner = h.runner([tools["get_weather"]])
    first = await h.run(runner, "Weather in Oslo?")
    assert first.status == "done", first.error
    first_history = (await settled(runner.load(first.run_id))).messages

    second = await settled(runner.create("Should I bring a jacket?", continue_from=first.run_id))
    result = await h.drive(runner, second)

    assert result.status == "done", result.error
    assert result.output == "Bring a light jacket."
    assert result.run_id != first.run_id
    h.api.assert_valid(expected=3)
    sent = h.api.sent(2)
    assert sent == [*first_history, user_text("Should I bring a jacket?")]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert (await settled(runner.load(first.run_id))).messages == first_history  # the parent is untouched


async def test_continue_after_results_merges_the_prompt_after_them(
    h: Harness, tools: dict[str, Tool], calls: Calls
) -> None:
    h.api.reply_tool_use("lookup", {"key": "a"})
    runner = h.runner([tools["lookup"]], limits=Limits(max_steps=1))
    first = await h.run(runner, "Start")
    assert first.status == "failed"
    h.api.reply_text("Continuing.")

    result = await h.run(runner, "Go on", continue_from=first.run_id)

    # max_steps counts the new run's own model calls: one is allowed again
    assert result.status == "done", result.error
    h.api.assert_valid(expected=2)
    sent = h.api.sent(1)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result", "text"]
    assert sent[2]["content"][1]["text"] == "Go on"


async def test_continue_after_a_cancelled_approval_is_valid(h: Harness, tools: dict[str, Tool], calls: Calls) -> None:
    call_id = h.api.reply_tool_use("delete_file", {"path": "/etc/passwd"})
    runner = h.runner([tools["delete_file"]])
    first = await h.run(runner, "Clean up")
    assert first.status == "awaiting_approval"
    (await settled(runner.cancel(first.run_id, "changed my mind")))
    h.api.reply_text("OK, nothing deleted.")

    state = await settled(runner.create("Never mind, just list the files", continue_from=first.run_id))
    result = await h.drive(runner, state)

    assert result.status == "done", result.error
    assert calls == []
    h.api.assert_valid(expected=2)
    sent = h.api.sent(1)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    answer, prompt = sent[2]["content"]
    assert answer["type"] == "tool_result"
    assert answer["tool_use_id"] == call_id
    assert answer["is_error"] is True
    assert prompt == {"type": "text", "text": "Never mind, just list the files"}


@pytest.mark.parametrize("stop_reason", ["refusal", "end_turn"])
async def test_continue_after_an_empty_or_refused_turn_is_valid(h: Harness, stop_reason: str) -> None:
    h.api.reply({"content": [], "stop_reason": stop_reason})
    h.api.reply_text("Second try.")
    runner = h.runner()
    first = await h.run(runner, "First")
    assert first.status in ("done", "failed")

    result = await h.run(runner, "Again", continue_from=first.run_id)

    h.api.assert_valid(expected=2)
    assert result.status == "done", result.error
