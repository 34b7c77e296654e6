"""A lease's holder process, and whether it is certainly gone: read from /proc, on this host only.

A dead holder (no such pid, its zombie, or its pid now another process's) is recognised on
the same host and in the same PID namespace; anywhere else a pid means nothing, so nothing
is ever declared gone there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from support import as_holder
from tether.stores import Holder
from tether.stores.holders import is_gone, this_process

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_this_process_names_its_host_namespace_pid_and_start() -> None:
    me = this_process()
    assert me.host == "boot:" + Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert me.pid_namespace == os.stat("/proc/self/ns/pid").st_ino
    assert me.pid == os.getpid()
    assert me == as_holder(os.getpid())


def test_a_live_process_is_not_gone(child: subprocess.Popen[bytes]) -> None:
    assert not is_gone(this_process())
    assert not is_gone(as_holder(child.pid))


def test_an_ended_process_is_gone_once_reaped_and_as_a_zombie(child: subprocess.Popen[bytes]) -> None:
    holder = as_holder(child.pid)
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie still has its pid
    assert Path(f"/proc/{child.pid}/stat").exists()
    assert is_gone(holder)
    child.wait()
    assert is_gone(holder)


def test_a_pid_now_used_by_a_later_process_is_gone(child: subprocess.Popen[bytes]) -> None:
    earlier = as_holder(child.pid)
    assert is_gone(replace(earlier, started=earlier.started - 1))  # type: ignore[operator]


def test_nothing_is_gone_in_another_namespace_on_another_host_or_where_proc_says_nothing(
    child: subprocess.Popen[bytes],
) -> None:
    dead = as_holder(child.pid)
    child.kill()
    child.wait()
    assert is_gone(dead)
    other_namespace = replace(dead, pid_namespace=dead.pid_namespace + 1)  # type: ignore[operator]
    assert not is_gone(other_namespace)  # its pids are another namespace's: this one's say nothing
    assert not is_gone(replace(dead, host="boot:another-host"))
    assert not is_gone(replace(dead, started=None))  # a holder that could not read its own start time
    no_proc = Holder("name:somewhere", None, os.getpid(), None)  # this process, were it not on Linux
    assert not is_gone(replace(dead, host=no_proc.host, pid_namespace=None), me=no_proc)
