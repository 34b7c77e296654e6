"""The ``tether`` command line.

Exit codes (:class:`~tether.surfaces.exit_codes.ExitCode`): 0 done, 1 failed or cancelled (or
refused), 2 usage error (nothing done; a run, call or database not there), 3 awaiting approval,
4 waiting for a tool retry due later than ``--max-wait`` (resume it then, e.g. from cron with
``tether runs --due``), 5 busy (another process is driving the run: it holds the run's lease;
``resume --force`` takes it over), 128 + the signal when interrupted while the model or a tool
ran or at the approval prompt (the run is parked first, the calls not answered left pending):
130 Ctrl-C, 143 SIGTERM, 129 SIGHUP, all handled alike (the run resumes from its last committed
step; the hint says how); a reader leaving early (``| head``) is 0. ``--json`` prints exactly
one JSON object on stdout and nothing else, an interrupted run's object as it stands included.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import getpass
import io
import json
import logging
import math
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from tether import __version__, durations
from tether.agent import Agent
from tether.core.approvals import (
    Approve,
    Approver,
    AutoApprover,
    DecideLater,
    Deny,
    PendingApproval,
    edited_input,
    overruled,
)
from tether.core.forks import MessageEdit
from tether.core.links import chain_of, link_of, parent_of
from tether.core.state import RunState
from tether.drivers.loader import (
    DEMO_MODEL,
    NoModel,
    agent_from_spec,
    agent_spec,
    continued_spec,
    normalise_model_spec,
    policy_change,
    reader_agent,
    toolset_changes,
)
from tether.drivers.queue import (
    DEFAULT_QUEUE,
    DEFAULT_STALLED_AFTER,
    check_can_queue,
    ensure_schema,
    queue_of,
    requeue,
)
from tether.drivers.runner import EventListener, Runner, RunResult, result_of, shown_status
from tether.drivers.worker import Worker, WorkerNote
from tether.errors import (
    ApprovalError,
    ConfigError,
    CorruptData,
    InvalidForkPoint,
    MissingExtra,
    RunBusy,
    RunEnded,
    RunNotFound,
    StaleRun,
    TetherError,
    UnknownCall,
)
from tether.extras import require
from tether.facts.events import Event
from tether.facts.status import ENDED, SHOWN, WAITING_RETRY, RunStatus, stored_filter, stored_status
from tether.heap import freeze_startup_heap
from tether.models import ModelAdapter
from tether.models.providers import missing_credentials
from tether.policy.policies import Budget
from tether.policy.pricing import PRICE_FORM, parse_price
from tether.stores import PARKED_STATUSES, RunQuery, RunRecord, Store, deletable, leases, open_store, shown_url
from tether.surfaces import replaying
from tether.surfaces.exit_codes import SIGNAL_BASE, ExitCode
from tether.surfaces.hints import RUN_ID_HELP, command, db_option, invocation, lines
from tether.toolsets import from_record

if TYPE_CHECKING:
    from tether.drivers.otel import OpenTelemetry
    from tether.policy.access import Credentials
    from tether.surfaces.terminal import LiveView, TerminalApprover

STOP_SIGNALS = ("SIGTERM", "SIGHUP")
"""Handled like Ctrl-C: the run stays resumable from its last committed step."""
STATUS_EXIT = {
    RunStatus.done.shown: ExitCode.DONE,
    RunStatus.awaiting_approval.shown: ExitCode.AWAITING,
    WAITING_RETRY: ExitCode.WAITING_RETRY,
}
RUN_STATUSES = SHOWN
"""Every status ``tether runs`` shows (snake_case, as on every CLI surface)."""
ENDED_SHOWN = sorted(status.shown for status in ENDED)
"""The statuses ``tether gc`` may delete."""
DEFAULT_MAX_WAIT = 30.0
"""Seconds ``run``/``resume`` sleep for a tool retry before parking the run instead (exit 4)."""


def _db_url(value: str | None) -> str:
    return value or os.environ.get("TETHER_DB") or "sqlite:///tether.db"


def _parser() -> argparse.ArgumentParser:  # noqa: PLR0915 - one block per command, read top to bottom
    parser = argparse.ArgumentParser(
        prog="tether", description="Run LLM agents whose tools the host executes, step by step."
    )
    parser.add_argument("--version", action="version", version=f"tether {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_db(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument("--db", help="SQLAlchemy URL (default $TETHER_DB, else sqlite:///tether.db)")
        return sub

    def with_approvals(sub: argparse.ArgumentParser) -> None:
        group = sub.add_mutually_exclusive_group()
        group.add_argument("--approve-all", action="store_true", help="approve every gated call")
        group.add_argument("--deny-all", action="store_true", help="deny every gated call")

    run = _with_otel(with_db(commands.add_parser("run", help="start a run")))
    _add_run(run)
    with_approvals(run)

    resume = _with_otel(with_db(commands.add_parser("resume", help="drive a parked or interrupted run on")))
    resume.add_argument("run_id", help=RUN_ID_HELP)
    resume.add_argument("--json", action="store_true", help="print one JSON object")
    _add_max_wait(resume)
    resume.add_argument(
        "--force",
        action="store_true",
        help="take the run from the process holding its lease; its calls in flight count as abandoned "
        "(only if you know that process is gone)",
    )
    resume.add_argument(
        "--detach", action="store_true", help="queue a submitted run again for `tether worker` instead (its job failed)"
    )
    with_approvals(resume)

    approve = _with_otel(with_db(commands.add_parser("approve", help="approve a pending tool call")))
    _add_decision(approve)
    approve.add_argument("--input", help="edited input as JSON (validated against the tool's schema)")
    approve.add_argument("--for-run", action="store_true", help="also approve this tool's later calls in this run")

    deny = _with_otel(with_db(commands.add_parser("deny", help="deny a pending tool call")))
    _add_decision(deny)
    deny.add_argument("--reason", default="", help="why (the model sees it)")

    _add_cancel(with_db(commands.add_parser("cancel", help="stop a run that has not ended, from any process")))

    _add_fork(_with_otel(with_db(commands.add_parser("fork", help="start a new run from an event of an earlier one"))))

    show = with_db(commands.add_parser("show", help="show a run as a conversation: prompt, steps, calls, decisions"))
    show.add_argument("run_id", help=RUN_ID_HELP)
    show.add_argument("--events", action="store_true", help="show the run's event log instead of the conversation")
    show.add_argument("--json", action="store_true", help="print one JSON object, with the messages and the event log")

    runs = with_db(commands.add_parser("runs", help="list runs"))
    runs.add_argument(
        "--status", choices=RUN_STATUSES, metavar="STATUS", help=f"only runs in this status: {', '.join(RUN_STATUSES)}"
    )
    runs.add_argument("--due", action="store_true", help="only runs whose tool retry is due now (to resume them)")
    runs.add_argument("--json", action="store_true", help='print one object {"runs": [...], "total": N}')
    _add_limit(runs, "runs")

    _add_gc(with_db(commands.add_parser("gc", help="delete finished runs and their events")))

    pending = with_db(commands.add_parser("pending", help="list tool calls waiting for approval"))
    pending.add_argument("--json", action="store_true", help='print one object {"pending": [...], "total": N}')
    pending.add_argument("--run", dest="run_id", help="only this run's calls (and those of the child runs below it)")
    pending.add_argument("--tenant", help="only this tenant's runs")
    _add_limit(pending, "calls")

    _add_audit(with_db(commands.add_parser("audit", help="every tool call: input, decision, attempts, outcome")))

    demo = _with_otel(commands.add_parser("demo", help="an agent with real tools and an approval gate"))
    demo.add_argument("--workspace", default=None, help="scratch directory (default ./tether-demo)")
    demo.add_argument("--db", help="SQLAlchemy URL (default sqlite in the workspace)")
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    with_approvals(demo)

    diagram = with_db(commands.add_parser("diagram", help="draw the run graph, a run's path, or its timeline"))
    diagram.add_argument(
        "--format",
        choices=["mermaid", "dot", "svg", "png"],
        help="mermaid or dot source, or svg or png rendered by Graphviz (default: the one -o FILE's extension "
        "names, .mmd .dot .svg .png; else mermaid)",
    )
    diagram.add_argument("--run", metavar="RUN_ID", help="highlight this run's path (with --kind graph)")
    diagram.add_argument(
        "--kind", choices=["graph", "sequence"], default="graph", help="sequence: the run's timeline (Mermaid)"
    )
    diagram.add_argument("-o", "--output", metavar="FILE", help="write here (a PNG needs it on a terminal)")
    _add_ui(_with_otel(with_db(commands.add_parser("ui", help="serve the web inspector and approval inbox"))))
    _add_worker(_with_otel(with_db(commands.add_parser("worker", help="drive queued runs (--detach) on PostgreSQL"))))
    replaying.add_commands(commands, with_db)
    return parser


def _with_otel(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command that can trace what it does (see :func:`_telemetry`)."""
    sub.add_argument(
        "--otel",
        action="store_true",
        help="trace with OpenTelemetry (tether[otel]; on too when $OTEL_TRACES_EXPORTER is set: otlp, console)",
    )
    return sub


