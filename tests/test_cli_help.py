"""The command line explains itself: every option of every command has help, and --version says which tether."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import tether
from support import Cli, CliResult


def undocumented(help_text: str) -> list[str]:
    """The options and arguments ``--help`` lists without a word about them.

    argparse puts an entry's help after two spaces on its line, or on the next, indented
    lines when the entry is long; an entry with neither has none.
    """
    lines = help_text.splitlines()
    missing = []
    section = ""
    for i, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):  # "options:", "positional arguments:", a group
            section = line
            continue
        entry_start = r"^  \S" if section == "positional arguments:" else r"^  -"  # not a group's description
        if not section or not re.match(entry_start, line):
            continue
        entry = line.strip()
        following = lines[i + 1] if i + 1 < len(lines) else ""
        help_below = re.match(r"^ {3,}\S", following) is not None and not following.strip().startswith("-")
        if not re.search(r"\S {2,}\S", entry) and not help_below:
            missing.append(entry)
    return missing


def test_every_option_of_every_command_has_help(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    top = cli("--help")
    assert top.returncode == 0, top
    commands = re.search(r"\{([a-z,-]+)\}", top.stdout)
    assert commands is not None, top.stdout
    names = commands.group(1).split(",")
    assert {"run", "resume", "approve", "deny", "show", "runs", "gc", "pending", "audit", "demo", "diagram"} <= set(
        names
    )
    helps: list[CliResult] = cli.parallel(*([name, "--help"] for name in names))
    gaps = {}
    for name, shown in zip(names, [top, *helps][1:], strict=True):
        assert shown.returncode == 0, shown
        assert "usage: tether " + name in shown.stdout, shown
        if missing := undocumented(shown.stdout):
            gaps[name] = missing
    assert gaps == {}, f"options without help text: {gaps}"
    assert undocumented(top.stdout) == []


def test_the_checker_sees_an_option_without_help() -> None:
    shown = "usage: x\n\noptions:\n  -h, --help  show this help message and exit\n  --json\n  --db DB     where\n"
    assert undocumented(shown) == ["--json"]
    wrapped = "options:\n  --a-very-long-option-name LONG_METAVAR\n                        its help, below\n  --json\n"
    assert undocumented(wrapped) == ["--json"]


def test_version_is_written_once_and_read_by_the_metadata_and_the_cli(tmp_path: Path) -> None:
    """``src/tether/__about__.py`` holds it; the build reads it into the metadata (hatch's dynamic version)."""
    about = (Path(tether.__file__).parent / "__about__.py").read_text(encoding="utf-8")
    assert f'__version__ = "{tether.__version__}"' in about
    assert version("tether") == tether.__version__
    shown = Cli(tmp_path)("--version")
    assert shown.returncode == 0, shown
    assert shown.stdout.strip() == f"tether {tether.__version__}"
