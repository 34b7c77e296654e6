"""Every Python block of README.md and docs/ runs, so the docs cannot rot.

A page's blocks run in order in one namespace, as a reader would type them, in a scratch
directory: a later block may use what an earlier one made. Each block is compiled under the
page's own name and line numbers, so a failure's traceback shows the page's lines; a block with
``#>`` comments must print exactly those lines. A fenced block with a title
(```` ```toml title="rules.toml" ````) is written there as that file first, so code that reads a
file the page shows reads that very text.

Nothing reaches a real model. A page's blocks see ``ANTHROPIC_BASE_URL`` and ``OPENAI_BASE_URL``
pointing at tether.testing's fakes of the two APIs (which validate every request as the real ones
do), and an HTML comment right above a block scripts what the model answers, invisible on the
rendered page:

- ``<!-- model: [TURN, ...] -->`` queues Claude's turns, ``<!-- openai: [TURN, ...] -->`` the
  OpenAI-compatible server's; a TURN is a text answer (``"Done."``), one tool call
  (``["refund", {"invoice_id": "INV-7"}]``) or several in one turn (a list of those). The list is
  JSON, or a Python expression building one (``[TURN] * 64 + ["Done."]``);
- ``<!-- requires: graphviz -->`` (or ``postgres``) skips the page where that is missing, and fails
  it under ``TETHER_REQUIRE_TOOLS`` / ``TETHER_REQUIRE_PG`` as the rest of the suite does; a page
  that requires PostgreSQL finds a database of its own (a fresh schema) in ``TETHER_DB``.

Every scripted turn must be asked for: a page whose code makes fewer model calls than its script
says fails, so the script cannot drift from the code.

(pytest-examples does this job for Pydantic AI; its 0.0.18 rebuilds a failing block's frames
with Python 3.12's code-object layout on 3.11, so a failure crashed pytest's report instead of
showing it. What it did that we need is the few lines below.)
"""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support import PgSchema, graphviz_missing, need_tool, run_tether
from tether.models.anthropic import AnthropicModel
from tether.models.openai import OpenAIModel
from tether.testing import FakeChatCompletionsAPI, FakeMessagesAPI

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
DIRECTIVE = re.compile(r"<!--\s*(model|openai|requires):\s*((?:(?!-->).)*?)\s*-->\s*\Z", re.S)
TITLE = re.compile(r'title="([^"]+)"')
CALL_IDS = itertools.count(1)
"""Tool-use ids of the scripted Claude turns: unique across every page."""


@dataclass
class Block:
    """One fenced block of a page, with the directives written right above it."""

    line: int
    """The line of its first line of code (1-based)."""
    language: str
    code: str
    title: str | None = None
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def is_python(self) -> bool:
        return self.language in ("python", "py")

    @property
    def printed(self) -> list[str] | None:
        """What its ``#>`` comments say it prints, or None when it has none."""
        said = [line.strip()[3:] for line in self.code.splitlines() if line.strip().startswith("#> ")]
        return said or None


def directives_above(text: str, line: int) -> dict[str, str]:
    """The ``<!-- key: value -->`` comments ending right above ``line`` (1-based), by key."""
    before = "\n".join(text.splitlines()[: line - 1])
    found: dict[str, str] = {}
    while match := DIRECTIVE.search(before):
        found.setdefault(match[1], match[2])
        before = before[: match.start()]
    return found


def blocks_of(page: Path) -> list[Block]:
    """The page's fenced blocks, in the order they appear."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        line = text[: match.start()].count("\n") + 2
        info = match["info"].strip()
        title = TITLE.search(info)
        language = info.split(maxsplit=1)[0].strip("{.") if info else ""
        directives = directives_above(text, line - 1)
        blocks.append(Block(line, language, match["body"], title[1] if title else None, directives))
    return blocks


def pages_with_code() -> list[Path]:
    return [page for page in PAGES if any(block.is_python for block in blocks_of(page))]


def run_block(block: Block, page: Path, namespace: dict[str, Any]) -> None:
    """Run one block in the page's namespace, under the page's name and line numbers."""
    code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, namespace)
    if block.printed is not None:
        assert printed.getvalue().rstrip().splitlines() == block.printed, f"{page.name}:{block.line}: printed otherwise"


def turns(text: str) -> list[Any]:
    """A directive's turns: JSON, or a Python expression of lists (``[TURN] * 64 + ["Done."]``)."""
    parsed = eval(text, {"__builtins__": {}, "true": True, "false": False, "null": None})  # our own docs' text
    assert isinstance(parsed, list), f"a model script is a list of turns, not {text!r}"
    return parsed


def calls_of(turn: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """A tool-calling turn's calls: one ``[name, input]`` or a list of them."""
    if turn and isinstance(turn[0], str):
        return [(turn[0], turn[1])]
    return [(name, arguments) for name, arguments in turn]


def script_claude(api: FakeMessagesAPI, text: str) -> None:
    for turn in turns(text):
        if isinstance(turn, str):
            api.reply_text(turn)
            continue
        content = [
            {"type": "tool_use", "id": f"toolu_docs_{next(CALL_IDS)}", "name": name, "input": arguments}
            for name, arguments in calls_of(turn)
        ]
        api.reply({"content": content, "stop_reason": "tool_use"})


def script_openai(api: FakeChatCompletionsAPI, text: str) -> None:
    for turn in turns(text):
        if isinstance(turn, str):
            api.reply_text(turn)
        else:
            api.reply_tool_calls(*calls_of(turn))


@pytest.fixture
def fake_apis(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeMessagesAPI, FakeChatCompletionsAPI]]:
    """Both model APIs, faked locally, where the SDKs' environment variables point."""
    with FakeMessagesAPI() as claude, FakeChatCompletionsAPI() as openai:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "docs-test-key")
        monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
        monkeypatch.setenv("OPENAI_BASE_URL", openai.url)
        monkeypatch.setenv("OPENAI_API_KEY", "docs-test-key")
        yield claude, openai


