"""The ``tether`` command line.

Exit codes of ``run``/``resume``/``demo``: 0 done, 1 failed or cancelled, 2 usage error,
3 awaiting approval. ``--json`` prints exactly one JSON object on stdout and nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tether.agent import Agent
from tether.approvals import Approve, Approver, AutoApprover, DecideLater, Deny
from tether.errors import ApprovalError, ConfigError, RunNotFound, StaleRun, TetherError
from tether.loader import DEMO_MODEL, agent_from_spec, normalise_model_spec
from tether.machine import STATUS_VALUES
from tether.runner import EventListener, Runner, RunResult, result_of
from tether.stores import Store, open_store, shown_url

if TYPE_CHECKING:
    from tether.terminal import LiveView

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_AWAITING = 0, 1, 2, 3
STATUS_EXIT = {"done": EXIT_DONE, "awaiting_approval": EXIT_AWAITING}


def _db_url(value: str | None) -> str:
    return value or os.environ.get("TETHER_DB") or "sqlite:///tether.db"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether", description="Run LLM agents whose tools the host executes, step by step."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def with_db(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument("--db", help="SQLAlchemy URL (default $TETHER_DB, else sqlite:///tether.db)")
        return sub

    def with_approvals(sub: argparse.ArgumentParser) -> None:
        group = sub.add_mutually_exclusive_group()
        group.add_argument("--approve-all", action="store_true", help="approve every gated call")
        group.add_argument("--deny-all", action="store_true", help="deny every gated call")

    run = with_db(commands.add_parser("run", help="start a run"))
    _add_run(run)
    with_approvals(run)

    resume = with_db(commands.add_parser("resume", help="drive a parked or interrupted run on"))
    resume.add_argument("run_id")
    resume.add_argument("--json", action="store_true")
    resume.add_argument(
        "--force",
        action="store_true",
        help="treat tool calls another process started as abandoned (only if you know it is gone)",
    )
    with_approvals(resume)

    approve = with_db(commands.add_parser("approve", help="approve a pending tool call"))
    _add_decision(approve)
    approve.add_argument("--input", help="edited input as JSON (validated against the tool's schema)")
    approve.add_argument("--by", default=None, help="who decided (default $USER)")
    approve.add_argument(
        "--for-run", action="store_true", help="also approve this tool's later calls in this run"
    )

    deny = with_db(commands.add_parser("deny", help="deny a pending tool call"))
    _add_decision(deny)
    deny.add_argument("--reason", default="", help="why (the model sees it)")
    deny.add_argument("--by", default=None)

    show = with_db(commands.add_parser("show", help="show a run, its history and event log"))
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true")

    runs = with_db(commands.add_parser("runs", help="list runs"))
    runs.add_argument("--status", help="done, failed, awaiting_approval, cancelled, thinking, executing_tool")
    runs.add_argument("--json", action="store_true")

    _add_gc(with_db(commands.add_parser("gc", help="delete finished runs and their events")))

    pending = with_db(commands.add_parser("pending", help="list tool calls waiting for approval"))
    pending.add_argument("--json", action="store_true", help='print one object {"pending": [...]}')
    pending.add_argument("--run", dest="run_id", help="only this run's calls")
    pending.add_argument("--tenant", help="only this tenant's runs")

    _add_audit(with_db(commands.add_parser("audit", help="every tool call: input, decision, attempts, outcome")))

    demo = commands.add_parser("demo", help="an agent with real tools and an approval gate")
    demo.add_argument("--workspace", default=None, help="scratch directory (default ./tether-demo)")
    demo.add_argument("--db", help="SQLAlchemy URL (default sqlite in the workspace)")
    demo.add_argument("--json", action="store_true")
    with_approvals(demo)

    diagram = with_db(commands.add_parser("diagram", help="draw the run graph, a run's path, or its timeline"))
    diagram.add_argument("--format", choices=["mermaid", "dot", "svg", "png"], default="mermaid")
    diagram.add_argument("--run", metavar="RUN_ID", help="highlight this run's path (with --kind graph)")
    diagram.add_argument(
        "--kind", choices=["graph", "sequence"], default="graph", help="sequence: the run's timeline (Mermaid)"
    )
    diagram.add_argument("-o", "--output", metavar="FILE", help="write here (required for svg/png)")
    return parser


def _add_audit(audit: argparse.ArgumentParser) -> None:
    """``tether audit``'s filters (apart, to keep :func:`_parser` readable)."""
    audit.add_argument("--run", metavar="RUN_ID", help="only this run")
    audit.add_argument("--tool", metavar="NAME", help="only calls of this tool")
    audit.add_argument("--since", metavar="WHEN", help="activity since: 30m, 2h, 7d, or an ISO date/time")
    audit.add_argument("--json", action="store_true", help='print one object {"entries": [...]}')