DEFAULT_LISTED = 100
"""How many runs ``tether runs`` lists, and calls ``tether pending``, unless ``--limit`` or ``--all``."""


def _add_limit(listing: argparse.ArgumentParser, what: str) -> None:
    """``--limit N`` or ``--all``: how much of a listing is shown (a cut one says so on stderr)."""
    group = listing.add_mutually_exclusive_group()
    group.add_argument(
        "--limit",
        type=_positive(int),
        default=DEFAULT_LISTED,
        metavar="N",
        help=f"list at most N {what} (default {DEFAULT_LISTED}); when there are more, stderr says how many",
    )
    group.add_argument("--all", action="store_true", help=f"list every {what}")


def _say_cut(session: _Session, shown: int, total: int, which: str) -> None:
    """On stderr, when a listing shows less than there is: ``showing the newest 100 of 1,234 runs; ...``.

    ``which`` says what is listed first and what the items are: ``newest runs``.
    """
    if shown < total:
        order, noun = which.rsplit(" ", 1)
        said = f"showing the {order} {shown:,} of {total:,} {noun}; --limit N or --all for more"
        session.err.print(Text(said))


def _add_fork(fork: argparse.ArgumentParser) -> None:
    """``tether fork``'s arguments: where to fork, and one message to change."""
    fork.add_argument("run_id", help=RUN_ID_HELP)
    fork.add_argument(
        "--at-event",
        "--at",
        dest="at",
        type=int,
        required=True,
        metavar="EVENT",
        help="the event (its # in `tether show --events`) whose history the fork starts with; it must end with a "
        "user turn (--at is its former name)",
    )
    fork.add_argument(
        "--edit-message",
        type=int,
        metavar="K",
        help="the message of the fork's history to edit (0 the first, -1 the last; default with --text: the "
        "last user message holding text, the prompt the model answers next)",
    )
    fork.add_argument("--text", help="the edited message's new text (its tool calls or results stay)")
    fork.add_argument("--json", action="store_true", help="print the new run's JSON object")


def _add_worker(worker: argparse.ArgumentParser) -> None:
    """``tether worker``'s options."""
    worker.add_argument(
        "--concurrency", type=_positive(int), default=4, metavar="N", help="runs driven at once (default 4)"
    )
    worker.add_argument(
        "--queue", default=DEFAULT_QUEUE, metavar="NAME", help=f"take this queue's jobs (default {DEFAULT_QUEUE})"
    )
    worker.add_argument(
        "--stalled-after",
        type=_positive(float),
        default=DEFAULT_STALLED_AFTER,
        metavar="SECONDS",
        help="a worker silent this long is presumed dead: its runs go to another (also each run's lease time); "
        f"default {DEFAULT_STALLED_AFTER:g}",
    )
    worker.add_argument(
        "--json",
        action="store_true",
        help='print each run picked up and each drive\'s outcome as a JSON line on stdout: {"run_id", "what", ...}',
    )


def _add_audit(audit: argparse.ArgumentParser) -> None:
    """``tether audit``'s filters (apart, to keep :func:`_parser` readable)."""
    audit.add_argument("--run", metavar="RUN_ID", help="only this run")
    audit.add_argument("--tool", metavar="NAME", help="only calls of this tool")
    audit.add_argument("--since", metavar="WHEN", help=f"activity since then: {durations.EXAMPLES}")
    audit.add_argument("--json", action="store_true", help='print one object {"entries": [...]}')


UI_TOKEN_ENV = "TETHER_UI_TOKEN"
"""The token ``tether ui`` accepts when no token file is given."""
UI_SESSION_IDLE = "30min"
UI_SESSION_LIFETIME = "8h"


def _add_ui(ui: argparse.ArgumentParser) -> None:
    """``tether ui``'s options: where to listen, who may come in, and for how long."""
    ui.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)"
    )
    ui.add_argument(
        "--port", type=int, default=8321, help="port to listen on; 0 picks a free one (default: %(default)s)"
    )
    who = ui.add_argument_group("who may come in (a token is never an argument: `ps` shows arguments to everyone)")
    who.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"a file holding the token to sign in with (default ${UI_TOKEN_ENV}; without either, one is made "
        "and printed)",
    )
    who.add_argument("--token", help=argparse.SUPPRESS)  # refused with a way out: see _cmd_ui
    who.add_argument("--tenant", help="bind the token to this tenant: it shows and decides that tenant's runs only")
    who.add_argument(
        "--tokens",
        metavar="FILE",
        help="named tokens, TOML: [[tokens]] name, token (or sha256), tenant, role = viewer|approver; decisions are "
        'recorded under the name. Or JSON {"TOKEN": "TENANT", "TOKEN2": null} (null: every tenant)',
    )
    who.add_argument(
        "--session-idle",
        metavar="AGE",
        default=UI_SESSION_IDLE,
        help="a browser is signed out after this long without a page opened or a form sent (default: %(default)s)",
    )
    who.add_argument(
        "--session-lifetime",
        metavar="AGE",
        default=UI_SESSION_LIFETIME,
        help="and after this long in all, however busy (default: %(default)s)",
    )
    reach = ui.add_argument_group("beyond this machine")
    reach.add_argument("--certfile", metavar="FILE", help="serve HTTPS with this certificate (PEM, chain included)")
    reach.add_argument("--keyfile", metavar="FILE", help="the certificate's private key (PEM)")
    reach.add_argument(
        "--insecure",
        action="store_true",
        help="listen on a non-loopback --host over plain HTTP (only where something else encrypts: a TLS proxy, a VPN)",
    )
    reach.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name browsers may reach the inspector by, besides localhost and the --host address "
        "(repeatable); requests naming any other are refused, against DNS rebinding",
    )


class _Console(Console):
    """A console whose reader leaving early (``| head``) ends the command as a ``print`` does: exit 0.

    rich's own answer exits 1, so ``audit | head`` and ``runs | head`` would differ.
    """

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "the reader left")  # see _main


_CREATES_ITS_DATABASE = frozenset({"run", "demo", "worker"})
"""The commands that may start the first run of a database; the others refuse a SQLite file not there."""


