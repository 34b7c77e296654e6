"""The terminal experience (rich): progress lines, approval prompts, run summaries.

With :mod:`tether.cli`, the only module importing rich. Nothing below the engine knows a
terminal exists: this module only listens to events and answers approval requests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.spinner import Spinner
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from tether import engine
from tether import events as ev
from tether.agent import Agent
from tether.approvals import ApprovalRequest, Approve, Decision, Deny
from tether.audit import AuditEntry
from tether.events import Event
from tether.pending import PendingApproval
from tether.policies import ApprovalContext
from tether.rules import denial
from tether.runner import Activity, RunResult
from tether.state import RunState

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
    "A approve the tool for the rest of the run · full words work too"
)
"""Printed once above the prompts, which stay short enough for 80 columns."""

def _preview(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class ProgressPrinter:
    """An event listener printing one line per meaningful fact, as the run goes."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, state: RunState, event: Event) -> None:
        """Print ``event`` of ``state``'s run."""
        data = event.data
        if event.type == ev.MODEL_RESPONDED and not data.get("discarded"):
            for block in data.get("content", []):
                if block.get("type") == "text" and block.get("text"):
                    self.console.print(Text("model  ", style="magenta") + Text(_preview(block["text"])))
                elif block.get("type") == "tool_use":
                    arguments = _preview(json.dumps(block.get("input"), ensure_ascii=False), 100)
                    self.console.print(Text("call   ", style="blue") + Text(f"{block['name']} {arguments}"))
        elif event.type == ev.TOOL_FINISHED:
            style = "red" if data.get("is_error") else "green"
            self.console.print(
                Text("result ", style=style) + Text(f"{data.get('tool')}: {_preview(str(data.get('content')))}")
            )
        elif event.type == ev.RETRY_SCHEDULED:
            self.console.print(
                Text("retry  ", style="yellow")
                + Text(f"{data['tool']} attempt {data['attempt']} failed: {_preview(data['error'])}")
            )
        elif event.type == ev.WARNING:
            self.console.print(Text("warn   ", style="yellow") + Text(str(data.get("message"))))
        elif event.type == ev.TRANSITION and data.get("source") is not None:
            self.console.print(Text(f"state  {data['source']} → {data['target']}", style="dim"))


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
            activity.text = (activity.text + text)[-STREAM_TAIL_CHARS:]
            live.refresh()

    def waiting_for_model(self, seconds: float, retry: int) -> bool:
        """Say the model API asked to wait before retry number ``retry``; False if not shown."""
        live, activity = self._live, self._activity
        if not self.enabled or live is None or activity is None:
            return False
        activity.spinner.update(text=Text(f"{self._prefix} · API asked to wait {seconds:.0f}s (retry {retry})…"))
        live.refresh()
        return True

    def __call__(self, state: RunState, event: Event) -> None:
        """A commit ends the activity; a tool's recorded start is part of it."""
        if event.type not in (ev.TOOL_STARTED, ev.CACHE_MISS):  # a miss is written with the start
            self.stop()

    def stop(self) -> None:
        """Clear the spinner (idempotent); called on errors too, so the cursor comes back."""
        live, self._live, self._activity = self._live, None, None
        if live is not None:
            live.stop()


def activity_prefix(state: RunState, action: Activity) -> str:
    """The run's state and step number while ``action`` is under way."""
    step = state.steps + 1 if isinstance(action, engine.CallModel) else state.steps  # a model call is the step
    return f"{state.status} · step {step}"


def describe_activity(state: RunState, action: Activity, *, now: float | None = None) -> str:
    """One line: the run's state, its step count and the work under way."""
    if isinstance(action, engine.CallModel):
        doing = "calling the model"
    elif isinstance(action, engine.RunTool):
        attempt = f" (attempt {action.attempt})" if action.attempt > 1 else ""
        doing = f"running {action.call.tool}{attempt}"
    else:
        wait = max(0.0, action.due_at - (time.time() if now is None else now))
        doing = f"waiting {wait:.0f}s to retry"
    return f"{activity_prefix(state, action)} · {doing}…"


