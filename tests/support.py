"""Helpers shared by the test modules: the ``tether`` command in a subprocess or a
pseudo-terminal, PostgreSQL schemas, the Anthropic client pointed at FakeMessagesAPI, and
the external tools some tests need (Graphviz, Mermaid's parser).

Imported as ``from support import ...`` (tests/ is on sys.path);
the fixtures built on these live in conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pexpect
import pytest

from tether import Agent, Runner, RunResult
from tether.core.approvals import DecideLater
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
ANSI = re.compile(  # CSI sequences (colours, cursor) and OSC sequences (titles, links)
    r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07"
)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child: no ANTHROPIC_* or TETHER_* settings (no API
    key, database, model or demo workspace leaks in), rich at 200 columns, the venv first on
    PATH (as once activated: the hints tether prints then say plain ``tether``), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_ENV_PREFIXES)}
    env["COLUMNS"] = "200"  # rich wraps at 80 columns without a terminal; keep messages on one line
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


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
    )


def finish_tether(process: subprocess.Popen[str]) -> CliResult:
    """Wait (60 s at most) for a command from :func:`start_tether`."""
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"tether timed out: {process.args}\n{out}\n{err}") from None
    args = [str(a) for a in process.args[3:]]  # type: ignore[index]
    return CliResult(args, process.returncode, out, err)


def finish_all(*processes: subprocess.Popen[str]) -> list[CliResult]:
    """Wait for commands already started together (to keep the suite fast)."""
    return [finish_tether(process) for process in processes]


def run_tether(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> CliResult:
    """Run ``python -m tether ARGS`` in ``cwd`` to the end (see :func:`start_tether`)."""
    return finish_tether(start_tether(cwd, *args, env=env))


@dataclass
class Cli:
    """Runs ``python -m tether`` in ``cwd`` (see :func:`start_tether`): ``cli("runs", "--json")``."""

    cwd: Path

    def start(self, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a command in the background (in ``cwd`` if given); see :func:`finish_tether`."""
        return start_tether(cwd or self.cwd, *args, env=env)

    def __call__(self, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> CliResult:
        return finish_tether(self.start(*args, cwd=cwd, env=env))

    def parallel(self, *commands: Sequence[str]) -> list[CliResult]:
        """Independent commands at once (only readers, or writers of different databases)."""
        return finish_all(*(self.start(*command) for command in commands))


@dataclass
class Scenario:
    """A directory of its own, and the first command started there; started early (many at
    once, to keep the suite fast) and waited for when a test first reads ``first``."""

    cli: Cli
    process: subprocess.Popen[str]
    done: CliResult | None = None

    @property
    def cwd(self) -> Path:
        return self.cli.cwd

    @property
    def first(self) -> CliResult:
        """The first command's result (waits for it once)."""
        if self.done is None:
            self.done = finish_tether(self.process)
        return self.done


def run_python(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` (a driver script) in :func:`clean_env`, output captured as text."""
    return subprocess.run(
        [sys.executable, *args], env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


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

    def __enter__(self) -> LaggyProxy:
        self._start(self._accept)
        return self

    def __exit__(self, *exc_info: object) -> None:
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

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
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