class _Session:
    """What one command invocation shares: consoles, the store, output mode."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.json = bool(getattr(args, "json", False))
        # soft_wrap: commands and ids printed for copying are never broken across lines
        self.out = Console(soft_wrap=True)
        self.err = Console(stderr=True, soft_wrap=True)
        self.db_url = _db_url(getattr(args, "db", None))
        self.store: Store = open_store(self.db_url)
        self.live: LiveView | None = None

    def approver(self, args: argparse.Namespace, agent: Agent) -> Approver:
        if getattr(args, "approve_all", False):
            return AutoApprover(approve=True)
        if getattr(args, "deny_all", False):
            return AutoApprover(approve=False)
        if sys.stdin.isatty() and not self.json:
            from tether.terminal import TerminalApprover

            return TerminalApprover(self.out, agent, actor=os.environ.get("USER") or "terminal")
        return DecideLater()  # parked for `tether approve`: calls in doubt after a crash are asked too

    def runner(self, args: argparse.Namespace, agent: Agent) -> Runner:
        listeners: list[EventListener] = []
        if not self.json:
            from tether.terminal import LiveView, ProgressPrinter

            self.live = LiveView(self.out)  # a no-op unless stdout is a terminal
            listeners += [self.live, ProgressPrinter(self.out)]
            if "tether.models.anthropic" in sys.modules:  # only then can the model be Claude's
                from tether.models.anthropic import AnthropicModel

                if isinstance(agent.model, AnthropicModel):  # surface the SDK's retry waits
                    agent.model.on_retry_wait = self._show_retry_wait
        on_action = self.live.on_action if self.live is not None else None
        return Runner(
            agent, self.store, approver=self.approver(args, agent), listeners=listeners, on_action=on_action
        )

    def _show_retry_wait(self, seconds: float) -> None:
        self.err.print(f"[yellow]the model API asked to wait: retrying in {seconds:.1f}s[/]")

    def close(self) -> None:
        """Clear a spinner left by an error, so the message and the cursor show."""
        if self.live is not None:
            self.live.stop()

    def finish(self, result: RunResult) -> int:
        if self.json:
            print(json.dumps(result.to_dict(), ensure_ascii=False))
        else:
            from tether.terminal import render_result

            render_result(self.out, result)
            if result.status == "awaiting_approval":
                self.out.print(
                    f"Decide with [bold]tether approve {result.run_id} CALL_ID[/] or [bold]tether deny ...[/], "
                    f"then [bold]tether resume {result.run_id}[/]" + self._db_hint()
                )
        return STATUS_EXIT.get(result.status, EXIT_FAILED)

    def _db_hint(self) -> str:
        """`` --db URL`` for a follow-up command, unless it is the default; never with the password."""
        if self.db_url == "sqlite:///tether.db" and "TETHER_DB" not in os.environ:
            return ""
        return f" --db {shlex.quote(shown_url(self.db_url))}"


def _cmd_run(args: argparse.Namespace, session: _Session) -> int:
    spec = {
        "tools": list(args.tools),
        "model": normalise_model_spec(args.model),
        "system": args.system,
        "cwd": os.getcwd(),
        "max_steps": args.max_steps,
        **({"policy": str(Path(args.policy).resolve())} if args.policy else {}),
    }
    agent = agent_from_spec(spec)
    if args.max_steps is None:
        spec["max_steps"] = agent.limits.max_steps
    runner = session.runner(args, agent)
    return session.finish(runner.run(args.prompt, continue_from=args.continue_from))


def _agent_for(session: _Session, run_id: str) -> Agent:
    return agent_from_spec(session.store.load_run(run_id).spec)


def _cmd_resume(args: argparse.Namespace, session: _Session) -> int:
    runner = session.runner(args, _agent_for(session, args.run_id))
    return session.finish(runner.drive(args.run_id, force=args.force))


def _cmd_decide(args: argparse.Namespace, session: _Session) -> int:
    runner = Runner(_agent_for(session, args.run_id), session.store)
    actor = args.by or os.environ.get("USER") or "cli"
    if args.command == "approve":
        edited = None
        if args.input is not None:
            try:
                edited = json.loads(args.input)
            except ValueError as error:
                raise ConfigError(f"--input is not valid JSON: {error}") from error
            if not isinstance(edited, dict):
                raise ConfigError("--input must be a JSON object")
        approval = Approve(input=edited, actor=actor, remember_for_run=args.for_run)
        result = runner.decide(args.run_id, args.call_id, approval, fingerprint=args.fingerprint)
    else:
        result = runner.decide(args.run_id, args.call_id, Deny(args.reason, actor=actor), fingerprint=args.fingerprint)
    verb = "approved" if args.command == "approve" else "denied"
    session.out.print(f"{verb} {args.call_id} in run {args.run_id} (status now {result.status})")
    if result.status != "awaiting_approval":
        session.out.print(f"continue with: tether resume {args.run_id}{session._db_hint()}")
    return EXIT_DONE


def _cmd_show(args: argparse.Namespace, session: _Session) -> int:
    runner = Runner(Agent(model=_NoModel()), session.store)
    state = runner.load(args.run_id)
    events = session.store.load_events(args.run_id)
    result = result_of(state)
    if session.json:
        payload: dict[str, Any] = result.to_dict()
        payload["cost_usd"] = result.cost_usd
        payload["messages"] = state.messages
        payload["events"] = [event.to_dict() for event in events]
        print(json.dumps(payload, ensure_ascii=False, default=str))
        return EXIT_DONE
    from tether.terminal import render_events, render_result

    render_result(session.out, result)
    render_events(session.out, events)
    return EXIT_DONE


def _cmd_runs(args: argparse.Namespace, session: _Session) -> int:
    status = args.status
    if status is not None:
        by_id = {v: k for k, v in STATUS_VALUES.items()}
        if status not in by_id and status not in STATUS_VALUES:
            raise ConfigError(f"unknown status {status!r}; one of {', '.join(sorted(by_id))}")
        status = by_id.get(status, status)
    rows = [
        {
            "run_id": r.id,
            "status": STATUS_VALUES.get(r.status, r.status),
            "steps": r.summary.get("steps", 0),
            "tool_calls": r.summary.get("tool_calls", 0),
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "updated": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.updated_at)),
            "error": r.summary.get("error"),
        }
        for r in session.store.list_runs(status=status)
    ]
    if session.json:
        print(json.dumps({"runs": rows}, ensure_ascii=False))
        return EXIT_DONE
    from tether.terminal import render_runs

    render_runs(session.out, rows)
    return EXIT_DONE


def _cmd_pending(args: argparse.Namespace, session: _Session) -> int:
    from tether.pending import pending_approvals

    pending = pending_approvals(session.store, tenant=args.tenant, run_id=args.run_id)
    if session.json:
        print(json.dumps({"pending": [p.to_dict() for p in pending]}, ensure_ascii=False, default=str))
        return EXIT_DONE
    from tether.terminal import render_pending

    render_pending(session.out, pending)
    return EXIT_DONE


def _cmd_audit(args: argparse.Namespace, session: _Session) -> int:
    from tether import audit

    since = audit.parse_since(args.since, now=time.time()) if args.since else None
    found = audit.query(session.store, run_id=args.run, tool=args.tool, since=since)
    if session.json:
        print(json.dumps({"entries": [e.to_dict() for e in found]}, ensure_ascii=False, default=str))
        return EXIT_DONE
    from tether.terminal import render_audit

    render_audit(session.out, found)
    return EXIT_DONE


def _cmd_demo(args: argparse.Namespace, session: _Session) -> int:
    from tether import demo

    spec = {
        "tools": ["tether.demo:TOOLS"],
        "system": demo.SYSTEM,
        "cwd": os.getcwd(),
        "max_steps": 10,
        "model": normalise_model_spec(None) if os.environ.get("ANTHROPIC_API_KEY") else DEMO_MODEL,
        "env": {demo.WORKSPACE_ENV: str(demo.workspace())},
    }
    agent = agent_from_spec(spec)
    if not session.json:
        model = "Claude (" + agent.model_name + ")" if agent.model_name != DEMO_MODEL else "the offline scripted model"
        database = shown_url(session.db_url)
        session.out.print(f"[bold]tether demo[/]: workspace {demo.workspace()}, database {database}, {model}")
        session.out.print(f"[bold]prompt[/]: {demo.PROMPT}")
    runner = session.runner(args, agent)
    return session.finish(runner.run(demo.PROMPT))


def _cmd_diagram(args: argparse.Namespace, session: _Session) -> int:
    """Text formats go to stdout unless -o; images need -o and Graphviz's ``dot``."""
    from rich.markup import escape
    from statemachine.contrib.diagram.graphviz import GraphvizError

    from tether import diagram

    if args.format in diagram.IMAGE_FORMATS and not args.output:
        raise ConfigError(f"--format {args.format} is binary: write it to a file with -o FILE")
    if args.kind == "sequence" and (args.run is None or args.format != "mermaid"):
        raise ConfigError("--kind sequence draws one run in Mermaid: give --run RUN_ID (and --format mermaid)")
    events, agent = None, None
    if args.run is not None:
        record = session.store.load_run(args.run)
        events = session.store.load_events(args.run)
        try:
            agent = agent_from_spec(record.spec, model=_NoModel())
        except TetherError as error:  # the tools module may not import here: draw without them
            session.err.print(f"[yellow]note:[/] tools not shown: {escape(str(error))}")
    if args.kind == "sequence":
        output: str | bytes = diagram.to_sequence(events or [])
    elif args.format == "mermaid":
        output = diagram.to_mermaid(events=events, agent=agent)
    elif args.format == "dot":
        output = diagram.to_dot(events=events, agent=agent)
    else:
        try:
            output = diagram.render(events=events, agent=agent, format=args.format)
        except GraphvizError as error:
            session.err.print(f"[red]error:[/] {escape(str(error))}")
            return EXIT_FAILED
    if args.output:
        with open(args.output, "wb") as file:
            file.write(output.encode() if isinstance(output, str) else output)
    else:
        sys.stdout.write(str(output))
    return EXIT_DONE


