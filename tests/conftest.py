"""Fixtures shared by the test modules (the plain helpers behind them are in support.py)."""

from __future__ import annotations

import gc
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from support import (
    BROWSER_WAIT_MS,
    MERMAID_DIR,
    MERMAID_HOME,
    PG_URL,
    SCREENSHOTS,
    SNAPSHOT_EVERY_IN_TESTS,
    PgSchema,
    assert_snapshots_fold_alike,
    chromium_missing,
    fresh_pg_schema,
    graphviz_missing,
    libpq_dsn,
    mermaid_missing,
    need_tool,
)
from tether.stores.memory import MemoryStore
from tether.testing import FakeChatCompletionsAPI, FakeMessagesAPI
from tether.tools import Tool
from wires import Calls, ChatWire, Harness, MessagesWire, Wire, make_tools


# Snapshots ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def snapshots_fold_alike(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every run the suite keeps in a MemoryStore must fold alike from any snapshot as from its first event.

    Memory stores snapshot every few events in tests (not their default), so the suite's loads
    and resumes go through snapshots; after each test, each of its runs is checked at every
    event (see support.assert_snapshots_fold_alike).
    """
    made: list[MemoryStore] = []
    original = MemoryStore.__init__

    def init(self: MemoryStore, *, snapshot_every: int = SNAPSHOT_EVERY_IN_TESTS) -> None:
        original(self, snapshot_every=snapshot_every)
        made.append(self)

    monkeypatch.setattr(MemoryStore, "__init__", init)
    yield
    for store in made:
        assert_snapshots_fold_alike(store)


# PostgreSQL -----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pg_url() -> str:
    """The server URL, after checking it answers.

    Without it the PostgreSQL tests are skipped, unless TETHER_REQUIRE_PG is set (as
    scripts/test and CI do): then they fail, so a missing server never passes for green.
    """
    required = bool(os.environ.get("TETHER_REQUIRE_PG"))
    try:
        import psycopg
    except ImportError:
        if required:
            pytest.fail("TETHER_REQUIRE_PG is set but psycopg is not installed")
        pytest.skip("psycopg is not installed")
    try:
        with psycopg.connect(libpq_dsn(PG_URL), connect_timeout=3) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        message = f"PostgreSQL unreachable at {PG_URL} (set TETHER_TEST_PG_URL): {error}"
        if required:
            pytest.fail(f"TETHER_REQUIRE_PG is set: {message}")
        pytest.skip(message)
    return PG_URL


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[PgSchema]:
    """A fresh schema for this test alone (dropped afterwards): its name and URL."""
    with fresh_pg_schema(pg_url) as schema:
        yield schema


@pytest.fixture(scope="module")
def module_pg_schema(pg_url: str) -> Iterator[PgSchema]:
    """A fresh schema for the module's tests to share (dropped after its last): where a schema and
    its tables made per test would cost more than the tests, and each test reads only its own rows
    (or empties the tables first)."""
    with fresh_pg_schema(pg_url) as schema:
        yield schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database, once per backend: SQLite in tmp_path, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    schema: PgSchema = request.getfixturevalue("pg_schema")
    return schema.url


# External tools -------------------------------------------------------------------------
@pytest.fixture
def graphviz() -> None:
    """Graphviz's ``dot`` is on PATH (else skip, or fail under TETHER_REQUIRE_TOOLS=1)."""
    need_tool(graphviz_missing())


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's Chromium, for Playwright (else skip, or fail under TETHER_REQUIRE_TOOLS=1)."""
    need_tool(chromium_missing())
    return str(shutil.which("chromium"))


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright: one per module.

    Not one per session: Playwright's sync API keeps an event loop running in the thread while
    it is open, and a later module's ``asyncio.run`` would then refuse to start.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    """A fresh browser profile (no cookie yet) whose expectations wait up to BROWSER_WAIT_MS."""
    from playwright.sync_api import expect

    expect.set_options(timeout=BROWSER_WAIT_MS)
    made = browser.new_context(viewport={"width": 1280, "height": 860})
    yield made
    made.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a browser test saves its screenshots: the test's directory, or $TETHER_UI_SCREENSHOTS."""
    where = Path(os.environ.get(SCREENSHOTS) or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="session")
def mermaid_dir() -> Path:
    """Where Mermaid's parser is installed: $TETHER_MERMAID_DIR, else tests/mermaid (else skip or fail)."""
    where = Path(os.environ.get(MERMAID_DIR) or MERMAID_HOME)
    need_tool(mermaid_missing(where))
    return where


# FakeMessagesAPI ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_api_server() -> Iterator[FakeMessagesAPI]:
    """One FakeMessagesAPI server per test module (starting one per test is slow)."""
    with FakeMessagesAPI() as server:
        yield server


@pytest.fixture
def api(fake_api_server: FakeMessagesAPI) -> FakeMessagesAPI:
    """The module's FakeMessagesAPI, reset: no queued replies, no recorded requests."""
    fake_api_server.reset()
    return fake_api_server


# FakeChatCompletionsAPI -------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_chat_server() -> Iterator[FakeChatCompletionsAPI]:
    """One FakeChatCompletionsAPI server per test module."""
    with FakeChatCompletionsAPI() as server:
        yield server


@pytest.fixture
def chat_api(fake_chat_server: FakeChatCompletionsAPI) -> FakeChatCompletionsAPI:
    """The module's FakeChatCompletionsAPI, reset: no queued replies, no recorded requests."""
    fake_chat_server.reset()
    return fake_chat_server


# Engine scenarios on every provider ---------------------------------------------------------
def wire_for(request: pytest.FixtureRequest, provider: str) -> Wire:
    """The provider's fake API, reset, as the scenarios script and read it (see wires.py)."""
    if provider == "anthropic":
        return MessagesWire(request.getfixturevalue("api"))
    return ChatWire(request.getfixturevalue("chat_api"))


@pytest.fixture(
    params=[
        pytest.param((provider, kind), id=f"{provider}-{kind}")
        for provider in ("anthropic", "openai")
        for kind in ("sync", "async")
    ]
)
async def h(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """A scenario's harness: each provider's real adapter against its fake, driven by Runner and AsyncRunner."""
    provider, kind = request.param
    harness = Harness(wire_for(request, provider), kind)
    yield harness
    await harness.close()


@pytest.fixture
def calls() -> Calls:
    """What the scenario tools were called with."""
    return Calls()


@pytest.fixture
def tools(calls: Calls) -> dict[str, Tool]:
    """The scenario tools by name, recording their calls in ``calls``."""
    return make_tools(calls)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the heap the test modules' imports made, as tether's own processes do (tether.heap).

    Some 400,000 objects live as long as the worker: each full collection traversed them all
    (0.3 s of CPU), at every module's end (below) and whenever the collector ran a full pass.
    Frozen, only what the tests allocate is traversed: the leaks below are still found.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _leaks_found_in_their_module() -> Iterator[None]:
    """Collect garbage after each module, so an unclosed socket or connection fails that module's
    last test instead of whichever test a later collection happens to run in (a flaky failure)."""
    yield
    gc.collect()
