"""``tether export --as-test`` and ``tether replay``: stored runs as regression tests.

Kept beside :mod:`tether.surfaces.cli`, which adds these commands to its parser and table: the
logic is :mod:`tether.testing.recording` (replay) and :mod:`tether.testing.export` (the test module).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol

from tether.agent import Agent
from tether.stores import Store

RUN_ID_HELP = "the run's id (see `tether runs`)"
Command = Callable[[argparse.Namespace, Any], int]


class Session(Protocol):
    """What a command gets from the CLI's session: its store, consoles and the database's URL."""

    store: Store
    out: Any
    """The rich console of stdout (rendered by :mod:`tether.surfaces.terminal`)."""
    db_url: str
    agents: list[Agent]


def add_commands(commands: Any, with_db: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    """Add ``export`` (and ``replay``) to the CLI's subcommands."""
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


def cmd_export(args: argparse.Namespace, session: Session) -> int:
    """Write the run's test module and recording; print how to run it."""
    from tether.stores.sql import url_secrets
    from tether.testing.export import export_test
    from tether.testing.recording import Recording

    recording = Recording.from_events(args.run_id, session.store.load_events(args.run_id))
    test, data = export_test(
        recording, args.as_test, agent=args.agent, secrets=url_secrets(session.db_url), overwrite=args.force
    )
    print(f"wrote {test} and {data}: run it with `pytest {test}`")
    return 0


COMMANDS: dict[str, Command] = {"export": cmd_export}
"""The commands this module serves, by name (merged into the CLI's)."""


__all__ = ["COMMANDS", "add_commands", "cmd_export"]