def _add_decision(decide: argparse.ArgumentParser) -> None:
    """What ``approve`` and ``deny`` share: the call, and the arguments the person saw."""
    decide.add_argument("run_id")
    decide.add_argument("call_id")
    decide.add_argument(
        "--fingerprint", help="refuse unless the call's arguments are those shown (see `tether pending`)"
    )


def _add_run(run: argparse.ArgumentParser) -> None:
    """``tether run``'s options (apart, to keep :func:`_parser` readable)."""
    run.add_argument("prompt")
    run.add_argument(
        "--tools", action="append", default=[], metavar="MODULE:ATTR", help="a tool or list of tools (repeatable)"
    )
    run.add_argument("--model", help="Claude model name, or scripted:PATH (default $TETHER_MODEL)")
    run.add_argument("--system", help="system prompt")
    run.add_argument("--max-steps", type=int, help="cap on model invocations")
    run.add_argument("--policy", metavar="FILE", help="policy rules (.toml, .yaml, .yml) over the tool calls")
    run.add_argument(
        "--continue", dest="continue_from", metavar="RUN_ID", help="continue an earlier run's conversation"
    )
    run.add_argument("--json", action="store_true", help="print one JSON object")


def _add_gc(gc: argparse.ArgumentParser) -> None:
    """``tether gc``'s options."""
    gc.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 90m: last updated before then")
    gc.add_argument(
        "--status",
        action="append",
        choices=["done", "failed", "cancelled"],
        help="only runs with this status (repeatable; default: all three)",
    )
    gc.add_argument(
        "--include-retryable",
        action="store_true",
        help="also delete runs that failed transiently (by default kept: `tether resume` may still finish them)",
    )
    gc.add_argument("--json", action="store_true")


