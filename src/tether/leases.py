"""Who is running a tool call right now, and whether that driver is still alive.

A tool start records its driver as ``host:pid:token``. Another process that finds the call
unfinished must not treat it as crashed while that driver lives: on the same host it checks
the process (and, for itself, whether that drive is still active); across hosts it trusts
the lease until it expires. Only an abandoned call is "in doubt".
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tether.state import Lease

HOST = socket.gethostname()
_active: set[str] = set()
_lock = threading.Lock()


@contextmanager
def driving() -> Iterator[str]:
    """An owner id for one drive, marked active while the drive lasts."""
    owner = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    with _lock:
        _active.add(owner)
    try:
        yield owner
    finally:
        with _lock:
            _active.discard(owner)


def alive(lease: Lease, now: float, *, me: str) -> bool:
    """Whether the driver that started a call may still be running it."""
    host, _, rest = lease.owner.partition(":")
    pid_text, _, _token = rest.partition(":")
    if lease.owner == me:
        return False  # this drive is not running it now, so it was interrupted
    if host != HOST or not pid_text.isdigit():
        return now < lease.until
    pid = int(pid_text)
    if pid == os.getpid():
        with _lock:
            return lease.owner in _active
    return _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
