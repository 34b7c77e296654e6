"""Helpers shared by the test modules: the ``tether`` command in a subprocess or a
pseudo-terminal, PostgreSQL schemas, the Anthropic client pointed at FakeMessagesAPI, and
the external tools some tests need (Graphviz, Mermaid's parser).

Imported as ``from support import ...`` (tests/ is on sys.path);
the fixtures built on these live in conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import io
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import queue
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pexpect
import pytest

from tether import Agent, Runner, RunResult
from tether.core.approvals import DecideLater
from tether.stores import Holder
from tether.stores.sql import SQLStore
from tether.testing import FakeMessagesAPI, ScriptedModel

if TYPE_CHECKING:
    from tether.models.anthropic import AnthropicModel

# The demo --------------------------------------------------------------------------------
FIBONACCI = "0 1 1 2 3 5 8 13 21 34"
"""What the demo's fib.py prints once its run_python call is approved."""

DEMO_PROMPT = r"run_python toolu_demo_run[^\n]*: approve[^\n]*> "
"""The terminal approval prompt for the demo's gated run_python call (a pexpect pattern)."""


def demo_db_url(workspace: Path) -> str:
    """The database the demo keeps in its workspace (``tether-demo`` in the cwd by default)."""
    return f"sqlite:///{workspace / 'tether.db'}"


# A tools module with visible side effects ----------------------------------------------
EFFECT_TOOLS = textwrap.dedent(
    '''
    """Tools for the session and lifecycle tests; each run leaves a line in effects.log."""

    import time
    from pathlib import Path

    from tether import tool

    HERE = Path(__file__).parent


    def _effect(line: str) -> None:
        with (HERE / "effects.log").open("a", encoding="utf-8") as log:
            log.write(line + "\\n")


    @tool(approval=True)
    def delete(path: str) -> str:
        """Delete a file (pretend: the call is only logged)."""
        _effect(f"delete {path}")
        return f"deleted {path}"


    @tool(approval=True)
    def send(to: str, body: str) -> str:
        """Send a message."""
        _effect(f"send {to}")
        return f"sent to {to}"


    @tool
    def wait_for(flag: str) -> str:
        """Wait (at most 60 s) until a file named ``flag`` exists beside this module."""
        _effect(f"waiting for {flag}")
        deadline = time.monotonic() + 60
        while not (HERE / flag).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        _effect(f"wait_for {flag}")
        return f"{flag} is there"


    TOOLS = [delete, send, wait_for]
    '''
)
"""A tools module (``mytools.py``) whose tools log to ``effects.log`` beside it: ``delete`` and
``send`` are gated; ``wait_for`` holds its call open until a flag file appears beside it."""