class _Notices(logging.Handler):
    """Says on stderr what a drive notes in passing (a run taken over from a dead driver), as ``notice: ...``."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.INFO)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.print(Text.assemble(("notice:", "yellow"), " ", record.getMessage()))


class _Session:
    """What one command invocation shares: consoles, the store, output mode."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.json = bool(getattr(args, "json", False))
        # soft_wrap: commands and ids printed for copying are never broken across lines
        self.out = _Console(soft_wrap=True)
        self.err = _Console(stderr=True, soft_wrap=True)
        self.notices = _Notices(self.err)
        leases.log.addHandler(self.notices)
        self.db_url = _db_url(getattr(args, "db", None))
        reads_runs = args.command not in _CREATES_ITS_DATABASE and getattr(args, "run", True) is not None
        self.store: Store = open_store(self.db_url, must_exist=reads_runs)  # `diagram` alone reads no run
        self.live: LiveView | None = None
        self.run_id: str | None = args.run_id if args.command == "resume" else None
        self.telemetry = _telemetry(args, self.err)
        """Traces the command's runs (``--otel``, ``$OTEL_TRACES_EXPORTER``); None: not traced."""
        """The run being driven, once known: named when Ctrl-C stops the command."""
        self.agents: list[Agent] = []
        """The agents made here: their teams' toolsets and models are closed at the end (:meth:`Agent.close`)."""
        self.prompt: TerminalApprover | None = None
        """The person's prompt, if one was made: a Ctrl-C there parks the run and ends the command as interrupted."""

    def agent(self, spec: dict[str, Any], *, model: ModelAdapter | None = None) -> Agent:
        """The agent ``spec`` describes; its team's toolsets and models are closed when the command ends."""
        agent = agent_from_spec(spec, model=model)
        self.agents.append(agent)
        return agent

    def approver(self, args: argparse.Namespace, agent: Agent) -> Approver:
        if getattr(args, "approve_all", False):
            return AutoApprover(approve=True)
        if getattr(args, "deny_all", False):
            return AutoApprover(approve=False)
        if sys.stdin.isatty():
            from tether.surfaces.terminal import TerminalApprover

            # with --json, stdout holds the one JSON object: the person is asked on stderr
            console = self.err if self.json else self.out
            actor = person() or "terminal"
            self.prompt = TerminalApprover(console, agent, actor=actor, still_waiting=self._decided_meanwhile)
            return self.prompt
        return DecideLater()  # parked for `tether approve`: calls in doubt after a crash are asked too

    def _decided_meanwhile(self, request: PendingApproval) -> str | None:
        """Whether ``request`` still waits, as the store says now: None, else what became of it.

        ``tether approve`` in another shell may decide a call while the prompt is open: it is not asked then.
        """
        try:
            state = Runner(reader_agent(), self.store).load(request.run_id, tenant=request.tenant)
        except TetherError:  # the store cannot say: ask, and the drive sorts it out when it records the answer
            return None
        return overruled(state, request.call_id, request.fingerprint)

    def runner(self, args: argparse.Namespace, agent: Agent) -> Runner:
        listeners: list[EventListener] = [self._note_run]
        if not self.json:
            from tether.models.sdk import SdkAdapter  # here: only a drive needs it
            from tether.surfaces.terminal import LiveView, ProgressPrinter

            self.live = LiveView(self.out)  # a no-op unless stdout is a terminal
            listeners += [self.live, ProgressPrinter(self.out)]
            if isinstance(agent.model, SdkAdapter):  # Claude's or OpenAI's: surface the SDK's retry waits
                agent.model.on_retry_wait = self._show_retry_wait
        on_action = self.live.on_action if self.live is not None else None
        on_text = self.live.on_text if self.live is not None and self.live.enabled else None  # stream to a screen only
        return Runner(
            agent,
            self.store,
            approver=self.approver(args, agent),
            listeners=listeners,
            on_action=on_action,
            on_text=on_text,
            telemetry=self.telemetry,
        )

    def _note_run(self, state: RunState, event: Event) -> None:
        self.run_id = state.id

    def interrupted(self) -> None:
        """Ctrl-C (or SIGTERM, SIGHUP) while work ran: take the spinner down, then say how to go on.

        With ``--json`` the run's object is printed as it stands (read back from the store), so
        a script still gets one JSON object; none if no run was created yet.
        """
        self.close()
        self.print_as_it_stands()
        hint = lines("interrupted; resume with:", self.command("resume", self.run_id)) if self.run_id else "interrupted"
        self.err.print(Text(hint, style="yellow"))

    def print_as_it_stands(self, **extra: Any) -> None:
        """With ``--json``, the run's object as the store has it now (plus ``extra``); none if no run.

        A drive that stopped early (interrupted, busy, changed by another process) still prints its one object.
        """
        if not self.json or self.run_id is None:
            return
        try:
            state = Runner(reader_agent(), self.store).load(self.run_id)
        except TetherError:  # the store cannot say: the message on stderr still names the run
            return
        print(json.dumps({**result_of(state).to_dict(), **extra}, ensure_ascii=False))

    def _show_retry_wait(self, seconds: float, retry: int) -> None:
        if self.live is not None and self.live.waiting_for_model(seconds, retry):
            return  # shown in the spinner; the event log keeps it (model_responded's retry_waits)
        self.err.print(f"[yellow]the model API is busy or unreachable: retrying in {seconds:.1f}s (retry {retry})[/]")

    def close(self) -> None:
        """Clear a spinner left by an error, so the message and the cursor show; stop toolsets' servers.

        The store's pooled connections are released too (it reconnects if used again).
        """
        if self.live is not None:
            with suppress(OSError):  # the terminal is gone (SIGHUP): nothing left to clear
                self.live.stop()
        while self.agents:  # what main() runs in-process leaves no socket or server behind
            self.agents.pop().close()
        if self.telemetry is not None:
            self.telemetry.close()  # flushes the spans
        leases.log.removeHandler(self.notices)
        self.store.close()

    def finish(self, result: RunResult) -> int:
        from tether.views.tree import child_entries, run_tree

        if self.json:
            data = result.to_dict()
            children = child_entries(self.store, result.run_id)
            if children:  # only runs that started child runs have them (the contract's keys otherwise)
                data["children"] = children
            print(json.dumps(data, ensure_ascii=False))
        else:
            from tether.surfaces.terminal import render_result, render_tree

            render_result(self.out, result)
            tree = run_tree(self.store, result.run_id)
            if tree.children:
                render_tree(self.out, tree)
            if result.status == RunStatus.awaiting_approval.shown:
                self.out.print(self._decide_hint(result))
            elif result.status == WAITING_RETRY and result.next_due_at is not None:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result.next_due_at))
                lead = f"A tool retry is due at {when}: resume after it with:"
                resume = lines(lead, self.command("resume", result.run_id))
                due = lines("or let this find it when it is due:", self.command("runs", "--due"))
                self.out.print(Text(f"{resume}\n{due}"))
        if self.prompt is not None and self.prompt.interrupted is not None:  # parked, the calls pending
            return _interrupted_exit(self.prompt.interrupted)
        return STATUS_EXIT.get(result.status, ExitCode.FAILED)

    def _decide_hint(self, result: RunResult) -> Text:
        """Commands to copy, one a line, with the first pending call's real id (absolute, with ``--db``)."""
        from tether.views.printable import printable  # call ids come from the model

        pending = [printable(p["call_id"]) for p in result.pending_approvals] or ["CALL_ID"]
        run = result.run_id
        decide = lines("Decide with:", self.command("approve", run, pending[0]), self.command("deny", run, pending[0]))
        each = f"\n(and likewise for {', '.join(pending[1:])})" if len(pending) > 1 else ""
        return Text(f"{decide}{each}\n" + lines("then go on with:", self.command("resume", run)))

    def command(self, *words: str) -> str:
        """``/abs/tether WORDS --db URL``: a whole command to copy, for this tether and this database."""
        return command(self.db_url, *words)


def _cmd_run(args: argparse.Namespace, session: _Session) -> int:
    """Start a run; with ``--continue``, its agent is the earlier run's but for what the flags set."""
    if args.detach:
        if args.approve_all or args.deny_all:
            raise ConfigError("a queued run's gated calls wait for `tether approve`: --detach takes no --approve-all")
        ensure_schema(check_can_queue(session.store))
    given = _run_flags(args)
    if args.continue_from is not None:
        spec = continued_spec(session.store.load_run(args.continue_from).spec, given)
    else:
        budget = given.get("budget") or {}
        fresh = {"budget": Budget(**budget).to_dict() if set(budget) - {"on_limit"} else None}
        spec = {"tools": [], "cwd": os.getcwd(), **given, **fresh}
    spec.setdefault("model", normalise_model_spec(None))
    if args.price:  # a price without MODEL= is the run's model's, known only now
        prices = dict(parse_price(text, model=spec["model"]) for text in args.price)
        spec["prices"] = {**(spec.get("prices") or {}), **{model: price.to_dict() for model, price in prices.items()}}
    agent = session.agent(spec)  # its settings checked first: a key would not mend them
    if not args.detach and spec["model"] != DEMO_MODEL:  # a queued run is called by its worker, with its keys
        missing = missing_credentials(spec["model"])
        if missing is not None:
            raise ConfigError(missing)
    if args.detach:
        return _detach(args, session, agent)
    runner = session.runner(args, agent)
    return session.finish(runner.run(args.prompt, continue_from=args.continue_from, max_wait=args.max_wait))


