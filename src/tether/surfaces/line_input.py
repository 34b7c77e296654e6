"""One line typed at the terminal, read so that a Ctrl-C is never lost while it is awaited.

``input()`` notices a signal only when the signal interrupts its read. A Ctrl-C that arrives
in the instant between the prompt being printed and the read beginning (the process was
preempted right after writing the prompt, as happens on a busy machine) has its handler run
already, so nothing interrupts the read: the key seems ignored until Enter. Here the wait is a
``select`` on the terminal and on the interpreter's signal wake-up pipe, so a signal that came
at any moment before or during the wait raises at once (``KeyboardInterrupt`` for Ctrl-C).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

LINE_BYTES = 65536
"""More than a terminal's line discipline holds (4096 on Linux): one read takes a whole line."""


def read_line() -> str:
    """The next line typed, without its line break; ``EOFError`` on Ctrl-D at its start, as ``input()``.

    Only the main thread of a POSIX process reading a terminal waits this way (signals are
    handled there, and a terminal gives one line per read); anything else reads with ``input()``.
    """
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object with no descriptor
        return input()
    if os.name != "posix" or threading.current_thread() is not threading.main_thread() or not os.isatty(fd):
        return input()
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    previous = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    try:  # a signal handled before this point raised already, at the call above's return
        return _wait_for_line(fd, woken)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(woken)
        os.close(wake)


def _wait_for_line(fd: int, woken: int) -> str:
    while True:
        ready, _, _ = select.select([fd, woken], [], [])
        if woken in ready:  # a signal came: its handler runs as this call returns (Ctrl-C raises there)
            os.read(woken, LINE_BYTES)
            continue  # a signal whose handler does not raise: wait on
        data = os.read(fd, LINE_BYTES)
        if not data:
            raise EOFError
        return data.decode(sys.stdin.encoding or "utf-8", errors="replace").removesuffix("\n")