# Scripted model replies (ScriptedModel / FakeMessagesAPI shapes) -------------------------
def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` content block: the model asks to call ``name`` with ``arguments``."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def tool_use_turn(*uses: dict[str, Any]) -> dict[str, Any]:
    """A model reply asking for these :func:`tool_use` calls (one token each way)."""
    return {"content": list(uses), "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1}}


def model_reply(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    """A model reply with this content and stop reason (10 tokens in, 5 out)."""
    return {"content": content, "stop_reason": stop_reason, "usage": {"input_tokens": 10, "output_tokens": 5}}


def token_usage(inp: int, out: int, created: int = 0, read: int = 0) -> dict[str, int]:
    """A reply's ``usage``: input and output tokens, cache writes (``created``) and reads."""
    return {
        "input_tokens": inp,
        "output_tokens": out,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
    }


DONE = {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "usage": {"input_tokens": 1}}
"""A model reply ending the run."""


def results_by_call(runner: Runner, run_id: str) -> dict[str, dict[str, Any]]:
    """The ``tool_result`` blocks of a stored run's history, by ``tool_use_id``."""
    return {
        block["tool_use_id"]: block
        for message in runner.load(run_id).messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    }


def asks(tool: Any) -> str | None:
    """Why a call of ``tool`` waits for a person by the tool's own setting, or None when it does not."""
    from tether.policy.policies import ApprovalContext, decide_approval

    verdict = decide_approval(tool.approval, {}, ApprovalContext(run_id="run", tool=tool.name, call_id="call"))
    return verdict.reason if verdict.verdict == "require_approval" else None


def parked_with(toolset: Any, use: dict[str, Any], db: str) -> tuple[Runner, RunResult]:
    """A run in the database ``db`` with ``toolset``, parked on its one (gated) call ``use``."""
    script = [tool_use_turn(use), DONE]
    runner = Runner(Agent(model=ScriptedModel(script), toolsets=[toolset]), SQLStore(db), approver=DecideLater())
    parked = runner.run("go")
    assert parked.status == "awaiting_approval"
    return runner, parked


# What `tether show --json` printed -----------------------------------------------------------
def tool_results(shown: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``tool_result`` blocks of a shown run's history, by ``tool_use_id``."""
    return {
        block["tool_use_id"]: block
        for message in shown["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    }


def events_of(shown: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    """A shown run's events of one type, oldest first."""
    return [event for event in shown["events"] if event["type"] == kind]


# Environment and text ---------------------------------------------------------------------
CLEAN_ENV_PREFIXES = ("ANTHROPIC", "OPENAI", "TETHER")
EDITOR_VARIABLES = ("VISUAL", "EDITOR")
"""Left out too: ``e`` at a prompt would open the person's editor instead of asking for a line."""
ANSI = re.compile(  # CSI sequences (colours, cursor) and OSC sequences (titles, links)
    r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07"
)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child: no ANTHROPIC_* or TETHER_* settings (no API
    key, database, model or demo workspace leaks in), no editor, rich at 200 columns, the venv first on
    PATH (as once activated: the hints tether prints then say plain ``tether``), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_ENV_PREFIXES) and k not in EDITOR_VARIABLES}
    env["COLUMNS"] = "200"  # rich wraps at 80 columns without a terminal; keep messages on one line
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def default_signals() -> None:
    """In a child, before it runs: Ctrl-C and hangups act by default, as in a user's shell.

    A child inherits ignored signals, so under ``nohup`` (SIGHUP ignored) or as a background job
    (SIGINT ignored) the signals a test sends would otherwise be lost. Pass as ``preexec_fn``:
    it only calls ``signal.signal``, which takes no lock another thread could hold at the fork.
    """
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def flat(text: str) -> str:
    """Whitespace-normalised text (rich may wrap long messages)."""
    return " ".join(text.split())


def screen_text(text: str) -> str:
    """What a terminal showed: escape codes removed, whitespace normalised."""
    return flat(ANSI.sub("", text))


# External tools -------------------------------------------------------------------------------
REQUIRE_TOOLS = "TETHER_REQUIRE_TOOLS"
"""With this set to ``1`` (scripts/test sets it), a test whose external tool is missing fails
instead of skipping, so a broken install cannot pass as a green run."""
MERMAID_DIR = "TETHER_MERMAID_DIR"
"""A directory where ``npm ci`` installed tests/mermaid/package.json (default: tests/mermaid)."""
MERMAID_HOME = Path(__file__).resolve().parent / "mermaid"


def need_tool(missing: str | None) -> None:
    """Skip the test when ``missing`` names a missing tool, or fail it under :data:`REQUIRE_TOOLS`."""
    if missing is None:
        return
    if os.environ.get(REQUIRE_TOOLS) == "1":
        pytest.fail(f"{missing} ({REQUIRE_TOOLS}=1 requires it; scripts/setup installs it)")
    pytest.skip(missing)


def graphviz_missing() -> str | None:
    """Why Graphviz's ``dot`` cannot run here, or None."""
    return None if shutil.which("dot") else "Graphviz is not installed (apt-get install graphviz)"


SCREENSHOTS = "TETHER_UI_SCREENSHOTS"
"""Where the browser tests save their screenshots (scripts/ui-screenshots sets it to diagrams/)."""
BROWSER_WAIT_MS = 30_000
"""How long a browser test's expectation waits for the page (a shared 2-core machine can be slow); not a speed check."""


def chromium_missing() -> str | None:
    """Why the browser tests cannot drive Debian's Chromium here, or None."""
    if shutil.which("chromium") is None:
        return "Chromium is not installed (apt-get install chromium), so the browser tests cannot run"
    try:
        import playwright.sync_api  # noqa: F401 - only whether it imports
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


def mermaid_node(where: Path) -> str | None:
    """The ``node`` that runs Mermaid's parser: the Node 20 scripts/setup installed in ``where``/.node
    (where the one on PATH is older), else the one on PATH."""
    local = where / ".node" / "node_modules" / ".bin" / "node"
    return str(local) if local.exists() else shutil.which("node")


def mermaid_missing(where: Path) -> str | None:
    """Why Mermaid's parser cannot run from ``where``, or None."""
    node = mermaid_node(where)
    if node is None:
        return "Node.js is not installed (apt-get install nodejs npm), so Mermaid's parser cannot run"
    asked = subprocess.run([node, "-p", "process.versions.node"], capture_output=True, text=True, check=False)
    version = asked.stdout.strip() or "unreadable"
    if not re.match(r"(2\d|[3-9]\d|\d{3,})\.", version):
        return (
            f"Mermaid's parser needs Node.js >= 20 (for jsdom), and {node} is {version}: "
            "scripts/setup installs Node 20 from the npm registry into tests/mermaid/.node, or says why it could not"
        )
    if not (where / "node_modules" / "mermaid").is_dir() or not (where / "node_modules" / "jsdom").is_dir():
        return f"Mermaid's parser is not installed in {where} (scripts/setup runs `npm ci` in tests/mermaid)"
    return None


def mermaid_parse_errors(where: Path, texts: Mapping[str, str], scratch: Path) -> dict[str, str]:
    """Feed each text (keyed by a file name) to Mermaid's own parser, installed in ``where``;
    return name → first line of the error, for the texts it rejects (tests/mermaid/parse.mjs)."""
    for name, text in texts.items():
        (scratch / name).write_text(text, encoding="utf-8")
    script = (MERMAID_HOME / "parse.mjs").read_text(encoding="utf-8")
    node = mermaid_node(where) or "node"
    command = [node, "--input-type=module", "-e", script, *(str(scratch / name) for name in texts)]
    completed = subprocess.run(command, cwd=where, capture_output=True, text=True, timeout=120, check=False)
    errors = {}
    for line in completed.stdout.splitlines():
        path, _, error = line.partition("\t")
        errors[Path(path).name] = error
    assert completed.returncode == (1 if errors else 0), completed.stdout + completed.stderr  # it ran
    return errors


# The tether command in a subprocess -------------------------------------------------------
PROCESS_WAIT = 180.0
"""Seconds a test waits for a process at most: a busy machine slows each one tenfold, a hang still fails."""


@dataclass(repr=False)
class CliResult:
    """A finished ``tether`` command; its repr shows the command, exit status and output."""

    args: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def data(self) -> dict[str, Any]:
        """Stdout as exactly one JSON object (fails on anything else on stdout)."""
        try:
            value = json.loads(self.stdout)
        except ValueError as error:
            raise AssertionError(f"stdout is not one JSON object: {error}\n{self}") from error
        assert isinstance(value, dict), self
        return value

    @property
    def err(self) -> str:
        """Stderr, whitespace-normalised."""
        return flat(self.stderr)

    def __repr__(self) -> str:
        command = " ".join(self.args)
        return f"$ tether {command}\n[exit {self.returncode}]\n--stdout--\n{self.stdout}\n--stderr--\n{self.stderr}"


def start_tether(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -m tether ARGS`` in ``cwd``: stdin not a terminal, :func:`clean_env`
    plus ``env``, output captured. Pair with :func:`finish_tether`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=clean_env(**(env or {})),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,  # noqa: PLW1509 - see default_signals
    )


def finish_tether(process: subprocess.Popen[str]) -> CliResult:
    """Wait (:data:`PROCESS_WAIT` at most) for a command from :func:`start_tether`."""
    try:
        out, err = process.communicate(timeout=PROCESS_WAIT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"tether timed out: {process.args!r}\n{out}\n{err}") from None
    args = [str(a) for a in process.args[3:]]  # type: ignore[index]
    return CliResult(args, process.returncode, out, err)


def finish_all(*processes: subprocess.Popen[str]) -> list[CliResult]:
    """Wait for commands already started together (to keep the suite fast)."""
    return [finish_tether(process) for process in processes]


def run_tether_process(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> CliResult:
    """Run ``python -m tether ARGS`` in a new process, to the end (see :func:`start_tether`): for
    what only a real process shows (its exit status from the console script, signals, imports)."""
    return finish_tether(start_tether(cwd, *args, env=env))


TETHER_MAIN = str(Path(__file__).resolve().parents[1] / "src" / "tether" / "__main__.py")
"""What ``sys.argv[0]`` is in ``python -m tether`` (the hints tether prints depend on it)."""
TETHER = str(Path(sys.executable).parent / "tether")
"""How the hints of ``python -m tether`` under :func:`clean_env` name tether: this venv's script, absolutely."""


def run_tether(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> CliResult:
    """``tether ARGS`` run in this process as ``python -m tether ARGS`` would run in ``cwd``.

    The same entry point, :func:`tether.surfaces.cli.main`, with what a new process would
    have had (see :func:`_like_a_new_process`); an uncaught error is a traceback and exit 1.
    A process costs over half a second of CPU just to import tether, so only tests where the
    process itself is the point use :func:`run_tether_process`.
    """
    from tether.surfaces import cli

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with _like_a_new_process(Path(cwd), [TETHER_MAIN, *args], clean_env(**(env or {})), err=err, out=out):
        try:
            code = cli.main(list(args))
        except SystemExit as leaving:  # argparse's usage errors and --help
            code = leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
            if isinstance(leaving.code, str):
                print(leaving.code, file=sys.stderr)
        except Exception:  # what the interpreter prints for an uncaught error
            traceback.print_exc()
            code = 1
    return CliResult(list(args), code, _written(out), _written(err))


@contextmanager
def _like_a_new_process(
    cwd: Path, argv: list[str], environment: Mapping[str, str], *, out: io.TextIOWrapper, err: io.TextIOWrapper
) -> Iterator[None]:
    """This process made to look like a new one, undone afterwards.

    ``environment``, ``cwd`` and ``argv``; stdin not a terminal, at end of file; stdout and
    stderr to ``out`` and ``err``; Python's default warning filters (pytest's make every
    warning an error), the warnings shown on ``err``, as are logged warnings. Modules imported
    from elsewhere than Python, the venv, tether and tests/ (a run's tools module, its helpers)
    are forgotten afterwards, as are directories added to ``sys.path``: the next command
    imports them anew, as a new process would.
    """
    from tether.surfaces import hints

    saved_env, saved_cwd, saved_argv, saved_path = dict(os.environ), os.getcwd(), sys.argv, list(sys.path)
    modules = set(sys.modules)
    logged = logging.StreamHandler(err)  # what logging's last resort prints in a process without handlers
    logged.setLevel(logging.WARNING)
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    sys.argv = argv
    hints.invocation.cache_clear()  # it depends on PATH and argv
    logging.getLogger().addHandler(logged)
    try:
        with (
            warnings.catch_warnings(record=True) as warned,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            _stdin_at_eof(),
        ):
            _python_default_warnings()
            try:
                yield
            finally:
                for shown in warned:
                    err.write(warnings.formatwarning(shown.message, shown.category, shown.filename, shown.lineno))
    finally:
        logging.getLogger().removeHandler(logged)
        hints.invocation.cache_clear()
        sys.argv = saved_argv
        sys.path[:] = saved_path
        for name in set(sys.modules) - modules:
            if not _installed(getattr(sys.modules[name], "__file__", None)):
                del sys.modules[name]
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


INSTALLED = tuple({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(__file__).resolve().parents[1]})
"""Where the modules every process imports alike come from: Python, the venv, this checkout."""


def _installed(file: str | None) -> bool:
    """Whether a module's file is Python's, the venv's or this checkout's (not a run's own)."""
    if file is None:
        return True
    path = Path(file).resolve()
    return any(path.is_relative_to(root) for root in INSTALLED)


@contextmanager
def _stdin_at_eof() -> Iterator[None]:
    """Stdin as ``subprocess.DEVNULL`` makes it: not a terminal, at end of file."""
    saved = sys.stdin
    sys.stdin = io.StringIO()
    try:
        yield
    finally:
        sys.stdin = saved


def _python_default_warnings() -> None:
    """The warning filters of a plain ``python`` process (pytest's turn every warning into an error)."""
    warnings.resetwarnings()
    warnings.simplefilter("default")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", category)


def _written(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8")


@dataclass
class Cli:
    """Runs ``tether`` in ``cwd``: ``cli("runs", "--json")`` in this process (see :func:`run_tether`),
    ``cli.start(...)`` as a process of its own, for commands that must run at the same time."""

    cwd: Path

    def start(self, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a command in a process in the background (in ``cwd`` if given); see :func:`finish_tether`."""
        return start_tether(cwd or self.cwd, *args, env=env)

    def __call__(self, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> CliResult:
        return run_tether(cwd or self.cwd, *args, env=env)

    def process(self, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> CliResult:
        """A command in a process of its own, to its end (see :func:`run_tether_process`)."""
        return finish_tether(self.start(*args, cwd=cwd, env=env))

    def parallel(self, *commands: Sequence[str]) -> list[CliResult]:
        """Independent commands (only readers, or writers of different databases), one after another."""
        return [self(*command) for command in commands]


def runs_made(cli: Cli) -> list[dict[str, Any]]:
    """The runs in the default database of ``cli``'s directory: none when no command created it."""
    if not (cli.cwd / "tether.db").exists():
        return []
    listed: list[dict[str, Any]] = cli("runs", "--json").data["runs"]
    return listed


@dataclass
class Scenario:
    """A directory of its own, and the first command to run there: run when a test first reads ``first``."""

    cli: Cli
    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    done: CliResult | None = None

    @property
    def cwd(self) -> Path:
        return self.cli.cwd

    @property
    def first(self) -> CliResult:
        """The first command's result (run once)."""
        if self.done is None:
            self.done = self.cli(*self.command, env=self.env)
        return self.done


def run_python(*args: str, timeout: float = PROCESS_WAIT) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` (a driver script) in :func:`clean_env`, output captured as text."""
    return subprocess.run(
        [sys.executable, *args], env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


@dataclass
class Script:
    """A driver script running in a process of its own (see :func:`start_script`)."""

    args: list[str]
    process: Any
    """Its ``multiprocessing`` process: ``is_alive()``, ``exitcode`` (-9 when SIGKILLed)."""
    scratch: tempfile.TemporaryDirectory[str]
    """Where its stdout and stderr go."""

    def finish(self, timeout: float = PROCESS_WAIT) -> subprocess.CompletedProcess[str]:
        """Wait for its end: its exit status and output, as ``subprocess.run`` gives them."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            raise AssertionError(f"{self.args} timed out after {timeout}s")
        code = self.process.exitcode
        self.process.close()
        with self.scratch as scratch:
            out, err = (Path(scratch, name).read_text(encoding="utf-8") for name in ("out", "err"))
        return subprocess.CompletedProcess(self.args, code, out, err)