def _detach(args: argparse.Namespace, session: _Session, agent: Agent) -> int:
    """Create the run and queue it in one transaction; print its id (a worker drives it)."""
    runner = Runner(agent, session.store, telemetry=session.telemetry)  # a worker's drives continue its trace
    run_id = runner.submit(args.prompt, queue=args.queue, continue_from=args.continue_from)
    if session.json:
        print(json.dumps({"run_id": run_id, "status": "queued", "queue": args.queue}))
    else:
        print(run_id)
        follow = session.command("show", run_id)
        session.err.print(Text(lines(f"queued for `tether worker` (queue {args.queue}); follow it with:", follow)))
    return ExitCode.DONE


def _cmd_worker(args: argparse.Namespace, session: _Session) -> int:
    """Drive queued runs until SIGTERM or Ctrl-C, which let each run finish its current step first.

    Prints a line per run it picks up and per drive's outcome: on stderr, as its other lines, or
    with ``--json`` one JSON object per line on stdout (for a log shipper; the rest stays on stderr).
    """
    from tether.surfaces.terminal import render_worker_note

    def note_as_json(note: WorkerNote) -> None:
        print(json.dumps({"time": time.time(), **dataclasses.asdict(note)}, ensure_ascii=False), flush=True)

    worker = Worker(
        session.db_url,
        queue=args.queue,
        concurrency=args.concurrency,
        stalled_after=args.stalled_after,
        telemetry=session.telemetry,
        on_note=note_as_json if args.json else lambda note: render_worker_note(session.err, note),
    )
    session.err.print(
        Text(
            f"tether worker: queue {args.queue!r}, {args.concurrency} runs at a time, on {shown_url(session.db_url)}"
            " (SIGTERM or Ctrl-C: stop after each run's current step)"
        )
    )
    freeze_startup_heap()  # this process is the worker's: its imports stay out of the GC's full passes
    asyncio.run(_serve(worker, session.err))
    session.err.print(Text("tether worker: stopped; unfinished runs are queued again"))
    return ExitCode.DONE


async def _serve(worker: Worker, err: Console) -> None:
    loop = asyncio.get_running_loop()

    def stop(name: str) -> None:
        if not worker.stopping.is_set():
            err.print(Text(f"tether worker: {name}: stopping after each run's current step"))
        worker.stop()

    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None:
            loop.add_signal_handler(signum, stop, "Ctrl-C" if name == "SIGINT" else name)
    await worker.run()


def _run_flags(args: argparse.Namespace) -> dict[str, Any]:
    """What ``tether run``'s flags set, in a run spec's terms (a flag not given sets nothing).

    ``budget`` holds only the limits given (and ``on_limit``), so a continued run can keep
    the others; given tools come with the directory they are loaded from.
    """
    budget = {
        "max_cost_usd": args.max_cost,
        "max_total_tokens": args.max_tokens,
        "max_tool_calls": args.max_tool_calls,
        "max_seconds": args.max_seconds,
        "on_limit": args.on_limit,
    }
    flags = {
        "toolsets": [{"kind": given["kind"], **from_record(given).options()} for given in args.toolsets] or None,
        "tools": list(args.tools) or None,
        "cwd": os.getcwd() if args.tools else None,
        "model": normalise_model_spec(args.model) if args.model else None,
        "system": args.system,
        "max_steps": args.max_steps,
        "policy": str(Path(args.policy).resolve()) if args.policy else None,
        "budget": {k: v for k, v in budget.items() if v is not None} or None,
        "model_settings": _model_settings_flags(args) or None,
    }
    return {k: v for k, v in flags.items() if v is not None}


def _model_settings_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The model settings the flags set, in their stored form (checked when the agent is made)."""
    given = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": args.max_tokens_per_call,
        "stop_sequences": list(args.stop) or None,
        "tool_choice": args.tool_choice,
        "thinking_budget": args.thinking_budget,
    }
    return {k: v for k, v in given.items() if v is not None}


def _agent_for(session: _Session, run_id: str, *, model: ModelAdapter | None = None) -> Agent:
    """The run's agent (importing its tools module, reaching its toolsets).

    Warns on stderr of what changed since the run started: its rule file, its toolsets' tools.
    """
    spec = agent_spec(session.store, session.store.load_run(run_id))
    agent = session.agent(spec, model=model)
    changed = policy_change(run_id, spec, agent)
    for warning in ([changed] if changed is not None else []) + toolset_changes(spec, agent):
        session.err.print(Text.assemble(("warning:", "yellow"), " ", warning))
    return agent


def _root_of(session: _Session, run_id: str) -> str:
    """The first run of ``run_id``'s tree (itself, unless a child run): its agent, rebuilt, reaches every run below."""
    return chain_of(run_id, session.store.load_run(run_id).spec)[0]


def _cmd_resume(args: argparse.Namespace, session: _Session) -> int:
    """Drive a run on; a child run is driven by its root (which drives it, then goes on), so name that."""
    root = _root_of(session, args.run_id)
    if root != args.run_id:
        lead = f"run {args.run_id} is a child run: resume the run it belongs to, which drives it first:"
        raise ConfigError(lines(lead, session.command("resume", root)))
    if args.detach:
        if args.force or args.approve_all or args.deny_all:
            raise ConfigError("--detach hands the run to a worker: it takes no --force, --approve-all or --deny-all")
        queued = requeue(session.store, args.run_id)
        if session.json:
            print(json.dumps({"run_id": args.run_id, "status": "queued", "already": not queued}))
        else:
            session.out.print(Text(f"run {args.run_id} {'queued again' if queued else 'was queued already'}"))
        return ExitCode.DONE
    runner = session.runner(args, _agent_for(session, args.run_id))
    return session.finish(runner.drive(args.run_id, max_wait=args.max_wait, force=args.force))


def person() -> str | None:
    """Who is at this terminal: ``$USER``, else the system's login name for this uid.

    A container, cron or ``docker exec`` sets no ``$USER``; "cli" would say nothing of who decided.
    """
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):  # a uid with no account (a container's arbitrary uid)
        return None


def _cmd_decide(args: argparse.Namespace, session: _Session) -> int:
    """Approve (with the run's tools, to validate an edit) or deny (with none: the module may be gone).

    A call waiting in a child run is decided by the child's id or any run's above it; an
    approval rebuilds the root run's agent, whose agent tools lead down to the child's.
    """
    root = _root_of(session, args.run_id)
    agent = _agent_for(session, root, model=NoModel()) if args.command == "approve" else reader_agent()
    runner = Runner(agent, session.store, telemetry=session.telemetry)
    actor = args.by or person() or "cli"
    if args.command == "approve":
        edited = None if args.input is None else edited_input(args.input, what="--input")
        approval = Approve(input=edited, actor=actor, remember_for_run=args.for_run)
        result = runner.decide(args.run_id, args.call_id, approval, fingerprint=args.fingerprint)
    else:
        result = runner.decide(args.run_id, args.call_id, Deny(args.reason, actor=actor), fingerprint=args.fingerprint)
    verb = "approved" if args.command == "approve" else "denied"
    where = result.run_id if result.run_id == root else f"{result.run_id} (a child run of {root})"
    session.out.print(Text(f"{verb} {args.call_id} in run {where} (status now {result.status})"))
    if result.status != RunStatus.awaiting_approval.shown:
        queue = queue_of(session.store.load_run(root).spec)
        if queue is not None:  # the decision queued the root, in its own transaction
            session.out.print(Text(f"queued for `tether worker` (queue {queue}): it goes on by itself"))
        else:
            session.out.print(Text(lines("continue with:", session.command("resume", root))))
    return ExitCode.DONE


def _add_cancel(cancel: argparse.ArgumentParser) -> None:
    """``tether cancel``'s arguments."""
    cancel.add_argument("run_id", help=RUN_ID_HELP)
    cancel.add_argument("--reason", default="", help="why (kept as the run's error: cancelled: REASON)")
    cancel.add_argument("--json", action="store_true", help="print the run's JSON object")


def _cmd_cancel(args: argparse.Namespace, session: _Session) -> int:
    """End a run that has not ended (parked, interrupted, waiting for a retry, failed transiently).

    Imports no tools and loads no model, so a run whose tools module is gone can still be
    stopped. An ended run is a usage error (exit 2): there is nothing to cancel.
    """
    runner = Runner(reader_agent(), session.store)
    before = result_of(runner.load(args.run_id)).status
    result = runner.cancel(args.run_id, args.reason)
    if session.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        session.out.print(Text(f"cancelled run {args.run_id} (it was {before})"))
    return ExitCode.DONE