class TerminalApprover:
    """Asks a person at the terminal; EOF or Ctrl-C leaves calls pending, never approved."""

    def __init__(self, console: Console, agent: Agent, *, actor: str = "terminal") -> None:
        self.console = console
        self.agent = agent
        self.actor = actor

    def decide(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, Decision]:
        """Show every pending call of the batch, then ask about each in turn.

        "A" answers ``Approve(remember_for_run=True)``: the run records it, so later calls
        of the tool are not asked about, whichever process drives the run on. Each prompt
        names the call (``[2/3] delete toolu_3``), so same-tool calls are never confused.
        """
        decisions: dict[str, Decision] = {}
        remembered: dict[str, str] = {}  # tool -> the call whose "A" covers its siblings in this batch
        title = f"{len(requests)} calls need your approval" if len(requests) > 1 else "Approval needed"
        self.console.rule(Text(title, style="bold yellow"))
        for request in requests:
            self.console.print(self._panel(request), soft_wrap=False)  # see render_result
        self.console.print(Text(LEGEND, style="dim"))
        try:
            for position, request in enumerate(requests, start=1):
                label = request.tool + " " + request.call_id
                if len(requests) > 1:
                    label = f"[{position}/{len(requests)}] {label}"
                if request.tool in remembered:
                    decisions[request.call_id] = Approve(actor=self.actor, remember_for_run=True)
                    covered = f"{label}: approved ({request.tool} approved for the run with {remembered[request.tool]})"
                    self.console.print(Text(covered, style="green"))
                    continue
                decision = decisions[request.call_id] = self._ask(request, label)
                if isinstance(decision, Approve) and decision.remember_for_run:
                    remembered[request.tool] = request.call_id
        except (EOFError, KeyboardInterrupt):
            self.console.print(Text("\nNo decision: the call stays pending and the run is parked.", style="yellow"))
            return {}
        return decisions

    def _panel(self, request: ApprovalRequest) -> Panel:
        arguments = _json(request.input)
        body = Group(
            Text(request.description or "(no description)", style="italic"),
            Text.assemble(("why: ", "bold"), request.reason or "approval required"),
            Text.assemble(("call: ", "bold"), request.call_id),
            arguments,
        )
        return Panel(body, title=Text(request.tool, style="bold"), border_style="yellow")

    def _ask(self, request: ApprovalRequest, label: str) -> Decision:
        prompt = Text.assemble((label, "bold"), ": approve? [", ("a", "cyan"), "/d/e/A] > ")
        while True:
            answer = self.console.input(prompt).strip()
            choice = CHOICES.get(answer) or CHOICES.get(answer.lower())
            if choice == "approve":
                return Approve(actor=self.actor)
            if choice == "always":
                return Approve(actor=self.actor, remember_for_run=True)
            if choice == "deny":
                reason = self.console.input("Give a reason for the model (optional) > ").strip()
                return Deny(reason or "denied at the terminal", actor=self.actor)
            if choice == "edit":
                return Approve(input=self._edit(request), actor=self.actor)
            self.console.print(Text("Please answer a, d, e or A (or approve, deny, edit, always).", style="red"))

    def _edit(self, request: ApprovalRequest) -> dict[str, Any]:
        """Asked again until the JSON is valid for the tool and no deny rule forbids it."""
        tool = self.agent.tool_index.get(request.tool)
        while True:
            raw = self.console.input("New input as JSON > ").strip()
            try:
                value = json.loads(raw)
                arguments = tool.validate(value) if tool is not None else None
            except (ValueError, pydantic.ValidationError) as error:
                self.console.print(Text(f"Not valid for {request.tool}: {error}", style="red"))
                continue
            if not isinstance(value, dict):
                self.console.print(Text("The input must be a JSON object.", style="red"))
                continue
            if tool is None or arguments is None:
                return value
            context = ApprovalContext(
                run_id=request.run_id,
                tool=tool.name,
                call_id=request.call_id,
                tenant=request.tenant,
                agent=self.agent.name,
            )
            why = denial(self.agent.policy, tool, arguments, context)
            if why is None:
                return arguments.model_dump(mode="json")
            self.console.print(Text(f"Not allowed: {why}", style="red"))


def render_result(console: Console, result: RunResult) -> None:
    """The end of a drive: status, answer or error, pending calls, usage."""
    style = {"done": "green", "failed": "red", "awaiting_approval": "yellow", "waiting_retry": "yellow"}.get(
        result.status, "white"
    )
    lines: list[Any] = [Text.assemble(("status: ", "bold"), (result.status, style))]
    if result.output:
        lines.append(Text(result.output))
    if result.result is not None:
        lines.append(_json(result.result))
    if result.error:
        lines.append(Text(f"error: {result.error}", style="red"))
    if result.next_due_at is not None:
        due = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result.next_due_at))
        lines.append(Text(f"next tool retry due at {due}", style="yellow"))
    for pending in result.pending_approvals:
        lines.append(
            Text(f"pending: {pending['call_id']} {pending['tool']} {json.dumps(pending['input'])}", style="yellow")
        )
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
    return Syntax(json.dumps(value, indent=2, ensure_ascii=False), "json", theme="ansi_dark", word_wrap=True)


