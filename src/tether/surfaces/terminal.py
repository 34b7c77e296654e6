"""The terminal experience (rich): progress lines, approval prompts, run summaries.

With :mod:`tether.surfaces.cli`, the only module importing rich. Nothing below the engine knows a
terminal exists: this module only listens to events and answers approval requests.

Text from models, tools and people goes through :func:`printable` before it is printed, so
an escape sequence in it is shown, never obeyed by the terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.spinner import Spinner
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from tether.agent import Agent
from tether.core import engine
from tether.core.approvals import Approve, Decision, Deny, PendingApproval
from tether.core.flow import Activity, RunningTools
from tether.core.links import depth_of
from tether.core.state import RunState
from tether.drivers.runner import RunResult
from tether.drivers.worker import WorkerNote
from tether.errors import ConfigError, DeniedByPolicy, InvalidEditedInput
from tether.facts.events import (
    ApprovalRequested,
    CacheMiss,
    Event,
    HandedOff,
    HistoryCompacted,
    ModelResponded,
    RetryScheduled,
    RunFinished,
    ToolFinished,
    ToolStarted,
    Transition,
    Warned,
)
from tether.facts.status import WAITING_RETRY, RunStatus, status_name
from tether.facts.usage import Usage
from tether.surfaces.editor import chosen_editor, edit_text
from tether.surfaces.line_input import read_line
from tether.views.audit import AuditEntry, decision_said
from tether.views.printable import printable
from tether.views.tree import RunNode

CHOICES = {
    "a": "approve",
    "approve": "approve",
    "y": "approve",
    "yes": "approve",
    "d": "deny",
    "deny": "deny",
    "n": "deny",
    "no": "deny",
    "e": "edit",
    "edit": "edit",
    "A": "always",
    "always": "always",
}
LEGEND = (
    "a approve · d deny (then a reason for the model) · e edit the input as JSON\n"
    "A approve the tool for the rest of the run · full words work too\n"
    "e opens $VISUAL or $EDITOR when set, else asks for the JSON on one line"
)
"""Printed once above the prompts, which stay short enough for 80 columns."""


def _preview(text: str, limit: int = 160) -> str:
    """:func:`printable` text on one line of at most ``limit`` characters.

    Line breaks become spaces; other spacing is kept (it can matter, as in ``rm -rf    /x``).
    """
    flat = " ".join(line.strip() for line in printable(text).splitlines() if line.strip())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


UNNAMED_AGENT = "the run's agent"


class ProgressPrinter:
    """An event listener printing one line per meaningful fact, as the run goes."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, state: RunState, event: Event) -> None:
        """Print ``event`` of ``state``'s run (a child run's lines indented under its agent's name)."""
        depth = depth_of(state.spec)
        agent = printable(str(state.spec.get("agent") or UNNAMED_AGENT))
        for line in self._lines(event):
            self.console.print(Text.assemble("  " * depth, (agent, "cyan"), " ") + line if depth else line)

    @staticmethod
    def _lines(event: Event) -> list[Text]:
        match event.fact:
            case ModelResponded(discarded=False, content=content):
                lines = []
                for block in content:  # content blocks are the API's free JSON
                    if block.get("type") == "text" and block.get("text"):
                        lines.append(Text("model  ", style="magenta") + Text(_preview(block["text"])))
                    elif block.get("type") == "tool_use":
                        arguments = _preview(json.dumps(block.get("input"), ensure_ascii=False), 100)
                        lines.append(Text("call   ", style="blue") + Text(f"{printable(block['name'])} {arguments}"))
                return lines
            case ToolFinished(tool=tool, content=content, is_error=is_error):
                style = "red" if is_error else "green"
                return [Text("result ", style=style) + Text(f"{printable(tool)}: {_preview(content)}")]
            case RetryScheduled(tool=tool, attempt=attempt, error=error):
                failed = f"{printable(tool)} attempt {attempt} failed: {_preview(error)}"
                return [Text("retry  ", style="yellow") + Text(failed)]
            case Warned(message=message):
                return [Text("warn   ", style="yellow") + Text(printable(message))]
            case HandedOff(from_agent=from_agent, to_agent=to_agent):
                handed = f"{printable(from_agent or UNNAMED_AGENT)} → {printable(to_agent)}"
                return [Text("handoff ", style="cyan") + Text(f"{handed}, from the next turn")]
            case Transition(source=str(source), target=target):
                return [Text(f"state  {status_name(source)} → {status_name(target)}", style="dim")]
        return []


STREAM_TAIL_CHARS = 4000
"""How much streamed text the view keeps: only its last lines fit on screen anyway."""


