"""Forking a run: a new run whose history is an earlier run's as it stood at one of its events.

The fork point is an event of the run's log, numbered by its ``seq`` (the ``#`` of ``tether show
--events`` and of the web inspector's timeline); not a step, which is a model invocation. The
fork's history is the original's messages folded up to and including that event, so it is exactly
what the run held then; optionally one message's text is edited. Driving the fork asks the model
from there: the history must end with a user turn whose tool results answer every ``tool_use``
before it. An event in the middle of a turn (the model asked
for tools that have no results yet, or it just answered) is refused, naming the nearest events that
can be forked. The original run is only read. No I/O here: :func:`tether.core.lifecycle.fork`
reads the log and creates the fork.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.core.links import agent_link
from tether.core.state import RunState
from tether.errors import InvalidForkPoint, InvalidHistory
from tether.facts.events import Event, RunStarted
from tether.facts.history import Message, check_pairing, text_block, tool_uses
from tether.stores import PARENT_KEY

FORK_KEYS_DROPPED = (PARENT_KEY, "forked_from", "trace", "handed_to")
"""Spec entries of the original a fork does not keep: a fork is a root run (it serves no parent
call: a fork of a child run is listed, resumed and retried like any root run), has its own
origin, starts its own trace (see :mod:`tether.drivers.otel`), and has the agent in charge at
its event (see :func:`spec_of`)."""


@dataclass(frozen=True)
class MessageEdit:
    """Replace the text of one message of the fork's history (its tool_use/tool_result blocks stay)."""

    index: int | None
    """Position in the fork's history: 0 is the first message, -1 the last (Python's indexing).

    None: the last user message that holds text, the prompt the model answers next (after tool
    results, whose message holds none, the one that began the turn)."""
    text: str


def fork_points(events: list[Event]) -> list[int]:
    """The seqs a run can be forked at: where its history ends with a user turn the model can answer."""
    state = RunState(id="")
    points = []
    for event in events:
        state.apply(event)
        if _askable(state.messages):
            points.append(event.seq)
    return points


def state_at(run_id: str, events: list[Event], seq: int) -> RunState:
    """The run as it stood once event ``seq`` was recorded: its messages, the agent then in charge.

    Raises:
        InvalidForkPoint: no such event, or the history there ends in the middle of a turn.
    """
    last = events[-1].seq if events else -1
    if not 0 <= seq <= last:
        raise InvalidForkPoint(run_id, seq, f"the run has events 0 to {last}", _near(events, seq))
    state = RunState(id=run_id)
    for event in events[: seq + 1]:
        state.apply(event)
    if not _askable(state.messages):
        why = _why_not(state)
        raise InvalidForkPoint(run_id, seq, why, _near(events, seq))
    return state


def _askable(messages: list[Message]) -> bool:
    """Whether the model can be asked with ``messages`` as they are: they end with a user turn."""
    return bool(messages) and messages[-1]["role"] == "user"


def _why_not(state: RunState) -> str:
    if state.messages and tool_uses(state.messages[-1]):
        waiting = [call.call_id for call in state.unfinished_calls()]
        if waiting:
            return f"the model's tool calls {', '.join(waiting)} have no results there yet"
        return "the tool results are not in the history yet there (they go back to the model an event later)"
    return "the model's answer ends the history there (fork at an earlier event to have it answer again)"


def _near(events: list[Event], seq: int) -> tuple[int | None, int | None]:
    """The nearest events before and after ``seq`` that can be forked."""
    points = fork_points(events)
    before = max((p for p in points if p < seq), default=None)
    after = min((p for p in points if p > seq), default=None)
    return before, after


def edited(run_id: str, messages: list[Message], edit: MessageEdit) -> list[Message]:
    """``messages`` with ``edit`` made: the message's text blocks become one block holding the new text.

    Raises:
        InvalidForkPoint: no such message, it holds no text (only tool results or calls), or the
            new text is empty.
    """
    count = len(messages)
    if not edit.text.strip():
        raise InvalidForkPoint(run_id, None, "the edited text is empty")
    if edit.index is None:
        prompts = [i for i, message in enumerate(messages) if message["role"] == "user" and _has_text(message)]
        if not prompts:
            raise InvalidForkPoint(run_id, None, "no user message of the fork's history holds text to edit")
        index = prompts[-1]
    elif not -count <= edit.index < count:
        raise InvalidForkPoint(run_id, None, f"the fork's history has messages 0 to {count - 1}, not {edit.index}")
    else:
        index = edit.index % count
    message = messages[index]
    content = message["content"]
    if isinstance(content, str):
        blocks: list[dict[str, Any]] = [text_block(content)]
    else:
        blocks = list(content)
    at = [i for i, block in enumerate(blocks) if block.get("type") == "text"]
    if not at:
        kinds = ", ".join(sorted({str(block.get("type")) for block in blocks})) or "nothing"
        raise InvalidForkPoint(run_id, None, f"message {index} holds no text to edit (only {kinds})")
    kept = [block for i, block in enumerate(blocks) if i not in at[1:]]
    kept[at[0]] = text_block(edit.text)
    changed = [*messages]
    changed[index] = {**message, "content": kept}
    try:
        check_pairing(changed, run_id=run_id)
    except InvalidHistory as error:  # cannot happen for text; kept as the API's own rule
        raise InvalidForkPoint(run_id, None, str(error)) from error
    return changed


def _has_text(message: Message) -> bool:
    content = message["content"]
    return isinstance(content, str) or any(block.get("type") == "text" for block in content)


def spec_of(run_id: str, events: list[Event], then: RunState, seq: int) -> dict[str, Any]:
    """The fork's spec: the original's (model, tools, limits as recorded), linked back to it.

    ``forked_from["step"]`` holds the event's seq (the key kept from before "step" meant a model
    invocation). A run handed to another agent before event ``seq`` (``then``) is forked with that
    agent in charge.
    A fork of a child run keeps the link that names its agent as ``forked_from["agent_of"]``
    (see :func:`agent_link`): it is driven with the child's agent, but as a root run.

    Raises:
        InvalidForkPoint: the log does not begin with the run's start.
    """
    first = events[0].fact if events else None
    if not isinstance(first, RunStarted):
        raise InvalidForkPoint(run_id, seq, "its log does not begin with the run's start")
    spec = {key: value for key, value in first.spec.items() if key not in FORK_KEYS_DROPPED}
    spec["forked_from"] = {"run_id": run_id, "step": seq}
    if (link := agent_link(first.spec)) is not None:
        spec["forked_from"]["agent_of"] = link
    if then.agent is not None:
        spec["handed_to"] = then.agent
    return spec


__all__ = ["MessageEdit", "edited", "fork_points", "spec_of", "state_at"]
