"""``tether export --as-test`` and ``tether replay``: stored runs as regression tests.

Kept beside :mod:`tether.surfaces.cli`, which adds these commands to its parser and table. The
logic is :mod:`tether.testing.export` (the test module) and :mod:`tether.testing.compare` (a
changed agent against stored runs); here are the arguments and the side-by-side tables.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether.errors import ConfigError
from tether.facts.status import SHOWN, stored_filter
from tether.stores import RunQuery, Store
from tether.surfaces.exit_codes import ExitCode
from tether.surfaces.hints import RUN_ID_HELP
from tether.views.printable import printable
from tether.views.trajectory import Trajectory

if TYPE_CHECKING:  # tether.testing is imported by these commands alone: every other command starts without it
    from tether.testing.compare import Comparison

UNMATCHED = ("ask", "deny")
"""``--unmatched``: :data:`tether.testing.replay_tools.UNMATCHED`, spelt again so the CLI starts without it."""
EXIT_WRITTEN = EXIT_AGREE = ExitCode.DONE
EXIT_DIFFER = ExitCode.FAILED
"""A replay that differs from its recording is a failure, as a failed run is (see :class:`ExitCode`)."""
Command = Callable[[argparse.Namespace, Any], int]
SHOWN_CHARS = 120
"""An answer or result is cut to this many characters in a table (`tether show` has the recorded one whole)."""


class Session(Protocol):
    """What a command gets from the CLI's session: its store, its stdout console, the database's URL."""

    store: Store
    out: Console
    db_url: str
    json: bool


def add_commands(commands: Any, with_db: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    """Add ``export`` and ``replay`` to the CLI's subcommands."""
    export = with_db(commands.add_parser("export", help="write a stored run as an offline pytest regression test"))
    export.add_argument("run_id", help=RUN_ID_HELP)
    export.add_argument(
        "--as-test",
        required=True,
        metavar="PATH",
        help="the test module to write (e.g. tests/test_refund.py); its recording goes beside it as PATH.json",
    )
    export.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="the agent under test in your program (an Agent, or a function making one); default: the run's "
        "--tools, --system and settings (a run started from Python needs it)",
    )
    export.add_argument("--force", action="store_true", help="write over the files if they exist")

    replay = with_db(
        commands.add_parser("replay", help="ask a stored run's prompt again with a changed agent; compare the calls")
    )
    replay.add_argument("run_id", nargs="?", help=f"{RUN_ID_HELP}; or --from-runs")
    replay.add_argument("--system", metavar="TEXT", help="the changed system prompt")
    replay.add_argument(
        "--model",
        metavar="PROVIDER:NAME",
        help="a model answers instead of the recording (scripted:PATH too); without it the recorded model "
        "answers by turn while the conversation is the recorded one",
    )
    replay.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="the changed tools, imported from the current directory (repeatable)",
    )
    replay.add_argument(
        "--unmatched",
        choices=UNMATCHED,
        default="ask",
        help="a tool call the recording does not answer: ask (the replay parks there) or deny (the model is "
        "told); no tool ever runs (default: %(default)s)",
    )
    replay.add_argument("--json", action="store_true", help="print one JSON object (the comparison, or the summary)")
    many = replay.add_argument_group("many runs")
    many.add_argument("--from-runs", action="store_true", help="replay the runs these filters find; print a summary")
    many.add_argument("--status", choices=SHOWN, metavar="STATUS", help=f"only runs in this status: {', '.join(SHOWN)}")
    many.add_argument("--agent", metavar="NAME", help="only runs of an agent whose name holds NAME")
    many.add_argument("--tool", metavar="NAME", help="only runs that called this tool")
    many.add_argument("--limit", type=int, default=50, metavar="N", help="at most the newest N runs (default 50)")


def cmd_export(args: argparse.Namespace, session: Session) -> int:
    """Write the run's test module and recording; print how to run it."""
    from tether.stores.sql import url_secrets
    from tether.testing.export import export_test
    from tether.testing.recording import Recording

    recording = Recording.from_events(args.run_id, session.store.load_events(args.run_id))
    test, data = export_test(
        recording, args.as_test, agent=args.agent, secrets=url_secrets(session.db_url), overwrite=args.force
    )
    session.out.print(Text(f"wrote {test} and {data}: run it with `pytest {test}`"))
    session.out.print(Text(f"{data} holds the run's prompt and tool results: read it before you commit it"))
    return EXIT_WRITTEN