class _Activity:
    """The spinner line and, under it, the end of the answer streamed so far (as much as fits)."""

    def __init__(self, spinner: Spinner) -> None:
        self.spinner = spinner
        self.text = ""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.spinner
        tail = self.text.rstrip("\n")  # no blank row for a paragraph not begun
        if tail:
            lines = list(Text(tail).wrap(console, options.max_width))
            yield Text("\n").join(lines[-max(1, console.height - 2) :])


class LiveView:
    """A spinner line saying what the run is doing now, below :class:`ProgressPrinter`'s lines.

    Give :meth:`on_action` to the runner's ``on_action``, :meth:`on_text` to its ``on_text``
    and the view itself as an event listener (before the printer). The spinner runs from
    the start of a model call, tool attempt or retry wait until the next committed event,
    so it is gone before any approval prompt (parking is itself a commit); while the model
    writes, its text grows under the spinner, and the printer's summary replaces it once
    the response is committed. On anything but a terminal it does nothing: pipes and
    files get plain lines only.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.enabled = console.is_terminal and not console.is_dumb_terminal
        self._live: Live | None = None
        self._activity: _Activity | None = None
        self._prefix = ""
        """The spinner's state and step, kept for a model retry wait announced mid-call."""

    @property
    def active(self) -> bool:
        """Whether the spinner is on screen now."""
        return self._live is not None

    def on_action(self, state: RunState, action: Activity) -> None:
        """Show (or update) the spinner for work that is about to start."""
        if not self.enabled:
            return
        self._prefix = activity_prefix(state, action)
        activity = self._activity = _Activity(Spinner("dots", Text(describe_activity(state, action)), style="cyan"))
        if self._live is None:
            self._live = Live(activity, console=self.console, transient=True, refresh_per_second=12.5)
            self._live.start(refresh=True)
        else:
            self._live.update(activity, refresh=True)

    def on_text(self, text: str) -> None:
        """Show the answer's newest text under the spinner (every piece is drawn once at least)."""
        live, activity = self._live, self._activity
        if live is not None and activity is not None:
            activity.text = (activity.text + printable(text))[-STREAM_TAIL_CHARS:]
            live.refresh()

    def waiting_for_model(self, seconds: float, retry: int) -> bool:
        """Say the model API will be asked again (busy or unreachable) for retry ``retry``; False if not shown."""
        live, activity = self._live, self._activity
        if not self.enabled or live is None or activity is None:
            return False
        waiting = f"API busy or unreachable: retrying in {seconds:.0f}s (retry {retry})…"
        activity.spinner.update(text=Text(f"{self._prefix} · {waiting}"))
        live.refresh()
        return True

    def __call__(self, state: RunState, event: Event) -> None:
        """A commit ends the activity; a tool's recorded start is part of it."""
        if not isinstance(event.fact, ToolStarted | CacheMiss):  # a miss is written with the start
            self.stop()

    def stop(self) -> None:
        """Clear the spinner (idempotent); called on errors too, so the cursor comes back."""
        live, self._live, self._activity = self._live, None, None
        if live is not None:
            live.stop()


def activity_prefix(state: RunState, action: Activity) -> str:
    """The run's state and step number while ``action`` is under way."""
    step = state.steps + 1 if isinstance(action, engine.CallModel) else state.steps  # a model call is the step
    return f"{status_name(state.status)} · step {step}"


def _attempt_of(action: engine.RunTool) -> str:
    """``fetch``, or ``fetch (attempt 2)`` from the second attempt on."""
    attempt = f" (attempt {action.attempt})" if action.attempt > 1 else ""
    return f"{printable(action.call.tool)}{attempt}"


def describe_activity(state: RunState, action: Activity, *, now: float | None = None) -> str:
    """One line: the run's state, its step count and the work under way."""
    if isinstance(action, engine.CallModel):
        doing = "calling the model"
    elif isinstance(action, engine.RunTool):
        doing = f"running {_attempt_of(action)}"
    elif isinstance(action, RunningTools):
        doing = f"running {', '.join(_attempt_of(call) for call in action.calls)} at once"
    else:
        wait = max(0.0, action.due_at - (time.time() if now is None else now))
        doing = f"waiting {wait:.0f}s to retry"
    return f"{activity_prefix(state, action)} · {doing}…"


