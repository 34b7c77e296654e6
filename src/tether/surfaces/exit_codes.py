"""The exit status of every ``tether`` command: one code per situation, defined here only.

``docs/reference/exit-codes.md`` lists them and what to do about each; ``tests/test_exit_codes.py``
brings about each situation. Alike situations share a code: something named that is not there is
2 whether it is a run, a call or a database (a SQLite file or a PostgreSQL database); a reader
that leaves early (``| head``) ends every command with 0, as the output was all that was cut.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a command's exit status says happened."""

    DONE = 0
    """The run is done; any other command did what it was asked (its reader may have left early)."""
    FAILED = 1
    """The run failed or was cancelled; or the command was refused or failed: a decision made first
    elsewhere or bound to other arguments, a store error, Graphviz missing, ``gc`` declined."""
    USAGE = 2
    """Nothing was done: a bad flag or value, or something named that is not there (a run, a tool
    call, a database), or a run that has already ended."""
    AWAITING = 3
    """The run is parked awaiting approval."""
    WAITING_RETRY = 4
    """The run waits for a tool retry due later than ``--max-wait``."""
    BUSY = 5
    """Another process holds the run's lease (it drives the run); nothing was done."""


SIGNAL_BASE = 128
"""Interrupted by a signal: exit 128 + its number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), as shells do."""

__all__ = ["SIGNAL_BASE", "ExitCode"]
