"""Text edited in the person's own editor, ``$VISUAL`` else ``$EDITOR``, as ``git commit`` does it.

The editor gets the terminal (``/dev/tty``, so a ``--json`` run's stdout keeps only its JSON), and
while it runs a Ctrl-C is the editor's: vim's users press it to leave insert mode, and it must not
stop the command (git ignores it too).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tether.errors import ConfigError

EDITOR_VARIABLES = ("VISUAL", "EDITOR")
"""Where the editor's command is read, the first one set winning."""


def chosen_editor() -> list[str] | None:
    """The editor's command (``$VISUAL``, else ``$EDITOR``) split as a shell would; None when neither is set."""
    for name in EDITOR_VARIABLES:
        command = os.environ.get(name, "").strip()
        if command:
            return shlex.split(command)
    return None


def edit_text(text: str, command: list[str], *, name: str = "input.json") -> str:
    """``text`` as the person left it after editing it with ``command``, in a file named ``name``.

    Raises:
        ConfigError: the editor cannot be started, or it exited with a failure (its edit is not used).
    """
    shown = shlex.join(command)
    with tempfile.TemporaryDirectory(prefix="tether-edit-") as folder:
        path = Path(folder) / name
        path.write_text(text, encoding="utf-8")
        with _terminal() as terminal, _ctrl_c_to_the_editor():
            try:
                done = subprocess.run([*command, str(path)], stdin=terminal, stdout=terminal, check=False)
            except OSError as error:
                raise ConfigError(f"cannot start the editor {shown}: {error.strerror or error}") from None
        if done.returncode != 0:
            raise ConfigError(f"the editor {shown} exited with status {done.returncode}")
        return path.read_text(encoding="utf-8", errors="replace")


@contextmanager
def _terminal() -> Iterator[IO[bytes] | None]:
    """The controlling terminal, for the editor's input and output; None (inherit ours) if there is none."""
    try:
        terminal = open("/dev/tty", "r+b", buffering=0)  # noqa: SIM115 - closed below
    except OSError:
        yield None
        return
    with terminal:
        yield terminal


def _ignore(signum: int, frame: object) -> None:
    """A handler that does nothing: unlike ``SIG_IGN``, the editor does not inherit it (exec resets it)."""


@contextmanager
def _ctrl_c_to_the_editor() -> Iterator[None]:
    """While the editor runs, Ctrl-C is its own (main thread only: signals are handled there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _ignore)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