class TerminalApprover:
    """Asks a person at the terminal; EOF or Ctrl-C leaves the undecided calls pending, never approved."""

    def __init__(
        self,
        console: Console,
        agent: Agent,
        *,
        actor: str = "terminal",
        still_waiting: Callable[[PendingApproval], str | None] | None = None,
    ) -> None:
        self.console = console
        self.agent = agent
        self.actor = actor
        self.still_waiting = still_waiting
        """Asked before each call is put to the person: None if it still waits, else what became of it
        (``approved by bob``: another process decided it meanwhile, so it is not asked)."""
        self.stopped = False
        """The person ended the input (EOF or Ctrl-C): nobody is asked again by this approver."""
        self.interrupted: KeyboardInterrupt | None = None
        """The Ctrl-C (or SIGTERM, SIGHUP: raised alike) that stopped the answers, for the command's exit code."""

    def decide(self, requests: Sequence[PendingApproval]) -> Mapping[str, Decision]:
        """Show every pending call of the batch, then ask about each in turn.

        "A" answers ``Approve(remember_for_run=True)``: the run records it, so later calls
        of the tool are not asked about, whichever process drives the run on. Each prompt
        names the call (``[2/3] delete toolu_3``), so same-tool calls are never confused.
        EOF or Ctrl-C keeps the decisions already given; the rest stay pending, and since the
        person has stopped answering, the run parks instead of asking again.
        """
        if self.stopped:
            return {}
        decisions: dict[str, Decision] = {}
        remembered: dict[str, str] = {}  # tool -> the call whose "A" covers its siblings in this batch
        skipped: set[str] = set()  # decided by another process before the person was asked
        title = f"{len(requests)} calls need your approval" if len(requests) > 1 else "Approval needed"
        try:  # a Ctrl-C while the calls are shown is one at the prompt: nothing decided, nothing lost
            self.console.rule(Text(title, style="bold yellow"))
            for request in requests:
                self.console.print(self._panel(request), soft_wrap=False)  # see render_result
            self.console.print(Text(LEGEND, style="dim"))
            for position, request in enumerate(requests, start=1):
                tool = printable(request.tool)
                label = f"{tool} {printable(request.call_id)}"
                if len(requests) > 1:
                    label = f"[{position}/{len(requests)}] {label}"
                if request.tool in remembered:
                    decisions[request.call_id] = Approve(actor=self.actor, remember_for_run=True)
                    covered = f"{label}: approved ({tool} approved for the run with {remembered[request.tool]})"
                    self.console.print(Text(covered, style="green"))
                    continue
                elsewhere = self.still_waiting(request) if self.still_waiting is not None else None
                if elsewhere is not None:
                    skipped.add(request.call_id)
                    said = f"{label}: not asked: {printable(elsewhere)}"
                    self.console.print(Text(said, style="yellow"))
                    continue
                decision = decisions[request.call_id] = self._ask(request, label)
                if isinstance(decision, Approve) and decision.remember_for_run:
                    remembered[request.tool] = printable(request.call_id)
        except (EOFError, KeyboardInterrupt) as stop:
            self.stopped = True
            if isinstance(stop, KeyboardInterrupt):
                self.interrupted = stop
            answered = set(decisions) | skipped
            waiting = sum(1 for r in requests if r.call_id not in answered and r.tool not in remembered)
            message = Text("\n" + _stopped_message(len(decisions), waiting), style="yellow")
            self.console.print(message, soft_wrap=False)  # wrapped between words
        return decisions

    def decided_elsewhere(self, notes: Sequence[tuple[str, str]]) -> None:
        """Say which answers were not recorded: another process decided those calls first (the drive's hook)."""
        for call_id, what in notes:
            said = f"{printable(call_id)}: your answer was not recorded: {printable(what)}"
            self.console.print(Text(said, style="yellow"), soft_wrap=False)

    def _panel(self, request: PendingApproval) -> Panel:
        arguments = _json(request.input)
        body = Group(
            Text(printable(request.description or "(no description)"), style="italic"),
            Text.assemble(("why: ", "bold"), printable(request.reason or "approval required")),
            Text.assemble(("call: ", "bold"), printable(request.call_id)),
            arguments,
        )
        return Panel(body, title=Text(printable(request.tool), style="bold"), border_style="yellow")

    def _ask(self, request: PendingApproval, label: str) -> Decision:
        prompt = Text.assemble((label, "bold"), ": approve? [", ("a", "cyan"), "/d/e/A] > ")
        while True:
            answer = self._input(prompt).strip()
            choice = CHOICES.get(answer) or CHOICES.get(answer.lower())
            if choice == "approve":
                return Approve(actor=self.actor)
            if choice == "always":
                return Approve(actor=self.actor, remember_for_run=True)
            if choice == "deny":
                reason = self._input(Text("Give a reason for the model (optional) > ")).strip()
                return Deny(reason or "denied at the terminal", actor=self.actor)
            if choice == "edit":
                edited = self._edit(request)
                if edited is not None:
                    return Approve(input=edited, actor=self.actor)
                continue  # an empty line: back to this question
            self.console.print(Text("Please answer a, d, e or A (or approve, deny, edit, always).", style="red"))

    def _input(self, prompt: Text) -> str:
        """The person's answer to ``prompt``; a Ctrl-C pressed at any moment it is awaited raises (see line_input)."""
        self.console.print(prompt, end="")
        return read_line()

    def _judging(self, request: PendingApproval) -> Agent:
        """The agent whose tool and rules judge an edit here: after a handoff, the one with the call's tool.

        Only a first check, to ask again at once: the decision is checked by the agent in charge.
        """
        agents = (self.agent, *self.agent.reachable_agents.values())
        return next((agent for agent in agents if request.tool in agent.tool_index), self.agent)

    def _edit(self, request: PendingApproval) -> dict[str, Any] | None:
        """The edited input, checked: in ``$VISUAL``/``$EDITOR`` when set, else typed on one line.

        None when the person goes back to the question (they changed their mind about editing).
        """
        editor = chosen_editor()
        if editor is not None:
            try:
                return self._edit_in(editor, request)
            except ConfigError as error:  # the editor cannot be started, or failed
                said = f"{printable(str(error))}: type the input on one line instead"
                self.console.print(Text(said, style="red"), soft_wrap=False)
        return self._edit_line(request)

    def _edit_in(self, editor: list[str], request: PendingApproval) -> dict[str, Any] | None:
        """Edited in the editor, as pretty JSON; a mistake is said and the same text edited again.

        Nothing typed is lost: the editor reopens on what the person left, never on the original.
        An emptied or unchanged file goes back to the question.
        """
        text = printable(json.dumps(request.input, indent=2, ensure_ascii=False)) + "\n"
        while True:
            text = edit_text(text, editor)
            if not text.strip():
                self.console.print(Text("The input was emptied: back to the question.", style="yellow"))
                return None
            checked = self._checked(request, text)
            if checked is not None:
                if checked == request.input:
                    self.console.print(Text("The input was not changed: back to the question.", style="yellow"))
                    return None
                # what was saved in the editor is gone from the screen: say what is approved
                shown = printable(json.dumps(checked, indent=2, ensure_ascii=False))
                self.console.print(Text.assemble(("Approving the edited input:\n", "bold"), shown), soft_wrap=True)
                return checked
            again = self._input(Text("Enter: edit it again · b: back to the question > ")).strip().lower()
            if again in ("b", "back"):
                return None

    def _edit_line(self, request: PendingApproval) -> dict[str, Any] | None:
        """Asked again until the JSON typed is valid; None when the person enters an empty line."""
        while True:
            raw = self._input(Text("New input as JSON (empty line: back) > ")).strip()
            if not raw:
                return None
            checked = self._checked(request, raw)
            if checked is not None:
                return checked

    def _checked(self, request: PendingApproval, raw: str) -> dict[str, Any] | None:
        """``raw`` as the call's new input, if valid for the tool and allowed by the rules.

        Else None, the mistake said in one line.
        """
        try:
            value = json.loads(raw)
        except ValueError as error:
            self.console.print(Text(f"Not valid JSON: {error}", style="red"), soft_wrap=False)
            return None
        if not isinstance(value, dict):
            self.console.print(Text("The input must be a JSON object.", style="red"))
            return None
        try:
            return engine.check_edit(self._judging(request), request, value)
        except InvalidEditedInput as error:
            problems = Text(f"Not valid for {printable(error.tool)}: {printable(error.problems)}", style="red")
            self.console.print(problems, soft_wrap=False)
        except DeniedByPolicy as error:
            self.console.print(Text(f"Not allowed: {printable(error.reason)}", style="red"), soft_wrap=False)
        return None