def _cmd_fork(args: argparse.Namespace, session: _Session) -> int:
    """Start a new run from an event of an earlier one (not driven: its tools are loaded by ``resume``)."""
    if args.edit_message is not None and args.text is None:
        raise ConfigError("--edit-message K needs --text: the message's new text")
    edit = None if args.text is None else MessageEdit(args.edit_message, args.text)
    runner = Runner(reader_agent(), session.store, telemetry=session.telemetry)
    fork = runner.fork(args.run_id, at_event=args.at, edit=edit)
    if session.json:
        print(json.dumps({**result_of(fork).to_dict(), "forked_from": fork.spec["forked_from"]}, ensure_ascii=False))
    else:
        session.out.print(Text(f"forked run {args.run_id} at event {args.at}: new run {fork.id}"))
        session.out.print(Text(lines("drive it with:", session.command("resume", fork.id))))
    return ExitCode.DONE


def _cmd_show(args: argparse.Namespace, session: _Session) -> int:
    """The run, where it sits in its tree of runs (if any), and its event log."""
    from tether.views.tree import run_tree

    runner = Runner(reader_agent(), session.store)
    state = runner.load(args.run_id)
    events = session.store.load_events(args.run_id)
    result = result_of(state)
    tree = run_tree(session.store, args.run_id)
    link = link_of(state.spec)
    if session.json:
        payload: dict[str, Any] = result.to_dict()
        payload["cost_usd"] = result.cost_usd
        payload["model_seconds"] = result.model_seconds
        payload["tool_seconds"] = result.tool_seconds
        payload["forked_from"] = state.spec.get("forked_from")
        payload["agent"], payload["handed_off_from"] = tree.agent, tree.handed_off_from
        if link is not None:
            payload["parent"] = link
        if tree.children:
            payload["children"] = [child.to_dict() for child in tree.children]
        payload["messages"] = state.messages
        payload["events"] = [event.to_dict() for event in events]
        print(json.dumps(payload, ensure_ascii=False, default=str))
        return ExitCode.DONE
    from tether.surfaces.terminal import render_events, render_result, render_tree

    render_result(session.out, result)
    if tree.handed_off_from is not None and not tree.children:  # else the tree's first line says so
        session.out.print(Text(f"agent in charge: {tree.agent} (handed off from {tree.handed_off_from})"))
    if (origin := state.spec.get("forked_from")) is not None:
        session.out.print(Text(f"forked from run {origin.get('run_id')} at event {origin.get('step')}"))
    if link is not None:
        root = chain_of(state.id, state.spec)[0]
        of = f"child run of {link['run_id']} (its call {link['call_id']} of {link['tool']}); the whole tree:"
        session.out.print(Text(lines(of, session.command("show", root))))
    if tree.children:
        render_tree(session.out, tree)
    if args.events:
        render_events(session.out, events)
        return ExitCode.DONE
    from tether.surfaces.story import render_conversation
    from tether.views.conversation import conversation

    render_conversation(session.out, conversation(args.run_id, events, tree.children))
    return ExitCode.DONE


def _cmd_runs(args: argparse.Namespace, session: _Session) -> int:
    if args.due and args.status is not None:
        raise ConfigError("--due lists runs waiting for a retry: it cannot be combined with --status")
    store, limit = session.store, None if args.all else args.limit
    if args.due:  # every run due is read (those waiting for a retry bound them), to count them
        retrying = store.query_runs(RunQuery(waiting_retry=True), limit=0).total
        due = store.list_due(time.time(), limit=max(retrying, 1))
        records, total, which = due[:limit], len(due), "earliest due runs"
    else:
        status, waiting_retry = stored_filter(args.status) if args.status is not None else (None, None)
        query = RunQuery(status=status, waiting_retry=waiting_retry)
        found = store.query_runs(query, limit=store.query_runs(query, limit=0).total if limit is None else limit)
        records, total, which = found.records, found.total, "newest runs"
    _say_cut(session, len(records), total, which)
    rows = [
        {
            "run_id": r.id,
            "status": shown_status(r),
            "parent": parent_of(r.spec),
            "prompt": r.spec.get("prompt"),
            "steps": r.summary.get("steps", 0),
            "tool_calls": r.summary.get("tool_calls", 0),
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "updated": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.updated_at)),
            "next_due_at": r.summary.get("next_due_at"),
            "error": r.unreadable or r.summary.get("error"),
        }
        for r in records
    ]
    for record in records:  # listed all the same, so one damaged row hides no other run
        if record.unreadable:
            session.err.print(Text.assemble(("warning:", "yellow"), f" run {record.id}: {record.unreadable}"))
    if session.json:
        print(json.dumps({"runs": rows, "total": total}, ensure_ascii=False))
        return ExitCode.DONE
    from tether.surfaces.terminal import render_runs

    render_runs(session.out, rows)
    return ExitCode.DONE


def _cmd_pending(args: argparse.Namespace, session: _Session) -> int:
    from tether.views.pending import pending_approvals

    waiting = pending_approvals(session.store, tenant=args.tenant, run_id=args.run_id)  # all, to count them
    pending = waiting if args.all else waiting[: args.limit]
    _say_cut(session, len(pending), len(waiting), "longest waiting calls")
    roots = {call.root for call in pending}
    queues = {root: queue for root in roots if (queue := queue_of(session.store.load_run(root).spec)) is not None}
    if session.json:
        shown = [{**p.to_dict(), "queue": queues.get(p.root)} for p in pending]
        print(json.dumps({"pending": shown, "total": len(waiting)}, ensure_ascii=False, default=str))
        return ExitCode.DONE
    from tether.surfaces.terminal import render_pending

    render_pending(
        session.out, pending, command=invocation(), db=db_option(session.db_url), queues=queues, total=len(waiting)
    )
    return ExitCode.DONE


def _cmd_audit(args: argparse.Namespace, session: _Session) -> int:
    from tether.views import audit

    since = audit.parse_since(args.since, now=time.time()) if args.since else None
    found = audit.query(session.store, run_id=args.run, tool=args.tool, since=since)
    if session.json:
        print(json.dumps({"entries": [e.to_dict() for e in found]}, ensure_ascii=False, default=str))
        return ExitCode.DONE
    from tether.surfaces.terminal import render_audit

    render_audit(session.out, found)
    return ExitCode.DONE


def _cmd_demo(args: argparse.Namespace, session: _Session) -> int:
    from tether.examples import demo

    spec = {
        "tools": ["tether.examples.demo:TOOLS"],
        "system": demo.SYSTEM,
        "cwd": os.getcwd(),
        "max_steps": 10,
        "model": normalise_model_spec(None) if os.environ.get("ANTHROPIC_API_KEY") else DEMO_MODEL,
        "env": {demo.WORKSPACE_ENV: str(demo.workspace())},
    }
    agent = session.agent(spec)
    if not session.json:
        model = "Claude (" + agent.model_name + ")" if agent.model_name != DEMO_MODEL else "the offline scripted model"
        about = f"workspace {demo.workspace()}, database {shown_url(session.db_url)}, {model}"
        session.out.print(Text.assemble(("tether demo", "bold"), ": ", about))
        session.out.print(Text.assemble(("prompt", "bold"), ": ", demo.PROMPT))
    runner = session.runner(args, agent)
    return session.finish(runner.run(demo.PROMPT))


