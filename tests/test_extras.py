"""A missing optional dependency is one line naming the extra to install, in the library and the CLI.

Here a package is made missing the way Python sees an uninstalled one (``None`` in
``sys.modules``: its import raises ModuleNotFoundError); test_extras_installed.py installs each
extra alone into a fresh venv and checks the same lines there for real.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from support import PG_URL, Cli
from tether.errors import MissingExtra, TetherError
from tether.extras import MODULES, needs, require
from tether.models.providers import model_for


def missing(monkeypatch: pytest.MonkeyPatch, package: str, *reimported: str) -> None:
    """Make ``package`` look uninstalled, and the tether modules that import it be imported afresh."""
    for name in list(sys.modules):
        if any(name == module or name.startswith(f"{module}.") for module in (package, *reimported)):
            monkeypatch.delitem(sys.modules, name)  # a module of the package imported before would still be found
    monkeypatch.setitem(sys.modules, package, None)


def message(extra: str, feature: str, module: str) -> str:
    return re.escape(f"{feature} needs: pip install 'tether[{extra}]' ({module} is not installed)")


def sql_store(url: str) -> object:
    from tether.stores.sql import SQLStore

    return SQLStore(url)


def async_sql_store(url: str) -> object:
    from tether.stores.sql import AsyncSQLStore

    return AsyncSQLStore(url)


def worker(url: str) -> object:
    from tether.drivers.worker import Worker

    return Worker(url)


LIBRARY: list[tuple[str, str, str, Callable[[], object], tuple[str, ...]]] = [
    ("postgres", "psycopg", f"the database '{PG_URL}'", lambda: sql_store(PG_URL), ()),
    ("async", "greenlet", f"the database '{PG_URL}'", lambda: async_sql_store(PG_URL), ()),
    (
        "service",
        "starlette",
        "the example service (tether.examples.service)",
        lambda: importlib.import_module("tether.examples.service"),
        ("tether.examples.service",),
    ),
    (
        "openai",
        "openai",
        "--model 'openai:gpt-test'",
        lambda: model_for("openai:gpt-test"),
        ("tether.models.openai",),
    ),
    (
        "ui",
        "jinja2",
        "the web inspector (tether.surfaces.web)",
        lambda: importlib.import_module("tether.surfaces.web.app"),
        ("tether.surfaces.web",),
    ),
    (
        "mcp",
        "mcp",
        "an MCP toolset (tether.toolsets.mcp)",
        lambda: importlib.import_module("tether.toolsets.mcp"),
        ("tether.toolsets.mcp",),
    ),
    (
        "openapi",
        "jsonschema",  # through tether.tools.schema, which the mcp extra's tools share: said as OpenAPI's here
        "an OpenAPI toolset (tether.toolsets.openapi)",
        lambda: importlib.import_module("tether.toolsets.openapi"),
        ("tether.toolsets.openapi", "tether.tools.schema"),
    ),
    (
        "otel",
        "opentelemetry",
        "tracing (tether.drivers.otel)",
        lambda: importlib.import_module("tether.drivers.otel"),
        ("tether.drivers.otel",),
    ),
    ("worker", "procrastinate", "a tether worker (tether.drivers.worker.Worker)", lambda: worker(PG_URL), ()),
]


@pytest.mark.parametrize(("extra", "package", "feature", "use", "reimported"), LIBRARY, ids=[row[0] for row in LIBRARY])
def test_the_library_says_which_extra_to_install_as_an_import_error(
    monkeypatch: pytest.MonkeyPatch,
    extra: str,
    package: str,
    feature: str,
    use: Callable[[], object],
    reimported: tuple[str, ...],
) -> None:
    missing(monkeypatch, package, *reimported)
    with pytest.raises(ImportError, match=message(extra, feature, package)) as raised:
        use()
    assert isinstance(raised.value, MissingExtra)
    assert isinstance(raised.value, TetherError)
    assert (raised.value.extra, raised.value.name) == (extra, package)


def test_the_example_service_started_without_its_extra_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import runpy

    missing(monkeypatch, "starlette", "tether.examples.service")
    with pytest.raises(SystemExit) as exited:  # python -m tether.examples.service: no traceback
        runpy.run_module("tether.examples.service", run_name="__main__")
    feature = "the example service (tether.examples.service)"
    assert re.fullmatch("error: " + message("service", feature, "starlette"), str(exited.value.code))


def test_every_extra_has_a_case_here() -> None:
    assert sorted(row[0] for row in LIBRARY) == sorted(MODULES)


CLI = [
    ("ui", "starlette", ["ui", "--port", "0"], "tether ui"),
    ("worker", "procrastinate", ["worker", "--db", PG_URL], "tether worker"),
    ("worker", "procrastinate", ["run", "hi", "--detach", "--db", PG_URL], "tether run --detach"),
    ("otel", "opentelemetry", ["demo", "--otel", "--approve-all"], "tether demo --otel"),
    ("openai", "openai", ["run", "hi", "--model", "openai:gpt-test"], "--model 'openai:gpt-test'"),
    ("postgres", "psycopg", ["runs", "--db", PG_URL], f"the database '{PG_URL}'"),
]


@pytest.mark.parametrize(("extra", "package", "command", "feature"), CLI, ids=[" ".join(row[2][:2]) for row in CLI])
def test_the_cli_says_which_extra_to_install_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, extra: str, package: str, command: list[str], feature: str
) -> None:
    missing(monkeypatch, package)
    done = Cli(tmp_path)(*command)
    assert done.returncode == 2, done
    assert re.fullmatch(f"error: {message(extra, feature, package)}\n", done.stderr), done
    assert done.stdout == ""


def test_an_inner_features_missing_module_is_said_as_the_outer_features_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    missing(monkeypatch, "greenlet")
    with pytest.raises(MissingExtra, match=message("worker", "the queue", "greenlet")), needs("worker", "the queue"):
        require("async", "the async store")


def test_other_import_errors_pass_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    missing(monkeypatch, "not_an_extras_module")
    with pytest.raises(ModuleNotFoundError, match="not_an_extras_module") as not_ours, needs("ui", "tether ui"):
        importlib.import_module("not_an_extras_module")
    assert not isinstance(not_ours.value, MissingExtra)
    with pytest.raises(ImportError, match="cannot import name") as no_such_name, needs("ui", "tether ui"):
        from jinja2 import not_a_name  # type: ignore[attr-defined]  # noqa: F401 - jinja2 is there; the name is not
    assert not isinstance(no_such_name.value, MissingExtra)


def test_require_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in {module.split(".")[0] for modules in MODULES.values() for module in modules}:
        monkeypatch.delitem(sys.modules, module, raising=False)
    for extra in MODULES:
        require(extra, "this test")  # the dev environment has every extra
    imported = {module.split(".")[0] for modules in MODULES.values() for module in modules} & set(sys.modules)
    assert imported <= {"opentelemetry"}  # finding opentelemetry.sdk imports the namespace package above it