def _stopped_message(decided: int, waiting: int) -> str:
    """What EOF or Ctrl-C at a prompt did: the decisions given are kept, the rest wait."""
    if decided == 0:
        return "No decision: the call stays pending and the run is parked."
    return (
        f"No more answers: the {decided} decision(s) given are kept; "
        f"{waiting} call(s) stay pending and the run is parked."
    )


_RESULT_STYLES = {
    RunStatus.done.shown: "green",
    RunStatus.failed.shown: "red",
    RunStatus.awaiting_approval.shown: "yellow",
    WAITING_RETRY: "yellow",
}
"""The colour of each status a drive ends in (others are white)."""


def render_result(console: Console, result: RunResult) -> None:
    """The end of a drive: status, answer or error, pending calls, usage."""
    style = _RESULT_STYLES.get(result.status, "white")
    lines: list[Any] = [Text.assemble(("status: ", "bold"), (result.status, style))]
    if result.output:
        lines.append(Text(printable(result.output)))
    if result.result is not None:
        lines.append(_json(result.result))
    if result.error:
        lines.append(Text(f"error: {printable(result.error)}", style="red"))
    if result.next_due_at is not None:
        due = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result.next_due_at))
        lines.append(Text(f"next tool retry due at {due}", style="yellow"))
    for pending in result.pending_approvals:
        call = f"{pending['call_id']} {pending['tool']} {json.dumps(pending['input'], ensure_ascii=False)}"
        lines.append(Text(f"pending: {printable(call)}", style="yellow"))
    usage = result.usage
    lines.append(
        Text(
            f"{result.steps} model call(s), {result.tool_calls} tool call(s); tokens in {usage.input_tokens}, "
            f"out {usage.output_tokens}, cache write {usage.cache_creation_input_tokens}, "
            f"cache read {usage.cache_read_input_tokens}; "
            + (f"cost ${result.cost_usd:.4f}" if result.cost_usd is not None else "cost unknown (model not priced)")
            + f"; model {result.model_seconds:.2f}s, tools {result.tool_seconds:.2f}s",
            style="dim",
        )
    )
    # A soft-wrapping console (the CLI's, so ids stay whole) would crop every line in a panel.
    console.print(Panel(Group(*lines), title=Text(f"run {result.run_id}"), border_style=style), soft_wrap=False)


