"""MkDocs hook: the parts of the docs that are generated from the code, at every build.

- The pictures in ``diagrams/`` (kept there, beside the scripts that regenerate them) join the
  site at ``diagrams/NAME``, so the pages link to one copy and ``strict`` still checks the links.
- ``<!-- generated: cli -->`` becomes every ``tether`` command's ``--help``, as the installed
  command prints it, so the CLI reference cannot go stale.
- ``<!-- generated: events -->`` becomes one section per fact a run can record
  (``tether.facts.events.Fact``), with a table of its fields read from the source.
- ``<!-- generated: json-schemas -->`` becomes the JSON Schema of each command's ``--json`` output,
  read from the files the package ships (``tether/surfaces/schemas/``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import typing
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
PICTURES = ("*.svg", "*.png")
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)
HELP_WIDTH = "100"
"""Columns argparse wraps the help to (it reads $COLUMNS): what a reader's page holds without a scrollbar."""
HELPS = """
import contextlib, io, json, re, sys
from tether.surfaces.cli import main

def helped(args):
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
        main([*args, "--help"])
    return shown.getvalue()

top = helped([])
names = re.search(r"\\{([a-z,-]+)\\}", top).group(1).split(",")
json.dump({"": top, **{name: helped([name]) for name in names}}, sys.stdout)
"""
"""Run in a process of its own: ``tether --help`` and each command's, by the entry point itself."""


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add every picture of ``diagrams/`` to the site, at ``diagrams/NAME``."""
    for pattern in PICTURES:
        for picture in sorted((ROOT / "diagrams").glob(pattern)):
            files.append(
                File(
                    f"diagrams/{picture.name}",
                    src_dir=str(ROOT),
                    dest_dir=config.site_dir,
                    use_directory_urls=config.use_directory_urls,
                )
            )
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with what NAME generates."""

    def generated(match: re.Match[str]) -> str:
        name = match[1]
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: no generator named {name!r} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)


@cache
def command_helps() -> dict[str, str]:
    """``tether --help`` (key ``""``) and each command's ``--help``, by command name."""
    env = {**os.environ, "COLUMNS": HELP_WIDTH}
    done = subprocess.run(
        [sys.executable, "-c", HELPS], capture_output=True, text=True, check=True, env=env, timeout=120
    )
    helps: dict[str, str] = json.loads(done.stdout)
    return helps


def cli() -> str:
    """A section per command: its one-line purpose, then its whole ``--help``."""
    helps = command_helps()
    purposes = dict(re.findall(r"^    ([a-z-]+)\s{2,}(.+)$", helps[""], re.M))
    sections = [f"## `tether`\n\n```text\n{helps['']}```\n"]
    for name, text in helps.items():
        if name:
            sections.append(f"## `tether {name}`\n\n{purposes.get(name, '').capitalize()}.\n\n```text\n{text}```\n")
    return "\n".join(sections)


def events() -> str:
    """A section per kind of fact, in the order ``Fact`` lists them: what it says, and a table of its fields.

    Each field's type and docstring are read from the source by griffe (as mkdocstrings reads
    the API pages), so a new field or fact shows here at the next build.
    """
    import griffe

    from tether.core import events as facts

    module = griffe.load("tether.facts.events", search_paths=[str(ROOT / "src")])
    sections = []
    for fact in typing.get_args(facts.Fact):
        source = module[fact.__name__]
        rows = [
            f"| `{name}` | `{member.annotation}` | {_field_note(member)} |"
            for name, member in source.members.items()
            if member.is_attribute and name != "kind"
        ]
        table = "| field | type | meaning |\n|---|---|---|\n" + "\n".join(rows) if rows else "No fields."
        summary = _markdown(source.docstring.value.split("\n\n")[0]) if source.docstring else ""
        sections.append(f"## `{fact.kind}`\n\n{summary}\n\n{table}\n")
    return "\n".join(sections)


RST = re.compile(r"``([^`]+)``|:[a-z]+:`~?([^`]+)`")
"""A reStructuredText literal, or a Sphinx role (shown as its target's last part)."""


def _markdown(text: str) -> str:
    """``text`` on one line, its reStructuredText literals and roles as Markdown code."""
    return RST.sub(lambda found: f"`{found[1] or found[2].rsplit('.', 1)[-1]}`", " ".join(text.split()))


def _field_note(member: Any) -> str:
    """A field's docstring for a table cell, saying when the field may be left out of the JSON."""
    text = _markdown(member.docstring.value).replace("|", "\\|") if member.docstring else ""
    return f"{text} *(optional)*".strip() if member.value is not None else text


def json_schemas() -> str:
    """Each ``--json`` output's schema, as the package ships it: its title, description and text."""
    folder = resources.files("tether.surfaces") / "schemas"
    sections = []
    for schema in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if not schema.name.endswith(".json"):
            continue
        text = schema.read_text(encoding="utf-8")
        data = json.loads(text)
        sections.append(
            f"### `{data['title']}`\n\n{data['description']}\n\n"
            f'??? note "Its JSON Schema: `tether/surfaces/schemas/{schema.name}`"\n\n'
            f"    ```json\n{_indented(text.rstrip(), 4)}\n    ```\n"
        )
    return "\n".join(sections)


def _indented(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


GENERATORS = {"cli": cli, "events": events, "json-schemas": json_schemas}