def _cmd_diagram(args: argparse.Namespace, session: _Session) -> int:
    """Every format goes to stdout unless -o, but PNG not to a terminal; images need Graphviz's ``dot``."""
    from statemachine.contrib.diagram.graphviz import GraphvizError

    from tether.views import diagram
    from tether.views.diagram_format import output_format

    args.format = output_format(args.output, args.format, kind=args.kind)
    if args.format == "png" and not args.output and sys.stdout.isatty():
        raise ConfigError("--format png is binary: write it to a file with -o FILE (or redirect: > graph.png)")
    if args.kind == "sequence" and args.run is None:
        raise ConfigError("--kind sequence draws one run's timeline: give --run RUN_ID")
    events, tools, children = None, None, []
    if args.run is not None:  # drawn from what the run recorded: its tools module is never imported
        record = session.store.load_run(args.run)
        events = session.store.load_events(args.run)
        tools = diagram.ToolNote.of_run(record.spec)
        children = diagram.ChildNote.of_run(session.store, args.run)  # the runs its agent tools started
        if tools is None and args.kind == "graph":
            session.err.print("[yellow]note:[/] tools not shown: the run did not record them (an older tether)")
    drawn = diagram.build(events=events, tools=tools, children=children)
    if args.kind == "sequence":
        output: str | bytes = diagram.to_sequence(events or [])
    elif args.format == "mermaid":
        output = diagram.render_mermaid(drawn)
    elif args.format == "dot":
        output = diagram.render_dot(drawn)
    else:
        try:
            output = diagram.graphviz(diagram.render_dot(drawn), args.format)
        except GraphvizError as error:
            session.err.print(f"[red]error:[/] {escape(str(error))}")
            return ExitCode.FAILED
    if args.output:
        try:
            text = output.encode(errors="backslashreplace") if isinstance(output, str) else output  # as on stdout
            Path(args.output).write_bytes(text)
        except OSError as error:  # a missing directory, no permission, a full disk: say so, no traceback
            raise ConfigError(f"cannot write {args.output}: {error.strerror or error}") from error
    elif isinstance(output, bytes):  # SVG is UTF-8 text as its XML declaration says, whatever the locale
        sys.stdout.flush()
        sys.stdout.buffer.write(output)
        sys.stdout.buffer.flush()
    else:
        sys.stdout.write(output)
    return ExitCode.DONE


def _cmd_ui(args: argparse.Namespace, session: _Session) -> int:
    """Serve the inspector until stopped: on loopback unless a token was chosen for it, and TLS."""
    try:
        from tether.surfaces.web.app import create_app
        from tether.surfaces.web.listen import check_bind, default_hosts
        from tether.surfaces.web.server import Tls, address, serve
    except ImportError as error:
        raise ConfigError(str(error)) from None

    credentials, generated = _ui_credentials(args)
    if (args.certfile is None) != (args.keyfile is None):
        raise ConfigError("--certfile and --keyfile go together: the certificate and its private key")
    tls = Tls(args.certfile, args.keyfile) if args.certfile and args.keyfile else None
    check_bind(args.host, token_given=generated is None, tls=tls is not None, insecure=args.insecure)
    app = create_app(
        session.store,
        credentials,
        telemetry=session.telemetry,
        session_idle=_ui_age(args.session_idle, "--session-idle"),
        session_lifetime=_ui_age(args.session_lifetime, "--session-lifetime"),
        allowed_hosts=default_hosts(args.host) | set(args.allowed_host),
    )

    def announce(url: str) -> None:
        where = f"{url}?token={generated}" if generated else f"{url} (sign in with your token)"
        scope = f"tenant {args.tenant}'s runs" if args.tenant else "runs"
        session.out.print(Text.assemble(("tether ui", "bold"), f": {where}"), highlight=False)
        session.out.print(Text(f"showing {scope} in {shown_url(session.db_url)}; Ctrl-C stops"), highlight=False)
        sys.stdout.flush()

    freeze_startup_heap()  # this process is the inspector's: its imports stay out of the GC's full passes
    try:
        serve(app, host=args.host, port=args.port, announce=announce, tls=tls)
    except OSError as error:
        where = address(args.host, args.port, tls=tls is not None)
        raise ConfigError(f"cannot listen on {where}: {error.strerror or error}") from None
    return ExitCode.DONE


def _ui_credentials(args: argparse.Namespace) -> tuple[Credentials, str | None]:
    """The tokens ``tether ui`` lets in, and the one it made to print (None when they were given)."""
    from tether.policy.access import Credentials  # (only `ui` pays for reading token files)

    if args.token is not None:
        raise ConfigError(
            "--token puts the token where every user of this machine can read it (ps): "
            f"give it as ${UI_TOKEN_ENV} or in a file (--token-file FILE)"
        )
    token = _read_token(args.token_file) if args.token_file else os.environ.get(UI_TOKEN_ENV)
    if args.tokens and (token or args.tenant):
        raise ConfigError(
            f"--tokens FILE names every token and its tenant: give it alone, without --token-file, "
            f"${UI_TOKEN_ENV} or --tenant"
        )
    if args.tokens:
        return Credentials.from_file(args.tokens), None
    if token:
        return Credentials({token: args.tenant}), None
    return Credentials.generate(tenant=args.tenant)


def _read_token(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ConfigError(f"cannot read the token file {path}: {reason}") from None


def _ui_age(text: str, option: str) -> float:
    seconds = durations.age_seconds(text, option=option)
    if seconds is None:
        raise ConfigError(f"{option} {text!r}: expected an age like 90s, 30min, 12h or 7d")
    if not seconds > 0:
        raise ConfigError(f"{option} {text!r}: a session must last some time")
    return seconds


def _add_decision(decide: argparse.ArgumentParser) -> None:
    """What ``approve`` and ``deny`` share: the call, the arguments the person saw, and who decided."""
    decide.add_argument("run_id", help=RUN_ID_HELP)
    decide.add_argument("call_id", help="the tool call's id (see `tether pending`)")
    decide.add_argument(
        "--fingerprint", help="refuse unless the call's arguments are those shown (see `tether pending`)"
    )
    decide.add_argument("--by", default=None, help="who decided (default $USER, else your login name)")


def _add_max_wait(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--max-wait",
        type=_seconds,
        default=DEFAULT_MAX_WAIT,
        metavar="SECONDS",
        help=f"sleep at most this long for a tool retry, else park the run (exit 4); default {DEFAULT_MAX_WAIT:g}",
    )


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be positive and finite: leave the flag out for no limit")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be >= 0")
    return value


def _add_run(run: argparse.ArgumentParser) -> None:
    """``tether run``'s options (apart, to keep :func:`_parser` readable)."""
    run.add_argument("prompt", help="what the agent is asked to do")
    run.add_argument(
        "--tools", action="append", default=[], metavar="MODULE:ATTR", help="a tool or list of tools (repeatable)"
    )
    run.add_argument(
        "--model",
        help="anthropic:NAME, openai:NAME or scripted:PATH; a bare name is Claude's (default $TETHER_MODEL). "
        "Keys and base URLs come from ANTHROPIC_API_KEY/ANTHROPIC_BASE_URL and OPENAI_API_KEY/OPENAI_BASE_URL",
    )
    run.add_argument("--system", help="system prompt")
    run.add_argument(
        "--max-steps", type=_positive(int), metavar="N", help="cap on model invocations: reaching it fails the run"
    )
    budget = run.add_argument_group(
        "budget", "warned about at 80 percent; at the limit one last model call without tools gives the answer"
    )
    budget.add_argument("--max-cost", type=_positive(float), metavar="USD", help="cost of the run's model calls")
    budget.add_argument(
        "--max-tokens", type=_positive(int), metavar="N", help="input plus output tokens of the run (cache included)"
    )
    budget.add_argument("--max-tool-calls", type=_positive(int), metavar="N", help="tool executions of the run")
    budget.add_argument("--max-seconds", type=_positive(float), metavar="S", help="wall-clock time of the run")
    budget.add_argument(
        "--on-limit",
        choices=["final_answer", "fail"],
        help="what a budget limit does (default: final_answer)",
    )
    budget.add_argument(
        "--price",
        action="append",
        default=[],
        metavar=PRICE_FORM,
        help="USD per million tokens, for --max-cost with a model tether has no price for (default MODEL: the "
        "run's; cache prices default to 1.25x and 0.1x INPUT; repeatable)",
    )
    _add_toolsets(run)
    _add_model_settings(run)
    run.add_argument("--policy", metavar="FILE", help="policy rules (.toml, .yaml, .yml) over the tool calls")
    run.add_argument(
        "--continue",
        dest="continue_from",
        metavar="RUN_ID",
        help="continue an earlier run's conversation, with its tools, model, system prompt, policy and limits "
        "(each flag given replaces what it sets)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object")
    _add_max_wait(run)
    run.add_argument(
        "--detach",
        action="store_true",
        help="queue the run for `tether worker` (PostgreSQL) and print its id, instead of driving it here",
    )
    run.add_argument("--queue", default=DEFAULT_QUEUE, metavar="NAME", help="with --detach: the queue to wait in")