def _json(value: Any) -> Syntax:
    """Highlighted JSON that wraps inside a panel instead of being cut at its edge."""
    text = printable(json.dumps(value, indent=2, ensure_ascii=False))
    return Syntax(text, "json", theme="ansi_dark", word_wrap=True)


# Logs: a table on a wide terminal, else one record per row -------------------------------------
WRAPPED_MIN_COLUMNS = 30
"""The least room a table's one wrapping column needs; with less, records are printed instead."""
SCREEN_VALUE_CHARS = 400
"""How much of one value a record shows on a terminal; a pipe gets every value whole."""


def _table(*headers: str, wraps: str) -> Table:
    """A log table whose columns never wrap nor shrink, but the one named ``wraps`` (see :func:`_fits`)."""
    table = Table(show_lines=False)
    for header in headers:
        wrapping = header == wraps
        table.add_column(header, no_wrap=not wrapping, overflow="fold" if wrapping else "ellipsis")
    return table


def _fits(console: Console, table: Table) -> bool:
    """Whether ``table`` shows whole on this terminal: fixed columns whole, room for the wrapping one.

    A table squeezed narrower cuts its cells (``wh…``, ``to…``), so a narrow terminal, like a
    pipe, gets one record per row instead.
    """
    if not console.is_terminal:
        return False
    needed = len(table.columns) + 1  # the vertical borders
    for column in table.columns:
        cells = [column.header, *column.cells]
        widest = max(Measurement.get(console, console.options, cell).maximum for cell in cells)
        needed += 2 + (widest if column.no_wrap else WRAPPED_MIN_COLUMNS)  # with the cell padding
    return needed <= console.width


def record_value(console: Console, value: Any) -> Text:
    """A record's value: text as it is, anything else as JSON; cut only on a terminal."""
    text = printable(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))
    if console.is_terminal and len(text) > SCREEN_VALUE_CHARS:
        text = text[: SCREEN_VALUE_CHARS - 1] + "…"
    return Text(text)


def print_record(console: Console, heading: Text, fields: Sequence[tuple[str, Text]], *, indent: int = 0) -> None:
    """A heading line, then ``label  value`` lines indented under it (all ``indent`` columns in).

    On a terminal each value wraps beside its label, within the screen; in a pipe each field
    is one whole line, for grep and for people reading a file.
    """
    margin = " " * indent
    if not console.is_terminal:
        width = max((len(label) for label, _ in fields), default=0)
        console.print(Text(margin) + heading, soft_wrap=True)
        under = Text("\n" + margin + " " * (width + 4))  # a value's later lines start under its first
        for label, value in fields:
            lines = under.join(value.split("\n", allow_blank=True))
            console.print(Text.assemble(margin, "  ", (label.ljust(width), "dim"), "  ", lines), soft_wrap=True)
        return
    console.print(Padding(heading, (0, 0, 0, indent)), soft_wrap=False)
    if fields:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")  # a long word (an id, a path) breaks instead of being cut
        for label, value in fields:
            grid.add_row(label, value)
        console.print(Padding(grid, (0, 0, 0, indent + 2)), soft_wrap=False)


_MEASURES = ("content", "messages", "spec", "full_content", "usage", "cost_usd", "latency", "duration")
"""Event fields not repeated in the detail column: too long, or shown in their own columns."""


def render_events(console: Console, events: Sequence[Event]) -> None:
    """The event log, with each event's tokens, cost, model latency and tool time (a model call's, a tool's)."""
    table = _table("seq", "type", "tokens in/out/cache w/r", "cost $", "model s", "tool s", "detail", wraps="detail")
    for column in table.columns[2:6]:
        column.justify = "right"
    for event in events:
        table.add_row(
            str(event.seq),
            Text(event.type),
            *_measures(event),
            Text(_preview(json.dumps(_detail(event, whole=False), ensure_ascii=False, default=str), 160)),
        )
    if _fits(console, table):
        console.print(table)
        return
    for event in events:
        _print_event(console, event)


