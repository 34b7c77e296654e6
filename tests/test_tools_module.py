"""The tools module a run records: imported without shadowing anything, and only when needed.

A run's spec names its tools module and the directory it was started from; whoever can write
the database chooses them. Resuming imports that module (that is what resuming means), but
never lets a file beside it stand in for another module (a ``yaml.py`` next to ``mytools.py``
must not run when a YAML policy is read), and reading or stopping a run (``show``, ``runs``,
``pending``, ``audit``, ``diagram --run``, ``deny``, ``cancel``) imports nothing at all: those
work when the tools module or the scripted model file is gone, or raises on import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import Cli, clean_env, tool_use, tool_use_turn
from tether.drivers.loader import load_tools

TOOLS = textwrap.dedent(
    '''
    """Tools for these tests; their side effects land in files of this directory."""

    from pathlib import Path

    from tether import tool

    HERE = Path(__file__).resolve().parent


    @tool(approval=True)
    def danger(path: str) -> str:
        """Something irreversible: appends the path to danger.marker."""
        with (HERE / "danger.marker").open("a", encoding="utf-8") as marker:
            marker.write(path + "\\n")
        return f"danger ran on {path}"


    TOOLS = [danger]
    '''
)
SCRIPT = [
    tool_use_turn(tool_use("toolu_danger", "danger", {"path": "a.txt"})),
    {"content": [{"type": "text", "text": "All done."}], "stop_reason": "end_turn"},
]
POLICY = "rules:\n  - tool: danger\n    action: require_approval\n"
SHADOWS = ("yaml", "json", "pathlib")


def impostor(name: str) -> str:
    """A module that leaves ``NAME.imported`` beside itself when imported."""
    return f"from pathlib import Path as _P\n(_P(__file__).resolve().parent / '{name}.imported').write_text('x')\n"


def imported(where: Path) -> list[str]:
    """Which impostor modules in ``where`` were imported (by the markers they left)."""
    return sorted(marker.stem for marker in where.glob("*.imported"))


def parked_run(tmp_path: Path, *, policy: bool = False) -> tuple[Cli, Path, str]:
    """A run started in ``tmp_path/project`` and parked at its gated call; commands then run
    from ``tmp_path/elsewhere`` (the database is in tmp_path)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "mytools.py").write_text(TOOLS, encoding="utf-8")
    (project / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")
    (project / "policy.yaml").write_text(POLICY, encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    options = ["--policy", "policy.yaml"] if policy else []
    started = Cli(project)(
        "run", "go", "--tools", "mytools:TOOLS", "--model", "scripted:script.json", *options, "--json", "--db", db
    )
    assert started.returncode == 3, started
    return Cli(elsewhere), project, started.data["run_id"]


def with_db(tmp_path: Path, *args: str) -> list[str]:
    return [*args, "--db", f"sqlite:///{tmp_path / 'runs.db'}"]


@pytest.mark.slow  # processes importing the run's modules anew
def test_modules_beside_the_tools_module_never_shadow_others(tmp_path: Path) -> None:
    cli, project, run_id = parked_run(tmp_path, policy=True)
    for name in SHADOWS:
        (project / f"{name}.py").write_text(impostor(name), encoding="utf-8")

    # processes of their own: in this one, yaml, json and pathlib are imported already
    approved = cli.process(*with_db(tmp_path, "approve", run_id, "toolu_danger"))
    assert approved.returncode == 0, approved
    resumed = cli.process(*with_db(tmp_path, "resume", run_id, "--json"))
    assert resumed.returncode == 0, resumed
    assert resumed.data["status"] == "done"
    assert (project / "danger.marker").read_text(encoding="utf-8") == "a.txt\n"  # the tools module itself ran
    assert imported(project) == []


@pytest.mark.slow  # processes importing the run's modules anew
def test_a_tools_module_named_like_another_module_is_still_the_runs_own(tmp_path: Path) -> None:
    """The module is loaded from the run's directory by its file, whatever module it is named like.

    Run with the ``tether`` console script: ``python -m`` would put the directory first on
    ``sys.path`` itself, before tether starts.
    """
    project = tmp_path / "project"
    project.mkdir()
    (project / "string.py").write_text(TOOLS, encoding="utf-8")  # `string` is in the standard library
    (project / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")
    command = [str(Path(sys.executable).parent / "tether"), "run", "go", "--tools", "string:TOOLS"]
    command += ["--model", "scripted:script.json", "--approve-all", "--json", "--db", "sqlite:///runs.db"]
    done = subprocess.run(
        command, cwd=project, env=clean_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["status"] == "done"
    assert (project / "danger.marker").read_text(encoding="utf-8") == "a.txt\n"


def test_a_tools_module_can_import_its_own_helper_modules(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "helpers.py").write_text("GREETING = 'hello from a helper'\n", encoding="utf-8")
    (project / "mytools.py").write_text(
        "from helpers import GREETING\nfrom tether import tool\n\n\n@tool\ndef greet() -> str:\n"
        '    """Greet."""\n    return GREETING\n',
        encoding="utf-8",
    )
    script = [tool_use_turn(tool_use("toolu_greet", "greet", {})), SCRIPT[1]]
    (project / "script.json").write_text(json.dumps(script), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    done = Cli(project)(
        "run", "go", "--tools", "mytools:greet", "--model", "scripted:script.json", "--json", "--db", db
    )
    assert done.returncode == 0, done
    shown = Cli(tmp_path)("show", done.data["run_id"], "--json", "--db", db)
    assert "hello from a helper" in json.dumps(shown.data["messages"])


READ_COMMANDS = {
    "show": ["show", "RUN"],
    "runs": ["runs", "--json"],
    "pending": ["pending", "--json"],
    "audit": ["audit", "--run", "RUN", "--json"],
    "diagram --run": ["diagram", "--run", "RUN"],
    "diagram --run --kind sequence": ["diagram", "--run", "RUN", "--kind", "sequence"],
}


def test_reading_and_denying_never_import_the_tools_nor_load_the_model(tmp_path: Path) -> None:
    """The tools module now exits on import (it would leave a marker) and the model file is gone.

    (``tether cancel`` with the tools module deleted: see test_cancel.py.)
    """
    cli, project, run_id = parked_run(tmp_path)
    (project / "script.json").unlink()
    (project / "mytools.py").write_text(impostor("mytools") + "raise SystemExit(0)\n", encoding="utf-8")
    commands = [[run_id if arg == "RUN" else arg for arg in command] for command in READ_COMMANDS.values()]
    results = dict(zip(READ_COMMANDS, cli.parallel(*(with_db(tmp_path, *c) for c in commands)), strict=True))
    for name, done in results.items():
        assert done.returncode == 0, (name, done)
        assert run_id in done.stdout or name.startswith("diagram"), (name, done)
        assert "Traceback" not in done.stderr, (name, done)
    assert [p["call_id"] for p in results["pending"].data["pending"]] == ["toolu_danger"]
    assert "        danger: needs approval\n" in results["diagram --run"].stdout  # from what the run recorded

    denied = cli(*with_db(tmp_path, "deny", run_id, "toolu_danger", "--reason", "no"))
    assert denied.returncode == 0, denied
    shown = cli(*with_db(tmp_path, "show", run_id, "--json")).data
    assert [e["approved"] for e in shown["events"] if e["type"] == "approval_decided"] == [False]
    assert imported(project) == []


def test_approve_needs_the_tools_but_not_the_model_file(tmp_path: Path) -> None:
    cli, project, run_id = parked_run(tmp_path)
    (project / "script.json").unlink()
    approved = cli(*with_db(tmp_path, "approve", run_id, "toolu_danger"))
    assert approved.returncode == 0, approved


def test_a_package_in_the_runs_directory_keeps_its_relative_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_tools appends the directory
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "helpers.py").write_text("GREETING = 'hello from the package'\n", encoding="utf-8")
    (package / "tools.py").write_text(
        'from .helpers import GREETING\nfrom tether import tool\n\n\n@tool\ndef greet() -> str:\n    """Greet."""\n'
        "    return GREETING\n",
        encoding="utf-8",
    )
    [greet] = load_tools(["mypkg.tools:greet"], cwd=str(tmp_path))
    assert greet() == "hello from the package"
    assert "mypkg" not in sys.modules  # loaded under a private name, shadowing nothing
    assert sys.path[-1] == str(tmp_path.resolve())
