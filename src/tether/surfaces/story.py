"""``tether show``: a run told as a conversation, on a terminal or in a pipe.

Reads a :class:`~tether.views.conversation.Conversation`; what is said is decided there, how it
looks here. On a terminal, text wraps within the screen and a long value is cut (``--json`` has
it whole); in a pipe, every value is one whole line and no colour is written.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.rule import Rule
from rich.text import Text

from tether.surfaces.terminal import CALL_STATUS_STYLES, print_record, record_value
from tether.views.audit import decision_said
from tether.views.conversation import Aside, Call, Conversation, Turn
from tether.views.printable import printable

SYSTEM_CHARS = 160
"""How much of the system prompt is shown, folded on one line (one screen line on a terminal): ``--json``
has it whole."""

_OUTCOME_LABELS = {"ok": "result", "denied": "refused", "not_run": "not run"}
"""A call's status as its outcome line is labelled, where the status itself does not read well."""
_SAID_BY_THE_DECISION = frozenset({"awaiting_approval", "never_decided"})
"""Statuses the decision's line says already (``pending``, ``never decided``): no outcome line."""


def render_conversation(console: Console, told: Conversation) -> None:
    """The system prompt (folded), the prompt, then each step: the model's text and its calls."""
    if told.system:
        flat = " ".join(printable(told.system).split())
        room = min(SYSTEM_CHARS, console.width - len("system ")) if console.is_terminal else SYSTEM_CHARS
        folded = flat if len(flat) <= room else flat[: room - 1] + "…"  # one line on a screen
        console.print(Text.assemble(("system ", "bold dim"), (folded, "dim")), soft_wrap=not console.is_terminal)
    if told.prompt is not None:
        earlier = f" (after {told.earlier} earlier message(s))" if told.earlier else ""
        console.print(Text.assemble(("prompt", "bold"), (earlier, "dim")))
        _paragraph(console, told.prompt, indent=2)
    for beat in told.beats:
        if isinstance(beat, Turn):
            _turn(console, beat)
        else:
            _aside(console, beat)


def _turn(console: Console, turn: Turn) -> None:
    title = Text.assemble((f"step {turn.step}", "bold magenta"))
    if turn.agent:
        title.append(f" · {printable(turn.agent)}", style="cyan")
    cost = "" if turn.cost_usd is None else f" · ${turn.cost_usd:.6f}"
    title.append(f" · {turn.tokens} tokens{cost} · {turn.latency:.3f}s", style="dim")
    console.print(Rule(title, align="left", style="dim"))
    if turn.discarded:
        console.print(Text(f"  the answer was {turn.discarded}", style="yellow"), soft_wrap=not console.is_terminal)
    if turn.text:
        _paragraph(console, turn.text, indent=2)
    for call in turn.calls:
        _call(console, call)


def _call(console: Console, call: Call) -> None:
    """A call's heading (tool, id, seconds), then its input, decision, outcome and child runs."""
    entry = call.entry
    label, style = _OUTCOME_LABELS.get(entry.status, entry.status), CALL_STATUS_STYLES.get(entry.status, "")
    heading = Text.assemble(("▸ ", "blue"), (printable(entry.tool), "bold blue"), "  ")
    heading.append(printable(entry.call_id), style="dim")
    if entry.duration is not None:
        heading.append(f"  {entry.duration:.3f}s", style="dim")
    fields: list[tuple[str, Text]] = [("input", record_value(console, entry.input_ran))]
    if entry.edited:
        fields.append(("original", record_value(console, entry.input)))
    at = (entry.decision or {}).get("at")
    gone = [(a.at, ("abandoned", Text(printable(f"by {a.by}: {a.reason}"), style="yellow"))) for a in call.abandoned]
    fields += [line for when, line in gone if at is None or at >= when]  # before the decision made after it
    for said, text in decision_said(entry):
        fields.append((said, Text(printable(text), style=_DECISION_STYLES.get(said, ""))))
    fields += [line for when, line in gone if at is not None and at < when]  # after the one it interrupted
    fields += [("retry", Text(printable(f"attempt {r['attempt']} failed: {r['error']}"))) for r in entry.retries]
    fields += [("warning", Text(printable(warning), style="yellow")) for warning in entry.warnings]
    if entry.status not in _SAID_BY_THE_DECISION:
        fields.append((label, _outcome(console, call, style)))
    for child in call.children:
        said = f"{child.run_id}  {child.agent or ''}  {child.status}".replace("    ", "  ")
        fields.append(("child run", Text(printable(said))))
    print_record(console, heading, fields, indent=2)


_DECISION_STYLES = {"approved": "green", "allowed": "green", "denied": "red", "pending": "yellow"}


def _outcome(console: Console, call: Call, style: str) -> Text:
    """What came back: the result or the error text (whole in a pipe), or why nothing did."""
    entry = call.entry
    value: Any
    if entry.status == "ok":
        value = entry.result or ""
    elif entry.status in ("error", "denied"):
        value = entry.error or ""  # what the model was told (it names the exception)
    else:
        value = "started, no result recorded" if entry.status == "running" else "the tool did not run"
    shown = record_value(console, value)
    shown.stylize(style)
    if entry.cached:
        shown.append(" (from the cache)", style="dim")
    if entry.truncated_from is not None:
        shown.append(f" (the model saw the first part of {entry.truncated_from} chars)", style="dim")
    return shown


def _aside(console: Console, aside: Aside) -> None:
    said = Text.assemble(("· ", "dim"), printable(aside.text))
    said.stylize("yellow" if aside.warning else "dim")
    console.print(said, soft_wrap=not console.is_terminal)


def _paragraph(console: Console, text: str, *, indent: int) -> None:
    """Text as it was written, indented: wrapped within a terminal, its own lines whole in a pipe."""
    shown = printable(text).strip("\n")
    if console.is_terminal:
        console.print(Padding(Text(shown), (0, 0, 0, indent)), soft_wrap=False)
        return
    margin = " " * indent
    console.print(Text("\n".join(margin + line for line in shown.split("\n"))), soft_wrap=True)


__all__ = ["render_conversation"]