def _print_event(console: Console, event: Event) -> None:
    """One event as a record: its number, type and measures, then each detail on its own line."""
    tokens, cost, model, tool = _measures(event)
    said = [f"tokens in/out/cache w/r {tokens}" if tokens else "", f"cost ${cost}" if cost else ""]
    said += [f"model {model}s" if model else "", f"tool {tool}s" if tool else ""]
    heading = Text.assemble((str(event.seq), "bold"), "  ", (event.type, "bold"))
    if any(said):
        heading.append("  " + " · ".join(part for part in said if part), "dim")
    detail = _detail(event, whole=True)
    print_record(console, heading, [(key, record_value(console, value)) for key, value in detail.items()])


def _detail(event: Event, *, whole: bool) -> dict[str, Any]:
    """What an event says besides its measures; a tool's result whole, or its start only."""
    detail = {k: v for k, v in event.data.items() if k not in _MEASURES}  # every stored field, generically
    for key, value in detail.items():  # a moment (created_at, due_at...) as a person reads it; --json keeps the number
        if key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
            detail[key] = _local_time(value)
    match event.fact:
        case ToolFinished(content=content):
            detail["content"] = content if whole or len(content) <= 80 else content[:79] + "…"
        case Transition(source=source, target=target):  # statuses shown as their ids
            detail["source"] = None if source is None else status_name(source)
            detail["target"] = status_name(target)
        case RunFinished(status=status):
            detail["status"] = status_name(status)
    return detail


def _local_time(at: float) -> str:
    """``2026-11-25 01:16:06.882`` (this machine's time zone)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def _measures(event: Event) -> tuple[str, str, str, str]:
    """An event's tokens in/out/cache write/read, cost in $, model and tool seconds ("": none)."""
    match event.fact:
        case (
            ModelResponded(usage=usage, cost_usd=cost, latency=latency)
            | HistoryCompacted(usage=Usage() as usage, cost_usd=cost, latency=latency)  # a summary's call
        ):
            counts = (usage.input_tokens, usage.output_tokens, usage.cache_creation_input_tokens)
            tokens = "/".join(str(count) for count in (*counts, usage.cache_read_input_tokens))
            return tokens, "?" if cost is None else f"{cost:.6f}", _seconds(latency), ""
        case ToolFinished(duration=duration) | RetryScheduled(duration=duration) | ApprovalRequested(duration=duration):
            return "", "", "", _seconds(duration)
    return "", "", "", ""


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def render_tree(console: Console, root: RunNode) -> None:
    """A run and the child runs it started, each with its agent, the call it serves, status and spending."""
    tree = Tree(_tree_label(root), guide_style="dim")
    _grow(tree, root)
    console.print(tree, soft_wrap=False)


def _grow(branch: Tree, node: RunNode) -> None:
    for child in node.children:
        _grow(branch.add(_tree_label(child)), child)
    if node.cut:
        branch.add(Text("… more runs not read", style="dim"))


def _tree_label(node: RunNode) -> Text:
    """``run_…  reviewer for review toolu_1 (attempt 2)  done  17 tokens, 1 tool call, $0.0001``."""
    label = Text.assemble((printable(node.run_id), "bold"))
    if node.agent is not None:
        label.append_text(Text.assemble("  ", (printable(node.agent), "cyan")))
    if node.handed_off_from is not None:
        label.append(f" (handed off from {printable(node.handed_off_from)})", style="dim")
    if node.call_id is not None:
        attempt = f" (attempt {node.attempt})" if node.attempt > 1 else ""
        label.append(f" for {printable(node.tool or '?')} {printable(node.call_id)}{attempt}", style="dim")
    label.append_text(Text.assemble("  ", (node.status, _RESULT_STYLES.get(node.status, "white"))))
    calls = f"{node.tool_calls} tool call{'' if node.tool_calls == 1 else 's'}"
    cost = f", ${node.cost_usd:.4f}" if node.cost_usd is not None else ""
    label.append(f"  {node.tokens} tokens, {calls}{cost}", style="dim")
    return label