class _NewToolset(argparse.Action):
    """``--mcp``, ``--mcp-url``, ``--openapi``: one more toolset, which the options after it shape."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        kind, field = TOOLSET_FLAGS[str(option_string)]
        value = shlex.split(str(values)) if field == "command" else str(values)
        namespace.toolsets = [*namespace.toolsets, {"kind": kind, field: value, "flag": option_string}]


class _ToolsetOption(argparse.Action):
    """An option of the toolset given just before it (``--openapi api.yaml --base-url URL``)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        name, value = str(option_string), str(values)
        if not namespace.toolsets:
            parser.error(f"{name} applies to the --mcp, --mcp-url or --openapi given before it: give that first")
        toolset = dict(namespace.toolsets[-1])  # a copy: the parser's default list stays empty
        if toolset["flag"] not in TOOLSET_OPTIONS[name]:
            parser.error(f"{name} does not apply to {toolset['flag']} (only to {' or '.join(TOOLSET_OPTIONS[name])})")
        if name == "--header":
            header, _, variable = value.partition("=")
            if not (header and variable):
                parser.error(f"--header {value!r}: expected NAME=VARIABLE (the variable holds the value)")
            toolset["headers"] = {**toolset.get("headers", {}), header: variable}
        elif name in ("--env", "--include"):
            key = name.removeprefix("--")
            toolset[key] = [*toolset.get(key, []), value]
        else:
            toolset[name.removeprefix("--").replace("-", "_")] = value
        namespace.toolsets = [*namespace.toolsets[:-1], toolset]


TOOLSET_FLAGS = {"--mcp": ("mcp", "command"), "--mcp-url": ("mcp", "url"), "--openapi": ("openapi", "spec")}
"""The flags that add a toolset: its kind, and what their value is."""
TOOLSET_OPTIONS = {
    "--header": ("--mcp-url", "--openapi"),
    "--bearer": ("--mcp-url", "--openapi"),
    "--env": ("--mcp",),
    "--base-url": ("--openapi",),
    "--prefix": ("--mcp", "--mcp-url", "--openapi"),
    "--include": ("--mcp", "--mcp-url", "--openapi"),
}
"""The options that shape the toolset before them, and the flags they may follow."""


def _add_toolsets(run: argparse.ArgumentParser) -> None:
    """``tether run``'s toolsets: MCP servers and OpenAPI specs, each shaped by the options after it."""
    group = run.add_argument_group(
        "toolsets",
        "tools from MCP servers and OpenAPI services (pip install 'tether[mcp]' / 'tether[openapi]'); "
        "the options below apply to the toolset given just before them; the run remembers them all",
    )
    group.set_defaults(toolsets=[])
    group.add_argument(
        "--mcp",
        action=_NewToolset,
        metavar="COMMAND",
        help='an MCP server to start, e.g. "python server.py" (repeatable, as are --mcp-url and --openapi)',
    )
    group.add_argument("--mcp-url", action=_NewToolset, metavar="URL", help="an MCP server over streamable HTTP")
    group.add_argument("--openapi", action=_NewToolset, metavar="SPEC", help="an OpenAPI 3 spec: a file or a URL")
    group.add_argument("--base-url", action=_ToolsetOption, metavar="URL", help="where the spec's requests go")
    group.add_argument(
        "--header",
        action=_ToolsetOption,
        metavar="NAME=VARIABLE",
        help="send header NAME, its value read from environment variable VARIABLE (never stored; repeatable)",
    )
    group.add_argument(
        "--bearer", action=_ToolsetOption, metavar="VARIABLE", help="send Authorization: Bearer $VARIABLE"
    )
    group.add_argument(
        "--env", action=_ToolsetOption, metavar="VARIABLE", help="pass this variable to an --mcp server (repeatable)"
    )
    group.add_argument("--prefix", action=_ToolsetOption, metavar="TEXT", help="put before the toolset's tool names")
    group.add_argument(
        "--include", action=_ToolsetOption, metavar="GLOB", help="offer only the tools whose names match (repeatable)"
    )


def _add_model_settings(run: argparse.ArgumentParser) -> None:
    """``tether run``'s model settings: stored with the run, so resuming asks the model the same way."""
    settings = run.add_argument_group(
        "model settings", "how every model call of the run is made (kept by resume and --continue)"
    )
    settings.add_argument("--temperature", type=float, metavar="T", help="sampling temperature (0-2; Claude: 0-1)")
    settings.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling (0-1)")
    settings.add_argument(
        "--max-tokens-per-call", type=_positive(int), metavar="N", help="the length of each answer, in tokens"
    )
    settings.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="a text that ends the answer (repeatable)"
    )
    settings.add_argument(
        "--tool-choice", metavar="auto|any|none|TOOL", help="whether the model must (any, TOOL) or may not call tools"
    )
    settings.add_argument(
        "--thinking-budget",
        type=_positive(int),
        metavar="N",
        help="Claude's extended thinking: tokens it may think in (>= 1024, below the answer's length)",
    )


def _add_gc(gc: argparse.ArgumentParser) -> None:
    """``tether gc``'s options."""
    gc.add_argument(
        "--older-than", required=True, metavar="AGE", help=f"delete runs last updated before then: {durations.EXAMPLES}"
    )
    gc.add_argument("--dry-run", action="store_true", help="list the runs that would be deleted; delete nothing")
    gc.add_argument("-y", "--yes", action="store_true", help="delete without asking (gc asks only on a terminal)")
    gc.add_argument(
        "--status",
        action="append",
        choices=ENDED_SHOWN,
        help="only runs with this status (repeatable; default: all three)",
    )
    gc.add_argument(
        "--include-retryable",
        action="store_true",
        help="also delete runs that failed transiently (by default kept: `tether resume` may still finish them)",
    )
    gc.add_argument(
        "--include-parked",
        action="store_true",
        help="also delete runs that have not ended (awaiting approval, waiting for a retry, interrupted), "
        "except those a process drove since the cutoff",
    )
    gc.add_argument("--json", action="store_true", help='print one object {"deleted": N, ...}')


def _cmd_gc(args: argparse.Namespace, session: _Session) -> int:
    """Delete old finished runs; parked or running ones and resumable transient failures only if asked.

    Only final statuses can be chosen; a run that failed transiently is kept unless
    ``--include-retryable``, a run that has not ended unless ``--include-parked``. Expired
    tool-cache entries go too (they are never read again, whatever their age). ``--dry-run``
    lists the runs instead; a person at a terminal is asked first (a cron job, with stdin not a
    terminal, is not).
    """
    now = time.time()
    cutoff = durations.parse_ago(args.older_than, now=now, option="--older-than")
    if cutoff > now:  # a date mistyped into the future would take every run
        raise ConfigError(
            f"--older-than {args.older_than!r} is in the future: every run is older than that; "
            "to delete every finished run, say so with --older-than 0s"
        )
    statuses = {stored_status(name).value for name in args.status or ENDED_SHOWN}
    retryable, parked = args.include_retryable, args.include_parked
    kept = "" if retryable or RunStatus.failed not in statuses else "; transient failures kept"
    before = _cutoff_text(cutoff, args.older_than)
    kinds = ", ".join(sorted(statuses)) + kept + ("; parked runs too" if parked else "")
    what = f"{'run(s)' if parked else 'finished run(s)'} ({kinds}) last updated before {before}"
    report: dict[str, Any] = {
        "before": cutoff,
        "statuses": sorted(statuses),
        "include_retryable": retryable,
        "include_parked": parked,
    }
    if args.dry_run or (sys.stdin.isatty() and not args.yes):
        from tether.views.audit import DEFAULT_RUN_LIMIT

        listed = sorted(statuses | (PARKED_STATUSES if parked else set()))
        doomed = [
            record
            for status in listed
            for record in session.store.list_runs(status=status, limit=DEFAULT_RUN_LIMIT)
            if deletable(
                record, finished_before=cutoff, statuses=statuses, include_retryable=retryable, include_parked=parked
            )
        ]
        if args.dry_run:
            return _gc_dry_run(session, doomed, what, report)
        if doomed and not _confirm(session, f"delete {len(doomed)} {what}?"):
            session.err.print("nothing deleted")
            return ExitCode.FAILED
    deleted = session.store.delete_runs(
        finished_before=cutoff, statuses=statuses, include_retryable=retryable, include_parked=parked
    )
    expired = session.store.cache_purge(time.time())
    if session.json:
        print(json.dumps({"deleted": deleted, **report, "cache_deleted": expired}))
    else:
        session.out.print(Text(f"deleted {deleted} {what}"))
        session.out.print(f"deleted {expired} expired tool-cache entr{'y' if expired == 1 else 'ies'}")
    return ExitCode.DONE


