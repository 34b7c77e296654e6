"""No text can make a run stuck: any string is stored losslessly on every backend, and printed.

PostgreSQL's JSONB cannot hold U+0000 and its text cannot hold unpaired surrogates (what
``errors="surrogateescape"`` makes of a binary file's bytes); SQLite can, but a terminal or
a UTF-8 pipe cannot print a lone surrogate. The store escapes such strings at its edge and
every CLI output path stays encodable, so the model and the user see the same content on
every backend.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import Cli, tool_results, tool_use
from tether import Agent, Runner, tool
from tether.facts.events import Event, RunStarted, Warned
from tether.stores import RunRecord
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

NASTY = [
    "nul \x00 inside",
    "\x00",
    "lone high \ud800 surrogate",
    "lone low \udcff",
    "\udfff\ud800",  # a low then a high: two lone surrogates, not a pair
    "\ufdd0starts like an escaped string",
    "\ufdd0",
    "ends with \ufdd0",
    "back\\slash \\u0000 and \\ufdd0 spelled out",
    "emoji 😀 and é",
    "",
]
"""Strings PostgreSQL cannot hold as they are, strings that look like their escaped form, and
ordinary ones that must come back untouched."""


def nasty_tree() -> dict[str, Any]:
    """Every :data:`NASTY` string as a value, a dict key and a list item, nested."""
    return {
        "values": list(NASTY),
        "keys": {text: index for index, text in enumerate(NASTY)},
        "nested": [{"deep": {text: [text, 1, None, True, 2.5]}} for text in NASTY],
    }


def test_the_store_gives_back_exactly_what_it_was_given(db_url: str) -> None:
    store = SQLStore(db_url)
    try:
        tree = nasty_tree()
        first = RunRecord(id="run_1", status="thinking", version=1, tenant="t", spec=tree, summary=tree)
        facts = [RunStarted(tree, [tree]), RunStarted({"k": NASTY}, [])]
        store.create_run(first, [Event(0, 1.0, facts[0])])
        second = RunRecord(id="run_1", status="done", version=2, tenant="t", spec=tree, summary={"s": NASTY})
        store.append(second, 1, [Event(1, 2.0, facts[1])])
        loaded = store.load_run("run_1")
        assert (loaded.spec, loaded.summary) == (tree, {"s": NASTY})
        assert [e.fact for e in store.load_events("run_1")] == facts
        assert [e.fact for e in store.load_log("run_1").events] == facts
        assert [r.summary for r in store.list_runs()] == [{"s": NASTY}]
        for index, text in enumerate(NASTY):
            store.cache_put(f"key{index}", "reader", text, expires_at=2e9)
        assert [store.cache_get(f"key{index}", 1.0) for index in range(len(NASTY))] == NASTY
    finally:
        store.close()


def test_ordinary_text_is_stored_as_plain_json(db_url: str) -> None:
    """Only strings that need it are escaped: the rest stays readable (and queryable) JSON."""
    store = SQLStore(db_url)
    try:
        data = {"message": "héllo 😀 \\u0000"}
        first = RunRecord(id="run_1", status="done", version=1)
        store.create_run(first, [Event(0, 1.0, Warned(data["message"]))])
        with store.engine.connect() as connection:
            (stored,) = connection.exec_driver_sql("SELECT data FROM tether_event").one()
        assert (json.loads(stored) if isinstance(stored, str) else stored) == data
    finally:
        store.close()


BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00"


def test_a_tool_reading_a_binary_file_does_not_make_the_run_stuck(db_url: str, tmp_path: Path) -> None:
    """NUL and lone surrogates in model text, tool input and tool output: the run finishes
    once, and the model saw exactly the text the tool returned, on every backend."""
    (tmp_path / "image.png").write_bytes(BINARY)
    runs: list[str] = []

    @tool(idempotent=True)
    def read_file(path: str) -> str:
        """Read a file as text, whatever its bytes."""
        runs.append(path)
        return (tmp_path / path).read_bytes().decode("utf-8", errors="surrogateescape")

    name = "image.png"
    script = [
        {
            "content": [
                {"type": "text", "text": "Reading \x00 it \ud83d now"},
                tool_use("t1", "read_file", {"path": name}),
                tool_use("t2", "read_file", {"path": name, "\x00key": "x"}),
            ],
            "stop_reason": "tool_use",
        },
        {"content": [{"type": "text", "text": "It starts with \x89PNG \udc89 \x00."}], "stop_reason": "end_turn"},
    ]
    model = ScriptedModel(script)
    store = SQLStore(db_url)
    try:
        runner = Runner(Agent(model=model, tools=[read_file]), store)
        result = runner.run("What is in image.png?")
        assert result.status == "done", result.error
        assert result.output == "It starts with \x89PNG \udc89 \x00."
        assert runs == [name]  # t2's extra key makes its input invalid: an error result, not a run
        expected = BINARY.decode("utf-8", errors="surrogateescape")
        sent = model.requests[1].messages
        results = {b["tool_use_id"]: b for b in sent[-1]["content"] if b["type"] == "tool_result"}
        assert results["t1"]["content"] == expected
        assert sent[1]["content"][0]["text"] == "Reading \x00 it \ud83d now"
        reloaded = Runner(Agent(model=ScriptedModel([])), store).load(result.run_id)  # from the database
        assert reloaded.messages == [*sent, {"role": "assistant", "content": script[1]["content"]}]
    finally:
        store.close()


# The command line -------------------------------------------------------------------------------
READER_TOOLS = textwrap.dedent(
    '''
    """A tool that reads files as text, whatever their bytes."""

    from pathlib import Path

    from tether import tool


    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return Path(path).read_bytes().decode("utf-8", errors="surrogateescape")


    @tool(approval=True)
    def write_file(path: str, content: str) -> str:
        """Write a file (gated)."""
        Path(path).write_text(content, encoding="utf-8", errors="surrogateescape")
        return "written"
    '''
)
READER_SCRIPT = [
    {
        "content": [{"type": "text", "text": "Reading \udcff."}, tool_use("t1", "read_file", {"path": "blob.bin"})],
        "stop_reason": "tool_use",
    },
    {"content": [{"type": "text", "text": "Saw \udc89PNG \x00 and \ud800."}], "stop_reason": "end_turn"},
]
GATED_SCRIPT = [
    {
        "content": [tool_use("t1", "write_file", {"path": "out.bin", "content": "\udcff\x00"})],
        "stop_reason": "tool_use",
    },
    {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
]


@pytest.fixture
def reader(tmp_path: Path) -> Cli:
    (tmp_path / "readers.py").write_text(READER_TOOLS, encoding="utf-8")
    (tmp_path / "blob.bin").write_bytes(BINARY)
    (tmp_path / "reader.json").write_text(json.dumps(READER_SCRIPT), encoding="utf-8")
    (tmp_path / "gated.json").write_text(json.dumps(GATED_SCRIPT), encoding="utf-8")
    return Cli(tmp_path)


def test_every_output_path_prints_lone_surrogates(reader: Cli) -> None:
    tools = ("--tools", "readers:read_file", "--tools", "readers:write_file")
    run, gated, text_run = reader.parallel(
        ("run", "Read blob.bin", *tools, "--model", "scripted:reader.json", "--json", "--db", "sqlite:///a.db"),
        ("run", "Write it", *tools, "--model", "scripted:gated.json", "--json"),
        ("run", "Read blob.bin", *tools, "--model", "scripted:reader.json", "--db", "sqlite:///b.db"),
    )
    assert run.returncode == 0, run
    assert run.data["output"] == "Saw \udc89PNG \x00 and \ud800."
    assert gated.returncode == 3, gated
    assert gated.data["pending_approvals"][0]["input"] == {"path": "out.bin", "content": "\udcff\x00"}
    assert text_run.returncode == 0, text_run
    assert "Saw \\udc89PNG" in text_run.stdout  # shown escaped: display only

    a_db = ("--db", "sqlite:///a.db")
    shown, pending, audit, *printed = reader.parallel(
        ("show", run.data["run_id"], "--json", *a_db),
        ("pending", "--json"),
        ("audit", "--json", *a_db),
        ("show", run.data["run_id"], *a_db),
        ("runs", *a_db),
        ("pending",),
        ("diagram", "--run", run.data["run_id"], "--kind", "sequence", "-o", "run.mmd", *a_db),
    )
    for result in (shown, pending, audit, *printed):
        assert result.returncode == 0, result
        assert "Traceback" not in result.stderr, result
    assert tool_results(shown.data)["t1"]["content"] == BINARY.decode("utf-8", errors="surrogateescape")
    assert pending.data["pending"][0]["input"] == {"path": "out.bin", "content": "\udcff\x00"}
    assert audit.data["entries"][0]["result"] == BINARY.decode("utf-8", errors="surrogateescape")
    assert "Saw \\udc89PNG" in (reader.cwd / "run.mmd").read_text(encoding="utf-8")