def render_pending(
    console: Console,
    pending: Sequence[PendingApproval],
    *,
    command: str = "tether",
    db: str = "",
    queues: Mapping[str, str] | None = None,
    total: int | None = None,
) -> None:
    """Calls waiting for a person, one block each, with the exact input they would approve.

    ``total``: how many calls wait in all, when only some are shown (the footer counts them all).

    ``command`` starts the commands the footer suggests (how this tether was run, so they can be copied),
    and ``db`` ends them (`` --db URL`` unless the database is the default).
    ``queues``: the queue of each root run submitted to one (``run --detach``): a worker goes on
    with it once decided, so it needs no resume.

    Ids are whole (they are copied into approve/deny); the input is pretty JSON, never cut
    nor respaced, control characters shown as escapes.
    """
    if not pending:
        console.print("No tool calls are waiting for approval.")
        return
    queues = queues or {}
    for call in pending:
        console.print(
            Text.assemble(
                (printable(call.run_id), "bold"),
                "  ",
                (printable(call.call_id), "bold"),
                "  ",
                (printable(call.tool), "yellow"),
                ("  fingerprint ", "dim"),
                call.fingerprint,
            )
        )
        if len(call.chain) > 1:  # a child run's call: the runs from the root down to it
            console.print(Text.assemble(("  chain  ", "dim"), printable(" → ".join(call.chain))))
        console.print(Text.assemble(("  why    ", "dim"), printable(call.reason or "approval required")))
        shown = printable(json.dumps(call.input, indent=2, ensure_ascii=False)).replace("\n", "\n         ")
        console.print(Text.assemble(("  input  ", "dim"), shown), soft_wrap=True)  # copied as it is
        if (queue := queues.get(call.root)) is not None:
            console.print(
                Text.assemble(("  then   ", "dim"), f"queued for `tether worker` (queue {queue}): it goes on by itself")
            )
        console.print()
    waiting = len(pending) if total is None else total
    shown = "" if waiting == len(pending) else f" ({len(pending):,} shown)"
    console.print(f"{waiting:,} call(s) waiting{shown}. Decide with:")
    for verb in ("approve", "deny"):
        console.print(Text(f"  {command} {verb} RUN CALL{db}", style="bold"))
    if all(call.root in queues for call in pending):
        console.print("Each run's worker goes on by itself.")
        return
    chains = any(len(call.chain) > 1 for call in pending)
    console.print("then go on with" + (" (RUN: the first run of a call's chain):" if chains else ":"))
    console.print(Text(f"  {command} resume RUN{db}", style="bold"))
    if any(call.root in queues for call in pending):
        console.print("(a queued run's worker goes on by itself)")


def render_audit(console: Console, entries: Sequence[AuditEntry]) -> None:
    """The audit log: one row per tool call (``--json`` has every detail); the agent of each when any is named.

    The input is the one that ran (a person's edit); a record also shows the model's original,
    why a person was asked, and the error text whole.
    """
    if not entries:
        console.print("No tool calls match.")
        return
    agents = any(entry.agent for entry in entries)
    headers = ("when", *(("agent",) if agents else ()), "tool", "input", "decision", "tries", "outcome", "secs")
    table = _table(*headers, "run / call", wraps="input")
    for entry in entries:
        table.add_row(  # Text cells: inputs, reasons and ids are never read as markup
            _when(entry),
            *((Text(printable(entry.agent or "-")),) if agents else ()),
            Text(printable(entry.tool)),
            Text(_preview(json.dumps(entry.input_ran, ensure_ascii=False), 50)),
            Text(_preview(_verdict(entry), 60)),
            str(entry.attempts),
            _outcome(entry, error_chars=40),
            "-" if entry.duration is None else f"{entry.duration:.3f}",
            Text(printable(f"{entry.run_id} {entry.call_id}")),
        )
    if _fits(console, table):
        console.print(table)
        return
    for entry in entries:
        heading = Text.assemble(_when(entry), "  ", (printable(entry.tool), "bold"))
        fields = [
            ("call", Text(printable(f"{entry.run_id} {entry.call_id}"))),
            *((("agent", Text(printable(entry.agent))),) if entry.agent else ()),
            ("input", record_value(console, entry.input_ran)),
            *((("original", record_value(console, entry.input)),) if entry.edited else ()),
            *((label, Text(printable(text))) for label, text in decision_said(entry)[:-1]),
            ("decision", Text(_verdict(entry))),
            ("outcome", _outcome(entry)),
            *((("error", record_value(console, entry.error)),) if entry.error is not None else ()),
            ("tries", Text(str(entry.attempts))),
        ]
        if entry.duration is not None:
            fields.append(("seconds", Text(f"{entry.duration:.3f}")))
        print_record(console, heading, fields)


_NOTES = {
    "picked_up": ("picked up", "cyan"),
    RunStatus.done.shown: (RunStatus.done.shown, "green"),
    RunStatus.failed.shown: (RunStatus.failed.shown, "red"),
    RunStatus.cancelled.shown: (RunStatus.cancelled.shown, "yellow"),
    RunStatus.awaiting_approval.shown: ("parked awaiting approval", "yellow"),
    WAITING_RETRY: ("waiting for a retry", "yellow"),
    "requeued": ("queued again (the worker is stopping)", "yellow"),
    "busy": ("busy (another driver holds it): queued again", "yellow"),
    "changed": ("changed by another process meanwhile (its write queued it if it goes on)", "yellow"),
    "deleted": ("deleted before it was driven", "dim"),
    "error": ("job failed (procrastinate retries it)", "red"),
}