def _cutoff_text(cutoff: float, older_than: str) -> str:
    """The cutoff as a local date and time with its zone, and the age it came from: ``(1mo ago)``."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(cutoff))
    is_age = durations.age_seconds(older_than, option="--older-than") is not None
    return f"{when} ({older_than.strip()} ago)" if is_age else when


def _gc_dry_run(session: _Session, doomed: list[RunRecord], what: str, report: dict[str, Any]) -> int:
    if session.json:
        runs = [{"run_id": r.id, "status": shown_status(r), "updated_at": r.updated_at} for r in doomed]
        print(json.dumps({"dry_run": True, "deleted": 0, **report, "runs": runs}))
        return ExitCode.DONE
    session.out.print(Text(f"would delete {len(doomed)} {what}{':' if doomed else ''}"))
    for record in doomed:
        updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.updated_at))
        session.out.print(Text(f"  {record.id}  {shown_status(record)}  {updated}"))
    session.out.print("and any expired tool-cache entries")
    return ExitCode.DONE


def _confirm(session: _Session, question: str) -> bool:
    """Ask a yes/no question on the terminal; anything but yes (Ctrl-D included) is no."""
    try:
        answer = session.err.input(Text(f"{question} [y/N] "))
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


COMMANDS = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "approve": _cmd_decide,
    "deny": _cmd_decide,
    "cancel": _cmd_cancel,
    "fork": _cmd_fork,
    "show": _cmd_show,
    "runs": _cmd_runs,
    "gc": _cmd_gc,
    "audit": _cmd_audit,
    "pending": _cmd_pending,
    "demo": _cmd_demo,
    "diagram": _cmd_diagram,
    "ui": _cmd_ui,
    "worker": _cmd_worker,
    **replaying.COMMANDS,
}


def _check_extras(args: argparse.Namespace) -> None:
    """The extra a command or flag needs, checked before anything starts: else one line naming it."""
    if args.command in ("ui", "worker"):
        require(args.command, f"tether {args.command}")
    if getattr(args, "detach", False):
        require("worker", f"tether {args.command} --detach")
    if getattr(args, "otel", False):
        require("otel", f"tether {args.command} --otel")


def _telemetry(args: argparse.Namespace, err: Console) -> OpenTelemetry | None:
    """The command's tracing: asked for by ``--otel``, or by the standard ``$OTEL_TRACES_EXPORTER``.

    ``--otel`` without the extra is an error; the variable alone (set for other programs too)
    only warns.
    """
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    asked = bool(getattr(args, "otel", False))
    if not asked and (disabled or exporter == "none" or not hasattr(args, "otel")):
        return None
    try:
        from tether.drivers.otel import from_environment

        return from_environment()  # imports the SDK, which the base install lacks (it has the API)
    except ImportError as missing:  # MissingExtra: with --otel, checked before the command started
        if asked:
            raise
        err.print(Text.assemble(("warning:", "yellow"), f" OTEL_TRACES_EXPORTER is set but {missing}: not traced"))
        return None


def _busy_message(error: RunBusy, session: _Session | None) -> str:
    """What RunBusy says, with the command that takes the run over as this tether is run (and its ``--db``)."""
    if error.lost:
        return error.situation
    words = ("resume", error.run_id, "--force")
    take_over = session.command(*words) if session is not None else f"{invocation()} {' '.join(words)}"
    return lines(f"{error.situation}; only if you know that process is gone, take the run over with:", take_over)


def _print_error(label: str, error: Exception | str) -> None:
    """``label: message`` on stderr; the message is plain text (it may quote input like ``[/x]``)."""
    from tether.views.printable import printable  # it may quote a model's or a tool's text too

    Console(stderr=True, soft_wrap=True).print(Text.assemble((f"{label}:", "red"), " ", printable(str(error))))


def _printable_output() -> None:
    r"""Let every output path print any text a run holds (the one place output is made safe).

    A lone surrogate (what ``errors="surrogateescape"`` makes of a binary file's bytes) cannot
    be encoded: it is written as its ``\uXXXX`` escape instead, which a terminal shows and
    which, inside ``--json`` output, is JSON for the very same string.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


IDENTIFIERS = ("run_id", "call_id", "run", "continue_from", "tenant")
"""Arguments naming something stored, looked up in the database."""
RUN_ARGUMENTS = ("run_id", "run", "continue_from")
"""Arguments naming a run: by its id, or any start of it that names one run only."""


def _whole_run_ids(args: argparse.Namespace, session: _Session) -> None:
    """Each run named by the start of its id, named by its whole id (``AmbiguousRunId`` if several runs share it)."""
    from tether.stores.run_ids import resolve_run_id

    for name in RUN_ARGUMENTS:
        given = getattr(args, name, None)
        if isinstance(given, str):
            setattr(args, name, resolve_run_id(session.store, given))
    if args.command == "resume":  # named when Ctrl-C stops the drive
        session.run_id = args.run_id


def _surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt, so both are handled alike."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signum)


@contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """While a command runs, SIGTERM and SIGHUP interrupt it as Ctrl-C does (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for name in STOP_SIGNALS:
        signum = getattr(signal, name, None)  # no SIGHUP on Windows
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:  # nohup: keep ignoring it
            previous[signum] = signal.signal(signum, _raise_stopped)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tether`` console script."""
    _printable_output()
    with _stopped_by_signals():
        try:
            return _main(argv)
        except KeyboardInterrupt as interrupt:  # before the command started, or while it said so
            return _interrupted_exit(interrupt)


def _interrupted_exit(interrupt: KeyboardInterrupt) -> int:
    signum = interrupt.signum if isinstance(interrupt, _Stopped) else signal.SIGINT
    return SIGNAL_BASE + signum


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for name in IDENTIFIERS:  # bytes that are not UTF-8 arrive as lone surrogates, which no database takes
        value = getattr(args, name, None)
        if isinstance(value, str) and not value.isascii() and _surrogates(value):
            parser.error(f"{name}: {value!r} is not valid UTF-8 text")
    session: _Session | None = None
    try:
        if args.command == "demo":
            from tether.examples import demo

            if args.workspace:
                os.environ[demo.WORKSPACE_ENV] = args.workspace
            if not args.db:
                args.db = os.environ.get("TETHER_DB") or f"sqlite:///{demo.workspace() / 'tether.db'}"
        _check_extras(args)
        session = _Session(args)
        _whole_run_ids(args, session)
        return COMMANDS[args.command](args, session)
    except (ConfigError, MissingExtra, RunNotFound, UnknownCall, RunEnded, CorruptData, InvalidForkPoint) as error:
        _print_error("error", error)  # nothing was done; a run, a call or a database not there (NoDatabase) alike
        return ExitCode.USAGE
    except RunBusy as error:
        if session is not None:  # run/resume --json: one object still, saying who holds the run
            holder = {"holder": error.owner, "expires_at": error.expires_at, "lost": error.lost}
            session.print_as_it_stands(busy=holder)
        _print_error("busy", _busy_message(error, session))
        return ExitCode.BUSY
    except StaleRun as error:  # a drive another process's write stopped (a cancel): the run as it stands
        if session is not None:
            session.print_as_it_stands()
        _print_error("refused", error)
        return ExitCode.FAILED
    except ApprovalError as error:
        _print_error("refused", error)
        return ExitCode.FAILED
    except TetherError as error:
        _print_error("error", error)
        return ExitCode.FAILED
    except KeyboardInterrupt as interrupt:  # the last committed step stands; an unfinished tool call is in doubt
        if session is not None:
            with suppress(OSError):  # the terminal may be gone (SIGHUP)
                session.interrupted()
        return _interrupted_exit(interrupt)
    except BrokenPipeError:  # the reader (`| head`) left: the run's state is committed, only output was cut
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return ExitCode.DONE
    finally:
        if session is not None:
            session.close()
            session.store.close()  # its connections, for a caller that goes on (main called in-process)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
