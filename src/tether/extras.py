"""The optional extras (``pip install 'tether[EXTRA]'``): what each brings, and one line when one is missing.

``pip install tether`` runs agents on SQLite with the terminal's approval prompt. Each other
feature is an extra: PostgreSQL, the async store, the example service, OpenAI-compatible
models, the web inspector, MCP and OpenAPI toolsets, tracing, the queue worker. A feature built
on one imports its dependencies inside :func:`needs`, or checks them first with :func:`require`
(which imports nothing), so a person without the extra reads one line naming what to install::

    tether ui needs: pip install 'tether[ui]' (starlette is not installed)

raised as :class:`~tether.errors.MissingExtra`, an ImportError, never a bare ``No module named``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from tether.errors import MissingExtra

MODULES: Mapping[str, tuple[str, ...]] = {
    "postgres": ("psycopg",),
    "async": ("greenlet", "psycopg"),
    "service": ("starlette", "uvicorn", "greenlet", "psycopg"),
    "openai": ("openai",),
    "ui": ("starlette", "uvicorn", "jinja2", "markdown_it"),
    "mcp": ("mcp", "jsonschema"),
    "openapi": ("httpx", "jsonschema"),
    "otel": ("opentelemetry.trace", "opentelemetry.sdk"),
    "worker": ("procrastinate", "psycopg", "greenlet"),
}
"""The modules each extra brings that tether imports (pyproject.toml lists the packages: a test
keeps the two in step). ``all`` brings every one."""


@contextmanager
def needs(extra: str, feature: str) -> Iterator[None]:
    """Inside the block, an import that fails for want of a module of ``extra`` raises :class:`MissingExtra`.

    ``feature`` says what needs it, in words (``tether ui``). An inner block's MissingExtra for
    one of this extra's modules is said again as this feature's; any other error passes as it is.
    """
    try:
        yield
    except ImportError as error:
        missing = _missing_module(error) or ""
        ours = next((module for module in MODULES[extra] if missing and _within(module, missing)), None)
        if ours is None:
            raise
        raise MissingExtra(feature, extra, min(missing, ours, key=len)) from error  # the package, not a part of it


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` now unless every module ``extra`` brings is installed (none is imported).

    For a command that would otherwise fail only later, after work began (a server, a worker).
    """
    for module in MODULES[extra]:
        missing = _not_found(module)
        if missing is not None:
            raise MissingExtra(feature, extra, missing)


def _not_found(module: str) -> str | None:
    """The first of ``module`` and the packages above it (``a``, then ``a.b``...) not installed; None: all are."""
    parts = module.split(".")
    for name in (".".join(parts[:end]) for end in range(1, len(parts) + 1)):
        if importlib.util.find_spec(name) is None:
            return name
    return None


def _missing_module(error: BaseException | None) -> str | None:
    """The module not found that made an import fail, if that was why (SQLAlchemy raises greenlet's from its own)."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError | MissingExtra) and error.name:
            return error.name
        error = error.__cause__
    return None


def _within(module: str, missing: str) -> bool:
    """Whether ``missing`` not found means ``module`` is not there: it is that module, a package above it or below."""
    return module == missing or module.startswith(f"{missing}.") or missing.startswith(f"{module}.")
