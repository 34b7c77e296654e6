"""The history rules: tool_use/tool_result pairing, the cache breakpoint, prompt merging."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tether.errors import InvalidHistory
from tether.facts.history import (
    CACHE_BREAKPOINT,
    append_user_text,
    check_pairing,
    text_block,
    text_of,
    tool_result_block,
    tool_uses,
    with_cache_breakpoints,
)

Message = dict[str, Any]


def user(*blocks: Any) -> Message:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: Any) -> Message:
    return {"role": "assistant", "content": list(blocks)}


def use(call_id: str, name: str = "lookup") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {"q": call_id}}


def result(call_id: str, content: str = "ok", *, is_error: bool = False) -> dict[str, Any]:
    return tool_result_block(call_id, content, is_error=is_error)


def txt(text: str) -> dict[str, Any]:
    return text_block(text)


# check_pairing: accepted ---------------------------------------------------------------
VALID: dict[str, list[Message]] = {
    "one user prompt": [user(txt("hi"))],
    "string content": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ],
    "text exchange": [user(txt("hi")), assistant(txt("hello")), user(txt("bye"))],
    "one tool round trip": [
        user(txt("hi")),
        assistant(txt("let me look"), use("toolu_1")),
        user(result("toolu_1")),
        assistant(txt("done")),
    ],
    "parallel calls answered in order": [
        user(txt("hi")),
        assistant(use("toolu_1"), use("toolu_2"), use("toolu_3")),
        user(result("toolu_1"), result("toolu_2"), result("toolu_3", is_error=True)),
    ],
    "parallel calls answered out of order": [
        user(txt("hi")),
        assistant(use("toolu_1"), use("toolu_2")),
        user(result("toolu_2"), result("toolu_1")),
    ],
    "text after the results": [
        user(txt("hi")),
        assistant(use("toolu_1")),
        user(result("toolu_1"), txt("and now something else")),
    ],
    "two rounds": [
        user(txt("hi")),
        assistant(use("toolu_1")),
        user(result("toolu_1")),
        assistant(use("toolu_2")),
        user(result("toolu_2")),
        assistant(txt("all done")),
    ],
    "ends on an assistant without tools (pause_turn prefix)": [
        user(txt("hi")),
        assistant(txt("thinking about it")),
    ],
}


@pytest.mark.parametrize("messages", list(VALID.values()), ids=list(VALID))
def test_check_pairing_accepts_valid_histories(messages: list[Message]) -> None:
    before = copy.deepcopy(messages)
    check_pairing(messages, run_id="r1")
    assert messages == before


# check_pairing: rejected ---------------------------------------------------------------
INVALID: dict[str, tuple[list[Message], str]] = {
    "empty history": ([], "must start with a user message"),
    "starts with assistant": ([assistant(txt("hello")), user(txt("hi"))], "must start with a user"),
    "tool_use at the end, unanswered": (
        [user(txt("hi")), assistant(use("toolu_1"))],
        r"tool_use ids \['toolu_1'\] have no tool_result",
    ),
    "missing result": (
        [user(txt("hi")), assistant(use("toolu_1")), user(txt("no result here"))],
        "do not answer",
    ),
    "one of two results missing": (
        [user(txt("hi")), assistant(use("toolu_1"), use("toolu_2")), user(result("toolu_1"))],
        "do not answer",
    ),
    "extra result": (
        [user(txt("hi")), assistant(use("toolu_1")), user(result("toolu_1"), result("toolu_9"))],
        "do not answer",
    ),
    "result for the wrong id": (
        [user(txt("hi")), assistant(use("toolu_1")), user(result("toolu_2"))],
        "do not answer",
    ),
    "duplicate result": (
        [user(txt("hi")), assistant(use("toolu_1")), user(result("toolu_1"), result("toolu_1"))],
        "do not answer",
    ),
    "results not first": (
        [user(txt("hi")), assistant(use("toolu_1")), user(txt("first"), result("toolu_1"))],
        "must come first",
    ),
    "result between texts": (
        [
            user(txt("hi")),
            assistant(use("toolu_1"), use("toolu_2")),
            user(result("toolu_1"), txt("x"), result("toolu_2")),
        ],
        "must come first",
    ),
    "result without a preceding tool_use": (
        [user(txt("hi")), assistant(txt("no tools")), user(result("toolu_1"))],
        "tool_result without a tool_use in the previous message",
    ),
    "result answering a tool_use two turns back": (
        [
            user(txt("hi")),
            assistant(use("toolu_1")),
            user(result("toolu_1")),
            assistant(txt("ok")),
            user(result("toolu_1")),
        ],
        "tool_result without a tool_use",
    ),
}


@pytest.mark.parametrize(("messages", "match"), list(INVALID.values()), ids=list(INVALID))
def test_check_pairing_rejects(messages: list[Message], match: str) -> None:
    with pytest.raises(InvalidHistory, match=match) as caught:
        check_pairing(messages, run_id="r1")
    assert caught.value.run_id == "r1"


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([user(result("toolu_1"))], id="result in the first message"),
        pytest.param([user(txt("hi")), user(result("toolu_1"))], id="result after a user message"),
    ],
)
def test_check_pairing_rejects_a_result_not_preceded_by_an_assistant(
    messages: list[Message],
) -> None:
    with pytest.raises(InvalidHistory):
        check_pairing(messages, run_id="r1")


# with_cache_breakpoints ----------------------------------------------------------------
def _count_marks(messages: list[Message]) -> int:
    return sum(1 for m in messages if isinstance(m["content"], list) for b in m["content"] if "cache_control" in b)


def _marked(block: dict[str, Any]) -> dict[str, Any]:
    return {**block, "cache_control": CACHE_BREAKPOINT}


def test_with_cache_breakpoints_marks_the_newest_block_and_where_the_previous_request_ended() -> None:
    messages = [
        user(txt("hi")),
        assistant(txt("a"), use("toolu_1")),
        user(result("toolu_1"), txt("tail")),
    ]
    marked = with_cache_breakpoints(messages)
    assert marked[-1]["content"] == [result("toolu_1"), _marked(txt("tail"))]
    assert marked[0]["content"] == [_marked(txt("hi"))]  # the previous request's newest block
    assert marked[1] is messages[1]
    assert _count_marks(marked) == 2
    assert [m["role"] for m in marked] == ["user", "assistant", "user"]


def test_with_cache_breakpoints_after_pause_turn_marks_the_request_before_the_partial_turn() -> None:
    messages = [user(txt("hi")), assistant(txt("a")), user(txt("go on")), assistant(txt("partial"))]
    marked = with_cache_breakpoints(messages)
    assert marked[2]["content"] == [_marked(txt("go on"))]
    assert marked[3]["content"] == [_marked(txt("partial"))]
    assert _count_marks(marked) == 2


def test_with_cache_breakpoints_within_a_budget() -> None:
    messages = [user(txt("hi")), assistant(txt("hello")), user(txt("again"))]
    assert _count_marks(with_cache_breakpoints(messages, budget=1)) == 1
    assert "cache_control" in with_cache_breakpoints(messages, budget=1)[-1]["content"][-1]
    assert with_cache_breakpoints(messages, budget=0) == messages


def test_with_cache_breakpoints_does_not_mutate_its_input() -> None:
    messages = [user(txt("hi")), assistant(txt("hello")), user(txt("again"))]
    before = copy.deepcopy(messages)
    marked = with_cache_breakpoints(messages)
    assert messages == before
    assert _count_marks(messages) == 0
    assert marked is not messages
    assert marked[-1] is not messages[-1]
    assert marked[-1]["content"][-1] is not messages[-1]["content"][-1]


def test_with_cache_breakpoints_do_not_pile_up() -> None:
    messages = [user(txt("hi"))]
    first = with_cache_breakpoints(messages)
    for turn in range(5):
        messages.extend([assistant(txt(f"hello {turn}")), user(txt("more"))])
    second = with_cache_breakpoints(messages)
    assert _count_marks(first) == 1
    assert _count_marks(second) == 2
    assert "cache_control" in second[-1]["content"][-1]
    assert "cache_control" in second[-3]["content"][-1]


def test_with_cache_breakpoints_turns_string_content_into_a_marked_block() -> None:
    messages: list[Message] = [{"role": "user", "content": "hi"}]
    marked = with_cache_breakpoints(messages)
    block = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    assert marked == [{"role": "user", "content": [block]}]
    assert messages == [{"role": "user", "content": "hi"}]


def test_with_cache_breakpoints_of_nothing() -> None:
    assert with_cache_breakpoints([]) == []


# append_user_text ----------------------------------------------------------------------
def test_append_user_text_to_an_empty_history() -> None:
    messages: list[Message] = []
    append_user_text(messages, "hello")
    assert messages == [user(txt("hello"))]


def test_append_user_text_after_an_assistant_adds_a_user_message() -> None:
    messages = [user(txt("hi")), assistant(txt("hello"))]
    append_user_text(messages, "next")
    assert messages == [user(txt("hi")), assistant(txt("hello")), user(txt("next"))]


def test_append_user_text_merges_into_a_trailing_user_message_after_the_results() -> None:
    trailing = user(result("toolu_1"))
    messages = [user(txt("hi")), assistant(use("toolu_1")), trailing]
    append_user_text(messages, "next")
    assert len(messages) == 3
    assert messages[-1] == user(result("toolu_1"), txt("next"))
    check_pairing(messages, run_id="r1")
    # the message object that was there is not modified (it may be shared with a parent run)
    assert trailing == user(result("toolu_1"))


def test_append_user_text_merges_into_trailing_string_content() -> None:
    messages: list[Message] = [{"role": "user", "content": "hi"}]
    append_user_text(messages, "there")
    assert messages == [user(txt("hi"), txt("there"))]


# small helpers used by the engine ------------------------------------------------------
def test_tool_uses_and_text_of() -> None:
    message = assistant(txt("a"), use("toolu_1"), txt("b"), use("toolu_2"))
    assert [b["id"] for b in tool_uses(message)] == ["toolu_1", "toolu_2"]
    assert text_of(message) == "ab"
    assert text_of({"role": "user", "content": "plain"}) == "plain"
    assert tool_uses({"role": "user", "content": "plain"}) == []


def test_tool_result_block_sets_is_error_only_on_errors() -> None:
    assert tool_result_block("toolu_1", "fine", is_error=False) == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "fine",
    }
    assert tool_result_block("toolu_1", "bad", is_error=True)["is_error"] is True