def _cmd_gc(args: argparse.Namespace, session: _Session) -> int:
    """Delete old finished runs; never parked or running ones, nor resumable transient failures.

    Only final statuses can be chosen; a run that failed transiently is kept unless
    ``--include-retryable`` says otherwise.
    """
    from tether.audit import parse_since

    try:
        cutoff = parse_since(args.older_than, now=time.time())
    except ConfigError as error:
        raise ConfigError(f"--older-than {args.older_than!r}: expected an age like 30d, 12h or 90m") from error
    statuses = set(args.status or ["done", "failed", "cancelled"])
    retryable = args.include_retryable
    deleted = session.store.delete_runs(finished_before=cutoff, statuses=statuses, include_retryable=retryable)
    if session.json:
        report = {"deleted": deleted, "before": cutoff, "statuses": sorted(statuses), "include_retryable": retryable}
        print(json.dumps(report))
    else:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(cutoff))
        kept = "" if retryable or "failed" not in statuses else "; transient failures kept"
        kinds = ", ".join(sorted(statuses)) + kept
        session.out.print(f"deleted {deleted} finished run(s) ({kinds}) last updated before {when}")
    return EXIT_DONE


COMMANDS = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "approve": _cmd_decide,
    "deny": _cmd_decide,
    "show": _cmd_show,
    "runs": _cmd_runs,
    "gc": _cmd_gc,
    "audit": _cmd_audit,
    "pending": _cmd_pending,
    "demo": _cmd_demo,
    "diagram": _cmd_diagram,
}


class _NoModel:
    """Stands in where a command reads runs but never calls a model."""

    def complete(self, request: Any) -> Any:
        raise ConfigError("this command does not call the model")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tether`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from tether import demo

        if args.workspace:
            os.environ[demo.WORKSPACE_ENV] = args.workspace
        if not args.db:
            args.db = os.environ.get("TETHER_DB") or f"sqlite:///{demo.workspace() / 'tether.db'}"
    session: _Session | None = None
    try:
        session = _Session(args)
        return COMMANDS[args.command](args, session)
    except (ConfigError, RunNotFound) as error:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {error}")
        return EXIT_USAGE
    except (ApprovalError, StaleRun) as error:
        Console(stderr=True, soft_wrap=True).print(f"[red]refused:[/] {error}")
        return EXIT_FAILED
    except TetherError as error:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {error}")
        return EXIT_FAILED
    finally:
        if session is not None:
            session.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