def render_worker_note(console: Console, note: WorkerNote) -> None:
    """One line of ``tether worker``'s output: ``12:00:01  run_…  parked awaiting approval: refund toolu_1``."""
    said, style = _NOTES.get(note.what, (note.what, "white"))
    line = Text.assemble(
        (time.strftime("%H:%M:%S"), "dim"), "  ", (printable(note.run_id), "bold"), "  ", (said, style)
    )
    if note.at is not None:
        line.append(f" until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(note.at))}")
    if note.detail:
        line.append(f": {printable(note.detail)}")
    console.print(line, soft_wrap=True)


def _when(entry: AuditEntry) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.requested_at))


def _verdict(entry: AuditEntry) -> str:
    """Who decided and how, with their reason: ``denied by alice: too risky``, ``approved by bob (input edited)``."""
    said = decision_said(entry)
    if not said:
        return "-"
    verdict, text = said[-1]
    return printable(f"{verdict} {text}" + (" (input edited)" if entry.edited else ""))


CALL_STATUS_STYLES = {
    "ok": "green",
    "error": "red",
    "denied": "red",
    "awaiting_approval": "yellow",
    "running": "yellow",
    "not_run": "dim",
}
"""A call's status (an audit entry's) as the terminal colours it, wherever it is shown."""


def _outcome(entry: AuditEntry, *, error_chars: int | None = None) -> Text:
    """The call's status, its exception type and (given ``error_chars``) the head of its error text."""
    outcome = entry.status
    if entry.status == "error" and entry.error_type:
        outcome += f" {entry.error_type}"
    if error_chars is not None and entry.error:
        outcome += f": {_preview(entry.error, error_chars)}"
    if entry.cached:
        outcome += " (cached)"
    if entry.truncated_from is not None:
        outcome += f" ({entry.truncated_from} chars, truncated for the model)"
    return Text(printable(outcome), style=CALL_STATUS_STYLES.get(entry.status, ""))


RUNS_HEADERS = ("status", "steps", "tools", "updated", "run")
PROMPT_BESIDE = 20
"""The least room for a prompt beside its run; on a narrower terminal it goes on a line of its own."""


def render_runs(console: Console, rows: Sequence[dict[str, Any]]) -> None:
    """Runs in columns (ids whole: they are copied into commands), each with its date and prompt.

    The prompt is cut to the room left on the line, or, when too little is left (80 columns),
    put on its own line under its run. A child run listed with its parent comes right under it,
    marked ``└``.
    """
    if not rows:
        console.print("No runs match.")
        return
    listed = _as_trees(rows)
    cells = [
        (
            row["status"],
            str(row["steps"]),
            str(row["tool_calls"]),
            _short_time(time.localtime(row["updated_at"]), time.localtime()),
            ("  " * (depth - 1) + "└ " if depth else "") + row["run_id"],
        )
        for row, depth in listed
    ]
    widths = [max(len(header), *(len(line[n]) for line in cells)) for n, header in enumerate(RUNS_HEADERS)]

    def columns(line: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))

    room = console.width - len(columns(RUNS_HEADERS)) - 2 if console.is_terminal else 160
    beside = room >= PROMPT_BESIDE
    console.print(Text(columns(RUNS_HEADERS) + ("  prompt" if beside else ""), style="bold"), soft_wrap=True)
    for line, (row, _) in zip(cells, listed, strict=True):
        prompt = _preview(row["prompt"], room if beside else console.width - 4) if row.get("prompt") else None
        if beside:
            console.print(Text.assemble(columns(line), "  ", prompt or ("-", "dim")), soft_wrap=True)
        else:
            console.print(Text(columns(line).rstrip()), soft_wrap=True)
            if prompt is not None:
                console.print(Text.assemble("    ", (prompt, "dim")), soft_wrap=True)


def _short_time(when: time.struct_time, now: time.struct_time) -> str:
    """As ``ls -l`` does, so the runs table fits 80 columns: this year's day and minute, else the date."""
    if when.tm_year == now.tm_year:
        return time.strftime("%m-%d %H:%M", when)
    return time.strftime("%Y-%m-%d", when)


def _as_trees(rows: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """``rows`` in their order, each child moved under its parent when that is listed too, with its depth."""
    listed = {row["run_id"] for row in rows}
    children: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("parent") in listed:
            children.setdefault(row["parent"], []).append(row)
    ordered: list[tuple[dict[str, Any], int]] = []

    def add(row: dict[str, Any], depth: int) -> None:
        ordered.append((row, depth))
        for child in children.get(row["run_id"], []):
            add(child, depth + 1)

    for row in rows:
        if row.get("parent") not in listed:
            add(row, 0)
    return ordered
