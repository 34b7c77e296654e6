"""The commands tether prints for a person to copy: whole, absolute, one per line.

A hint pasted in another directory, another shell or a cron job must find the same tether and
the same database: the executable is named by its absolute path and the database by an absolute
``--db`` (a relative SQLite path made absolute, the password hidden). Each command is printed on
a line of its own, so a terminal never breaks it between words of a sentence.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import sys
from pathlib import Path

from tether.stores import shown_url

RUN_ID_HELP = "the run's id, or its start if no other run's id starts so (see `tether runs`)"
"""The help of every command's RUN argument: a unique start of an id is enough."""


@functools.cache
def invocation() -> str:
    """How to run this same tether from any directory: an absolute path, quoted for the shell.

    The path it was started by (``../../.venv/bin/tether`` as ``/home/me/.venv/bin/tether``); for
    ``python -m tether``, this installation's ``tether`` script when it is on PATH, else this
    interpreter with ``-m tether``.
    """
    started = sys.argv[0] if sys.argv else ""
    if os.path.basename(started) != "__main__.py":
        found = started if os.path.isfile(started) else shutil.which(started) if started else None
        if found is not None:
            return shlex.quote(os.path.abspath(found))
    on_path = shutil.which("tether")
    scripts = os.path.realpath(os.path.dirname(sys.executable))
    if on_path is not None and os.path.dirname(os.path.realpath(on_path)) == scripts:
        return shlex.quote(os.path.abspath(on_path))
    return f"{shlex.quote(os.path.abspath(sys.executable))} -m tether"


def absolute_sqlite(url: str) -> str:
    """``sqlite:///runs.db`` as ``sqlite:////here/runs.db``; any other URL as it is."""
    scheme, separator, rest = url.partition(":///")
    if not separator or not scheme.startswith("sqlite") or rest.startswith("/") or rest.startswith(":memory:"):
        return url
    path, query, options = rest.partition("?")
    return f"{scheme}:///{Path(path).resolve()}{query}{options}" if path else url


def db_option(url: str) -> str:
    """`` --db URL`` naming the database absolutely, never with its password."""
    return f" --db {shlex.quote(shown_url(absolute_sqlite(url)))}"


def command(db_url: str, *words: str) -> str:
    """``/abs/tether WORDS --db URL``: one whole command for this tether and this database."""
    return f"{invocation()} {' '.join(words)}{db_option(db_url)}"


def lines(lead: str, *commands: str) -> str:
    """``lead``, then each command on a line of its own, indented: what a hint or an error prints."""
    return "\n".join([lead, *(f"  {each}" for each in commands)])


__all__ = ["RUN_ID_HELP", "absolute_sqlite", "command", "db_option", "invocation", "lines"]
