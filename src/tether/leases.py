"""Who is running a tool call right now, and whether that driver is still alive.

A tool start records its driver as ``host:pid:start:token``, where ``start`` is when that
process started. Another process that finds the call unfinished must not treat it as
crashed while that driver lives: on the same host it checks that the pid is alive *and*
still the same process (a pid reused by another program after a crash is not the driver;
``start`` tells them apart), and, for itself, whether that drive is still active; across
hosts it trusts the lease until it expires. Only an abandoned call is "in doubt".

When the start time cannot be read (no ``/proc``, no ``ps``), a live pid counts as the
driver: a reused pid then keeps the run busy (:class:`~tether.errors.RunBusy`) until an
operator who knows the driver is gone forces it (``tether resume RUN --force``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tether.state import Lease

HOST = socket.gethostname()
UNKNOWN_START = "?"
_active: set[str] = set()
_lock = threading.Lock()
_own_start: dict[int, str] = {}
"""This process's start time, by pid (a forked child has its own)."""


@dataclass(frozen=True)
class Owner:
    """A driver's identity, parsed from a lease's owner string."""

    host: str
    pid: int
    start: str
    """When the process started, as :func:`process_start` gives it; ``?`` if unknown."""


def owner_id(pid: int, start: str, token: str) -> str:
    """The owner string recorded with a tool start."""
    return f"{HOST}:{pid}:{start}:{token}"


def parse_owner(owner: str) -> Owner | None:
    """``host:pid:start:token`` (or the older ``host:pid:token``); None if neither."""
    parts = owner.split(":")
    if len(parts) not in (3, 4) or not parts[1].isdigit():
        return None
    start = parts[2] if len(parts) == 4 else UNKNOWN_START
    return Owner(parts[0], int(parts[1]), start)


def process_start(pid: int) -> str:
    """When process ``pid`` started, as an opaque token; ``?`` if it cannot be told.

    Linux: the start time in clock ticks since boot (``/proc/PID/stat``, field 22);
    elsewhere ``ps -o lstart=``. Only compared for equality, on the same host.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        pass
    else:
        fields = stat.rpartition(")")[2].split()  # the command name may hold spaces and parentheses
        return fields[19] if len(fields) > 19 else UNKNOWN_START
    try:
        shown = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN_START
    return re.sub(r"\W+", "-", shown.strip()) or UNKNOWN_START


def _my_start() -> str:
    pid = os.getpid()
    if pid not in _own_start:
        _own_start[pid] = process_start(pid)
    return _own_start[pid]


@contextmanager
def driving() -> Iterator[str]:
    """An owner id for one drive, marked active while the drive lasts."""
    owner = owner_id(os.getpid(), _my_start(), uuid.uuid4().hex[:8])
    with _lock:
        _active.add(owner)
    try:
        yield owner
    finally:
        with _lock:
            _active.discard(owner)


def alive(lease: Lease, now: float, *, me: str) -> bool:
    """Whether the driver that started a call may still be running it."""
    if lease.owner == me or lease.abandoned:
        return False  # this drive is not running it now (or an operator said its driver is gone)
    owner = parse_owner(lease.owner)
    if owner is None or owner.host != HOST:
        return now < lease.until
    if owner.pid == os.getpid():
        with _lock:
            return lease.owner in _active
    if not _pid_alive(owner.pid):
        return False
    if owner.start == UNKNOWN_START:
        return True  # cannot tell a reused pid from the driver: assume the driver
    current = process_start(owner.pid)
    return current in (owner.start, UNKNOWN_START)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