def require(what: str, request: pytest.FixtureRequest) -> None:
    """Skip (or fail, where the suite requires it) a page that needs a tool this machine lacks."""
    if what == "graphviz":
        need_tool(graphviz_missing())
    elif what == "postgres":  # the page reads its database's URL from TETHER_DB: a schema of its own
        schema: PgSchema = request.getfixturevalue("pg_schema")
        os.environ["TETHER_DB"] = schema.url  # restored by the page's monkeypatch (set below first)
    else:
        raise AssertionError(f"unknown requirement {what!r} (known: graphviz, postgres)")


@pytest.fixture
def models_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[AnthropicModel | OpenAIModel]]:
    """Every SDK model a page makes, closed when the page ends: an unclosed socket warns (and warnings
    fail the suite), so what a page leaves open would fail whichever test ran next."""
    made: list[AnthropicModel | OpenAIModel] = []
    for adapter in (AnthropicModel, OpenAIModel):
        monkeypatch.setattr(adapter, "__init__", recording(adapter.__init__, made))
    yield made
    for model in made:
        model.close()


def recording(init: Callable[..., None], made: list[Any]) -> Callable[..., None]:
    def init_and_record(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    return init_and_record


def forget_modules_of(directory: Path) -> None:
    """Drop the modules imported from ``directory`` (a page's ``report.py``...): a later page that
    writes a module of the same name in its own directory must import its own, not this one."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file is not None and Path(file).is_relative_to(directory):
            del sys.modules[name]


@pytest.mark.parametrize("page", pages_with_code(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_python_block_of_the_page_runs(
    page: Path,
    fake_apis: tuple[FakeMessagesAPI, FakeChatCompletionsAPI],
    models_made: list[AnthropicModel | OpenAIModel],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    claude, openai = fake_apis
    scratch = tmp_path / "cwd"
    scratch.mkdir()
    monkeypatch.chdir(scratch)
    monkeypatch.syspath_prepend(str(scratch))  # a module the page writes (title="billing.py") imports
    venv = str(Path(sys.executable).parent)  # the `python` a page's command line starts is this one
    monkeypatch.setenv("PATH", os.pathsep.join([venv, os.environ["PATH"]]))
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
    blocks = blocks_of(page)
    monkeypatch.delenv("TETHER_DB", raising=False)
    for block in blocks:
        if "requires" in block.directives:
            require(block.directives["requires"], request)
    try:
        for block in blocks:
            if block.title:
                (scratch / block.title).write_text(block.code, encoding="utf-8")
            if not block.is_python:
                continue
            if "model" in block.directives:
                script_claude(claude, block.directives["model"])
            if "openai" in block.directives:
                script_openai(openai, block.directives["openai"])
            run_block(block, page, namespace)
    finally:
        namespace.clear()  # its functions hold it in a cycle: only the collector frees it
        forget_modules_of(scratch)
        gc.collect()
    assert claude.pending == 0, f"{page.name}: {claude.pending} scripted Claude turn(s) never asked for"
    assert openai.pending == 0, f"{page.name}: {openai.pending} scripted OpenAI turn(s) never asked for"


CODE_WIDTH = 88
"""Characters of code a docs page shows without a scrollbar, next to the navigation (as black's default)."""


def test_every_python_line_of_the_docs_fits_the_page() -> None:
    too_wide = [
        f"{page.relative_to(ROOT)}:{block.line + i}"
        for page in PAGES
        for block in blocks_of(page)
        if block.is_python
        for i, line in enumerate(block.code.splitlines())
        if len(line) > CODE_WIDTH and not line.lstrip().startswith("#>")  # what it prints is what it prints
    ]
    assert too_wide == []


def test_the_tutorial_runs_offline_without_an_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer without a key follows every step: ``model.py``'s stand-in answers, Claude is never asked."""
    page = ROOT / "docs" / "tutorial.md"
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    venv = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join([venv, os.environ["PATH"]]))
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "TETHER_DB"):
        monkeypatch.delenv(name, raising=False)
    namespace: dict[str, Any] = {"__name__": "docs_tutorial_offline"}
    with FakeMessagesAPI() as claude:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.url)  # a request sent anyway would be seen here
        try:
            for block in blocks_of(page):
                if block.title:
                    (tmp_path / block.title).write_text(block.code, encoding="utf-8")
                if block.is_python:
                    run_block(block, page, namespace)  # each prints what the page says
        finally:
            namespace.clear()
            forget_modules_of(tmp_path)
            gc.collect()
        assert claude.requests == []
    db = f"sqlite:///{tmp_path / 'tutorial.db'}"
    parked = run_tether(
        tmp_path,
        "run",
        "Delete notes.txt.",
        "--tools",
        "files:TOOLS",
        "--db",
        db,
        "--model",
        "scripted:delete-notes.json",
        "--json",
    )  # the command line's step
    assert parked.data["status"] == "awaiting_approval", parked
    assert parked.data["pending_approvals"][0]["input"] == {"name": "notes.txt"}