_MEASURES = ("content", "messages", "spec", "full_content", "usage", "cost_usd", "latency", "duration")
"""Event fields not repeated in the detail column: too long, or shown in their own columns."""


def render_events(console: Console, events: Sequence[Event]) -> None:
    """The event log as a table, with each step's tokens, cost, model latency and tool time."""
    table = Table("seq", "type", show_lines=False)
    for header in ("tokens in/out/cache w/r", "cost $", "model s", "tool s"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("detail")
    for event in events:
        data = event.data
        detail = {k: v for k, v in data.items() if k not in _MEASURES}
        if "content" in data and event.type == ev.TOOL_FINISHED:
            detail["content"] = _preview(str(data["content"]), 80)
        tokens = ""
        if event.type == ev.MODEL_RESPONDED:
            usage = data.get("usage") or {}
            kinds = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            tokens = "/".join(str(usage.get(kind) or 0) for kind in kinds)
        cost = data.get("cost_usd")
        table.add_row(
            str(event.seq),
            Text(event.type),
            tokens,
            f"{cost:.6f}" if isinstance(cost, int | float) else ("?" if event.type == ev.MODEL_RESPONDED else ""),
            _seconds(data.get("latency")),
            _seconds(data.get("duration")),
            Text(_preview(json.dumps(detail, ensure_ascii=False, default=str), 160)),  # Text: never read as markup
        )
    console.print(table)


def _seconds(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else ""


def render_pending(console: Console, pending: Sequence[PendingApproval]) -> None:
    """Calls waiting for a person, one block each (ids whole: they are copied into approve/deny)."""
    if not pending:
        console.print("No tool calls are waiting for approval.")
        return
    for call in pending:
        console.print(
            Text.assemble(
                (call.run_id, "bold"),
                "  ",
                (call.call_id, "bold"),
                "  ",
                (call.tool, "yellow"),
                ("  fingerprint ", "dim"),
                call.fingerprint,
            )
        )
        console.print(Text.assemble(("  input  ", "dim"), _preview(json.dumps(call.input, ensure_ascii=False), 200)))
        console.print(Text.assemble(("  why    ", "dim"), call.reason or "approval required"))
    console.print(
        f"{len(pending)} call(s) waiting. Decide with [bold]tether approve RUN CALL[/] or "
        "[bold]tether deny RUN CALL[/], then [bold]tether resume RUN[/]"
    )


def render_audit(console: Console, entries: Sequence[AuditEntry]) -> None:
    """The audit log as a table: one row per tool call (``--json`` has every detail)."""
    if not entries:
        console.print("No tool calls match.")
        return
    table = Table("when", "tool", "input", "decision", "tries", "outcome", "secs")
    table.add_column("run / call", no_wrap=True)  # ids are copied into show/approve
    for entry in entries:
        decision = entry.decision or {}
        verdict = f"{decision.get('verdict', '-')} by {decision['by']}" if decision.get("by") else "-"
        if decision.get("verdict") == "allowed" and not decision.get("by"):
            verdict = str(decision.get("reason") or "allowed")  # no approval needed
        if decision.get("for_run_call"):
            verdict += f" (for the run, with {decision['for_run_call']})"
        if decision.get("reason") and decision.get("verdict") == "denied":
            verdict += f": {_preview(str(decision['reason']), 40)}"
        if decision.get("edited_input") is not None:
            verdict += " (input edited)"
        outcome = entry.status
        if entry.status == "error" and entry.error_type:
            outcome += f" {entry.error_type}"
        if entry.cached:
            outcome += " (cached)"
        if entry.truncated_from is not None:
            outcome += f" ({entry.truncated_from} chars, truncated for the model)"
        style = {"ok": "green", "error": "red", "denied": "red", "awaiting_approval": "yellow"}.get(entry.status, "")
        table.add_row(  # Text cells: inputs, reasons and ids are never read as markup
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.requested_at)),
            Text(entry.tool),
            Text(_preview(json.dumps(entry.input, ensure_ascii=False), 50)),
            Text(verdict),
            str(entry.attempts),
            Text(outcome, style=style),
            "-" if entry.duration is None else f"{entry.duration:.3f}",
            Text(f"{entry.run_id} {entry.call_id}"),
        )
    console.print(table)


def render_runs(console: Console, rows: Sequence[dict[str, Any]]) -> None:
    """A table of runs."""
    table = Table("status", "steps", "tools", "updated")
    table.columns[0].no_wrap = True
    table.add_column("run", no_wrap=True, min_width=24)  # ids are copied into approve/resume
    for row in rows:
        table.add_row(row["status"], str(row["steps"]), str(row["tool_calls"]), row["updated"], Text(row["run_id"]))
    console.print(table)