def start_script(script: Path, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> Script:
    """Start the driver ``script ARGS`` as ``python script ARGS`` would, in :func:`clean_env` plus ``env``.

    A real process of its own (it may SIGKILL itself, or race others), forked from a server
    that imported tether, its CLI, SQLAlchemy, psycopg and the Anthropic SDK once
    (multiprocessing's forkserver), instead of a new interpreter importing them again: the
    crash tests start hundreds.
    """
    scratch = tempfile.TemporaryDirectory()
    argv = [str(script), *args]
    out, err = (str(Path(scratch.name, name)) for name in ("out", "err"))
    process = _forkserver().Process(
        target=_as_script,
        args=(str(script), argv, clean_env(**(env or {})), None if cwd is None else str(cwd), out, err),
    )
    process.start()
    return Script(argv, process, scratch)


CLI_DRIVER = Path(__file__).with_name("cli_driver.py")


def start_tether_forked(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> Script:
    """:func:`start_tether`'s command as a process forked like :func:`start_script`'s drivers.

    For commands that race in real processes of their own, where how tether starts is not the
    point: a new interpreter imports tether and the Anthropic SDK anew, over a second of CPU.
    Pair with :func:`finish_tether_forked`.
    """
    return start_script(CLI_DRIVER, *args, cwd=cwd, env=env)


def finish_tether_forked(script: Script) -> CliResult:
    """Wait for a command from :func:`start_tether_forked`: its result, as :func:`finish_tether` gives it."""
    done = script.finish()
    return CliResult(done.args[1:], done.returncode, done.stdout, done.stderr)


def run_script(script: Path, *args: str, timeout: float = PROCESS_WAIT) -> subprocess.CompletedProcess[str]:
    """:func:`start_script`, to its end."""
    return start_script(script, *args).finish(timeout)


FORKSERVER_PRELOAD = [
    *("support", "tether", "tether.stores.sql", "tether.testing", "sqlalchemy", "psycopg"),
    *("tether.surfaces.cli", "anthropic", "tether.models.anthropic"),
    "forkserver_frozen",
]
"""What the forked drivers share, imported once by the server."""


@functools.cache
def _forkserver() -> Any:
    """The forkserver context, its server started with tests/ on its path.

    Python 3.11's forkserver ignores the ``sys.path`` it is handed, and skips a preload it cannot
    import without a word: without PYTHONPATH, ``support`` (and pytest with it) was imported
    again by every driver, unpickling its target (0.09 s of CPU each), and nothing was frozen.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *filter(None, [saved])])
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    return context


def _as_script(script: str, argv: list[str], environment: dict[str, str], cwd: str | None, out: str, err: str) -> None:
    """In the forked process: the environment, directory, argv and output files ``python script`` would have,
    then the script."""
    os.environ.clear()
    os.environ.update(environment)
    if cwd is not None:
        os.chdir(cwd)
    sys.argv = argv
    sys.path.insert(0, str(Path(script).parent))
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdout
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    else:
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# The tether command in a pseudo-terminal --------------------------------------------------
def spawn_tether(
    cwd: Path, *args: str, timeout: float = 20, columns: int = 200, env: Mapping[str, str] | None = None
) -> pexpect.spawn:
    """``python -m tether ARGS`` in ``cwd`` on a 50-line xterm ``columns`` wide (pexpect),
    :func:`clean_env` plus ``env``; everything it shows is kept for :func:`transcript`."""
    child = pexpect.spawn(
        sys.executable,
        ["-m", "tether", *args],
        cwd=str(cwd),
        env=clean_env(TERM="xterm", COLUMNS=str(columns), **(env or {})),
        encoding="utf-8",
        codec_errors="replace",
        timeout=timeout,
        dimensions=(50, columns),
        preexec_fn=default_signals,  # Ctrl-C reaches it through the terminal, even under nohup
    )
    child.logfile_read = io.StringIO()
    return child


def transcript(child: pexpect.spawn) -> str:
    """Everything a :func:`spawn_tether` child showed so far, escape codes included."""
    log = child.logfile_read
    assert isinstance(log, io.StringIO)
    return log.getvalue()


def finish_terminal(child: pexpect.spawn) -> tuple[int | None, str]:
    """Wait for the end of a spawned command: (its exit status, its :func:`screen_text`)."""
    child.expect(pexpect.EOF)
    output = screen_text(child.before or "")
    child.close()
    return child.exitstatus, output


# Stores ---------------------------------------------------------------------------------
class Blocking:
    """An :class:`~tether.stores.AsyncStore` called like a :class:`~tether.stores.Store`, for the contract suite.

    Each call runs to its end on this object's own event loop, so every test written against
    the sync contract checks the async stores too, unchanged.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.loop.run_until_complete(method(*args, **kwargs))

        return call

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.store.close())
        finally:
            self.loop.close()


async def settled(outcome: Any) -> Any:
    """What a runner's or a store's call gave: awaited if awaitable (AsyncRunner, an AsyncStore), else as is."""
    return await outcome if inspect.isawaitable(outcome) else outcome


def done(outcome: Any) -> Any:
    """:func:`settled` outside an event loop: a coroutine is run to its end on a new one."""
    return asyncio.run(outcome) if inspect.iscoroutine(outcome) else outcome


@contextmanager
def opened_store(kind: str, url: str) -> Iterator[Any]:
    """A store of ``kind`` on ``url``, sync in its calls, closed afterwards.

    Kinds: ``sync`` (SQLStore), ``async`` (AsyncSQLStore), ``threaded`` (SQLStore made awaitable
    by as_async_store); the last two through :class:`Blocking`.
    """
    from tether.stores.awaitable import as_async_store
    from tether.stores.sql import AsyncSQLStore, SQLStore

    store: Any
    if kind == "sync":
        store = SQLStore(url)
    elif kind == "async":
        store = Blocking(AsyncSQLStore(url))
    else:
        store = Blocking(as_async_store(SQLStore(url)))
    try:
        yield store
    finally:
        store.close()


# PostgreSQL -----------------------------------------------------------------------------
PG_URL = os.environ.get("TETHER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
"""The test server (TETHER_TEST_PG_URL, default: the local one); see the pg_url fixture."""


class PgSchema(NamedTuple):
    """A schema of its own: its name, and a SQLAlchemy URL whose search_path is that schema."""

    name: str
    url: str


def libpq_dsn(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as psycopg takes it (no ``+driver`` in the scheme)."""
    scheme, rest = url.split("://", 1)
    return "postgresql://" + rest if scheme.startswith("postgresql") else url


@contextmanager
def fresh_pg_schema(url: str) -> Iterator[PgSchema]:
    """A new, empty schema on the server at ``url``, dropped (with its tables) afterwards."""
    import psycopg

    name = f"tether_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(libpq_dsn(url), autocommit=True, connect_timeout=3) as connection:
        connection.execute(f'CREATE SCHEMA "{name}"')
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), ("options", f"-csearch_path={name}")]
    try:
        yield PgSchema(name, urlunsplit(parts._replace(query=urlencode(query))))
    finally:
        with psycopg.connect(libpq_dsn(url), autocommit=True, connect_timeout=3) as connection:
            connection.execute(f'DROP SCHEMA "{name}" CASCADE')


class LaggyProxy:
    """A TCP proxy to the server of a PostgreSQL URL that delays every byte ``delay`` seconds each way.

    A slower network, for real: what a client waits for takes at least two delays per round
    trip. Use as a context manager; :attr:`url` is the URL through the proxy.
    """

    def __init__(self, url: str, *, delay: float) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        self.url = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        self._start(self._accept)
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(OSError):  # wakes the accepting thread: close() alone leaves it blocked
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self.threads:
            thread.join(5)

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _admits(self) -> bool:
        """Whether a new connection is let through (a subclass may refuse some: a server down)."""
        return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            if not self._admits():
                client.close()
                continue
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                due: queue.Queue[tuple[float, bytes]] = queue.Queue()
                self._start(self._read, source, due)
                self._start(self._write, sink, due)

    def _read(self, source: socket.socket, due: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            due.put((time.monotonic() + self.delay, data))
            if not data:
                return

    def _write(self, sink: socket.socket, due: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            at, data = due.get()
            time.sleep(max(0.0, at - time.monotonic()))
            try:
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return


# Anthropic against FakeMessagesAPI --------------------------------------------------------
def fake_api_model(api: FakeMessagesAPI, model: str = "claude-test", **options: Any) -> AnthropicModel:
    """An AnthropicModel talking to ``api`` with a test key; no retries unless ``options`` say."""
    from tether.models.anthropic import AnthropicModel

    options.setdefault("api_key", "test-key")
    options.setdefault("base_url", api.url)
    options.setdefault("max_retries", 0)
    return AnthropicModel(model=model, **options)


def fake_api_env(api: FakeMessagesAPI, api_key: str = "test-key", **extra: str) -> dict[str, str]:
    """Extra environment that points a ``tether`` subprocess's Anthropic client at ``api``."""
    return {"ANTHROPIC_API_KEY": api_key, "ANTHROPIC_BASE_URL": api.url, **extra}


def closed_port() -> int:
    """A local TCP port that nothing listens on (connections to it are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving_app(app: Any) -> Iterator[str]:
    """An ASGI ``app`` on uvicorn at a free loopback port, in a thread, until the block ends: its base URL."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="auto", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped before serving"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


# Snapshots --------------------------------------------------------------------------------
SNAPSHOT_EVERY_IN_TESTS = 3
"""Events between snapshots of every MemoryStore in the suite (conftest.snapshots_fold_alike)."""
SNAPSHOTS_CHECKED = 40
"""At most this many snapshot points are checked per run (every one in shorter runs)."""


def assert_snapshots_fold_alike(store: Any) -> None:
    """Every run in ``store`` folds the same from a snapshot taken after ANY of its events as from event 0.

    Each snapshot goes through JSON, as a store keeps it; the events after it are folded in by
    :func:`tether.core.snapshots.rebuild`, exactly as a resume does.
    """
    from tether.core import snapshots
    from tether.core.state import RunState
    from tether.stores import RunLog, Snapshot

    for record in store.list_runs(limit=100_000):
        log = store.load_log(record.id)
        full = RunState.rebuild(record.id, log.events, version=log.version, tenant=log.tenant)
        stride = max(1, len(log.events) // SNAPSHOTS_CHECKED)
        prefix = RunState(id=record.id, tenant=log.tenant)
        for at, event in enumerate(log.events):
            prefix.apply(event)
            if at % stride and at != len(log.events) - 1:
                continue
            taken = snapshots.take(prefix)
            kept = Snapshot(taken.seq, taken.format, json.loads(json.dumps(taken.state)))
            resumed = snapshots.rebuild(record.id, RunLog(log.version, log.tenant, log.events[at + 1 :], kept))
            assert resumed == full, f"run {record.id}: a snapshot after event {event.seq} folds differently"


def as_holder(pid: int) -> Holder:
    """Process ``pid`` (of this host and PID namespace) as it would name itself in a lease (Linux only)."""
    from tether.stores.holders import this_process

    stat = Path(f"/proc/{pid}/stat").read_text()
    started = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22; the name, in parentheses, may hold anything
    return replace(this_process(), pid=pid, started=started)
