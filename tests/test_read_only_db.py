"""Read commands work on a SQLite database this user cannot write (``chmod 444``, a read-only directory).

In WAL mode SQLite keeps a ``-shm`` (and ``-wal``) file beside the database; in a directory it
cannot write, it cannot create them and so could not even read. The store opens such a
database read-only (``immutable`` when no ``-wal`` file holds committed pages), never switches
its journal mode, and a command that writes says the database is read-only.

Permissions do not bind root, so under root the commands run without the capabilities that
override them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), like any user.
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import clean_env, finish_all, tool_use
from tether import Agent, Runner, tool
from tether.core.approvals import DecideLater
from tether.stores import RunRecord
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text


@tool(approval=True)
def delete(path: str) -> str:
    """Delete a file (gated)."""
    return "deleted"


DONE = [
    {"content": [tool_use("t1", "echo", {"text": "hi"})], "stop_reason": "tool_use"},
    {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
]
PARKED = [{"content": [tool_use("t2", "delete", {"path": "x"})], "stop_reason": "tool_use"}]
PERMISSION_OVERRIDES = (1, 2)
"""CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: what lets root ignore file permissions."""


def _bound_by_permissions() -> None:
    """In the child, before exec: drop the capabilities that ignore permissions (PR_CAPBSET_DROP)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in PERMISSION_OVERRIDES:
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """Start ``python -m tether ARGS`` in ``cwd`` bound by file permissions, even under root."""
    return subprocess.Popen(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_bound_by_permissions if os.geteuid() == 0 else None,  # noqa: PLW1509 - nothing else runs threads here
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    """A directory the test makes read-only, writable again afterwards (so pytest can remove it)."""
    path = tmp_path / "ro"
    path.mkdir()
    try:
        yield path
    finally:
        for item in (path, *path.iterdir()):
            item.chmod(item.stat().st_mode | stat.S_IWUSR)


def start_runs(store: SQLStore) -> tuple[str, str]:
    """A finished run and one parked on an approval: (its id, the parked one's)."""
    done = Runner(Agent(model=ScriptedModel(DONE), tools=[echo]), store).run("hi")
    parked = Runner(Agent(model=ScriptedModel(PARKED), tools=[delete]), store, approver=DecideLater()).run("rm")
    assert (done.status, parked.status) == ("done", "awaiting_approval")
    return done.run_id, parked.run_id


@pytest.mark.slow  # processes bound by file permissions
@pytest.mark.parametrize(
    ("directory_writable", "live_writer"),
    [(False, False), (True, False), (False, True)],
    ids=["read-only-directory", "read-only-file", "read-only-directory-beside-a-writer"],
)
def test_read_commands_work_on_a_database_nobody_here_can_write(
    workspace: Path, directory_writable: bool, live_writer: bool
) -> None:
    """``beside-a-writer``: a process that could write has it open, its last run only in the -wal file."""
    url = f"sqlite:///{workspace / 'tether.db'}"
    store = SQLStore(url)
    run_id, parked_id = start_runs(store)
    store.close()
    assert not (workspace / "tether.db-wal").exists()  # closed cleanly: only the database file is left
    writer = SQLStore(url)
    if live_writer:
        writer.create_run(RunRecord(id="run_in_the_wal", status="done", version=1), [])
        assert (workspace / "tether.db-wal").stat().st_size > 0
    (workspace / "tether.db").chmod(0o444)
    workspace.chmod(0o777 if directory_writable else 0o555)

    checks = {("show", run_id, "--json"): '"status": "done"', ("runs", "--json"): parked_id}
    if live_writer:  # read through the -wal file, not from the database file alone
        checks[("runs", "--json")] = "run_in_the_wal"
    if not directory_writable and not live_writer:  # where opening was impossible: every read command
        checks |= {
            ("show", run_id): "done",
            ("pending",): "t2",
            ("audit", "--json"): '"call_id": "t1"',
            ("diagram", "--run", run_id): "stateDiagram",
            ("gc", "--older-than", "1d"): "",
        }
    try:
        results = finish_all(*(start(workspace, *command) for command in checks))
    finally:
        writer.close()
    for (command, expected), result in zip(checks.items(), results, strict=True):
        assert "Traceback" not in result.stderr, result
        if command[0] == "gc":  # a command that writes says why it cannot
            assert result.returncode == 1, result
            assert "is read-only here" in result.err, result
        else:
            assert result.returncode == 0, result
            assert expected in result.stdout, result


ASYNC_READER = """
import asyncio, sys
from tether.errors import StoreError
from tether.stores import RunRecord
from tether.stores.sql import AsyncSQLStore

async def main():
    store = AsyncSQLStore(sys.argv[1])
    print("runs:", sorted(r.id for r in await store.list_runs()))
    try:
        await store.create_run(RunRecord(id="run_new", status="done", version=1), [])
    except StoreError as error:
        print("write:", error)
    await store.close()

asyncio.run(main())
"""


@pytest.mark.slow  # a child process
def test_the_async_store_reads_a_database_nobody_here_can_write_and_says_why_it_cannot_write(workspace: Path) -> None:
    url = f"sqlite:///{workspace / 'tether.db'}"
    store = SQLStore(url)
    run_id, parked_id = start_runs(store)
    store.close()
    (workspace / "tether.db").chmod(0o444)
    workspace.chmod(0o555)
    child = subprocess.run(
        [sys.executable, "-c", ASYNC_READER, url],
        cwd=workspace,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=_bound_by_permissions if os.geteuid() == 0 else None,
    )
    assert child.returncode == 0, child.stderr
    assert f"runs: {sorted([run_id, parked_id])}" in child.stdout
    assert "write: database" in child.stdout
    assert "is read-only here" in child.stdout
