"""Who holds a lease, as the host knows the process, and whether that process is certainly gone.

A lease names its holder by the host's identity (Linux's boot id, which also changes when the
host restarts), the PID namespace (the inode of ``/proc/self/ns/pid``), the pid and the
process's start time (field 22 of ``/proc/PID/stat``, clock ticks since boot). A resumer on
the same host and in the same PID namespace can tell at once that the holder died: no process
has its pid (or only its zombie), or the process that has it started at another time. From
anywhere else (another host, another container, a system without ``/proc``) nothing is
certain, and :func:`is_gone` says False: the lease's time to live rules, as it always did.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

from tether.stores import Holder

_PROC = Path("/proc")
_MACHINE_IDS = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


def this_process() -> Holder:
    """This process as a lease's holder (read once per process: a forked child reads its own)."""
    return _identity(os.getpid())


@functools.cache
def _identity(pid: int) -> Holder:
    namespace = _pid_namespace(pid)
    try:
        started = _start_time(pid) if namespace is not None else None
    except (OSError, ValueError):
        started = None
    return Holder(_host(), namespace, pid, started)


def is_gone(holder: Holder, *, me: Holder | None = None) -> bool:
    """Whether ``holder`` certainly no longer runs: only ever True on ``me``'s host and in its PID namespace.

    ``me`` is this process unless given. A pid that cannot be looked at (another user's,
    under ``hidepid``) counts as alive.
    """
    me = me if me is not None else this_process()
    if holder.host != me.host or me.pid_namespace is None or holder.pid_namespace != me.pid_namespace:
        return False
    if holder.started is None or me.started is None or holder.pid <= 0:
        return False
    try:
        started = _start_time(holder.pid)
    except FileNotFoundError:  # no such process, or one /proc hides from this user: ask the kernel
        return not _exists(holder.pid)
    except (OSError, ValueError):  # unreadable: nothing is certain
        return False
    return started != holder.started


def _host() -> str:
    """This host's identity: the boot id where Linux has one, else the machine id, else the host name."""
    boot = _read(_PROC / "sys/kernel/random/boot_id")
    if boot:
        return f"boot:{boot}"
    machine = next((found for path in _MACHINE_IDS if (found := _read(path))), None)
    return f"machine:{machine}" if machine else f"name:{socket.gethostname()}"


def _pid_namespace(pid: int) -> int | None:
    """The inode of this process's PID namespace; None without one, or when ``/proc`` is another namespace's."""
    try:
        if os.readlink(_PROC / "self") != str(pid):  # /proc mounted for another PID namespace: its pids are not ours
            return None
        return os.stat(_PROC / "self/ns/pid").st_ino
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None for a zombie (it has ended).

    Raises FileNotFoundError when no such process is visible, ValueError for a line not as expected.
    """
    line = (_PROC / str(pid) / "stat").read_text()
    fields = line[line.rindex(")") + 2 :].split()  # the name, in parentheses, may hold anything
    if len(fields) < 20:
        raise ValueError(f"/proc/{pid}/stat has {len(fields) + 2} fields, not 22 or more")
    state, started = fields[0], fields[19]  # fields 3 and 22 of the line
    return None if state in ("Z", "X") else int(started)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, as another user's
        return True
    return True


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