def cmd_replay(args: argparse.Namespace, session: Session) -> int:
    """Compare one run (side by side) or many (a summary); exit 1 when a replay differs, else 0.

    A run that cannot be replayed (a continued conversation...) is listed as such, and fails nothing.
    """
    from tether.testing.compare import Changes, compare, compare_many

    changes = Changes(system=args.system, model=args.model, tools=tuple(args.tools), unmatched=args.unmatched)
    if args.from_runs == (args.run_id is not None):
        raise ConfigError("give a run id, or --from-runs with filters (--status, --agent, --tool, --limit)")
    if not args.from_runs:
        if any(value is not None for value in (args.status, args.agent, args.tool)):
            raise ConfigError("--status, --agent and --tool choose runs for --from-runs")
        comparison = compare(session.store, args.run_id, changes)
        if comparison.replayed is None:
            raise ConfigError(comparison.problem or f"run {args.run_id} cannot be replayed")
        if session.json:
            print(json.dumps(comparison.to_dict(), ensure_ascii=False))
        else:
            render_comparison(session.out, comparison)
        return EXIT_AGREE if comparison.verdict == "agrees" else EXIT_DIFFER
    if args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, not {args.limit}")
    status, waiting_retry = stored_filter(args.status) if args.status else (None, None)
    query = RunQuery(status=status, waiting_retry=waiting_retry, agent=args.agent, roots_only=True)
    comparisons = list(compare_many(session.store, query, changes, tool=args.tool, limit=args.limit))
    if session.json:
        print(json.dumps(summary_of(comparisons), ensure_ascii=False))
    else:
        render_summary(session.out, comparisons)
    return EXIT_DIFFER if any(c.verdict == "differs" for c in comparisons) else EXIT_AGREE


COMMANDS: dict[str, Command] = {"export": cmd_export, "replay": cmd_replay}
"""The commands this module serves, by name (merged into the CLI's)."""


def summary_of(comparisons: Sequence[Comparison]) -> dict[str, Any]:
    """``tether replay --from-runs --json``: each comparison; how many agree, differ, were not replayed."""
    return {
        "runs": [comparison.to_dict() for comparison in comparisons],
        "agree": sum(c.verdict == "agrees" for c in comparisons),
        "differ": sum(c.verdict == "differs" for c in comparisons),
        "not_replayed": sum(c.verdict == "not replayed" for c in comparisons),
    }


def render_comparison(console: Console, comparison: Comparison) -> None:
    """The recorded and the replayed trajectories side by side, then the verdict and why."""
    replayed = comparison.replayed
    assert replayed is not None  # only a replayed run is shown side by side
    table = Table(title=Text(f"run {comparison.run_id} and its replay ({replayed.result.run_id})"))
    table.add_column("", no_wrap=True)
    table.add_column("recorded", overflow="fold")  # an input is shown whole, folded, never cut
    table.add_column(f"replay (answered by {comparison.answered_by})", overflow="fold")
    table.add_column("")
    for label, recorded, now in _rows(replayed.expected, replayed.trajectory):
        same = recorded == now
        table.add_row(label, Text(recorded), Text(now), Text("=" if same else "≠", style="green" if same else "red"))
    console.print(table)
    if comparison.verdict == "agrees":
        console.print(Text("the replay agrees: the same calls, the same end", style="green"))
    else:
        console.print(Text(f"the replay differs: {len(replayed.differences)} difference(s)", style="red"))
        if replayed.result.error:
            console.print(Text(printable(replayed.result.error)))
        for pending in replayed.result.pending_approvals:
            call = f"{pending['tool']} {json.dumps(pending['input'], ensure_ascii=False, sort_keys=True)}"
            console.print(Text(printable(f"the replay waits at {call}: {pending['reason']}")))
    for line in comparison.let_through:
        console.print(Text.assemble(("note:", "yellow"), f" the recorded model answered although the {line}"))
    if comparison.let_through:
        console.print(Text("(it cannot react to that change: give --model to have a model answer the changed agent)"))


def _rows(recorded: Trajectory, now: Trajectory) -> list[tuple[str, str, str]]:
    rows = []
    for index in range(max(len(recorded.calls), len(now.calls))):
        was = recorded.calls[index].shown() if index < len(recorded.calls) else ""
        is_ = now.calls[index].shown() if index < len(now.calls) else ""
        rows.append((f"call {index + 1}", printable(was), printable(is_)))
    rows.append(("status", recorded.status, now.status))
    for name in ("answer", "result"):
        was, is_ = getattr(recorded, name), getattr(now, name)
        if was is not None or is_ is not None:
            rows.append((name, _shown(was), _shown(is_)))
    return rows


def _shown(value: Any) -> str:
    if value is None:
        return "—"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = printable(text)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def render_summary(console: Console, comparisons: Sequence[Comparison]) -> None:
    """One line per run (its verdict and first difference), then how many agree, differ or were not replayed."""
    if not comparisons:
        console.print("No runs match.")
        return
    table = Table("run", "recorded", "replay", "verdict", "where")
    table.columns[0].no_wrap = True
    styles = {"agrees": "green", "differs": "red", "not replayed": "yellow"}
    for comparison in comparisons:
        replayed = comparison.replayed
        recorded = replayed.expected.status if replayed is not None else ""
        now = replayed.trajectory.status if replayed is not None else ""
        verdict = Text(comparison.verdict, style=styles[comparison.verdict])
        where = comparison.where.removeprefix(f"run {comparison.run_id} ")  # the row names it
        table.add_row(comparison.run_id, recorded, now, verdict, Text(printable(where)))
    console.print(table)
    counts = {verdict: sum(c.verdict == verdict for c in comparisons) for verdict in styles}
    console.print(Text(f"{counts['agrees']} agree, {counts['differs']} differ, {counts['not replayed']} not replayed"))


__all__ = ["COMMANDS", "add_commands", "cmd_export", "cmd_replay", "render_comparison", "render_summary"]
