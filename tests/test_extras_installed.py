"""Every extra installs alone and its feature then works: the built wheel in a fresh venv per extra.

The suite's own venv has every extra (dev installs ``all``), so it cannot notice an extra that
lacks a package. Here the wheel is built once per session (``python -m build``) and installed
with one extra and nothing else into a venv of its own (``uv``: seconds each, from one shared
cache), where a real smoke of the feature runs: the worker drives a detached run to done on
PostgreSQL, ``tether ui`` serves a page, an MCP server's tool runs, and so on. The base install
runs the demo and says, in one line naming the extra, what each missing feature needs. Each module's
bytecode is compiled once and shared by the venvs (:class:`Bytecode`), not compiled again in each.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fixtures.pets_api import make_app
from support import (
    DONE,
    FIBONACCI,
    PG_URL,
    PgSchema,
    closed_port,
    default_signals,
    serving_app,
    tool_use,
    tool_use_turn,
)
from tether.extras import MODULES
from tether.testing import FakeChatCompletionsAPI

pytestmark = pytest.mark.slow  # builds a wheel, creates a venv per extra

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"
MCP_SERVER = ROOT / "tests" / "fixtures" / "mcp_server.py"
ONE_LINE = (
    r"error: (?P<feature>.+) needs: pip install 'tether\[(?P<extra>[a-z]+)\]' \((?P<module>[\w.]+) is not installed\)\n"
)
"""What a missing extra prints on stderr, and nothing else."""


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temporary directory: under xdist, the one above each worker's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tether's wheel, built once for the session (the first xdist worker builds it, the others wait).

    Its dependencies are then resolved once, online, so uv's cache holds PyPI's index as it is now
    and each venv installs offline (as a fresh resolution would, without asking PyPI again per package).
    """
    shared = shared_dir(tmp_path_factory)
    out = shared / "wheel"
    with (shared / "wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("tether-*.whl")):
            build = [sys.executable, "-m", "build", "--wheel", "--installer", "uv", "--outdir", str(out), str(ROOT)]
            done = subprocess.run(build, capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
            [built] = out.glob("tether-*.whl")
            resolve = ("pip", "compile", "--quiet", "--python", sys.executable, "-o", os.devnull, "-")
            done = uv(*resolve, stdin=f"tether[all] @ {built.as_uri()}")
            assert done.returncode == 0, done.stderr
    [built] = out.glob("tether-*.whl")
    return built


def uv(*args: str, env: Mapping[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``uv ARGS``, to its end."""
    return subprocess.run(
        [str(UV), *args], input=stdin, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@dataclass
class Venv:
    """A venv holding tether's wheel with one extra (or none), and what its commands need."""

    path: Path
    extra: str | None
    missing: dict[str, str | None] = field(default_factory=dict)
    """For each extra, tether.extras.require()'s message if one of its modules is not here, else None."""

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    @property
    def tether(self) -> str:
        return str(self.path / "bin" / "tether")

    def env(self, **extra: str) -> dict[str, str]:
        """This environment with the venv first on PATH and nothing of the suite's venv or settings."""
        suite = str(Path(sys.executable).parent)
        path = [str(self.path / "bin"), *(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != suite)]
        leaks = ("ANTHROPIC", "OPENAI", "TETHER", "OTEL", "PYTHON", "VIRTUAL_ENV")
        env = {k: v for k, v in os.environ.items() if not k.startswith(leaks)}
        return {**env, "PATH": os.pathsep.join(path), "COLUMNS": "200", **extra}

    def run(self, cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``tether ARGS`` (or ``python ARGS`` when the first is ``python``) in ``cwd``, to its end."""
        program = self.python if args[0] == "python" else self.tether
        rest = args[1:] if args[0] == "python" else args
        return subprocess.run(
            [program, *rest],
            cwd=cwd,
            env=self.env(**(env or {})),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def start(self, cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """A long-running command (a server, a worker) in the background."""
        program = [self.python, *args[1:]] if args[0] == "python" else [self.tether, *args]
        return subprocess.Popen(
            program,
            cwd=cwd,
            env=self.env(**(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_signals,  # noqa: PLW1509 - it is stopped with Ctrl-C (SIGINT), even under nohup
        )

    @property
    def site_packages(self) -> Path:
        [found] = (self.path / "lib").glob("python*/site-packages")
        return found


class Bytecode:
    """Compiled modules shared by the venvs, so each module is compiled once per session, not once per venv.

    A fresh venv has no bytecode: its first ``import`` of sqlalchemy, pydantic, rich, anthropic...
    compiles them, seconds of CPU in each of a dozen venvs. uv links every venv's files to the same
    files of its cache, so a module's source is one file (one inode) in all of them, and its
    bytecode (``__pycache__/NAME.TAG.pyc``) is the same too: :meth:`give` links a venv's bytecode
    into a store named by that file, :meth:`take` links it into the next venv. Python still checks
    each against its source's mtime and size (a mismatch is compiled again), and only bytecode is
    shared: each venv installs its own packages. Where uv copies instead (another filesystem),
    nothing matches and each venv compiles its own, as before.
    """

    SUFFIX = f".{sys.implementation.cache_tag}.pyc"

    def __init__(self, store: Path) -> None:
        self.store = store
        store.mkdir(exist_ok=True)

    def _key(self, source: Path) -> str:
        """The store's name for ``source``: the file itself (device, inode) as it is (size, mtime)."""
        st = source.stat()
        return f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"

    def take(self, venv: Venv) -> None:
        """Link into ``venv`` the bytecode other venvs compiled for its modules."""
        stored = set(os.listdir(self.store))
        for folder, _, files in os.walk(venv.site_packages):
            for name in files:
                if name.endswith(".py") and (key := self._key(Path(folder, name))) in stored:
                    _link(self.store / key, Path(folder, "__pycache__", name.removesuffix(".py") + self.SUFFIX))

    def give(self, venv: Venv) -> None:
        """Link into the store the bytecode ``venv`` compiled, for the next venvs."""
        for cache in venv.site_packages.rglob("__pycache__"):
            for compiled in cache.glob(f"*{self.SUFFIX}"):
                source = cache.parent / (compiled.name.removesuffix(self.SUFFIX) + ".py")
                if compiled.stat().st_nlink == 1 and source.exists():  # compiled here, not taken
                    _link(compiled, self.store / self._key(source))


def _link(existing: Path, new: Path) -> None:
    """A hard link ``new`` to ``existing``, unless ``new`` is there already."""
    if not new.exists():
        new.parent.mkdir(exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another xdist worker linked it, or Python wrote it, just now
            new.hardlink_to(existing)


Installed = Callable[[str | None], Venv]
"""The :func:`installed` fixture."""


@pytest.fixture(scope="session")
def bytecode(tmp_path_factory: pytest.TempPathFactory) -> Bytecode:
    """The session's :class:`Bytecode` (one for all xdist workers)."""
    return Bytecode(shared_dir(tmp_path_factory) / "bytecode")


@pytest.fixture(scope="session")
def venvs(wheel: Path, bytecode: Bytecode, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """``venvs("worker")``: a fresh venv with the wheel and that extra alone (``None``: no extra), made once."""
    made: dict[str | None, Venv] = {}

    def make(extra: str | None) -> Venv:
        if extra in made:
            return made[extra]
        path = tmp_path_factory.mktemp(f"venv-{extra or 'base'}")
        venv = Venv(path, extra)
        requirement = f"{wheel}[{extra}]" if extra else str(wheel)
        done = uv("venv", "--quiet", "--python", sys.executable, str(path), env=venv.env())
        assert done.returncode == 0, done.stderr
        install = ("pip", "install", "--quiet", "--python", venv.python, requirement)
        done = uv(*install, "--offline", env=venv.env())
        if done.returncode != 0:  # a package the session's resolution did not download: from PyPI, then
            done = uv(*install, env=venv.env())
        assert done.returncode == 0, done.stderr
        bytecode.take(venv)
        checked = venv.run(path, "python", "-c", INSTALLED_CHECK)
        assert checked.returncode == 0, checked.stderr
        found = json.loads(checked.stdout)
        assert Path(found["tether"]).is_relative_to(path)  # the wheel's tether, not this source tree
        venv.missing = found["missing"]
        made[extra] = venv
        return venv

    return make


@pytest.fixture
def installed(venvs: Installed, bytecode: Bytecode) -> Iterator[Installed]:
    """``installed("worker")``: the venv of that extra (see :func:`venvs`); what the test compiled is shared after."""
    used: list[Venv] = []

    def get(extra: str | None) -> Venv:
        used.append(venvs(extra))
        return used[-1]

    yield get
    for venv in used:
        bytecode.give(venv)


INSTALLED_CHECK = textwrap.dedent(
    """
    import json, tether
    from tether.extras import MODULES, require

    missing = {}
    for extra in MODULES:
        try:
            require(extra, "this check")
        except ImportError as error:
            missing[extra] = str(error)
        else:
            missing[extra] = None
    print(json.dumps({"tether": tether.__file__, "missing": missing}))
    """
)
"""Run in each venv once it is made (one process: each costs tether's import): where tether is, and
what :func:`tether.extras.require` says of each extra."""


def has_every_module_of(venv: Venv, *extras: str) -> None:
    """tether.extras.require() finds every module ``extras`` bring: the extra installs what tether says it does."""
    said = {extra: venv.missing[extra] for extra in extras}
    assert not any(said.values()), said


def scripted(where: Path, *turns: dict[str, Any]) -> str:
    """A scripted model file: these turns, then done."""
    (where / "script.json").write_text(json.dumps([*turns, DONE]), encoding="utf-8")
    return f"scripted:{where / 'script.json'}"


def data(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode in (0, 3), f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


# The base install ------------------------------------------------------------------------------
MISSING_IN_THE_CLI = [
    ("ui", ["ui", "--port", "0"]),
    ("worker", ["worker", "--db", PG_URL]),
    ("worker", ["run", "hi", "--detach", "--db", PG_URL]),
    ("otel", ["demo", "--otel", "--approve-all"]),
    ("openai", ["run", "hi", "--model", "openai:gpt-test"]),
    ("postgres", ["runs", "--db", PG_URL]),
    ("mcp", ["run", "hi", "--mcp", "server"]),
    ("openapi", ["run", "hi", "--openapi", "api.json"]),
]
MISSING_IN_THE_LIBRARY = {
    "postgres": f"from tether.stores.sql import SQLStore; SQLStore({PG_URL!r})",
    "async": f"from tether.stores.sql import AsyncSQLStore; AsyncSQLStore({PG_URL!r})",
    "service": "import tether.examples.service",
    "openai": "from tether.models.openai import OpenAIModel; OpenAIModel('gpt-test')",
    "ui": "import tether.surfaces.web.app",
    "mcp": "import tether.toolsets.mcp",
    "openapi": "import tether.toolsets.openapi",
    "otel": "from tether.drivers.otel import from_environment; from_environment()",
    "worker": f"from tether.drivers.worker import Worker; Worker({PG_URL!r})",
}
LIBRARY_CHECK = textwrap.dedent(
    """
    import json, sys
    from tether.errors import MissingExtra

    said = {}
    for extra, code in json.loads(sys.argv[1]).items():
        try:
            exec(code)
        except ImportError as error:
            said[extra] = [type(error).__name__, getattr(error, "extra", None), str(error)]
        else:
            said[extra] = None
    print(json.dumps(said))
    """
)


def test_the_base_install_runs_the_demo_traced_only_if_asked(installed: Installed, tmp_path: Path) -> None:
    """OTEL_TRACES_EXPORTER, set for other programs too, only warns without the otel extra (the API is there)."""
    base = installed(None)
    done = base.run(tmp_path, "demo", "--approve-all", "--json", env={"OTEL_TRACES_EXPORTER": "console"})
    assert data(done)["status"] == "done"
    assert FIBONACCI in data(done)["output"]
    warning = "warning: OTEL_TRACES_EXPORTER is set but tracing (tether.drivers.otel) needs: pip install 'tether[otel]'"
    assert done.stderr.startswith(warning), done.stderr
    assert done.stderr.count("\n") == 1


def test_the_base_install_says_in_one_line_which_extra_each_command_needs(installed: Installed, tmp_path: Path) -> None:
    base = installed(None)
    for extra, command in MISSING_IN_THE_CLI:
        done = base.run(tmp_path, *command)
        said = re.fullmatch(ONE_LINE, done.stderr)
        assert (done.returncode, done.stdout, said is not None) == (2, "", True), (command, done.stderr)
        assert said is not None
        assert said["extra"] == extra, (command, done.stderr)


def test_the_base_install_says_which_extra_each_feature_needs_as_an_import_error(installed: Installed) -> None:
    base = installed(None)
    done = base.run(Path.cwd(), "python", "-c", LIBRARY_CHECK, json.dumps(MISSING_IN_THE_LIBRARY))
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert sorted(said) == sorted(MODULES)  # every extra
    for extra, (kind, named, message) in said.items():
        assert (kind, named) == ("MissingExtra", extra), message
        assert re.fullmatch(ONE_LINE, f"error: {message}\n"), message


# Each extra alone ------------------------------------------------------------------------------
def test_postgres_a_run_is_kept_in_postgresql(installed: Installed, pg_schema: PgSchema, tmp_path: Path) -> None:
    venv = installed("postgres")
    has_every_module_of(venv, "postgres")
    done = data(venv.run(tmp_path, "demo", "--approve-all", "--json", "--db", pg_schema.url))
    assert done["status"] == "done"
    listed = data(venv.run(tmp_path, "runs", "--json", "--db", pg_schema.url))
    assert [run["run_id"] for run in listed["runs"]] == [done["run_id"]]


ASYNC_RUN = textwrap.dedent(
    """
    import asyncio, json, sys
    from tether import Agent, AsyncRunner, tool
    from tether.stores.sql import AsyncSQLStore
    from tether.testing import ScriptedModel

    @tool
    def add(a: int, b: int) -> int:
        "Add two integers."
        return a + b

    async def main() -> None:
        store = AsyncSQLStore(sys.argv[1])
        try:
            agent = Agent(model=ScriptedModel(json.loads(sys.argv[2])), tools=[add])
            result = await AsyncRunner(agent, store).run("Add 2 and 3.")
            print(json.dumps({"status": result.status, "tool_calls": result.tool_calls, "run_id": result.run_id}))
        finally:
            await store.close()

    asyncio.run(main())
    """
)


def test_async_an_async_runner_drives_a_run_on_postgresql(
    installed: Installed, pg_schema: PgSchema, tmp_path: Path
) -> None:
    venv = installed("async")
    has_every_module_of(venv, "async", "postgres")
    turns = [tool_use_turn(tool_use("t1", "add", {"a": 2, "b": 3})), DONE]
    done = data(venv.run(tmp_path, "python", "-c", ASYNC_RUN, pg_schema.url, json.dumps(turns)))
    assert (done["status"], done["tool_calls"]) == ("done", 1)
    shown = data(venv.run(tmp_path, "show", done["run_id"], "--json", "--db", pg_schema.url))
    assert shown["status"] == "done"


def test_service_the_example_service_answers_on_postgresql(
    installed: Installed, pg_schema: PgSchema, tmp_path: Path
) -> None:
    venv = installed("service")
    has_every_module_of(venv, "service", "async", "postgres")
    (tmp_path / "tokens.json").write_text(json.dumps({"token-of-acme-0123456789": "acme"}), encoding="utf-8")
    port = closed_port()
    args = ["python", "-m", "tether.examples.service", "--db", pg_schema.url, "--port", str(port)]
    server = venv.start(tmp_path, *args, "--tokens", "tokens.json")
    try:
        answer = request(
            f"http://127.0.0.1:{port}/runs", {"prompt": "go"}, token="token-of-acme-0123456789", server=server
        )
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)
    assert answer["status"] == "awaiting_approval"  # the demo agent asks before it runs its program
    assert [call["tool"] for call in answer["pending_approvals"]] == ["run_python"]


def test_openai_a_run_on_an_openai_compatible_api(installed: Installed, tmp_path: Path) -> None:
    venv = installed("openai")
    has_every_module_of(venv, "openai")
    with FakeChatCompletionsAPI() as api:
        api.reply_text("Hello from a Chat Completions API.")
        env = {"OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": api.url}
        done = data(venv.run(tmp_path, "run", "hi", "--model", "openai:gpt-test", "--json", env=env))
    assert (done["status"], done["output"]) == ("done", "Hello from a Chat Completions API.")


def test_ui_the_inspector_serves_the_runs(installed: Installed, tmp_path: Path) -> None:
    venv = installed("ui")
    has_every_module_of(venv, "ui")
    parked = data(venv.run(tmp_path, "demo", "--json"))
    db = f"sqlite:///{tmp_path / 'tether-demo' / 'tether.db'}"
    server = venv.start(tmp_path, "ui", "--db", db, "--port", "0")
    try:
        assert server.stdout is not None
        announced = server.stdout.readline()  # "tether ui: http://127.0.0.1:PORT/?token=TOKEN"
        found = re.search(r"(http://\S+/)\?token=(\S+)", announced)
        assert found is not None, announced
        with urllib.request.urlopen(
            urllib.request.Request(found[1], headers={"Authorization": f"Bearer {found[2]}"}), timeout=30
        ) as page:
            html = page.read().decode()
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)
    assert parked["run_id"] in html


def test_mcp_an_mcp_servers_tool_runs(installed: Installed, tmp_path: Path) -> None:
    venv = installed("mcp")
    has_every_module_of(venv, "mcp")
    model = scripted(tmp_path, tool_use_turn(tool_use("t1", "add", {"a": 1, "b": 2})))
    server = f"{venv.python} {MCP_SERVER}"  # built with the SDK the extra installed
    done = data(venv.run(tmp_path, "run", "add", "--mcp", server, "--model", model, "--json"))
    assert (done["status"], done["tool_calls"]) == ("done", 1)
    assert (tmp_path / "calls.log").read_text().splitlines() == ["add 1 2"]


def test_openapi_an_operation_of_a_local_service_runs(installed: Installed, tmp_path: Path) -> None:
    venv = installed("openapi")
    has_every_module_of(venv, "openapi")
    app = make_app()
    model = scripted(tmp_path, tool_use_turn(tool_use("t1", "listPets", {"limit": 1})))
    with serving_app(app) as url:
        done = data(venv.run(tmp_path, "run", "list", "--openapi", f"{url}/openapi.json", "--model", model, "--json"))
    assert (done["status"], done["tool_calls"]) == ("done", 1)
    assert [(method, path) for method, path, *_ in app.state.seen] == [("GET", "/v1/pets")]


def test_otel_a_runs_spans_are_exported(installed: Installed, tmp_path: Path) -> None:
    venv = installed("otel")
    has_every_module_of(venv, "otel")
    done = venv.run(tmp_path, "demo", "--approve-all", "--json", "--otel", env={"OTEL_TRACES_EXPORTER": "console"})
    assert data(done)["status"] == "done"
    run_id = data(done)["run_id"]
    assert re.search(r'"name": "invoke_agent [^"]+"', done.stderr), done.stderr  # the console exporter's JSON
    assert f'"tether.run.id": "{run_id}"' in done.stderr


def test_worker_drives_a_detached_run_to_done_on_postgresql(
    installed: Installed, pg_schema: PgSchema, tmp_path: Path
) -> None:
    venv = installed("worker")
    has_every_module_of(venv, "worker", "async", "postgres")
    db = ["--db", pg_schema.url]
    demo = ["--tools", "tether.examples.demo:TOOLS", "--model", "scripted-demo"]  # the demo's agent, queued
    queued = data(venv.run(tmp_path, "run", "go", "--detach", *demo, "--json", *db))
    run_id = queued["run_id"]
    worker = venv.start(tmp_path, "worker", "--json", *db)
    notes = Notes(worker)
    try:
        assert notes.next() == (run_id, "picked_up")
        assert notes.next() == (run_id, "awaiting_approval")  # the demo asks before it runs its program
        approved = venv.run(tmp_path, "approve", run_id, "toolu_demo_run", *db)
        assert approved.returncode == 0, approved.stderr
        assert notes.next() == (run_id, "picked_up")  # the decision queued the run again
        assert notes.next() == (run_id, "done")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    shown = data(venv.run(tmp_path, "show", run_id, "--json", *db))
    assert shown["status"] == "done"
    assert FIBONACCI in shown["output"]


def test_all_brings_every_extra(installed: Installed) -> None:
    venv = installed("all")
    has_every_module_of(venv, *MODULES)
    modules = ["tether.surfaces.web.app", "tether.examples.service", "tether.toolsets.mcp", "tether.toolsets.openapi"]
    modules += ["tether.drivers.otel", "tether.models.openai_client", "tether.models.anthropic_client", "procrastinate"]
    done = venv.run(
        Path.cwd(), "python", "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)", *modules
    )
    assert done.returncode == 0, done.stderr


# Helpers -----------------------------------------------------------------------------------------
def request(url: str, body: dict[str, Any], *, token: str, server: subprocess.Popen[str]) -> dict[str, Any]:
    """POST ``body`` as JSON once the server listens (it takes a moment to start): the JSON answer."""
    deadline = time.monotonic() + 60
    sent = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    while True:
        try:
            with urllib.request.urlopen(sent, timeout=30) as answer:
                value = json.loads(answer.read())
                assert isinstance(value, dict)
                return value
        except ConnectionRefusedError:
            pass
        except urllib.error.URLError as error:
            if not isinstance(error.reason, ConnectionRefusedError):
                raise
        assert server.poll() is None, server.communicate()[1]
        assert time.monotonic() < deadline, "the service did not start listening"
        time.sleep(0.1)


class Notes:
    """A worker's ``--json`` lines on stdout, read as they come (by a thread: a read may hold several)."""

    def __init__(self, worker: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(worker,), daemon=True).start()

    def _read(self, worker: subprocess.Popen[str]) -> None:
        for line in worker.stdout or ():
            self.lines.put(line)

    def next(self, timeout: float = 60) -> tuple[str, str]:
        """The next line, as (run id, what)."""
        try:
            line = json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError("the worker said nothing in time") from None
        return line["run_id"], line["what"]
