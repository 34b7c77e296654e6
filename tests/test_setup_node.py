"""scripts/setup and an old Node.js: it installs a Node 20 from the npm registry, or says exactly
what is missing.

The script runs for real, in a copy of the repository's layout, with a ``node`` that says it is
18.19.0 and an ``npm`` that stands in for the registry (it logs its calls and, when told to,
"installs" the ``node`` package by linking the machine's own Node 20), so nothing is fetched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import mermaid_missing, mermaid_node

ROOT = Path(__file__).resolve().parent.parent
REAL_NODE = shutil.which("node")
OLD_NODE = """#!/bin/sh
echo 18.19.0
"""
FAKE_NPM = """#!/bin/sh
echo "npm $* | node=$(command -v node) $(node -p process.versions.node)" >> "$NPM_LOG"
if [ "$1" = install ]; then
  [ "$REGISTRY" = up ] || { echo "npm error network request to https://registry.npmjs.org/node failed"; exit 1; }
  mkdir -p "$3/node_modules/.bin" && ln -s "$REAL_NODE" "$3/node_modules/.bin/node"
fi
[ "$1" = ci ] && mkdir -p node_modules
exit 0
"""
LOCAL_NODE = "tests/mermaid/.node/node_modules/.bin/node"

needs_node = pytest.mark.skipif(REAL_NODE is None, reason="the machine's Node 20 stands in for the registry's")


def checkout(tmp_path: Path, node: str | None) -> tuple[Path, dict[str, str]]:
    """The repository's layout with everything but Node already set up, and the environment to run it."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup", repo / "scripts" / "setup")
    (repo / "pyproject.toml").write_text("", encoding="utf-8")
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").symlink_to(Path(sys.executable))
    (repo / ".venv" / ".tether-installed").touch()
    os.utime(repo / "pyproject.toml", (0, 0))  # older than the install stamp: no pip install
    (repo / "tests" / "mermaid").mkdir(parents=True)
    (repo / "tests" / "mermaid" / "package-lock.json").write_text("{}", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text(FAKE_NPM, encoding="utf-8")
    if node == "old":
        (bin_dir / "node").write_text(OLD_NODE, encoding="utf-8")
    elif node == "20":
        (bin_dir / "node").symlink_to(str(REAL_NODE))
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    system = ["/usr/local/bin", "/usr/bin", "/bin"]
    env = {
        "PATH": os.pathsep.join([str(bin_dir), *system]),
        "HOME": str(tmp_path),
        "NPM_LOG": str(tmp_path / "npm.log"),
        "REAL_NODE": str(REAL_NODE),
    }
    return repo, env


def setup(repo: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    command = ["bash", str(repo / "scripts" / "setup")]
    return subprocess.run(command, env={**env, **extra}, capture_output=True, text=True, timeout=60, check=False)


def npm_calls(env: dict[str, str]) -> list[str]:
    log = Path(env["NPM_LOG"])
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


@needs_node
def test_an_old_node_gets_a_node_20_from_the_npm_registry(tmp_path: Path) -> None:
    repo, env = checkout(tmp_path, "old")
    done = setup(repo, env, REGISTRY="up")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    install, ci = npm_calls(env)
    assert install.startswith("npm install --prefix tests/mermaid/.node ")
    assert " node@20 " in install
    assert ci.startswith("npm ci ")
    assert f"node={repo / LOCAL_NODE} 20." in ci  # the modules are installed under Node 20
    assert (repo / "tests" / "mermaid" / "node_modules" / ".tether-installed").exists()
    assert mermaid_node(repo / "tests" / "mermaid") == str(repo / LOCAL_NODE)  # the tests run that node

    again = setup(repo, env, REGISTRY="up")
    assert again.returncode == 0
    assert len(npm_calls(env)) == 2  # installed once


def test_without_the_registry_it_says_what_is_missing_and_how_to_fix_it(tmp_path: Path) -> None:
    repo, env = checkout(tmp_path, "old")
    done = setup(repo, env, REGISTRY="down")
    assert done.returncode == 0  # best effort: the rest of the setup is not held up
    message = " ".join(done.stderr.split())
    assert "Mermaid's parser needs Node.js >= 20 (for jsdom); found 18.19.0" in message
    assert str(tmp_path / "bin" / "node") in message
    assert "npm error network request to https://registry.npmjs.org/node failed" in message
    assert "Fix: `npm install --prefix tests/mermaid/.node node@20`" in message
    assert [call.split(" |")[0] for call in npm_calls(env)] == [
        "npm install --prefix tests/mermaid/.node --no-audit --no-fund --loglevel=error node@20"
    ]  # and no `npm ci` under a Node that cannot run it


@needs_node
def test_a_node_20_on_path_is_used_as_it_is(tmp_path: Path) -> None:
    repo, env = checkout(tmp_path, "20")
    done = setup(repo, env)
    assert done.returncode == 0, done.stderr
    (ci,) = npm_calls(env)
    assert ci.startswith("npm ci ")
    assert f"node={tmp_path / 'bin' / 'node'} " in ci
    assert not (repo / "tests" / "mermaid" / ".node").exists()


def test_the_tests_say_which_old_node_they_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, env = checkout(tmp_path, "old")
    monkeypatch.setenv("PATH", env["PATH"])
    missing = mermaid_missing(tmp_path)
    assert missing is not None
    assert "needs Node.js >= 20" in missing
    assert f"{tmp_path / 'bin' / 'node'} is 18.19.0" in missing
